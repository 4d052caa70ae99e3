//! A small L4 balancer in front of the simulator's gateways, and the place
//! where link faults happen. Each accepted connection goes to the next live
//! backend (round robin; a backend that refuses is skipped), and its bytes
//! are pumped both ways through buffers the faults act on:
//!
//! - delay: every chunk waits before it is forwarded;
//! - blackhole (a partition from one gateway): nothing is read from that
//!   gateway's links and nothing is closed, so both ends see a half-open
//!   link until their heartbeats give up (or the partition heals and the
//!   held bytes flow on); new connections avoid the gateway, as a
//!   balancer's health check would;
//! - drop: a connection is closed from the middle (FIN both ways);
//! - reset: a connection is reset (RST both ways).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;

/// Bytes per read on each direction of a link: small, since a simulator
/// holds thousands of links.
const CHUNK: usize = 2048;

#[derive(Debug)]
struct Backend {
    name: String,
    addr: Option<SocketAddr>,
    blackholed: Arc<AtomicBool>,
}

/// How a link ends when a fault ends it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cut {
    Close,
    Reset,
}

#[derive(Debug)]
struct Link {
    backend: String,
    cut: Mutex<Option<Cut>>,
    notify: Notify,
}

#[derive(Debug, Default)]
pub struct Counters {
    pub accepted: AtomicU64,
    pub refused: AtomicU64,
    pub dropped: AtomicU64,
    pub reset: AtomicU64,
}

#[derive(Debug)]
pub struct Balancer {
    pub addr: SocketAddr,
    backends: Mutex<Vec<Backend>>,
    links: Mutex<Vec<std::sync::Weak<Link>>>,
    next: AtomicUsize,
    delay_ms: AtomicU64,
    /// The address its links to the backends come from (`None`: the
    /// kernel's choice, 127.0.0.1 on loopback).
    source: Option<std::net::IpAddr>,
    pub counters: Counters,
}

/// The source address of agent host `host` (0, 1, ...): 127.0.0.2 and up,
/// so each host reaches the gateways from an address of its own, as racks
/// of machines do, and the gateways' per-address rules see more than one
/// address. Every 127/8 address is the loopback's on Linux.
pub fn host_source(host: usize) -> std::net::IpAddr {
    let n = host.min(0x00ff_fffc) as u32 + 2;
    std::net::IpAddr::V4(std::net::Ipv4Addr::from(0x7f00_0000 | n))
}

impl Balancer {
    pub async fn start() -> std::io::Result<Arc<Balancer>> {
        Balancer::start_from(None).await
    }

    /// A balancer whose links to the backends come from `source`.
    pub async fn start_from(source: Option<std::net::IpAddr>) -> std::io::Result<Arc<Balancer>> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let b = Arc::new(Balancer {
            source,
            addr: listener.local_addr()?,
            backends: Mutex::new(Vec::new()),
            links: Mutex::new(Vec::new()),
            next: AtomicUsize::new(0),
            delay_ms: AtomicU64::new(0),
            counters: Counters::default(),
        });
        let me = b.clone();
        tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    continue;
                };
                let me = me.clone();
                tokio::spawn(async move { me.serve(client).await });
            }
        });
        Ok(b)
    }

    /// Adds or moves a backend.
    pub fn set_backend(&self, name: &str, addr: Option<SocketAddr>) {
        let mut b = self.backends.lock().expect("backends");
        match b.iter_mut().find(|x| x.name == name) {
            Some(x) => x.addr = addr,
            None => b.push(Backend {
                name: name.to_string(),
                addr,
                blackholed: Arc::new(AtomicBool::new(false)),
            }),
        }
    }

    pub fn set_delay(&self, d: Duration) {
        self.delay_ms.store(d.as_millis() as u64, Ordering::Relaxed);
    }

    /// Partitions a backend: its links go silent, new links avoid it.
    pub fn blackhole(&self, name: &str, on: bool) {
        let b = self.backends.lock().expect("backends");
        if let Some(x) = b.iter().find(|x| x.name == name) {
            x.blackholed.store(on, Ordering::Relaxed);
        }
    }

    fn live_links(&self) -> Vec<Arc<Link>> {
        let mut links = self.links.lock().expect("links");
        links.retain(|l| l.strong_count() > 0);
        links.iter().filter_map(|l| l.upgrade()).collect()
    }

    /// Ends `n` links chosen by `pick` (an index into the live links).
    pub fn cut(&self, n: usize, reset: bool, mut pick: impl FnMut(usize) -> usize) -> usize {
        let links = self.live_links();
        if links.is_empty() {
            return 0;
        }
        let mut done = 0;
        for _ in 0..n.min(links.len()) {
            let l = &links[pick(links.len())];
            let mut cut = l.cut.lock().expect("cut");
            if cut.is_none() {
                *cut = Some(if reset { Cut::Reset } else { Cut::Close });
                l.notify.notify_waiters();
                done += 1;
            }
        }
        let c = if reset {
            &self.counters.reset
        } else {
            &self.counters.dropped
        };
        c.fetch_add(done as u64, Ordering::Relaxed);
        done
    }

    /// Links per backend now.
    pub fn links_by_backend(&self) -> std::collections::BTreeMap<String, usize> {
        let mut m = std::collections::BTreeMap::new();
        for l in self.live_links() {
            *m.entry(l.backend.clone()).or_default() += 1;
        }
        m
    }

    /// A connection to a backend, from the balancer's source address.
    async fn dial(&self, addr: SocketAddr) -> std::io::Result<TcpStream> {
        let Some(source) = self.source else {
            return TcpStream::connect(addr).await;
        };
        let socket = match source {
            std::net::IpAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
            std::net::IpAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
        };
        socket.bind(SocketAddr::new(source, 0))?;
        socket.connect(addr).await
    }

    async fn serve(self: Arc<Self>, client: TcpStream) {
        let candidates: Vec<(String, SocketAddr, Arc<AtomicBool>)> = {
            let b = self.backends.lock().expect("backends");
            b.iter()
                .filter(|x| !x.blackholed.load(Ordering::Relaxed))
                .filter_map(|x| x.addr.map(|a| (x.name.clone(), a, x.blackholed.clone())))
                .collect()
        };
        if candidates.is_empty() {
            self.counters.refused.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        for k in 0..candidates.len() {
            let (name, addr, blackholed) = &candidates[(start + k) % candidates.len()];
            let Ok(server) = self.dial(*addr).await else {
                continue;
            };
            self.counters.accepted.fetch_add(1, Ordering::Relaxed);
            let _ = client.set_nodelay(true);
            let _ = server.set_nodelay(true);
            let link = Arc::new(Link {
                backend: name.clone(),
                cut: Mutex::new(None),
                notify: Notify::new(),
            });
            self.links
                .lock()
                .expect("links")
                .push(Arc::downgrade(&link));
            self.pump_both(client, server, link, blackholed.clone())
                .await;
            return;
        }
        self.counters.refused.fetch_add(1, Ordering::Relaxed);
    }

    async fn pump_both(
        &self,
        client: TcpStream,
        server: TcpStream,
        link: Arc<Link>,
        blackholed: Arc<AtomicBool>,
    ) {
        let (cr, cw) = client.into_split();
        let (sr, sw) = server.into_split();
        let delay = &self.delay_ms;
        let up = pump(cr, sw, &link, &blackholed, delay);
        let down = pump(sr, cw, &link, &blackholed, delay);
        // Either direction ending ends the link, as a proxy does.
        tokio::select! {
            _ = up => {}
            _ = down => {}
        }
    }
}

/// Copies one direction until EOF, an error or a cut. It holds one half of
/// each socket; a reset sets zero linger on both, so closing them sends RST.
async fn pump(
    mut r: tokio::net::tcp::OwnedReadHalf,
    mut w: tokio::net::tcp::OwnedWriteHalf,
    link: &Link,
    blackholed: &AtomicBool,
    delay_ms: &AtomicU64,
) {
    let mut buf = [0u8; CHUNK];
    loop {
        if link.cut.lock().expect("cut").is_some() {
            break;
        }
        // Partitioned: read nothing, so the sender's buffers fill and its
        // data waits, as behind a dead switch; nothing is lost or closed.
        if blackholed.load(Ordering::Relaxed) {
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(50)) => {}
                _ = link.notify.notified() => {}
            }
            continue;
        }
        let n = tokio::select! {
            n = r.read(&mut buf) => match n {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            },
            _ = link.notify.notified() => continue,
        };
        let d = delay_ms.load(Ordering::Relaxed);
        if d > 0 {
            tokio::time::sleep(Duration::from_millis(d)).await;
        }
        if w.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    if *link.cut.lock().expect("cut") == Some(Cut::Reset) {
        let zero = Some(Duration::ZERO);
        let _ = rustix::net::sockopt::set_socket_linger(AsRef::<TcpStream>::as_ref(&r), zero);
        let _ = rustix::net::sockopt::set_socket_linger(AsRef::<TcpStream>::as_ref(&w), zero);
    } else {
        let _ = w.shutdown().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_host_has_a_loopback_address_of_its_own() {
        assert_eq!(host_source(0).to_string(), "127.0.0.2");
        assert_eq!(host_source(1).to_string(), "127.0.0.3");
        assert_eq!(host_source(300).to_string(), "127.0.1.46");
        assert!(host_source(usize::MAX).is_loopback());
    }

    /// A backend sees a host's links come from the host's address.
    #[tokio::test]
    async fn links_come_from_the_balancers_source_address() {
        let backend = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let b = Balancer::start_from(Some(host_source(7))).await.unwrap();
        b.set_backend("gw", Some(backend.local_addr().unwrap()));
        let _client = TcpStream::connect(b.addr).await.unwrap();
        let (_, peer) = tokio::time::timeout(Duration::from_secs(10), backend.accept())
            .await
            .expect("the balancer dials the backend")
            .unwrap();
        assert_eq!(peer.ip().to_string(), "127.0.0.9");
        // Without one, the kernel's loopback address.
        let plain = Balancer::start().await.unwrap();
        plain.set_backend("gw", Some(backend.local_addr().unwrap()));
        let _client = TcpStream::connect(plain.addr).await.unwrap();
        let (_, peer) = backend.accept().await.unwrap();
        assert_eq!(peer.ip().to_string(), "127.0.0.1");
    }
}
