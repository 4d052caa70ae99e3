//! When a session ends, decided without I/O: time is a parameter.
//!
//! A session ends when the node falls silent for `missed_heartbeats`
//! intervals, when the certificate it opened with runs out (on the store's
//! clock), when a newer Hello took the node elsewhere, when the gateway
//! loses its lease or drains, when the certificate is revoked, or when the
//! stream ends. [`End`] says what the node is told and whether the store
//! gets an (epoch-fenced) disconnect.

use bc_store::NodeId;
use std::time::Duration;

use bc_store::Refusal;
use bc_store::sessions::SessionKey;
use tonic::Status;

use crate::api::status::{Turned, refusal, turned};

/// Why a session ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum End {
    /// No message for this long: three heartbeat intervals or more.
    MissedHeartbeats { silent: Duration },
    /// The certificate the session opened with ran out; the node renews
    /// and reconnects.
    CertificateExpired,
    /// A newer Hello routed the node elsewhere.
    Superseded,
    /// This gateway lost its lease.
    Fenced { gateway: String },
    /// The gateway is stopping; the node reconnects at random within this.
    Drain { within: Duration },
    /// The certificate was revoked; the statement the store kept says so.
    Revoked {
        reason: String,
        statement: Option<Vec<u8>>,
    },
    /// The node closed the stream, or it broke.
    StreamEnded,
}

impl End {
    /// The status the stream ends with (its typed reason in the details,
    /// through `api::status`); none when the node is told another way (a
    /// Drain) or cannot be told (the stream is gone).
    pub fn status(&self) -> Option<Status> {
        match self {
            End::MissedHeartbeats { silent } => Some(turned(Turned::MissedHeartbeats(*silent))),
            End::CertificateExpired => Some(refusal(Refusal::Expired)),
            End::Superseded => Some(turned(Turned::Superseded)),
            End::Fenced { gateway } => Some(refusal(Refusal::Fenced(gateway.clone()))),
            End::Revoked { reason, statement } => Some(turned(Turned::Revoked {
                reason: reason.clone(),
                statement: statement.clone(),
            })),
            End::Drain { .. } | End::StreamEnded => None,
        }
    }

    /// The disconnect the store records (cause, and how long ago the node
    /// was last heard); none when another session owns the node's route
    /// (superseded) or this gateway may not write (fenced).
    pub fn disconnect(&self) -> Option<(&'static str, Duration)> {
        match self {
            End::MissedHeartbeats { silent } => Some(("missed-heartbeats", *silent)),
            End::CertificateExpired => Some(("certificate-expired", Duration::ZERO)),
            End::Drain { .. } => Some(("drained", Duration::ZERO)),
            End::Revoked { .. } => Some(("revoked", Duration::ZERO)),
            End::StreamEnded => Some(("stream-ended", Duration::ZERO)),
            End::Superseded | End::Fenced { .. } => None,
        }
    }
}

/// The heartbeat rule: `missed` silent intervals end a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Heartbeats {
    pub interval: Duration,
    pub missed: u32,
}

impl Heartbeats {
    /// At a heartbeat tick, after `silent` without a message.
    pub fn check(&self, silent: Duration) -> Option<End> {
        (silent >= self.interval * self.missed).then_some(End::MissedHeartbeats { silent })
    }
}

/// A session as the liveness pass sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Local {
    pub node_id: String,
    pub epoch: u64,
    pub cert_not_after_ms: i64,
}

/// The liveness pass: the sessions to end at `store_now_ms`, given the
/// sessions the store says are no longer current (`gone`). Each session
/// ends once, for the first reason found.
pub fn sweep(sessions: &[Local], store_now_ms: i64, gone: &[SessionKey]) -> Vec<(SessionKey, End)> {
    sessions
        .iter()
        .filter_map(|s| {
            let key = SessionKey {
                node_id: NodeId::from(s.node_id.clone()),
                epoch: s.epoch,
            };
            let end = if s.cert_not_after_ms < store_now_ms {
                End::CertificateExpired
            } else if gone.contains(&key) {
                End::Superseded
            } else {
                return None;
            };
            Some((key, end))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Code;

    #[test]
    fn three_silent_intervals_end_a_session() {
        let h = Heartbeats {
            interval: Duration::from_secs(10),
            missed: 3,
        };
        assert_eq!(h.check(Duration::from_millis(29_999)), None);
        let end = h.check(Duration::from_secs(30)).unwrap();
        assert_eq!(end.status().unwrap().code(), Code::Unavailable);
        assert_eq!(
            end.status().unwrap().message(),
            "no heartbeat for 30s; reconnect"
        );
        assert_eq!(
            end.disconnect(),
            Some(("missed-heartbeats", Duration::from_secs(30))),
            "last seen when it fell silent"
        );
    }

    fn local(node: &str, epoch: u64, not_after: i64) -> Local {
        Local {
            node_id: node.into(),
            epoch,
            cert_not_after_ms: not_after,
        }
    }

    #[test]
    fn expired_certificates_and_superseded_sessions_end_at_the_liveness_pass() {
        let sessions = [
            local("a", 1, 1_000),
            local("b", 4, 5_000),
            local("c", 2, 5_000),
        ];
        let gone = [SessionKey {
            node_id: "b".into(),
            epoch: 4,
        }];
        let ends: Vec<(NodeId, End)> = sweep(&sessions, 1_001, &gone)
            .into_iter()
            .map(|(k, e)| (k.node_id, e))
            .collect();
        assert_eq!(
            ends,
            [
                ("a".into(), End::CertificateExpired),
                ("b".into(), End::Superseded)
            ]
        );
        assert!(
            sweep(&sessions, 1_000, &[]).is_empty(),
            "valid through its last millisecond"
        );
        // Only the epoch the store named is superseded.
        let older = [SessionKey {
            node_id: "c".into(),
            epoch: 1,
        }];
        assert!(sweep(&sessions, 0, &older).is_empty());
    }

    #[test]
    fn what_each_end_tells_the_node_and_the_store() {
        let expired = End::CertificateExpired.status().unwrap();
        assert_eq!(
            (expired.code(), expired.message()),
            (
                Code::Unauthenticated,
                "certificate expired; renew and reconnect"
            )
        );
        assert_eq!(End::Superseded.status().unwrap().code(), Code::Aborted);
        assert_eq!(
            End::Superseded.disconnect(),
            None,
            "the newer session owns the route"
        );
        let fenced = End::Fenced {
            gateway: "gw-1".into(),
        };
        assert_eq!(
            fenced.status().unwrap().message(),
            "gateway gw-1 does not hold its lease; reconnect"
        );
        assert_eq!(fenced.disconnect(), None);
        let revoked = End::Revoked {
            reason: "node-deleted".into(),
            statement: Some(b"st".to_vec()),
        };
        let s = revoked.status().unwrap();
        assert_eq!(s.code(), Code::Unauthenticated);
        assert_eq!(
            bcd_proto::refusal::reason(&s),
            bcd_proto::v1::RefusalReason::CertificateRevoked
        );
        assert_eq!(bcd_proto::refusal::of(&s).unwrap().statement, b"st");
        assert_eq!(revoked.disconnect(), Some(("revoked", Duration::ZERO)));
        let drain = End::Drain {
            within: Duration::from_secs(60),
        };
        assert!(drain.status().is_none(), "a Drain message says it");
        assert_eq!(drain.disconnect(), Some(("drained", Duration::ZERO)));
        assert_eq!(
            End::StreamEnded.disconnect(),
            Some(("stream-ended", Duration::ZERO))
        );
    }
}
