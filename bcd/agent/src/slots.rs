//! The A/B slots on disk, for self-update.
//!
//! Under `<data-dir>/slots/`: `a/bcd` and `b/bcd`, the binaries; `current`, a
//! symlink to `a` or `b` naming the one that runs; and `update.json`, the
//! [`UpdateState`] (sequences, floor, failed sequences, the pending
//! upgrade). The link is switched atomically: a new link is made under a
//! temporary name and renamed over `current`, then the directory is fsynced.
//! What `current` points at is read from the link itself, never from a
//! binary's claims.
//!
//! # Format versions
//!
//! `update.json` carries `version`, which versions the whole slots
//! directory (this layout and the state file). Version 0 is the unversioned
//! file of releases before format versions (its later fields with
//! defaults); version 1 adds `version` and writes every field. This bcd
//! writes [`STATE_VERSION`], reads every earlier version, and refuses a
//! newer one ([`SlotError::Newer`]). Golden files in `testdata/slots/` pin
//! the layout and what this code writes; `tests/formats.rs` reads every
//! earlier version back. Version 0 readers ignore the `version` field, so a
//! release swapped back to one still reads the state.

use std::collections::BTreeSet;
use std::fs;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use bcd_core::update::{Pending, Slot, UpdateState};
use serde::{Deserialize, Serialize};

use bcd_sys::fs as fsutil;

#[derive(Debug, thiserror::Error)]
pub enum SlotError {
    #[error("slot directory {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(
        "{path} is corrupt ({reason}): restore it from the slot directory's state or reinstall bcd"
    )]
    Corrupt { path: PathBuf, reason: String },
    #[error(
        "{path} is format version {version}, written by a newer bcd (this one reads up to \
         {known}): run that release of bcd or a newer one"
    )]
    Newer {
        path: PathBuf,
        version: u32,
        known: u32,
    },
    #[error(transparent)]
    Fs(#[from] bcd_sys::fs::FsError),
    /// A step the helper took for an unprivileged node failed (the text
    /// starts `helper: `).
    #[error("{0}")]
    Helper(String),
}

/// The `update.json` format (and slots layout) this bcd writes.
pub const STATE_VERSION: u32 = 1;

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> SlotError + '_ {
    move |source| SlotError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// `update.json`, version 1: every field written, none defaulted.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
struct StateV1 {
    version: u32,
    sequences: [u64; 2],
    versions: [String; 2],
    floor: u64,
    failed: BTreeSet<u64>,
    pending: Option<PendingV1>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
struct PendingV1 {
    command_id: String,
    from: String,
    from_sequence: u64,
    to: String,
    to_sequence: u64,
    to_version: String,
    next_key: Option<String>,
    deadline_ms: u64,
    starts: u32,
}

/// `update.json`, version 0: no version field; `versions`, `to_version`
/// and `next_key` were added to it with defaults.
#[derive(Debug, Clone, Deserialize)]
struct StateV0 {
    sequences: [u64; 2],
    #[serde(default)]
    versions: [String; 2],
    floor: u64,
    failed: BTreeSet<u64>,
    pending: Option<PendingV0>,
}

#[derive(Debug, Clone, Deserialize)]
struct PendingV0 {
    command_id: String,
    from: String,
    from_sequence: u64,
    to: String,
    to_sequence: u64,
    #[serde(default)]
    to_version: String,
    #[serde(default)]
    next_key: Option<String>,
    deadline_ms: u64,
    starts: u32,
}

impl From<StateV0> for StateV1 {
    fn from(v0: StateV0) -> StateV1 {
        StateV1 {
            version: 1,
            sequences: v0.sequences,
            versions: v0.versions,
            floor: v0.floor,
            failed: v0.failed,
            pending: v0.pending.map(|p| PendingV1 {
                command_id: p.command_id,
                from: p.from,
                from_sequence: p.from_sequence,
                to: p.to,
                to_sequence: p.to_sequence,
                to_version: p.to_version,
                next_key: p.next_key,
                deadline_ms: p.deadline_ms,
                starts: p.starts,
            }),
        }
    }
}

/// Reads `update.json` of any version this bcd knows, as the current one.
fn parse_state(path: &Path, bytes: &[u8]) -> Result<StateV1, SlotError> {
    #[derive(Deserialize)]
    struct Probe {
        version: Option<u32>,
    }
    let corrupt = |reason: String| SlotError::Corrupt {
        path: path.to_path_buf(),
        reason,
    };
    let probe: Probe = serde_json::from_slice(bytes).map_err(|e| corrupt(e.to_string()))?;
    match probe.version {
        None => serde_json::from_slice::<StateV0>(bytes)
            .map(StateV1::from)
            .map_err(|e| corrupt(e.to_string())),
        Some(1) => serde_json::from_slice(bytes).map_err(|e| corrupt(e.to_string())),
        Some(version) if version > STATE_VERSION => Err(SlotError::Newer {
            path: path.to_path_buf(),
            version,
            known: STATE_VERSION,
        }),
        Some(version) => Err(corrupt(format!("unknown format version {version}"))),
    }
}

fn slot_of(s: &str) -> Option<Slot> {
    match s {
        "a" => Some(Slot::A),
        "b" => Some(Slot::B),
        _ => None,
    }
}

#[derive(Debug, Clone)]
pub struct Slots {
    dir: PathBuf,
}

impl Slots {
    pub fn new(data_dir: &Path) -> Slots {
        Slots {
            dir: data_dir.join("slots"),
        }
    }

    pub fn binary(&self, slot: Slot) -> PathBuf {
        self.dir.join(slot.name()).join("bcd")
    }

    fn state_path(&self) -> PathBuf {
        self.dir.join("update.json")
    }

    /// Whether the slots are set up (the first upgrade sets them up).
    pub fn exist(&self) -> bool {
        fs::symlink_metadata(self.dir.join("current")).is_ok()
    }

    /// The binary `current` names, through the link.
    pub fn current_binary(&self) -> PathBuf {
        self.dir.join("current").join("bcd")
    }

    /// Sets up slot A with `binary` at `sequence` if there are no slots yet.
    pub fn init(
        &self,
        binary: &[u8],
        sequence: u64,
        version: &str,
    ) -> Result<UpdateState, SlotError> {
        if self.exist() {
            return self.load();
        }
        self.write_slot(Slot::A, binary)?;
        let state = UpdateState::new(Slot::A, sequence, version);
        self.save(&state)?;
        self.point(Slot::A)?;
        Ok(state)
    }

    /// Writes a verified binary into a slot (mode 0755, fsynced).
    pub fn write_slot(&self, slot: Slot, binary: &[u8]) -> Result<(), SlotError> {
        let path = self.binary(slot);
        let dir = path.parent().expect("slot directory");
        fs::create_dir_all(dir).map_err(io_err(dir))?;
        fsutil::atomic_write(&path, binary, 0o755)?;
        fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).map_err(io_err(&path))?;
        Ok(())
    }

    /// Where `current` points.
    pub fn link(&self) -> Result<Slot, SlotError> {
        let path = self.dir.join("current");
        let target = fs::read_link(&path).map_err(io_err(&path))?;
        target
            .to_str()
            .and_then(slot_of)
            .ok_or_else(|| SlotError::Corrupt {
                path,
                reason: format!("it points at {}", target.display()),
            })
    }

    /// Points `current` at `slot`, atomically.
    pub fn point(&self, slot: Slot) -> Result<(), SlotError> {
        let tmp = self.dir.join("current.tmp");
        let _ = fs::remove_file(&tmp);
        std::os::unix::fs::symlink(slot.name(), &tmp).map_err(io_err(&tmp))?;
        let current = self.dir.join("current");
        fs::rename(&tmp, &current).map_err(io_err(&current))?;
        fsutil::sync_dir(&self.dir).map_err(io_err(&self.dir))
    }

    pub fn save(&self, state: &UpdateState) -> Result<(), SlotError> {
        let file = StateV1 {
            version: STATE_VERSION,
            sequences: state.sequences,
            versions: state.versions.clone(),
            floor: state.floor,
            failed: state.failed.clone(),
            pending: state.pending.as_ref().map(|p| PendingV1 {
                command_id: p.command_id.clone(),
                from: p.from.name().into(),
                from_sequence: p.from_sequence,
                to: p.to.name().into(),
                to_sequence: p.to_sequence,
                to_version: p.to_version.clone(),
                next_key: p.next_key.clone(),
                deadline_ms: p.deadline_ms,
                starts: p.starts,
            }),
        };
        fs::create_dir_all(&self.dir).map_err(io_err(&self.dir))?;
        fsutil::atomic_write(
            &self.state_path(),
            &serde_json::to_vec_pretty(&file).expect("state serializes"),
            0o600,
        )?;
        Ok(())
    }

    /// The state, with `current` taken from the link.
    pub fn load(&self) -> Result<UpdateState, SlotError> {
        let path = self.state_path();
        let bytes = fs::read(&path).map_err(io_err(&path))?;
        let corrupt = |reason: String| SlotError::Corrupt {
            path: path.clone(),
            reason,
        };
        let f = parse_state(&path, &bytes)?;
        let pending = match f.pending {
            None => None,
            Some(p) => Some(Pending {
                from: slot_of(&p.from).ok_or_else(|| corrupt("bad slot".into()))?,
                to: slot_of(&p.to).ok_or_else(|| corrupt("bad slot".into()))?,
                command_id: p.command_id,
                from_sequence: p.from_sequence,
                to_sequence: p.to_sequence,
                to_version: p.to_version,
                next_key: p.next_key,
                deadline_ms: p.deadline_ms,
                starts: p.starts,
            }),
        };
        Ok(UpdateState {
            current: self.link()?,
            sequences: f.sequences,
            versions: f.versions,
            floor: f.floor,
            failed: f.failed,
            pending,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bcd_core::update::Decision;

    #[test]
    fn upgrade_confirm_and_swap_back_through_the_files() {
        let d = tempfile::tempdir().unwrap();
        let slots = Slots::new(d.path());
        let mut s = slots.init(b"old binary", 10, "1.0").unwrap();
        assert_eq!(slots.link().unwrap(), Slot::A);
        assert_eq!(
            slots.init(b"ignored", 99, "9.9").unwrap(),
            s,
            "init keeps what is there"
        );
        // Upgrade: write B, record, flip.
        slots.write_slot(Slot::B, b"new binary").unwrap();
        let to = s
            .begin(
                "cmd-1",
                11,
                "1.1",
                1_000,
                bcd_core::update::CONFIRM_WITHIN_MS,
            )
            .unwrap();
        slots.save(&s).unwrap();
        slots.point(to).unwrap();
        assert_eq!(std::fs::read(slots.binary(Slot::B)).unwrap(), b"new binary");
        let mode = std::fs::metadata(slots.binary(Slot::B))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o755);
        // The restarted process reads the link and the pending record.
        let mut after = slots.load().unwrap();
        assert_eq!(after, s);
        assert!(matches!(
            after.on_start(slots.link().unwrap(), 2_000),
            Decision::AwaitWelcome { .. }
        ));
        // No Welcome: swap back through the link.
        assert!(matches!(after.on_tick(200_000), Decision::SwapBack { .. }));
        slots.point(after.swap_back()).unwrap();
        slots.save(&after).unwrap();
        let mut old = slots.load().unwrap();
        assert_eq!(old.current, Slot::A);
        assert!(matches!(
            old.on_start(Slot::A, 201_000),
            Decision::Finished {
                succeeded: false,
                ..
            }
        ));
        slots.save(&old).unwrap();
        assert!(slots.load().unwrap().failed.contains(&11));
    }

    #[test]
    fn a_link_that_points_elsewhere_is_corrupt() {
        let d = tempfile::tempdir().unwrap();
        let slots = Slots::new(d.path());
        slots.init(b"bin", 1, "1").unwrap();
        std::fs::remove_file(d.path().join("slots/current")).unwrap();
        std::os::unix::fs::symlink("/usr/bin", d.path().join("slots/current")).unwrap();
        assert!(matches!(slots.link(), Err(SlotError::Corrupt { .. })));
    }
}
