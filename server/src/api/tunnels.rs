//! Tunnels to nodes (`better-compute exec`): the operator asks, the key
//! holder signs an exec ticket for exactly what was asked and relays the
//! tunnel's bytes between the CLI and the gateway holding the node's
//! session, reading none of them (they are sealed end to end between the
//! CLI and the node: `bcd_proto::tunnel`).
//!
//! The ticket is good for one tunnel (`sid`), one node, at most
//! [`TICKET_LIFE_S`] seconds, and names the CLI's ephemeral key. The node
//! takes ticket keys only from its worker-signed spec: a node whose spec
//! does not carry this key holder's yet gets a new generation first (the
//! same body, signed again) and the tunnel waits until the node applied
//! it. Each tunnel opened is a fleet event `tunnel.opened` (operator,
//! what, ticket id); the node reports its end as `tunnel.ended` (bytes,
//! exit).

use bc_store::NodeId;
use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bcd_proto::ticket::{self, Claims};
use bcd_proto::v1::{
    self, TunnelClientFrame, TunnelServerFrame, tunnel_client_frame, tunnel_server_frame,
};
use prost::Message;
use tokio::sync::{mpsc, oneshot};
use tokio_stream::Stream;
use tonic::{Status, Streaming};
use tracing::{info, warn};

use super::AdminService;
use super::auth::Operator;
use super::status::unavailable;

/// How long a ticket lives: the node must admit it within this.
pub const TICKET_LIFE_S: i64 = 30;

/// Tunnels one operator holds open at once, across nodes.
pub const MAX_PER_OPERATOR: usize = 32;

/// The tunnels each operator holds open through this key holder.
#[derive(Debug, Default)]
pub struct PerOperator(Mutex<HashMap<String, usize>>);

/// One open tunnel counted against its operator until dropped.
#[derive(Debug)]
pub struct Counted {
    of: Arc<PerOperator>,
    operator: String,
}

impl PerOperator {
    /// Counts a tunnel for `operator`, or refuses one past the cap.
    pub fn take(self: &Arc<Self>, operator: &str) -> Result<Counted, Status> {
        let mut open = lock(&self.0);
        let n = open.entry(operator.to_string()).or_default();
        if *n >= MAX_PER_OPERATOR {
            return Err(Status::resource_exhausted(format!(
                "operator {operator} has {MAX_PER_OPERATOR} tunnels open, as many as one \
                 operator may: close one first"
            )));
        }
        *n += 1;
        Ok(Counted {
            of: self.clone(),
            operator: operator.to_string(),
        })
    }

    /// Tunnels `operator` holds open now.
    pub fn open(&self, operator: &str) -> usize {
        lock(&self.0).get(operator).copied().unwrap_or(0)
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        let mut open = lock(&self.of.0);
        if let Some(n) = open.get_mut(&self.operator) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                open.remove(&self.operator);
            }
        }
    }
}

/// How long a tunnel waits for the node to take a spec carrying the
/// ticket keys.
const SPEC_WAIT: Duration = Duration::from_secs(15);

/// The node's side of a tunnel, as the gateway relays it: the sealed
/// frames each way.
#[derive(Debug)]
pub struct NodeLink {
    pub to_node: mpsc::Sender<Vec<u8>>,
    pub from_node: mpsc::Receiver<Vec<u8>>,
}

/// Where a tunnel to a node opens: the gateway holding its session.
#[tonic::async_trait]
pub trait Relay: Send + Sync + std::fmt::Debug {
    /// Asks `node`'s session to open tunnel `sid` under `ticket`; the
    /// link once the node opened it, or why not, worded for the operator.
    async fn open(&self, node: &str, sid: &str, ticket: &str) -> Result<NodeLink, Status>;

    /// Whether this relay holds `node`'s session now.
    fn holds(&self, node: &str) -> bool;
}

/// How long the gateways have to answer a tunnel asked of them.
const ANSWER_WITHIN: Duration = Duration::from_secs(20);

/// The gateways that hold no key, as the key holder reaches them: each
/// holds a `TunnelRequests` stream open; a tunnel is asked of all of them
/// and the one holding the node's session answers with its `TunnelRelay`
/// stream (the others say they hold none).
#[derive(Debug, Default)]
pub struct RemoteTunnels {
    /// Each registered stream, with the gateway id it registered under.
    gateways: Mutex<Vec<(String, mpsc::Sender<v1::TunnelOpenRequest>)>>,
    pending: Mutex<HashMap<String, Waiting>>,
}

#[derive(Debug)]
struct Waiting {
    /// Gateways yet to answer.
    remaining: usize,
    done: Option<oneshot::Sender<Result<NodeLink, Status>>>,
}

impl RemoteTunnels {
    /// A gateway's `TunnelRequests` stream: the requests for it.
    pub fn register(&self, gateway_id: &str) -> mpsc::Receiver<v1::TunnelOpenRequest> {
        let (tx, rx) = mpsc::channel(16);
        let mut gateways = lock(&self.gateways);
        gateways.retain(|(_, g)| !g.is_closed());
        gateways.push((gateway_id.to_string(), tx));
        rx
    }

    /// Sends a drain (or its end) to the gateways registered as
    /// `gateway_id`; how many streams took it. (A gateway names its own id:
    /// one registering under another's gets that one's drains, which tell
    /// it only to do what it may do anyway.)
    pub async fn drain(&self, gateway_id: &str, drain: v1::GatewayDrain) -> usize {
        let streams: Vec<_> = lock(&self.gateways)
            .iter()
            .filter(|(id, g)| id == gateway_id && !g.is_closed())
            .map(|(_, g)| g.clone())
            .collect();
        let mut took = 0;
        for g in streams {
            let request = v1::TunnelOpenRequest {
                drain: Some(drain),
                ..Default::default()
            };
            took += g.send(request).await.is_ok() as usize;
        }
        took
    }

    /// A gateway's first `TunnelRelay` frame for `sid`: when it carries
    /// the tunnel, the stream the gateway's frames go down; None when it
    /// says the gateway holds no session or the node refused (noted).
    #[allow(clippy::type_complexity)]
    pub fn answered(
        &self,
        first: v1::TunnelRelayFrame,
        mut inbound: Streaming<v1::TunnelRelayFrame>,
    ) -> Result<Option<mpsc::Receiver<Result<v1::TunnelRelayFrame, Status>>>, Status> {
        let mut pending = lock(&self.pending);
        let Some(w) = pending.get_mut(&first.sid) else {
            return Err(Status::not_found(format!(
                "no tunnel {} is asked for",
                first.sid
            )));
        };
        w.remaining = w.remaining.saturating_sub(1);
        let outcome = if first.absent {
            if w.remaining > 0 {
                return Ok(None);
            }
            Err(Status::unavailable(
                "no gateway holds the node's session: is it connected? (better-compute nodes list)",
            ))
        } else if !first.refused.is_empty() {
            Err(Status::permission_denied(format!(
                "the node refused the tunnel: {}",
                first.refused
            )))
        } else {
            Ok(())
        };
        let done = w.done.take();
        pending.remove(&first.sid);
        drop(pending);
        let Some(done) = done else {
            return Err(Status::cancelled("the operator is gone"));
        };
        if let Err(e) = outcome {
            let _ = done.send(Err(e));
            return Ok(None);
        }
        let (to_node, mut from_cli) = mpsc::channel::<Vec<u8>>(16);
        let (to_cli, from_node) = mpsc::channel::<Vec<u8>>(16);
        let (down, rx) = mpsc::channel(16);
        let first_data = first.data;
        tokio::spawn(async move {
            if to_cli.send(first_data).await.is_err() {
                return;
            }
            loop {
                tokio::select! {
                    m = inbound.message() => match m {
                        Ok(Some(f)) => {
                            if to_cli.send(f.data).await.is_err() {
                                break;
                            }
                        }
                        _ => break,
                    },
                    d = from_cli.recv() => match d {
                        Some(data) => {
                            let f = v1::TunnelRelayFrame { data, ..Default::default() };
                            if down.send(Ok(f)).await.is_err() {
                                break;
                            }
                        }
                        None => break,
                    },
                }
            }
        });
        if done.send(Ok(NodeLink { to_node, from_node })).is_err() {
            return Err(Status::cancelled("the operator is gone"));
        }
        Ok(Some(rx))
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[tonic::async_trait]
impl Relay for RemoteTunnels {
    async fn open(&self, node: &str, sid: &str, ticket: &str) -> Result<NodeLink, Status> {
        let gateways: Vec<_> = lock(&self.gateways)
            .iter()
            .filter(|(_, g)| !g.is_closed())
            .map(|(_, g)| g.clone())
            .collect();
        if gateways.is_empty() {
            return Err(Status::unavailable(format!(
                "node {node}'s session is on no gateway this key holder reaches: is it connected? \
                 (better-compute nodes list)"
            )));
        }
        let (done, answer) = oneshot::channel();
        lock(&self.pending).insert(
            sid.to_string(),
            Waiting {
                remaining: gateways.len(),
                done: Some(done),
            },
        );
        let request = v1::TunnelOpenRequest {
            node_id: node.to_string(),
            sid: sid.to_string(),
            ticket: ticket.to_string(),
            drain: None,
        };
        for g in gateways {
            if g.send(request.clone()).await.is_err()
                && let Some(w) = lock(&self.pending).get_mut(sid)
            {
                w.remaining = w.remaining.saturating_sub(1);
            }
        }
        let got = tokio::time::timeout(ANSWER_WITHIN, answer).await;
        lock(&self.pending).remove(sid);
        match got {
            Ok(Ok(r)) => r,
            Ok(Err(_)) => Err(Status::unavailable("the tunnel was not answered")),
            Err(_) => Err(Status::deadline_exceeded(format!(
                "no gateway opened the tunnel to node {node} within {} s",
                ANSWER_WITHIN.as_secs()
            ))),
        }
    }

    fn holds(&self, _node: &str) -> bool {
        true
    }
}

/// The gateway in this process first, the gateways that hold no key
/// otherwise.
#[derive(Debug)]
pub struct Relays {
    pub local: Option<Arc<dyn Relay>>,
    pub remote: Arc<RemoteTunnels>,
}

#[tonic::async_trait]
impl Relay for Relays {
    async fn open(&self, node: &str, sid: &str, ticket: &str) -> Result<NodeLink, Status> {
        match &self.local {
            Some(l) if l.holds(node) => l.open(node, sid, ticket).await,
            _ => self.remote.open(node, sid, ticket).await,
        }
    }

    fn holds(&self, node: &str) -> bool {
        self.local.as_ref().is_some_and(|l| l.holds(node)) || self.remote.holds(node)
    }
}

pub type TunnelStream = Pin<Box<dyn Stream<Item = Result<TunnelServerFrame, Status>> + Send>>;

fn random_id(prefix: &str) -> String {
    let mut b = [0u8; 16];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut b)
        .expect("the system's random source");
    format!("{prefix}{}", hex::encode(b))
}

/// What the CLI asked for, checked.
fn check(r: &v1::TunnelRequest) -> Result<(), Status> {
    if r.node_id.is_empty() {
        return Err(Status::invalid_argument(
            "name the node to open a tunnel to",
        ));
    }
    match (r.argv.is_empty(), r.port) {
        (false, 0) if r.argv[0].is_empty() => {
            Err(Status::invalid_argument("the command to run is empty"))
        }
        (false, 0) if r.user.is_empty() => Err(Status::invalid_argument(
            "name the user the command runs as on the node (--user)",
        )),
        (false, 0) => Ok(()),
        (true, p) if p > 0 && p <= u32::from(u16::MAX) => Ok(()),
        (true, 0) => Err(Status::invalid_argument(
            "give a command to run (exec NODE -- CMD...) or a port to reach",
        )),
        (true, p) => Err(Status::invalid_argument(format!(
            "port {p} is not a TCP port (1 to 65535)"
        ))),
        (false, _) => Err(Status::invalid_argument(
            "a tunnel runs a command or reaches a port, not both",
        )),
    }?;
    if r.client_public.len() != 32 {
        return Err(Status::invalid_argument(
            "the request carries no X25519 key of the CLI's (32 bytes)",
        ));
    }
    Ok(())
}

/// Makes sure the node enforces a spec naming a ticket key: if the stored
/// spec names neither, signs its body again with the keys and waits until
/// the node applied that generation. Returns that spec's JWKS.
async fn spec_carries_key(svc: &AdminService, node: &str) -> Result<String, Status> {
    let worker = {
        use ring::signature::KeyPair;
        vec![svc.worker_key.public_key().as_ref().to_vec()]
    };
    let stored = svc
        .store
        .signed_spec(&NodeId::from(node))
        .await
        .map_err(unavailable)?
        .and_then(|(_, signed)| bcd_proto::sign::open(&signed, &worker).ok())
        .and_then(|p| v1::NodeSpec::decode(p.as_slice()).ok());
    let carries = stored
        .as_ref()
        .is_some_and(|s| svc.ticket_key.named_in(&s.ticket_jwks));
    let (wanted, jwks) = match stored {
        Some(s) if carries => (s.generation, s.ticket_jwks),
        _ => {
            let info = super::specs::change(svc, node.to_string(), |_| Ok(())).await?;
            info!(
                node,
                generation = info.desired_generation,
                "spec signed again to carry the ticket keys"
            );
            (info.desired_generation, svc.ticket_key.jwks())
        }
    };
    let deadline = tokio::time::Instant::now() + SPEC_WAIT;
    loop {
        let view = svc
            .store
            .spec_view(&NodeId::from(node))
            .await
            .map_err(unavailable)?;
        if view.is_some_and(|v| v.applied_generation >= wanted) {
            return Ok(jwks);
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(Status::unavailable(format!(
                "node {node} has not applied spec generation {wanted}, which carries the ticket \
                 keys, within {} s: is it connected? (better-compute nodes list)",
                SPEC_WAIT.as_secs()
            )));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `RotateTicketKeys`: a new current key, then every node's spec signed
/// again (same body) so that it names both keys.
pub async fn rotate_keys(svc: &AdminService) -> Result<v1::RotateTicketKeysResponse, Status> {
    let rotated = svc.ticket_key.rotate().map_err(|e| {
        tracing::error!(error = %bcd_sys::error::chain(&e), "cannot rotate the ticket keys");
        Status::internal("cannot write the new ticket key in the data directory")
    })?;
    info!(kid = %rotated.kid, previous = %rotated.previous_kid, "ticket keys rotated");
    let mut nodes = Vec::new();
    for n in svc.store.list_nodes().await.map_err(unavailable)?.nodes {
        if svc
            .store
            .signed_spec(&n.node_id)
            .await
            .map_err(unavailable)?
            .is_none()
        {
            continue;
        }
        super::specs::change(svc, n.node_id.to_string(), |_| Ok(())).await?;
        nodes.push(n.node_id.into_string());
    }
    info!(
        nodes = nodes.len(),
        "specs signed again to name the new ticket key"
    );
    Ok(v1::RotateTicketKeysResponse {
        kid: rotated.kid,
        previous_kid: rotated.previous_kid,
        retired_kid: rotated.retired_kid.unwrap_or_default(),
        nodes,
    })
}

/// `Tunnel`: the first frame asks; the answer is the ticket, then the
/// node's bytes; the CLI's bytes go to the node.
pub async fn open(
    svc: &AdminService,
    operator: Operator,
    cert_sha256: String,
    mut inbound: Streaming<TunnelClientFrame>,
) -> Result<TunnelStream, Status> {
    let request = match inbound.message().await? {
        Some(TunnelClientFrame {
            msg: Some(tunnel_client_frame::Msg::Request(r)),
        }) => r,
        _ => {
            return Err(Status::invalid_argument("a tunnel starts with its request"));
        }
    };
    check(&request)?;
    let counted = svc.open_tunnels.take(&operator.name)?;
    let relay = svc
        .tunnels
        .clone()
        .ok_or_else(|| Status::unavailable("this process holds no gateway to open tunnels on"))?;
    let node = request.node_id.clone();
    let jwks = spec_carries_key(svc, &node).await?;
    let now_s = svc.store.now().await.map_err(unavailable)? / 1000;
    let sid = random_id("tn-");
    let (exec, port) = if request.argv.is_empty() {
        (None, Some(request.port as u16))
    } else {
        (Some(request.argv.clone()), None)
    };
    let claims = Claims {
        iss: ticket::ISSUER.into(),
        sub: operator.name.clone(),
        node: node.clone(),
        sid: sid.clone(),
        jti: random_id("jti-"),
        iat: now_s,
        exp: now_s + TICKET_LIFE_S,
        exec,
        port,
        tty: request.tty,
        user: request.user.clone(),
        epk: {
            use base64::Engine;
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(&request.client_public)
        },
    };
    let ticket = svc.ticket_key.issue(&jwks, &claims).ok_or_else(|| {
        Status::unavailable(format!(
            "node {node}'s spec names none of the ticket keys after a rotation: open the tunnel \
             again"
        ))
    })?;
    let what = match (&claims.exec, claims.port) {
        (Some(argv), _) => format!("exec {argv:?} as {}", claims.user),
        (None, Some(p)) => format!("port {p}"),
        (None, None) => String::new(),
    };
    svc.store
        .publish_fleet_event(
            "tunnel.opened",
            &NodeId::from(&node),
            &format!(
                "operator {} opened tunnel {sid}: {what} (ticket {})",
                operator.name, claims.jti
            ),
        )
        .await
        .map_err(unavailable)?;
    info!(%node, %sid, operator = %operator.name, %what, "tunnel asked for");
    let link = relay.open(&node, &sid, &ticket).await?;
    let (tx, rx) = mpsc::channel::<Result<TunnelServerFrame, Status>>(16);
    let granted = TunnelServerFrame {
        msg: Some(tunnel_server_frame::Msg::Granted(v1::TunnelGranted {
            sid: sid.clone(),
            ticket,
            fleet_ca_der: svc.ca_der.to_vec(),
        })),
    };
    let _ = tx.send(Ok(granted)).await;
    let standing = Standing {
        store: svc.store.clone(),
        revoked: svc.revoked_operators.clone(),
        cert_sha256,
        name: operator.name.clone(),
    };
    tokio::spawn(async move {
        splice(inbound, link, tx, sid, || standing.lost()).await;
        drop(counted);
    });
    Ok(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx)))
}

/// How often an open tunnel checks its operator is still admitted.
const STANDING_EVERY: Duration = Duration::from_millis(500);

/// Whether the operator who opened a tunnel still may: not revoked in the
/// store, and not among the revocations this key holder remembers.
struct Standing {
    store: bc_store::Store,
    revoked: Arc<super::revoked_operators::RevokedOperators>,
    cert_sha256: String,
    name: String,
}

impl Standing {
    /// Why the operator may no longer hold the tunnel, if so.
    async fn lost(&self) -> Option<String> {
        if self.revoked.contains(&self.cert_sha256) {
            return Some(format!("operator {} was revoked", self.name));
        }
        match self.store.operator_by_cert(&self.cert_sha256).await {
            Ok(Some(row)) if row.revoked_at.is_none() => None,
            Ok(_) => Some(format!("operator {} was revoked", self.name)),
            // The store being away for a moment closes nothing.
            Err(_) => None,
        }
    }
}

/// Moves frames both ways until either side ends, or the operator is
/// revoked. When the node's side stops taking frames (the command ended
/// and the node closed), what it sent before (its exit) still reaches the
/// CLI: the CLI's frames are no longer read, the node's are drained.
async fn splice<F: std::future::Future<Output = Option<String>>>(
    mut inbound: impl Stream<Item = Result<TunnelClientFrame, Status>> + Unpin,
    mut link: NodeLink,
    tx: mpsc::Sender<Result<TunnelServerFrame, Status>>,
    sid: String,
    mut lost: impl FnMut() -> F,
) {
    use tokio_stream::StreamExt;
    let mut check = tokio::time::interval(STANDING_EVERY);
    check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Whether the node's side still takes the CLI's frames.
    let mut to_node = true;
    loop {
        tokio::select! {
            _ = check.tick() => {
                if let Some(why) = lost().await {
                    warn!(%sid, %why, "tunnel closed");
                    let _ = tx
                        .send(Err(Status::permission_denied(format!("{why}: the tunnel is closed"))))
                        .await;
                    break;
                }
            }
            m = inbound.next(), if to_node => match m {
                Some(Ok(TunnelClientFrame { msg: Some(tunnel_client_frame::Msg::Data(d)) })) => {
                    if link.to_node.send(d).await.is_err() {
                        to_node = false;
                    }
                }
                Some(Ok(_)) => {}
                None => {
                    info!(%sid, "the operator's side ended the tunnel");
                    break;
                }
                Some(Err(e)) => {
                    warn!(%sid, error = %e.message(), "the operator's side of the tunnel failed");
                    break;
                }
            },
            d = link.from_node.recv() => match d {
                Some(d) => {
                    let frame = TunnelServerFrame { msg: Some(tunnel_server_frame::Msg::Data(d)) };
                    if tx.send(Ok(frame)).await.is_err() {
                        break;
                    }
                }
                None => {
                    let _ = tx
                        .send(Err(Status::unavailable(
                            "the gateway holding the node's session closed the tunnel (it went \
                             away, or the node's session ended): run the command again",
                        )))
                        .await;
                    warn!(%sid, "the node's side of the tunnel closed");
                    break;
                }
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(d: &[u8]) -> Result<TunnelClientFrame, Status> {
        Ok(TunnelClientFrame {
            msg: Some(tunnel_client_frame::Msg::Data(d.to_vec())),
        })
    }

    /// The node ran its command, sent its exit and closed; a frame of the
    /// CLI's comes in before the exit went out (its stdin closing). The
    /// exit still reaches the CLI, then the tunnel ends.
    #[tokio::test]
    async fn the_nodes_last_frames_reach_the_cli_after_it_stopped_taking_frames() {
        for _ in 0..50 {
            let (to_node, from_cli) = mpsc::channel::<Vec<u8>>(16);
            drop(from_cli);
            let (to_cli, from_node) = mpsc::channel::<Vec<u8>>(16);
            to_cli.send(b"stdout".to_vec()).await.unwrap();
            to_cli.send(b"exit".to_vec()).await.unwrap();
            drop(to_cli);
            let (tx, mut rx) = mpsc::channel(16);
            // The CLI's stream stays open, as the CLI's does while it
            // waits for the exit.
            let inbound = tokio_stream::StreamExt::chain(
                tokio_stream::iter(vec![data(b"stdin closed")]),
                tokio_stream::pending(),
            );
            splice(
                Box::pin(inbound),
                NodeLink { to_node, from_node },
                tx,
                "tn-1".into(),
                || async { None },
            )
            .await;
            let mut got = Vec::new();
            while let Some(Ok(TunnelServerFrame {
                msg: Some(tunnel_server_frame::Msg::Data(d)),
            })) = rx.recv().await
            {
                got.push(d);
            }
            assert_eq!(got, [b"stdout".to_vec(), b"exit".to_vec()]);
        }
    }

    fn req() -> v1::TunnelRequest {
        v1::TunnelRequest {
            node_id: "nd-1".into(),
            argv: vec!["true".into()],
            port: 0,
            tty: false,
            user: "root".into(),
            client_public: vec![7; 32],
        }
    }

    #[test]
    fn an_operator_holds_so_many_tunnels_and_a_closed_one_frees_its_place() {
        let per = Arc::new(PerOperator::default());
        let mut held: Vec<Counted> = (0..MAX_PER_OPERATOR)
            .map(|_| per.take("alice").unwrap())
            .collect();
        let e = per.take("alice").unwrap_err();
        assert_eq!(e.code(), tonic::Code::ResourceExhausted);
        assert!(e.message().contains("close one first"), "{}", e.message());
        // Another operator is not held back by alice's.
        let bob = per.take("bob").unwrap();
        drop(held.pop());
        assert_eq!(per.open("alice"), MAX_PER_OPERATOR - 1);
        let _again = per.take("alice").unwrap();
        drop(bob);
        assert_eq!(per.open("bob"), 0);
    }

    #[test]
    fn a_request_asks_for_exactly_one_thing() {
        assert!(check(&req()).is_ok());
        let cases: Vec<(v1::TunnelRequest, &str)> = vec![
            (
                v1::TunnelRequest {
                    node_id: String::new(),
                    ..req()
                },
                "name the node",
            ),
            (
                v1::TunnelRequest {
                    argv: vec![String::new()],
                    ..req()
                },
                "empty",
            ),
            (
                v1::TunnelRequest {
                    user: String::new(),
                    ..req()
                },
                "--user",
            ),
            (
                v1::TunnelRequest {
                    argv: vec![],
                    ..req()
                },
                "give a command",
            ),
            (v1::TunnelRequest { port: 22, ..req() }, "not both"),
            (
                v1::TunnelRequest {
                    argv: vec![],
                    port: 70_000,
                    ..req()
                },
                "not a TCP port",
            ),
            (
                v1::TunnelRequest {
                    client_public: vec![1; 5],
                    ..req()
                },
                "X25519",
            ),
        ];
        for (r, says) in cases {
            let e = check(&r).unwrap_err();
            assert!(e.message().contains(says), "{}", e.message());
        }
        assert!(
            check(&v1::TunnelRequest {
                argv: vec![],
                port: 8888,
                user: String::new(),
                ..req()
            })
            .is_ok()
        );
    }
}
