//! The restore journal: `restore.journal` in the data directory, one JSON
//! line per phase a restore reached, each fsynced before the next phase
//! begins. A journal whose last phase is not `complete` is an interrupted
//! restore: `serve` does not start and `backup restore` does nothing else
//! until the operator resumes it (`backup restore --resume`: every phase
//! again, from the start; each is idempotent and the store's is one
//! transaction) or abandons it (`backup restore --abandon`: the journal is
//! renamed aside and the data directory stays as the restore left it).

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::{Deserialize, Serialize};

/// The journal's name in the data directory.
pub const FILE: &str = "restore.journal";

/// What a restore's operator is told when one was interrupted.
pub const MANUAL_INTERVENTION_REQUIRED: &str = "MANUAL_INTERVENTION_REQUIRED";

/// The phases, in order; each is recorded once it is done.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Phase {
    /// Every file of the set matched its manifest; nothing is written yet.
    Verified,
    /// The CA and keys are in the data directory.
    KeysRestored,
    /// The store holds the set's dump.
    StoreRestored,
    Complete,
}

impl Phase {
    pub fn name(self) -> &'static str {
        match self {
            Phase::Verified => "verified",
            Phase::KeysRestored => "keys-restored",
            Phase::StoreRestored => "store-restored",
            Phase::Complete => "complete",
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Line {
    phase: Phase,
    backup: String,
    source: PathBuf,
    /// Unix milliseconds on this host's clock.
    at_ms: i64,
}

/// A journal read back, or being written.
#[derive(Debug)]
pub struct Journal {
    lines: Vec<Line>,
    file: Option<File>,
}

fn sync_dir(dir: &Path) -> anyhow::Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .with_context(|| format!("cannot sync {}", dir.display()))
}

impl Journal {
    /// The data directory's journal, if it has one. A line torn by a crash
    /// mid-write ends the journal there.
    pub fn read(data_dir: &Path) -> anyhow::Result<Option<Journal>> {
        let path = data_dir.join(FILE);
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
        };
        let lines: Vec<Line> = text
            .lines()
            .map_while(|l| serde_json::from_str(l).ok())
            .collect();
        anyhow::ensure!(
            !lines.is_empty(),
            "{} holds no phase: a restore was interrupted as it began; remove the file to \
             start (the data directory was not changed yet)",
            path.display()
        );
        Ok(Some(Journal { lines, file: None }))
    }

    /// Begins a restore's journal (replacing a complete one's): the set
    /// `backup` from `source` was verified.
    pub fn start(data_dir: &Path, backup: &str, source: &Path) -> anyhow::Result<Journal> {
        let path = data_dir.join(FILE);
        let file = OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(true)
            .open(&path)
            .with_context(|| format!("cannot create {}", path.display()))?;
        sync_dir(data_dir)?;
        let mut j = Journal {
            lines: vec![Line {
                phase: Phase::Verified,
                backup: backup.to_string(),
                source: source.to_path_buf(),
                at_ms: crate::clock::unix_ms(),
            }],
            file: Some(file),
        };
        j.append()?;
        Ok(j)
    }

    fn append(&mut self) -> anyhow::Result<()> {
        let line = self.lines.last().expect("a journal has a line");
        let text = format!("{}\n", serde_json::to_string(line)?);
        let f = self.file.as_mut().context("the journal is not open")?;
        f.write_all(text.as_bytes())
            .and_then(|()| f.sync_all())
            .context("cannot write the restore journal")
    }

    /// Records that `phase` is done (fsynced before it returns).
    pub fn reached(&mut self, phase: Phase) -> anyhow::Result<()> {
        let mut line = self.lines.last().expect("a journal has a line").clone();
        line.phase = phase;
        line.at_ms = crate::clock::unix_ms();
        self.lines.push(line);
        self.append()
    }

    pub fn phase(&self) -> Phase {
        self.lines.last().expect("a journal has a line").phase
    }

    pub fn is_complete(&self) -> bool {
        self.phase() == Phase::Complete
    }

    pub fn backup(&self) -> &str {
        &self.lines[0].backup
    }

    pub fn source(&self) -> &Path {
        &self.lines[0].source
    }

    /// The refusal an interrupted restore gets: what happened, and what to
    /// do.
    pub fn intervention_required(&self, data_dir: &Path) -> String {
        format!(
            "{MANUAL_INTERVENTION_REQUIRED}: the restore of backup {} (from {}) into {} was \
             interrupted after phase {} (journal {}); nothing starts on a half-restored control \
             plane. Run `better-compute backup restore --resume` to redo that restore from its \
             start, or `better-compute backup restore --abandon` to keep the data directory and \
             store as they are (then check them: better-compute doctor, better-compute check)",
            self.backup(),
            self.source().display(),
            data_dir.display(),
            self.phase().name(),
            data_dir.join(FILE).display()
        )
    }

    /// Renames the journal aside (`restore.journal.abandoned-<ms>`).
    pub fn abandon(&self, data_dir: &Path) -> anyhow::Result<String> {
        let to = data_dir.join(format!("{FILE}.abandoned-{}", crate::clock::unix_ms()));
        std::fs::rename(data_dir.join(FILE), &to)
            .with_context(|| format!("cannot rename {}", data_dir.join(FILE).display()))?;
        sync_dir(data_dir)?;
        Ok(format!(
            "abandoned the restore of backup {} at phase {}; its journal is {}",
            self.backup(),
            self.phase().name(),
            to.display()
        ))
    }
}

/// Refuses to start `serve` on a data directory with an interrupted
/// restore.
pub fn check_startable(data_dir: &Path) -> anyhow::Result<()> {
    match Journal::read(data_dir)? {
        Some(j) if !j.is_complete() => anyhow::bail!("{}", j.intervention_required(data_dir)),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_interrupted_journal_names_its_phase_and_a_torn_line_ends_it() {
        let d = tempfile::tempdir().unwrap();
        assert!(Journal::read(d.path()).unwrap().is_none());
        check_startable(d.path()).unwrap();
        let mut j = Journal::start(d.path(), "bk-1", Path::new("/b/bk-1")).unwrap();
        j.reached(Phase::KeysRestored).unwrap();
        drop(j);
        // A crash mid-write leaves half a line.
        let mut f = OpenOptions::new()
            .append(true)
            .open(d.path().join(FILE))
            .unwrap();
        f.write_all(b"{\"phase\":\"store-rest").unwrap();
        let j = Journal::read(d.path()).unwrap().unwrap();
        assert_eq!(j.phase(), Phase::KeysRestored);
        let e = check_startable(d.path()).unwrap_err().to_string();
        assert!(
            e.contains(MANUAL_INTERVENTION_REQUIRED)
                && e.contains("keys-restored")
                && e.contains("--resume")
                && e.contains("--abandon"),
            "{e}"
        );
        let said = j.abandon(d.path()).unwrap();
        assert!(said.contains("keys-restored"), "{said}");
        check_startable(d.path()).unwrap();
    }

    #[test]
    fn a_complete_journal_lets_serve_start() {
        let d = tempfile::tempdir().unwrap();
        let mut j = Journal::start(d.path(), "bk-1", Path::new("/b")).unwrap();
        for p in [Phase::KeysRestored, Phase::StoreRestored, Phase::Complete] {
            j.reached(p).unwrap();
        }
        check_startable(d.path()).unwrap();
        assert!(Journal::read(d.path()).unwrap().unwrap().is_complete());
    }
}
