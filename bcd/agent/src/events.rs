//! What the node journals as events, one type per kind.
//!
//! An event is its kind (`command.accepted`) and a JSON body; the journal
//! keeps both and the gateway stores them as sent. Each kind's body is a
//! type here, so what a kind carries is written once and pinned: the
//! bodies' JSON is fixed by `testdata/events/*.json` (this module's tests),
//! and each of those files still reads as its type. Fields are declared in
//! the order of their names, the order the bodies had when they were built
//! as JSON maps, so the bytes stay what they were.
//!
//! A frame the node refuses from a gateway ([`Refused`]) is journaled as a
//! `security.*` event whose body names what was refused ([`Refusal`]),
//! under the same rules for every kind.

use serde::{Deserialize, Serialize};

use crate::journal::EventClass;

/// An event's body, with its kind and how the journal keeps it.
pub trait Body: Serialize {
    /// Its kind, as journaled and sent.
    fn kind(&self) -> &'static str;
    /// How the journal keeps it (what it may drop when full).
    fn class(&self) -> EventClass;
}

/// Declares a body type of one kind and class.
macro_rules! body {
    ($ty:ty, $kind:literal, $class:ident) => {
        impl Body for $ty {
            fn kind(&self) -> &'static str {
                $kind
            }
            fn class(&self) -> EventClass {
                EventClass::$class
            }
        }
    };
}

/// A command journaled and about to start.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommandAccepted {
    pub command_id: String,
    pub kind: String,
    pub seq: u64,
}
body!(CommandAccepted, "command.accepted", Transition);

/// A command's side effect starts, in this boot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommandRunning {
    pub boot_id: String,
    pub command_id: String,
}
body!(CommandRunning, "command.running", Transition);

/// A command ended here.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommandFinished {
    pub command_id: String,
    pub outcome: String,
    pub reason: String,
}
body!(CommandFinished, "command.finished", Result);

/// A spec that did not verify or apply; the last good one stays.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpecRefused {
    pub generation: u64,
    pub reason: String,
}
body!(SpecRefused, "spec.refused", Transition);

/// The load averages, every metrics tick.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeLoad {
    pub load1: f64,
    pub load15: f64,
    pub load5: f64,
}
body!(NodeLoad, "node.load", Metric);

/// The node left a gateway: revoked by the signed list, or the list it
/// holds went stale.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GatewayLeft {
    pub gateway_sha256: String,
    pub why: String,
    /// Revoked (`security.gateway.revoked`), else stale
    /// (`security.gateway.stale`): the kind, not the body.
    #[serde(skip)]
    pub revoked: bool,
}

impl Body for GatewayLeft {
    fn kind(&self) -> &'static str {
        if self.revoked {
            "security.gateway.revoked"
        } else {
            "security.gateway.stale"
        }
    }
    fn class(&self) -> EventClass {
        EventClass::Transition
    }
}

/// A new binary runs an upgrade and awaits the key holder's receipt of
/// this report ([`bcd_core::update::CONFIRM_EVENT`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReleaseRunning {
    pub command_id: String,
    pub release_sequence: u64,
}
body!(ReleaseRunning, "security.release.running", Transition);

/// What a refused frame's event names: its kind, and its own fields.
pub trait Refusal: Serialize {
    /// The `security.*` kind it is journaled as.
    const KIND: &'static str;
}

/// A frame refused from a gateway, as journaled: what was refused (cut to
/// a few KiB of text when a gateway made it longer) and how many refusals
/// of the kind were held back since the last one journaled.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Refused<T> {
    pub detail: Detail<T>,
    pub held_back: u64,
}

/// What was refused, or its text cut short.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Detail<T> {
    Frame(T),
    Cut(String),
}

/// Declares a refusal of one kind.
macro_rules! refusal {
    ($ty:ty, $kind:literal) => {
        impl Refusal for $ty {
            const KIND: &'static str = $kind;
        }
    };
}

/// A command whose signature, node, kind, sequence or life gave it away as
/// no command of the key holder's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommandRefused {
    pub command_id: String,
    pub reason: String,
    pub seq: u64,
}
refusal!(CommandRefused, "security.command.refused");

/// A tunnel whose ticket did not admit it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TunnelRefused {
    pub sid: String,
    pub why: String,
}
refusal!(TunnelRefused, "security.tunnel.refused");

/// A secret's delivery that was not the broker's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SecretRefused {
    pub allocation: String,
    pub secret: String,
    pub version: u64,
    pub why: String,
}
refusal!(SecretRefused, "security.secret.refused");

/// A receipt that did not verify, or named another result or event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReceiptRefused {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command_id: Option<String>,
    pub why: String,
}
refusal!(ReceiptRefused, "security.receipt.refused");

/// A gateway revocation list that did not verify.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RevocationsRefused {
    pub why: String,
}
refusal!(RevocationsRefused, "security.gateway_revocations.refused");

/// A Welcome that named a stale epoch or a server time out of bounds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct WelcomeRefused(pub String);
refusal!(WelcomeRefused, "security.welcome.refused");

/// A server time past what the key holder's signed times allow.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClockAhead {
    pub limit_ms: i64,
    pub said_ms: i64,
    pub why: String,
}
refusal!(ClockAhead, "security.clock.ahead");

/// A refusal to end the stream that no worker-signed statement confirmed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RefusalUnconfirmed {
    pub code: String,
    pub message: String,
    pub why: String,
}
refusal!(RefusalUnconfirmed, "security.refusal.unconfirmed");

/// A revocation that no worker-signed statement about this node confirmed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RevocationUnconfirmed {
    pub reason: String,
    pub why: String,
}
refusal!(RevocationUnconfirmed, "security.revocation.unconfirmed");

/// A drain that asked for a longer reconnect window than the node allows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DrainClamped {
    pub asked_ms: u32,
    pub clamped_ms: u64,
}
refusal!(DrainClamped, "security.drain.clamped");

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use serde::de::DeserializeOwned;

    use super::*;

    /// `value`'s JSON is the golden file `name` (written when
    /// `BCD_WRITE_GOLDEN` is set and the file does not exist yet, never
    /// rewritten), and that file reads back as `value`.
    fn pinned<T: Serialize + DeserializeOwned + PartialEq + std::fmt::Debug>(
        name: &str,
        value: &T,
    ) {
        let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("testdata/events")
            .join(format!("{name}.json"));
        let json = serde_json::to_string(value).unwrap();
        if std::env::var_os("BCD_WRITE_GOLDEN").is_some() && !p.exists() {
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, format!("{json}\n")).unwrap();
        }
        let golden = std::fs::read_to_string(&p)
            .unwrap_or_else(|e| panic!("{}: {e} (new bodies: BCD_WRITE_GOLDEN=1)", p.display()));
        assert_eq!(json, golden.trim(), "the body of {name} changed");
        let read: T = serde_json::from_str(golden.trim()).unwrap();
        assert_eq!(&read, value, "{name} does not read back");
    }

    /// A refusal as the node journals it (its frame made JSON first, for
    /// every kind alike): the bytes of its typed form.
    fn journaled_as_typed<R: Refusal + Clone>(frame: &R) {
        let typed = Refused {
            detail: Detail::Frame(frame.clone()),
            held_back: 2,
        };
        let journaled = Refused {
            detail: Detail::Frame(serde_json::to_value(frame).unwrap()),
            held_back: 2,
        };
        assert_eq!(
            serde_json::to_string(&journaled).unwrap(),
            serde_json::to_string(&typed).unwrap()
        );
    }

    /// The JSON map the body was built as before it had a type: the bytes
    /// are the same.
    fn as_before<T: Serialize>(value: &T, before: serde_json::Value) {
        assert_eq!(serde_json::to_string(value).unwrap(), before.to_string());
    }

    #[test]
    fn every_body_is_pinned() {
        let accepted = CommandAccepted {
            command_id: "cmd-1".into(),
            kind: "exec.run".into(),
            seq: 3,
        };
        as_before(
            &accepted,
            serde_json::json!({"command_id": "cmd-1", "seq": 3, "kind": "exec.run"}),
        );
        pinned("command.accepted", &accepted);
        pinned(
            "command.running",
            &CommandRunning {
                boot_id: "boot-1".into(),
                command_id: "cmd-1".into(),
            },
        );
        pinned(
            "command.finished",
            &CommandFinished {
                command_id: "cmd-1".into(),
                outcome: "SUCCEEDED".into(),
                reason: String::new(),
            },
        );
        pinned(
            "spec.refused",
            &SpecRefused {
                generation: 4,
                reason: "signature".into(),
            },
        );
        let load = NodeLoad {
            load1: 0.5,
            load15: 0.25,
            load5: 1.0,
        };
        as_before(
            &load,
            serde_json::json!({"load1": 0.5, "load5": 1.0, "load15": 0.25}),
        );
        pinned("node.load", &load);
        let left = GatewayLeft {
            gateway_sha256: "ab".repeat(32),
            why: "revoked".into(),
            revoked: true,
        };
        assert_eq!(left.kind(), "security.gateway.revoked");
        pinned(
            "security.gateway.left",
            &GatewayLeft {
                revoked: false,
                ..left
            },
        );
        pinned(
            "security.release.running",
            &ReleaseRunning {
                command_id: "cmd-9".into(),
                release_sequence: 12,
            },
        );
        fn refused<T>(detail: Detail<T>) -> Refused<T> {
            Refused {
                detail,
                held_back: 2,
            }
        }
        pinned(
            "security.command.refused",
            &refused(Detail::Frame(CommandRefused {
                command_id: "cmd-1".into(),
                reason: "signature".into(),
                seq: 3,
            })),
        );
        pinned(
            "security.command.refused.cut",
            &refused(Detail::<CommandRefused>::Cut(
                "{\"command_id\":\"xx... (9000 bytes in all)".into(),
            )),
        );
        pinned(
            "security.tunnel.refused",
            &refused(Detail::Frame(TunnelRefused {
                sid: "tn-1".into(),
                why: "ticket expired".into(),
            })),
        );
        pinned(
            "security.secret.refused",
            &refused(Detail::Frame(SecretRefused {
                allocation: "job-1".into(),
                secret: "db".into(),
                version: 2,
                why: "not the broker's signature".into(),
            })),
        );
        let receipt = ReceiptRefused {
            command_id: None,
            why: "bad signature".into(),
        };
        as_before(&receipt, serde_json::json!({"why": "bad signature"}));
        pinned("security.receipt.refused", &refused(Detail::Frame(receipt)));
        pinned(
            "security.receipt.refused.command",
            &refused(Detail::Frame(ReceiptRefused {
                command_id: Some("cmd-1".into()),
                why: "another node".into(),
            })),
        );
        pinned(
            "security.gateway_revocations.refused",
            &refused(Detail::Frame(RevocationsRefused {
                why: "bad signature".into(),
            })),
        );
        journaled_as_typed(&ClockAhead {
            limit_ms: 1,
            said_ms: 2,
            why: "w".into(),
        });
        journaled_as_typed(&ReceiptRefused {
            command_id: Some("cmd-1".into()),
            why: "w".into(),
        });
        journaled_as_typed(&SecretRefused {
            allocation: "a".into(),
            secret: "s".into(),
            version: 1,
            why: "w".into(),
        });
        let welcome = WelcomeRefused("stale epoch 3".into());
        journaled_as_typed(&welcome);
        as_before(&welcome, serde_json::json!("stale epoch 3"));
        pinned("security.welcome.refused", &refused(Detail::Frame(welcome)));
        pinned(
            "security.clock.ahead",
            &refused(Detail::Frame(ClockAhead {
                limit_ms: 1_790_000_000_000,
                said_ms: 1_790_000_900_000,
                why: "past the signed times".into(),
            })),
        );
        pinned(
            "security.refusal.unconfirmed",
            &refused(Detail::Frame(RefusalUnconfirmed {
                code: "PermissionDenied".into(),
                message: "revoked".into(),
                why: "no statement".into(),
            })),
        );
        pinned(
            "security.revocation.unconfirmed",
            &refused(Detail::Frame(RevocationUnconfirmed {
                reason: "revoked".into(),
                why: "another node".into(),
            })),
        );
        pinned(
            "security.drain.clamped",
            &refused(Detail::Frame(DrainClamped {
                asked_ms: 3_600_000,
                clamped_ms: 600_000,
            })),
        );
    }
}
