//! Certificate renewal: attempts run in the background when
//! `bcd_core::Renewal` says one is due; a renewed pair is installed
//! crash-safely (`Identity::install_renewal`) and presented by the next
//! session. A failure no retry mends (the TPM derives another AK) stops
//! the attempts: logged once, the current certificate serves until it runs
//! out, and `bcd doctor`'s identity check says what to do.

use std::time::Duration;

use bcd_core::renewal::AfterFailure;
use bcd_core::{Renewal, SplitMix64};
use tokio::task::JoinHandle;
use tracing::{info, warn};

use super::Shared;
use crate::client::{self, RenewFailed, Renewed};
use crate::identity::Identity;
use bcd_proto::tls::ClientIdentity;

/// The server time renewal goes by: the session's estimate, unless this
/// machine's clock says the certificate has run out. A node back after
/// days away holds a mark from before it left, by which its certificate
/// would be hours from its renewal point; it renews at once instead, by
/// proving the old key (x509pop), dated by its own clock (which the
/// server checks to within a minute).
pub(super) fn clock(identity: &Identity, server_now_ms: i64) -> i64 {
    let wall_ms = bcd_sys::clock::unix_ms();
    if wall_ms > identity.file.cert_not_after_ms {
        server_now_ms.max(wall_ms)
    } else {
        server_now_ms
    }
}

/// Starts an attempt with the current certificate, at server time
/// `server_now_ms` (what the proof of possession is dated).
pub(super) fn spawn(
    shared: &Shared,
    server_now_ms: i64,
) -> JoinHandle<Result<Renewed, RenewFailed>> {
    let server_now_ms = clock(&shared.identity, server_now_ms);
    let expired = server_now_ms > shared.identity.file.cert_not_after_ms;
    if expired {
        info!(serial = %shared.identity.file.cert_serial, "the node certificate has run out; renewing it by proving its key (x509pop)");
    } else {
        info!(serial = %shared.identity.file.cert_serial, "renewing the node certificate");
    }
    let server = shared.identity.file.server.clone();
    if shared.identity.tpm_record().is_some() {
        // Never a file key for a certificate whose key is in the TPM:
        // the next key is the TPM's, certified by its AK.
        let Some(key) = shared.identity.tpm.clone() else {
            return tokio::spawn(async {
                Err(RenewFailed::from(
                    "the node key is in the TPM, which this process has not opened",
                ))
            });
        };
        let ca = shared.identity.ca.clone();
        let current = client::TpmCurrent {
            cert: shared.identity.cert.clone(),
            key,
            node_id: shared.identity.file.node_id.clone(),
            server_now_ms,
            expired,
        };
        let hostname = shared.machine.host.hostname();
        return tokio::spawn(async move {
            client::renew_tpm_certificate(&server, ca, current, &hostname).await
        });
    }
    let ca = shared.identity.ca.clone();
    let current = client::Current {
        identity: ClientIdentity {
            chain: vec![shared.identity.cert.clone()],
            key: shared.identity.private_key(),
        },
        key_pem: shared.identity.key_pem.clone(),
        node_id: shared.identity.file.node_id.clone(),
        server_now_ms,
        expired,
    };
    let hostname = shared.machine.host.hostname();
    tokio::spawn(async move {
        client::renew_certificate(&server, ca, current, &hostname)
            .await
            .map_err(RenewFailed::from)
    })
}

/// Renewal's own state: the jitter of its retries. The schedule itself is
/// the core's (`bcd_core::Renewal`, kept by the session loop).
#[derive(Debug)]
pub(super) struct Renewals {
    /// Jitter for the retries, apart from the session's.
    rng: SplitMix64,
}

impl Renewals {
    /// Renewal's jitter, seeded from the agent's seed.
    pub(super) fn new(seed: u64) -> Renewals {
        Renewals {
            rng: SplitMix64::new(seed.rotate_left(29) ^ 0x5245_4e45_5741_4c00),
        }
    }

    /// An attempt ended at `now` (server time `server_now_ms`): install the
    /// new pair, or schedule the retry, or (when retrying cannot help) stop.
    pub(super) fn finished(
        &mut self,
        identity: &mut Identity,
        result: Result<Renewed, RenewFailed>,
        renewal: &mut Renewal,
        now: Duration,
        server_now_ms: i64,
    ) {
        let error = match result {
            Ok(renewed) => {
                let serial = renewed.next.serial.clone();
                match identity.install_renewal(renewed.key_pem, renewed.cert, renewed.next) {
                    Ok(()) => {
                        if let (Some((record, public)), Some(key)) = (renewed.tpm, &identity.tpm) {
                            key.switch(record, public);
                        }
                        info!(%serial, "certificate renewed; the next session uses it");
                        renewal.renewed();
                        return;
                    }
                    Err(e) => RenewFailed::from(format!(
                        "cannot install the renewed certificate: {}",
                        bcd_sys::error::chain(&e)
                    )),
                }
            }
            Err(e) => e,
        };
        let expires_in_ms = identity.file.cert_not_after_ms - server_now_ms;
        match renewal.failed(now, error.failure, &mut self.rng) {
            AfterFailure::Retry(retry) => {
                warn!(error = %error.message, attempt = retry.attempt, expires_in_ms, retry_in = ?retry.retry_in, "renewal failed");
            }
            AfterFailure::Stopped { attempt } => {
                warn!(error = %error.message, attempt, expires_in_ms, "renewal failed; retrying cannot help: no more attempts, the current certificate serves until it runs out");
            }
        }
    }
}
