//! `better-compute backup`: backup sets of the store and the keys, and
//! restores (see [`crate::backup`]). These verbs work on the store and the
//! data directory directly, as `check` does, so they run beside a live
//! control plane (create, list, show) or a stopped one (restore).

use std::path::{Path, PathBuf};

use clap::Subcommand;

use super::output::{self, out};
use crate::backup::{Interrupted, OrStore, SetView, journal::Journal};

#[derive(Debug, Subcommand)]
pub enum BackupCommand {
    /// Take a backup set now (the control plane may be running): the
    /// store's dump, the CA and keys, and a manifest of their hashes.
    #[command(
        after_help = "Examples:\n  better-compute backup create\n  better-compute backup create --dir /srv/backups --json"
    )]
    Create {
        /// Where sets go; <data-dir>/backups by default.
        #[arg(long)]
        dir: Option<PathBuf>,
        /// JSON instead of a table (the same as the global `-o json`).
        #[arg(long)]
        json: bool,
    },
    /// The backup sets the store records, newest first.
    #[command(
        after_help = "Examples:\n  better-compute backup list\n  better-compute --store postgres://bc@db/fleet backup list --json"
    )]
    List {
        /// JSON instead of a table (the same as the global `-o json`).
        #[arg(long)]
        json: bool,
    },
    /// One backup set, with its files when its directory is here.
    #[command(
        after_help = "Examples:\n  better-compute backup show bk-20261206T101159-5ee8\n  better-compute backup show bk-20261206T101159-5ee8 --json"
    )]
    Show {
        /// The backup set's id (backup list shows them).
        id: String,
        /// JSON instead of a table (the same as the global `-o json`).
        #[arg(long)]
        json: bool,
    },
    /// Restore a backup set into a stopped control plane's data directory
    /// and store (--data-dir, --store). Every file's hash is verified
    /// first. An interrupted restore must be resumed or abandoned before
    /// anything else starts.
    #[command(
        after_help = "Examples:\n  better-compute backup restore /var/lib/better-compute/backups/bk-20261206T101159-5ee8\n  better-compute --data-dir /var/lib/bc-new backup restore bk-20261206T101159-5ee8 --dir /backups\n  better-compute backup restore --resume"
    )]
    Restore {
        /// The set: its directory, or its id under --dir.
        backup: Option<String>,
        /// Where sets are; <data-dir>/backups by default.
        #[arg(long)]
        dir: Option<PathBuf>,
        /// Redo an interrupted restore from its start.
        #[arg(long, conflicts_with = "abandon")]
        resume: bool,
        /// Give up an interrupted restore: keep the data directory and
        /// store as it left them, and let serve start.
        #[arg(long)]
        abandon: bool,
    },
}

pub async fn run(cmd: BackupCommand, data_dir: &Path, store: Option<&str>) -> anyhow::Result<()> {
    let location = crate::serve::store_location(data_dir, store);
    let backups_dir =
        |dir: Option<PathBuf>| dir.unwrap_or_else(|| crate::backup::default_dir(data_dir));
    match cmd {
        BackupCommand::Create { dir, json } => {
            let store = existing(&location).await?;
            let bar = output::progress(
                crate::cli::output::json_wanted(json),
                "{bar:40} {pos}/{len} rows  {msg}",
            );
            let created = crate::backup::create(&store, data_dir, &backups_dir(dir), &bar).await;
            bar.finish_and_clear();
            let created = created?;
            if crate::cli::output::json_wanted(json) {
                return output::json_line(&created);
            }
            out!("{}", created.id);
            eprintln!(
                "backup {} complete: {} files, {} in {}",
                created.id,
                created.files,
                output::mib(created.bytes),
                created.location
            );
            Ok(())
        }
        BackupCommand::List { json } => {
            let store = existing(&location).await?;
            let sets = views(
                data_dir,
                store
                    .backups()
                    .await
                    .or_store("cannot list the backup sets")?,
            );
            if crate::cli::output::json_wanted(json) {
                return output::json(&serde_json::json!({ "backups": sets }));
            }
            out!(
                "{:<26} {:<9} {:<22} {:<8} {:<20} {:>6} {:>10}  LOCATION",
                "ID",
                "STATE",
                "REASON",
                "RESTORE",
                "CREATED",
                "FILES",
                "SIZE"
            );
            for s in &sets {
                let r = &s.row;
                out!(
                    "{:<26} {:<9} {:<22} {:<8} {:<20} {:>6} {:>10}  {}{}",
                    r.id,
                    r.state,
                    if r.reason.is_empty() { "-" } else { &r.reason },
                    if r.restore_eligible { "eligible" } else { "no" },
                    output::time(r.created_at),
                    r.files,
                    output::mib(r.bytes),
                    r.location,
                    if s.restored_here {
                        " (restored here)"
                    } else {
                        ""
                    }
                );
            }
            Ok(())
        }
        BackupCommand::Show { id, json } => {
            let store = existing(&location).await?;
            let row = store
                .backup(&id)
                .await
                .or_store("cannot read the backup set")?
                .ok_or_else(|| anyhow::anyhow!("no backup {id}: see better-compute backup list"))?;
            let view = views(data_dir, vec![row]).remove(0);
            let manifest =
                std::fs::read(Path::new(&view.row.location).join(crate::backup::manifest::FILE))
                    .ok()
                    .and_then(|b| crate::backup::manifest::Manifest::parse(&b).ok());
            if crate::cli::output::json_wanted(json) {
                return output::json(&serde_json::json!({
                    "backup": view,
                    "manifest": manifest,
                }));
            }
            let r = &view.row;
            out!("id:               {}", r.id);
            out!(
                "state:            {}{}",
                r.state,
                output::around(" (", &r.reason, ")")
            );
            out!(
                "restore eligible: {}",
                if r.restore_eligible { "yes" } else { "no" }
            );
            out!("created:          {}", output::time(r.created_at));
            if let Some(f) = r.finished_at {
                out!("finished:         {}", output::time(f));
            }
            out!("location:         {}", r.location);
            out!("written by:       process {} on {}", r.process, r.host);
            if view.restored_here {
                out!("this control plane was restored from it");
            }
            match manifest {
                Some(m) => {
                    out!(
                        "files ({}, {}):",
                        m.files.len(),
                        output::mib(m.total_size())
                    );
                    for f in &m.files {
                        out!("  {:<40} {:>10}  {}", f.path, f.size, f.sha256);
                    }
                }
                None => out!("manifest:         none here"),
            }
            Ok(())
        }
        BackupCommand::Restore {
            backup,
            dir,
            resume,
            abandon,
        } => {
            if abandon {
                out!("{}", crate::backup::abandon(data_dir)?);
                return Ok(());
            }
            let source = backup.map(|b| {
                let p = PathBuf::from(&b);
                if p.is_dir() {
                    p
                } else {
                    backups_dir(dir.clone()).join(b)
                }
            });
            let bar = output::progress(false, "{bar:40} {bytes}/{total_bytes}  {msg}");
            let id = crate::backup::restore(
                source.as_deref(),
                data_dir,
                &location,
                if resume {
                    Interrupted::Resume
                } else {
                    Interrupted::Refuse
                },
                &bar,
            )
            .await;
            bar.finish_and_clear();
            let id = id?;
            out!("restored backup {id} into {}", data_dir.display());
            eprintln!(
                "start the control plane (better-compute serve); this backup's own record there \
                 is not restore eligible: it was being written when the store was read"
            );
            Ok(())
        }
    }
}

/// The store at `location`, which must exist.
async fn existing(location: &bc_store::Location) -> anyhow::Result<bc_store::Store> {
    if let bc_store::Location::Sqlite(path) = location {
        anyhow::ensure!(
            path.exists(),
            "no store at {}: pass --data-dir of the server, or its --store",
            path.display()
        );
    }
    bc_store::Store::open(location, std::sync::Arc::new(bc_store::SystemClock))
        .await
        .or_store(&format!("cannot open {location}"))
}

fn views(data_dir: &Path, rows: Vec<bc_store::backups::BackupRow>) -> Vec<SetView> {
    let restored_from = Journal::read(data_dir)
        .ok()
        .flatten()
        .filter(|j| j.is_complete())
        .map(|j| j.backup().to_string());
    rows.into_iter()
        .map(|row| SetView {
            restored_here: restored_from.as_deref() == Some(row.id.as_str()),
            row,
        })
        .collect()
}
