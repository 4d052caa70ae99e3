//! Which gateways the node stays on: the shell around
//! `bcd_core::gateways::GatewayTrust`. It verifies the lists gateways hand
//! (`ServerMessage.gateway_revocations`) against the worker keys, keeps
//! the newest in [`GATEWAY_REVOCATIONS`] across restarts, and closes the
//! session when the core says to leave.

use std::path::Path;

use bcd_core::gateways::{GatewayTrust, Leave, RevocationList, RevokedGateway};
use tracing::{debug, warn};

use super::Shared;
use crate::events::{GatewayLeft, RevocationsRefused};

/// The newest verified list, as the worker-signed envelope a gateway
/// handed (a `SignedEnvelope` holding `GatewayRevocations`), in the data
/// directory.
pub const GATEWAY_REVOCATIONS: &str = "gateway-revocations";

/// A list from its envelope, if it verifies against `keys`.
fn verified(envelope: &[u8], keys: &[Vec<u8>]) -> Result<RevocationList, String> {
    let l = bcd_proto::gateways::open(envelope, keys).map_err(|e| e.to_string())?;
    Ok(RevocationList {
        issued_ms: l.issued_ms,
        not_after_ms: l.not_after_ms,
        certs: l
            .certs
            .into_iter()
            .map(|c| RevokedGateway {
                name: c.name,
                sha256: c.sha256,
                not_after_ms: c.not_after_ms,
            })
            .collect(),
    })
}

/// Which gateways the node stays on: the core's judgement of the gateways
/// it reaches, and the newest signed revocation list it holds. This module
/// alone reads or changes it.
#[derive(Debug)]
pub(super) struct Trust {
    /// The core's trust: the list held, and whether it is kept on disk.
    gateways: GatewayTrust,
}

impl Trust {
    /// The node's trust at start: the list kept in `dir`, if it still
    /// verifies. One that does not (the worker keys changed since, the
    /// file damaged) is set aside and the node starts as if it held none.
    pub(super) fn load(dir: &Path, keys: &[Vec<u8>], seed: u64) -> Trust {
        let path = dir.join(GATEWAY_REVOCATIONS);
        let held = match std::fs::read(&path) {
            Ok(bytes) => match verified(&bytes, keys) {
                Ok(l) => Some(l),
                Err(why) => {
                    warn!(path = %path.display(), %why, "the kept gateway revocation list does not verify; starting without it");
                    None
                }
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => {
                warn!(path = %path.display(), error = %e, "cannot read the kept gateway revocation list");
                None
            }
        };
        Trust {
            gateways: GatewayTrust::new(held, seed.rotate_left(17) ^ 0x4757_5245_564f_4b45),
        }
    }

    /// Whether the node holds a list.
    pub(super) fn holds_list(&self) -> bool {
        self.gateways.held().is_some()
    }

    /// A gateway just reached: `Err` with why when the node leaves it
    /// before sending anything.
    pub(super) fn reached(&mut self, shared: &mut Shared, gateway: &str) -> Result<(), String> {
        self.gateways.reached(gateway).map_err(|leave| {
            left(shared, gateway, &leave);
            leave.to_string()
        })
    }

    /// A list `gateway` handed: kept when it verifies and is newer; `Err`
    /// with why when the node leaves the gateway. `Ok` with the signed
    /// time it carries when it verifies (`bcd_core::Event::SignedTime`).
    pub(super) async fn offered(
        &mut self,
        shared: &mut Shared,
        envelope: Vec<u8>,
        gateway: &str,
    ) -> Result<Option<(i64, std::time::Duration)>, String> {
        let list = match verified(&envelope, &shared.worker_keys()) {
            Ok(l) => l,
            Err(why) => {
                shared.refused_frame(RevocationsRefused { why });
                return Ok(None);
            }
        };
        let (named, issued) = (list.certs.len(), list.issued_ms);
        let signed = Some((issued, list.signed_every()));
        let (newer, leave) = self.gateways.offered(list, gateway, local_ms(shared));
        if newer {
            debug!(
                issued_ms = issued,
                revoked = named,
                "gateway revocation list taken"
            );
        }
        if newer && self.gateways.to_keep() {
            let path = shared.identity.dir.join(GATEWAY_REVOCATIONS);
            let kept = tokio::task::spawn_blocking(move || {
                bcd_sys::fs::atomic_write_shared(&path, &envelope, 0o600)
            })
            .await;
            if matches!(kept, Ok(Ok(()))) {
                self.gateways.kept_now();
            } else {
                warn!("cannot keep the gateway revocation list; it holds until a restart");
            }
        }
        leave.map(|()| signed).map_err(|l| {
            left(shared, gateway, &l);
            l.to_string()
        })
    }

    /// On `gateway` with the server time the session estimates: `Err`
    /// with why when the held list ran out here.
    pub(super) fn due(
        &mut self,
        shared: &mut Shared,
        server_now_ms: Option<i64>,
        gateway: &str,
    ) -> Result<(), String> {
        let local = local_ms(shared);
        self.gateways
            .due(server_now_ms, local, gateway)
            .map_err(|leave| {
                left(shared, gateway, &leave);
                leave.to_string()
            })
    }

    /// How long until [`Trust::due`] has something to say.
    pub(super) fn due_in(
        &self,
        shared: &Shared,
        server_now_ms: Option<i64>,
    ) -> Option<std::time::Duration> {
        self.gateways
            .due_in(server_now_ms, local_ms(shared))
            .map(|ms| std::time::Duration::from_millis(ms.max(0) as u64))
    }
}

/// The monotonic time handed to the core, in milliseconds.
fn local_ms(shared: &Shared) -> i64 {
    shared.now().as_millis() as i64
}

/// Journals that the node left `gateway` and why.
fn left(shared: &mut Shared, gateway: &str, leave: &Leave) {
    warn!(gateway, reason = %leave, "leaving the gateway");
    shared.event(&GatewayLeft {
        gateway_sha256: gateway.to_string(),
        why: leave.to_string(),
        revoked: matches!(leave, Leave::Revoked { .. }),
    });
}
