//! Tunnels through this gateway: it asks a node's session to open one
//! (`TunnelOpen`, carrying the key holder's ticket), takes the node's
//! `Tunnel` stream that names it, and relays the sealed frames both ways.
//!
//! The gateway holds no ticket key, so it cannot open a tunnel of its own
//! (the node verifies the ticket), and the frames are sealed between the
//! CLI and the node, so it reads none. It only admits a `Tunnel` stream
//! from the certificate of the session it holds for that node, naming a
//! tunnel asked of that node, once; and it closes a node's tunnels when
//! the session ends (revocation, drain, supersede, fencing).

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bcd_proto::tls::PeerInfo;
use bcd_proto::v1::{self, TunnelFrame};
use tokio::sync::{mpsc, oneshot, watch};
use tokio_stream::Stream;
use tonic::{Request, Response, Status, Streaming};
use tracing::{info, warn};

use super::GatewayState;
use crate::api::tunnels::{NodeLink, Relay};

/// How long the node has to open the stream for a tunnel asked of it.
const OPEN_WITHIN: Duration = Duration::from_secs(15);

/// Tunnel frames buffered each way.
const BUFFER: usize = 16;

/// A tunnel asked of a node, until the node opens its stream or refuses.
pub(super) struct Pending {
    node: String,
    done: oneshot::Sender<Result<NodeSide, String>>,
}

/// The node's stream of a tunnel.
pub(super) struct NodeSide {
    first: Vec<u8>,
    inbound: Streaming<TunnelFrame>,
    outbound: mpsc::Sender<Result<TunnelFrame, Status>>,
}

/// What a session holds for its tunnels.
#[derive(Debug)]
pub(super) struct SessionTunnels {
    /// TunnelOpen messages for the session to send.
    pub open: mpsc::Sender<v1::TunnelOpen>,
    /// Dropped with the session: its tunnels close.
    pub closing: watch::Sender<()>,
}

impl GatewayState {
    /// The node refused a tunnel asked of it.
    pub(super) fn tunnel_refused(&self, node: &str, r: v1::TunnelRefused) {
        let mut pending = self.tunnels();
        if pending.get(&r.sid).is_some_and(|p| p.node == node)
            && let Some(p) = pending.remove(&r.sid)
        {
            let _ = p.done.send(Err(r.reason));
        }
    }

    fn tunnels(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, Pending>> {
        self.tunnels.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[tonic::async_trait]
impl Relay for GatewayState {
    async fn open(&self, node: &str, sid: &str, ticket: &str) -> Result<NodeLink, Status> {
        let (open, mut closed) = {
            let sessions = self.sessions();
            let s = sessions.get(node).ok_or_else(|| {
                Status::unavailable(format!(
                    "node {node} has no session on this control plane's gateway: it is not \
                     connected, or a gateway-only process holds its session"
                ))
            })?;
            (s.tunnels.open.clone(), s.tunnels.closing.subscribe())
        };
        let (done, waiting) = oneshot::channel();
        self.tunnels().insert(
            sid.to_string(),
            Pending {
                node: node.to_string(),
                done,
            },
        );
        let asked = open
            .send(v1::TunnelOpen {
                sid: sid.to_string(),
                ticket: ticket.to_string(),
            })
            .await;
        let answer = match asked {
            Ok(()) => tokio::time::timeout(OPEN_WITHIN, waiting)
                .await
                .map(|r| r.ok()),
            Err(_) => Ok(None),
        };
        self.tunnels().remove(sid);
        let side = match answer {
            Ok(Some(Ok(side))) => side,
            Ok(Some(Err(reason))) => {
                return Err(Status::permission_denied(format!(
                    "node {node} refused the tunnel: {reason}"
                )));
            }
            Ok(None) => {
                return Err(Status::unavailable(format!(
                    "node {node}'s session ended before the tunnel opened: run the command again"
                )));
            }
            Err(_) => {
                return Err(Status::deadline_exceeded(format!(
                    "node {node} did not open the tunnel within {} s",
                    OPEN_WITHIN.as_secs()
                )));
            }
        };
        let (to_node, mut from_cli) = mpsc::channel::<Vec<u8>>(BUFFER);
        let (to_cli, from_node) = mpsc::channel::<Vec<u8>>(BUFFER);
        let NodeSide {
            first,
            mut inbound,
            outbound,
        } = side;
        let _ = to_cli.send(first).await;
        let (node, sid) = (node.to_string(), sid.to_string());
        tokio::spawn(async move {
            let why = loop {
                tokio::select! {
                    _ = closed.changed() => break "the node's session ended",
                    m = inbound.message() => match m {
                        Ok(Some(f)) => {
                            if to_cli.send(f.data).await.is_err() {
                                break "the operator's side closed";
                            }
                        }
                        Ok(None) => break "the node closed it",
                        Err(_) => break "the node's stream failed",
                    },
                    d = from_cli.recv() => match d {
                        Some(data) => {
                            let frame = TunnelFrame { sid: String::new(), data };
                            if outbound.send(Ok(frame)).await.is_err() {
                                break "the node's stream closed";
                            }
                        }
                        None => break "the operator's side closed",
                    },
                }
            };
            info!(%node, %sid, why, "tunnel relay ended");
        });
        Ok(NodeLink { to_node, from_node })
    }

    fn holds(&self, node: &str) -> bool {
        self.sessions().contains_key(node)
    }
}

/// A gateway that holds no key: holds the key holder's `TunnelRequests`
/// stream open (dialling again a second after it breaks) and answers each
/// request with a `TunnelRelay` stream: absent, refused, or the tunnel.
pub async fn upstream(state: Arc<GatewayState>, link: super::credential::UpstreamLink) {
    use bcd_proto::v1::gateway_services_client::GatewayServicesClient;
    loop {
        let hello = v1::TunnelRequestsHello {
            gateway_id: state.id.to_string(),
        };
        match GatewayServicesClient::new(link.channel())
            .tunnel_requests(hello)
            .await
        {
            Ok(r) => {
                let mut requests = r.into_inner();
                while let Ok(Some(req)) = requests.message().await {
                    if let Some(d) = req.drain {
                        if d.drain {
                            let within =
                                (d.within_ms > 0).then(|| Duration::from_millis(d.within_ms));
                            state.drain(within);
                        } else {
                            state.undrain();
                        }
                        continue;
                    }
                    tokio::spawn(answer(state.clone(), link.clone(), req));
                }
            }
            Err(e) => {
                warn!(error = %e.message(), "the key holder's tunnel requests are unreachable")
            }
        }
        if state.stopping.load(std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// One tunnel the key holder asked of this gateway.
async fn answer(
    state: Arc<GatewayState>,
    link: super::credential::UpstreamLink,
    req: v1::TunnelOpenRequest,
) {
    use bcd_proto::v1::gateway_services_client::GatewayServicesClient;
    let mut first = v1::TunnelRelayFrame {
        sid: req.sid.clone(),
        ..Default::default()
    };
    let node_link = if !state.holds(&req.node_id) {
        first.absent = true;
        None
    } else {
        match state.open(&req.node_id, &req.sid, &req.ticket).await {
            Ok(l) => Some(l),
            Err(s) => {
                first.refused = s.message().to_string();
                None
            }
        }
    };
    let (up, rx) = mpsc::channel::<v1::TunnelRelayFrame>(BUFFER);
    let Some(NodeLink {
        to_node,
        mut from_node,
    }) = node_link
    else {
        let _ = up.send(first).await;
        drop(up);
        let _ = GatewayServicesClient::new(link.channel())
            .tunnel_relay(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await;
        return;
    };
    // The node's accept goes in the first frame.
    first.data = from_node.recv().await.unwrap_or_default();
    let _ = up.send(first).await;
    let mut down = match GatewayServicesClient::new(link.channel())
        .tunnel_relay(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
    {
        Ok(r) => r.into_inner(),
        Err(e) => {
            warn!(sid = %req.sid, error = %e.message(), "the key holder did not take the tunnel");
            return;
        }
    };
    // Whether the node's side still takes the CLI's frames: once it does
    // not (the node closed), what the node sent before (its exit) still
    // goes up before the stream ends.
    let mut node_takes = true;
    loop {
        tokio::select! {
            d = from_node.recv() => match d {
                Some(data) => {
                    let f = v1::TunnelRelayFrame { data, ..Default::default() };
                    if up.send(f).await.is_err() {
                        break;
                    }
                }
                None => break,
            },
            m = down.message(), if node_takes => match m {
                Ok(Some(f)) => {
                    if to_node.send(f.data).await.is_err() {
                        node_takes = false;
                    }
                }
                _ => break,
            },
        }
    }
    // What went up is delivered before the stream goes (dropping the
    // answer first would reset the stream and lose it): the key holder
    // closes its side once the node's last frame reached it.
    drop(up);
    let _ = tokio::time::timeout(OPEN_WITHIN, async {
        while let Ok(Some(_)) = down.message().await {}
    })
    .await;
}

pub type TunnelStream = Pin<Box<dyn Stream<Item = Result<TunnelFrame, Status>> + Send>>;

/// A node's `Tunnel` stream: admitted from the certificate of the session
/// this gateway holds for the node, for a tunnel asked of that node.
pub(super) async fn accept(
    state: &Arc<GatewayState>,
    request: Request<Streaming<TunnelFrame>>,
) -> Result<Response<TunnelStream>, Status> {
    let cert = request
        .extensions()
        .get::<PeerInfo>()
        .and_then(|p| p.cert.clone())
        .ok_or_else(|| Status::unauthenticated("a tunnel needs the node's certificate"))?;
    let (node, serial) = match (
        crate::certs::named(&cert, "urn:bc:node:"),
        crate::certs::serial_hex(&cert),
    ) {
        (Some((node, _)), Some(serial)) => (node, serial),
        _ => return Err(Status::unauthenticated("the certificate names no node")),
    };
    let held = state
        .sessions()
        .get(node.as_str())
        .is_some_and(|s| s.cert_serial == serial);
    if !held {
        return Err(Status::permission_denied(format!(
            "node {node} has no session on this gateway under this certificate"
        )));
    }
    let mut inbound = request.into_inner();
    let first = match tokio::time::timeout(OPEN_WITHIN, inbound.message()).await {
        Ok(Ok(Some(f))) => f,
        _ => {
            return Err(Status::invalid_argument(
                "a tunnel starts with its first frame",
            ));
        }
    };
    let pending = {
        let mut pending = state.tunnels();
        match pending.get(&first.sid) {
            Some(p) if p.node == node => pending.remove(&first.sid),
            _ => None,
        }
    };
    let Some(pending) = pending else {
        warn!(%node, sid = %first.sid, "a tunnel stream for no tunnel asked of this node");
        return Err(Status::permission_denied(format!(
            "no tunnel {} was asked of node {node}",
            first.sid
        )));
    };
    let (outbound, rx) = mpsc::channel(BUFFER);
    let side = NodeSide {
        first: first.data,
        inbound,
        outbound,
    };
    if pending.done.send(Ok(side)).is_err() {
        return Err(Status::cancelled("the operator is gone"));
    }
    Ok(Response::new(Box::pin(
        tokio_stream::wrappers::ReceiverStream::new(rx),
    )))
}
