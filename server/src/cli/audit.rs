//! `better-compute audit list|verify|export`: the store's hash-chained
//! audit history, read as it is (nothing created, nothing migrated), and
//! checked as it is read.
//!
//! An export is JSON Lines: a first line that names the format and holds
//! every chain's head, then one line per record with the fields its hash
//! covers. Another tool verifies it without this one: each record's `hash`
//! is the SHA-256 (lowercase hex) of the UTF-8 text
//!
//! ```text
//! bc-audit-v2\n{chain}\n{prev_hash}\n{seq}\n{at}\n{len}:{node_id}\n{len}:{kind}\n{epoch}\n{len}:{gateway_id}\n{value}\n{len}:{detail}
//! ```
//!
//! (chain 0, sealed before chains existed, drops the `\n{chain}` and says
//! `bc-audit-v1`; `{len}` is the field's length in characters), each
//! chain's first `prev_hash` is 64 zeros, its sequence numbers run 1, 2,
//! 3... and its head names its last record.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use bc_store::audit::{AuditRow, ChainHead, verify_chain};
use clap::{Args, Subcommand};
use serde::Serialize;

use super::dur;
use super::output::{self, out};

/// The format an export names on its first line.
pub const EXPORT_FORMAT: &str = "bc-audit-export-v1";

#[derive(Debug, Subcommand)]
pub enum AuditCommand {
    /// Print audit records, oldest first (the chains are verified first;
    /// a broken one is reported and the command exits 1 after printing).
    #[command(
        after_help = "Examples:\n  better-compute audit list --node nd-1a2b --since 1h\n  better-compute audit list --kind route --limit 50 -o json"
    )]
    List(ListArgs),
    /// Verify every chain: each record's hash, the links between records,
    /// no record missing and every head at its chain's end. Exit 0 when
    /// intact, 1 with one line per break.
    #[command(
        after_help = "Examples:\n  better-compute audit verify\n  better-compute --store postgres://bc@db/fleet audit verify"
    )]
    Verify,
    /// Write the whole history with its heads as JSON Lines (standard
    /// output, or --out), for a tool of its own to verify.
    #[command(
        after_help = "Examples:\n  better-compute audit export --out audit.jsonl\n  better-compute --store postgres://bc@db/fleet audit export | gzip > audit.jsonl.gz"
    )]
    Export(ExportArgs),
}

#[derive(Debug, Args)]
pub struct ListArgs {
    /// Only this node's records.
    #[arg(long)]
    node: Option<String>,
    /// Only records of this kind (`route`, `disconnected`, `unreachable`,
    /// `lease`, `generation`, `floor`, `result`, `binding`, `backup`).
    #[arg(long)]
    kind: Option<String>,
    /// Only records this recent (`1h`, `30m`, `7d`).
    #[arg(long, value_parser = dur)]
    since: Option<Duration>,
    /// At most this many (the newest ones).
    #[arg(long, default_value_t = 1_000)]
    limit: usize,
    /// One JSON object per record.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
pub struct ExportArgs {
    /// Write here instead of standard output (written whole, then moved
    /// into place).
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
}

/// One record as `list -o json` and an export write it.
#[derive(Debug, Serialize)]
struct Record<'a> {
    chain: i64,
    seq: i64,
    at: i64,
    node_id: &'a str,
    kind: &'a str,
    epoch: u64,
    gateway_id: &'a str,
    value: i64,
    detail: &'a str,
    prev_hash: &'a str,
    hash: &'a str,
}

impl<'a> From<&'a AuditRow> for Record<'a> {
    fn from(r: &'a AuditRow) -> Record<'a> {
        Record {
            chain: r.chain,
            seq: r.seq,
            at: r.at,
            node_id: &r.node_id,
            kind: &r.kind,
            epoch: r.epoch,
            gateway_id: &r.gateway_id,
            value: r.value,
            detail: &r.detail,
            prev_hash: &r.prev_hash,
            hash: &r.hash,
        }
    }
}

#[derive(Debug, Serialize)]
struct Head<'a> {
    chain: i64,
    seq: i64,
    hash: &'a str,
}

#[derive(Debug, Serialize)]
struct ExportHeader<'a> {
    format: &'static str,
    /// The store's clock when it was read, unix ms.
    read_at: i64,
    records: usize,
    heads: Vec<Head<'a>>,
}

pub async fn run(c: AuditCommand, data_dir: &Path, store: Option<&str>) -> anyhow::Result<()> {
    let (store, location) = super::check::open_existing(data_dir, store).await?;
    // The history and the heads alone: none of the current tables.
    let snapshot = store
        .audit_history()
        .await
        .map_err(|e| crate::backup::store_error(e, &format!("cannot read {location}")))?;
    let (audit, heads) = (&snapshot.audit, &snapshot.heads);
    let breaks = verify_chain(audit, heads);
    match c {
        AuditCommand::Verify => {
            if breaks.is_empty() {
                out!(
                    "audit: {} records in {} chains, every chain intact",
                    audit.len(),
                    heads.len()
                );
                return Ok(());
            }
            for b in &breaks {
                out!("broken: {b}");
            }
            anyhow::bail!(
                "the audit history is broken in {}: it was changed outside the store's own writes",
                places(breaks.len())
            )
        }
        AuditCommand::List(a) => {
            list(&a, audit, snapshot.now)?;
            for b in &breaks {
                eprintln!("broken: {b}");
            }
            anyhow::ensure!(
                breaks.is_empty(),
                "the audit history is broken in {} (run `audit verify`)",
                places(breaks.len())
            );
            Ok(())
        }
        AuditCommand::Export(a) => {
            let mut text = String::new();
            let header = ExportHeader {
                format: EXPORT_FORMAT,
                read_at: snapshot.now,
                records: audit.len(),
                heads: heads.iter().map(head).collect(),
            };
            text.push_str(&serde_json::to_string(&header)?);
            text.push('\n');
            for r in audit {
                text.push_str(&serde_json::to_string(&Record::from(r))?);
                text.push('\n');
            }
            match &a.out {
                Some(path) => {
                    bcd_sys::fs::atomic_write(path, text.as_bytes(), 0o644)
                        .with_context(|| format!("cannot write {}", path.display()))?;
                    eprintln!(
                        "exported {} audit records in {} chains to {}",
                        audit.len(),
                        heads.len(),
                        path.display()
                    );
                }
                None => output::emit(&text)?,
            }
            for b in &breaks {
                eprintln!("broken: {b}");
            }
            anyhow::ensure!(
                breaks.is_empty(),
                "exported, but the audit history is broken in {} (run `audit verify`)",
                places(breaks.len())
            );
            Ok(())
        }
    }
}

fn places(n: usize) -> String {
    if n == 1 {
        "1 place".into()
    } else {
        format!("{n} places")
    }
}

fn head(h: &ChainHead) -> Head<'_> {
    Head {
        chain: h.chain,
        seq: h.seq,
        hash: &h.hash,
    }
}

fn list(a: &ListArgs, audit: &[AuditRow], now: i64) -> anyhow::Result<()> {
    let since = a
        .since
        .map(|d| now.saturating_sub(d.as_millis().min(i64::MAX as u128) as i64));
    let matching: Vec<&AuditRow> = audit
        .iter()
        .filter(|r| a.node.as_deref().is_none_or(|n| r.node_id == n))
        .filter(|r| a.kind.as_deref().is_none_or(|k| r.kind == k))
        .filter(|r| since.is_none_or(|s| r.at >= s))
        .collect();
    let shown = &matching[matching.len().saturating_sub(a.limit)..];
    if output::json_wanted(a.json) {
        let mut stdout = String::new();
        for r in shown {
            stdout.push_str(&serde_json::to_string(&Record::from(*r))?);
            stdout.push('\n');
        }
        return output::emit(&stdout);
    }
    let width = |f: &dyn Fn(&AuditRow) -> usize, title: &str| {
        shown
            .iter()
            .map(|r| f(r))
            .max()
            .unwrap_or(0)
            .max(title.len())
    };
    let place = |r: &AuditRow| format!("{}:{}", r.chain, r.seq);
    let (wp, wk, wn, wg) = (
        width(&|r| place(r).len(), "CHAIN:SEQ"),
        width(&|r| r.kind.chars().count(), "KIND"),
        width(&|r| r.node_id.chars().count(), "NODE"),
        width(&|r| r.gateway_id.chars().count(), "GATEWAY"),
    );
    let mut text = format!(
        "{:<20}  {:<wp$}  {:<wk$}  {:<wn$}  {:<wg$}  {:>5}  {:>6}  DETAIL\n",
        "TIME", "CHAIN:SEQ", "KIND", "NODE", "GATEWAY", "EPOCH", "VALUE"
    );
    for r in shown {
        text.push_str(&format!(
            "{:<20}  {:<wp$}  {:<wk$}  {:<wn$}  {:<wg$}  {:>5}  {:>6}  {}\n",
            output::time(r.at),
            place(r),
            r.kind,
            r.node_id,
            r.gateway_id,
            r.epoch,
            r.value,
            r.detail
        ));
    }
    if matching.len() > shown.len() {
        text.push_str(&format!(
            "({} older records not shown: raise --limit)\n",
            matching.len() - shown.len()
        ));
    }
    output::emit(&text)
}
