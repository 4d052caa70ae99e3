//! Rollouts: a release reaches a selection of nodes in waves.
//!
//! A rollout fixes its nodes when it starts (the selector is evaluated
//! once) and walks cumulative waves (1%, 10%, 50%, 100% of them by
//! default). Each node gets one `daemon.upgrade` command, issued under the
//! idempotency key `rollout:<id>:<node>`, so a controller that dies between
//! creating a command and recording it (or two gateways running the
//! controller at once) never upgrades a node twice. A wave is over when
//! every node in it has confirmed, failed or been skipped (it already runs
//! the release or a later one). More failures than `max_failures` halt the
//! rollout by itself.
//!
//! Nothing here takes a confirmed node backwards: `abort --rollback` cancels
//! upgrades not yet dispatched and sends `daemon.rollback` only to nodes
//! whose upgrade is still in flight; a node that confirmed keeps its
//! release, and a bad release that confirmed is fixed by rolling forward
//! with a higher sequence.
//!
//! [`decide`] is the controller's decision, pure; the rest is the store and
//! the loop around it.

use std::time::Duration;

use bcd_core::command::Kind;
use bcd_proto::v1::{NoArgs, UpgradeArgs, command_payload};
use rusqlite::{OptionalExtension, params};
use tracing::{info, warn};

use crate::store::{Refusal, Store, StoreError, TxError};

pub const DEFAULT_WAVES: [u32; 4] = [1, 10, 50, 100];

/// How long a rollout's upgrade command may wait for its node.
const UPGRADE_NOT_AFTER: Duration = Duration::from_secs(24 * 3600);

/// Where one node of a rollout stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeStatus {
    /// Not yet given the upgrade.
    Waiting,
    Upgrading,
    Confirmed,
    Failed,
    /// Already at the release or later.
    Skipped,
    /// Aborted before its upgrade was dispatched.
    Cancelled,
}

impl NodeStatus {
    pub fn name(self) -> &'static str {
        match self {
            NodeStatus::Waiting => "waiting",
            NodeStatus::Upgrading => "upgrading",
            NodeStatus::Confirmed => "confirmed",
            NodeStatus::Failed => "failed",
            NodeStatus::Skipped => "skipped",
            NodeStatus::Cancelled => "cancelled",
        }
    }

    /// From the upgrade command's state.
    pub fn of_command(state: Option<&str>, reason: &str) -> NodeStatus {
        match state {
            None => NodeStatus::Waiting,
            Some("succeeded") => NodeStatus::Confirmed,
            Some("expired") if reason == CANCELLED => NodeStatus::Cancelled,
            Some("failed" | "expired" | "rejected") => NodeStatus::Failed,
            Some(_) => NodeStatus::Upgrading,
        }
    }

    fn settled(self) -> bool {
        !matches!(self, NodeStatus::Waiting | NodeStatus::Upgrading)
    }
}

/// The reason a cancelled upgrade command carries.
pub const CANCELLED: &str = "rollout-aborted";

/// What the controller does next for a running rollout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Give these positions (in the rollout's order) the upgrade.
    Issue(Vec<usize>),
    /// The current wave is over: start the next.
    Advance(usize),
    Halt(String),
    Done,
    Wait,
}

/// Nodes in the first `wave + 1` waves: `pct` percent of `total`, rounded
/// up, at least one.
pub fn wave_end(total: usize, pct: u32) -> usize {
    if total == 0 {
        return 0;
    }
    (total * pct as usize).div_ceil(100).clamp(1, total)
}

/// The controller's decision for a running rollout, from each node's status
/// in rollout order.
pub fn decide(waves: &[u32], wave: usize, max_failures: u32, nodes: &[NodeStatus]) -> Step {
    let failures = nodes.iter().filter(|s| **s == NodeStatus::Failed).count();
    if failures > max_failures as usize {
        return Step::Halt(format!(
            "the failure budget is spent: {failures} failed upgrades, {max_failures} allowed"
        ));
    }
    let Some(pct) = waves.get(wave) else {
        return Step::Done;
    };
    let end = wave_end(nodes.len(), *pct);
    let issue: Vec<usize> = (0..end)
        .filter(|&i| nodes[i] == NodeStatus::Waiting)
        .collect();
    if !issue.is_empty() {
        return Step::Issue(issue);
    }
    if nodes[..end].iter().all(|s| s.settled()) {
        if wave + 1 < waves.len() {
            return Step::Advance(wave + 1);
        }
        return Step::Done;
    }
    Step::Wait
}

/// Parses `1%,10%,50%,100%`: rising percentages ending at 100.
pub fn parse_waves(s: &str) -> Result<Vec<u32>, String> {
    let waves: Vec<u32> = s
        .split(',')
        .map(|w| {
            w.trim()
                .trim_end_matches('%')
                .parse::<u32>()
                .map_err(|_| format!("wave {w:?} is not a percentage"))
        })
        .collect::<Result<_, _>>()?;
    validate_waves(&waves)?;
    Ok(waves)
}

pub fn validate_waves(waves: &[u32]) -> Result<(), String> {
    if waves.is_empty() || waves.last() != Some(&100) {
        return Err("the waves must end at 100%: e.g. 1%,10%,50%,100%".into());
    }
    if waves.windows(2).any(|w| w[0] >= w[1]) || waves[0] == 0 {
        return Err("the waves must rise, from above 0% to 100%: e.g. 1%,10%,50%,100%".into());
    }
    Ok(())
}

/// A node as the selector sees it.
#[derive(Debug, Clone)]
pub struct Candidate {
    pub node_id: String,
    pub hostname: String,
    pub version: String,
}

/// Whether a node matches a selector: comma-separated `key=value` terms,
/// all of which must hold (`node=ID`, `hostname=GLOB` with `*`,
/// `version=V`); empty or `all` matches every node.
pub fn selects(selector: &str, node: &Candidate) -> Result<bool, String> {
    let selector = selector.trim();
    if selector.is_empty() || selector == "all" {
        return Ok(true);
    }
    for term in selector.split(',') {
        let (key, value) = term.split_once('=').ok_or_else(|| {
            format!("selector term {term:?} is not key=value (node=, hostname=, version=)")
        })?;
        let hit = match key.trim() {
            "node" => node.node_id == value,
            "hostname" => glob(value, &node.hostname),
            "version" => node.version == value,
            other => {
                return Err(format!(
                    "unknown selector key {other:?}: use node=, hostname= or version="
                ));
            }
        };
        if !hit {
            return Ok(false);
        }
    }
    Ok(true)
}

/// `*` matches any run of characters.
fn glob(pattern: &str, s: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == s,
        Some((head, rest)) => {
            s.starts_with(head)
                && (0..=s.len() - head.len())
                    .any(|i| s.is_char_boundary(head.len() + i) && glob(rest, &s[head.len() + i..]))
        }
    }
}

/// A rollout as the store keeps it.
#[derive(Debug, Clone)]
pub struct Rollout {
    pub id: String,
    pub sequence: u64,
    pub version: String,
    pub selector: String,
    pub waves: Vec<u32>,
    pub max_failures: u32,
    pub state: String,
    pub wave: usize,
    pub reason: String,
    pub created_at_ms: i64,
    pub nodes: Vec<RolloutNode>,
}

#[derive(Debug, Clone)]
pub struct RolloutNode {
    pub node_id: String,
    pub position: usize,
    pub status: NodeStatus,
    pub command_id: Option<String>,
    pub command_state: Option<String>,
    pub reason: String,
    pub rollback_id: Option<String>,
    pub release_floor: u64,
}

fn refused(m: impl Into<String>) -> TxError {
    TxError::Refused(Refusal::BadRequest(m.into()))
}

impl Store {
    /// Starts a rollout; one rollout runs (or is paused) at a time.
    pub fn start_rollout(
        &self,
        sequence: u64,
        selector: &str,
        waves: &[u32],
        max_failures: u32,
    ) -> Result<Rollout, TxError> {
        validate_waves(waves).map_err(refused)?;
        let id = format!("ro-{:012x}", rand::random::<u64>() >> 16);
        {
            let mut conn = self.lock();
            let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
            let known: Option<String> = tx
                .query_row(
                    "SELECT version FROM releases WHERE sequence = ?1",
                    [sequence as i64],
                    |r| r.get(0),
                )
                .optional()?;
            if known.is_none() {
                return Err(refused(format!(
                    "no release {sequence}: register it first (better-compute releases register)"
                )));
            }
            let active: Option<String> = tx
                .query_row(
                    "SELECT id FROM rollouts WHERE state IN ('running', 'paused')",
                    [],
                    |r| r.get(0),
                )
                .optional()?;
            if let Some(a) = active {
                return Err(refused(format!(
                    "rollout {a} is still active: let it finish, or abort it first"
                )));
            }
            let candidates: Vec<Candidate> = tx
                .prepare(
                    "SELECT id, hostname, agent_version FROM nodes
                     WHERE deleted_at IS NULL ORDER BY id",
                )?
                .query_map([], |r| {
                    Ok(Candidate {
                        node_id: r.get(0)?,
                        hostname: r.get(1)?,
                        version: r.get(2)?,
                    })
                })?
                .collect::<rusqlite::Result<_>>()?;
            let mut chosen = Vec::new();
            for c in candidates {
                if selects(selector, &c).map_err(refused)? {
                    chosen.push(c.node_id);
                }
            }
            if chosen.is_empty() {
                return Err(refused(format!(
                    "the selector {selector:?} matches no node: see better-compute nodes list"
                )));
            }
            let now: i64 = tx.query_row(
                "SELECT CAST(unixepoch('subsec') * 1000 AS INTEGER)",
                [],
                |r| r.get(0),
            )?;
            tx.execute(
                "INSERT INTO rollouts (id, sequence, selector, waves, max_failures, state, wave,
                     created_at, updated_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, 'running', 0, ?6, ?6)",
                params![
                    id,
                    sequence as i64,
                    selector,
                    serde_json::to_string(waves).expect("serializes"),
                    max_failures,
                    now
                ],
            )?;
            for (i, node) in chosen.iter().enumerate() {
                tx.execute(
                    "INSERT INTO rollout_nodes (rollout_id, node_id, position) VALUES (?1, ?2, ?3)",
                    params![id, node, i as i64],
                )?;
            }
            tx.commit()?;
        }
        Ok(self.rollout(&id)?.expect("just created"))
    }

    pub fn rollout(&self, id: &str) -> Result<Option<Rollout>, StoreError> {
        let conn = self.lock();
        let row = conn
            .query_row(
                "SELECT r.id, r.sequence, COALESCE(rel.version, ''), r.selector, r.waves,
                        r.max_failures, r.state, r.wave, r.reason, r.created_at
                 FROM rollouts r LEFT JOIN releases rel ON rel.sequence = r.sequence
                 WHERE r.id = ?1",
                [id],
                |r| {
                    Ok(Rollout {
                        id: r.get(0)?,
                        sequence: r.get::<_, i64>(1)? as u64,
                        version: r.get(2)?,
                        selector: r.get(3)?,
                        waves: serde_json::from_str(&r.get::<_, String>(4)?).unwrap_or_default(),
                        max_failures: r.get(5)?,
                        state: r.get(6)?,
                        wave: r.get::<_, i64>(7)? as usize,
                        reason: r.get(8)?,
                        created_at_ms: r.get(9)?,
                        nodes: Vec::new(),
                    })
                },
            )
            .optional()?;
        let Some(mut rollout) = row else {
            return Ok(None);
        };
        let mut q = conn.prepare(
            "SELECT rn.node_id, rn.position, rn.command_id, c.state, COALESCE(c.reason, ''),
                    rn.rollback_id, rn.skipped, COALESCE(n.release_floor, 0)
             FROM rollout_nodes rn
             LEFT JOIN commands c ON c.id = rn.command_id
             LEFT JOIN nodes n ON n.id = rn.node_id
             WHERE rn.rollout_id = ?1 ORDER BY rn.position",
        )?;
        rollout.nodes = q
            .query_map([id], |r| {
                let state: Option<String> = r.get(3)?;
                let reason: String = r.get(4)?;
                let skipped: bool = r.get(6)?;
                Ok(RolloutNode {
                    node_id: r.get(0)?,
                    position: r.get::<_, i64>(1)? as usize,
                    status: if skipped {
                        NodeStatus::Skipped
                    } else {
                        NodeStatus::of_command(state.as_deref(), &reason)
                    },
                    command_id: r.get(2)?,
                    command_state: state,
                    reason,
                    rollback_id: r.get(5)?,
                    release_floor: r.get::<_, i64>(7)? as u64,
                })
            })?
            .collect::<rusqlite::Result<_>>()?;
        Ok(Some(rollout))
    }

    pub fn list_rollouts(&self) -> Result<Vec<Rollout>, StoreError> {
        let ids: Vec<String> = {
            let conn = self.lock();
            conn.prepare("SELECT id FROM rollouts ORDER BY created_at DESC, id")?
                .query_map([], |r| r.get(0))?
                .collect::<rusqlite::Result<_>>()?
        };
        let mut out = Vec::new();
        for id in ids {
            if let Some(r) = self.rollout(&id)? {
                out.push(r);
            }
        }
        Ok(out)
    }

    /// Moves a rollout from one of `from` to `to`; false if it was in none.
    fn set_rollout_state(
        &self,
        id: &str,
        from: &[&str],
        to: &str,
        reason: &str,
    ) -> Result<bool, StoreError> {
        let conn = self.lock();
        let states = serde_json::to_string(from).expect("serializes");
        let n = conn.execute(
            "UPDATE rollouts SET state = ?2, reason = ?3,
                 updated_at = CAST(unixepoch('subsec') * 1000 AS INTEGER)
             WHERE id = ?1 AND state IN (SELECT value FROM json_each(?4))",
            params![id, to, reason, states],
        )?;
        Ok(n == 1)
    }

    fn advance_rollout(&self, id: &str, from: usize, to: usize) -> Result<bool, StoreError> {
        let conn = self.lock();
        let n = conn.execute(
            "UPDATE rollouts SET wave = ?3 WHERE id = ?1 AND wave = ?2 AND state = 'running'",
            params![id, from as i64, to as i64],
        )?;
        Ok(n == 1)
    }

    fn record_rollout_command(
        &self,
        id: &str,
        node: &str,
        column: &'static str,
        command_id: &str,
    ) -> Result<(), StoreError> {
        let conn = self.lock();
        let sql = match column {
            "rollback_id" => {
                "UPDATE rollout_nodes SET rollback_id = ?3 WHERE rollout_id = ?1 AND node_id = ?2"
            }
            _ => "UPDATE rollout_nodes SET command_id = ?3 WHERE rollout_id = ?1 AND node_id = ?2",
        };
        conn.execute(sql, params![id, node, command_id])?;
        Ok(())
    }

    fn skip_rollout_node(&self, id: &str, node: &str) -> Result<(), StoreError> {
        self.lock().execute(
            "UPDATE rollout_nodes SET skipped = 1 WHERE rollout_id = ?1 AND node_id = ?2",
            params![id, node],
        )?;
        Ok(())
    }

    /// Cancels a command still waiting for dispatch; false if it has left.
    fn cancel_pending_command(&self, command_id: &str) -> Result<bool, StoreError> {
        let n = self.lock().execute(
            "UPDATE commands SET state = 'expired', reason = ?2,
                 result_at = CAST(unixepoch('subsec') * 1000 AS INTEGER),
                 updated_at = CAST(unixepoch('subsec') * 1000 AS INTEGER)
             WHERE id = ?1 AND state = 'pending'",
            params![command_id, CANCELLED],
        )?;
        Ok(n == 1)
    }
}

/// What the operator asks of a rollout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    Pause,
    Resume,
    Abort { rollback: bool },
}

/// Applies an operator's change. Returns the nodes that were sent a
/// rollback (with `abort --rollback`).
pub fn change(
    store: &Store,
    key: &ring::signature::Ed25519KeyPair,
    id: &str,
    change: Change,
) -> Result<Vec<String>, TxError> {
    let rollout = store.rollout(id)?.ok_or_else(|| {
        refused(format!(
            "no rollout {id}: see better-compute rollouts status"
        ))
    })?;
    let moved = match change {
        Change::Pause => store.set_rollout_state(id, &["running"], "paused", "paused")?,
        Change::Resume => store.set_rollout_state(id, &["paused", "halted"], "running", "")?,
        Change::Abort { .. } => store.set_rollout_state(
            id,
            &["running", "paused", "halted"],
            "aborted",
            "aborted by an operator",
        )?,
    };
    if !moved {
        return Err(refused(format!(
            "rollout {id} is {}: cannot {}",
            rollout.state,
            match change {
                Change::Pause => "pause it",
                Change::Resume => "resume it",
                Change::Abort { .. } => "abort it",
            }
        )));
    }
    let Change::Abort { rollback } = change else {
        return Ok(Vec::new());
    };
    let mut rolled_back = Vec::new();
    for n in &rollout.nodes {
        let (Some(cmd), Some(state)) = (&n.command_id, &n.command_state) else {
            continue;
        };
        if state == "pending" && store.cancel_pending_command(cmd)? {
            continue;
        }
        // Re-read: a command may have finished since.
        let now_state = store.get_command(cmd)?.map(|c| c.state);
        let in_flight = matches!(
            now_state.as_deref(),
            Some("dispatched" | "acked" | "running")
        );
        if rollback && in_flight {
            let (row, _) = crate::commands::create_signed(
                store,
                key,
                &n.node_id,
                Kind::DaemonRollback,
                command_payload::Args::None(NoArgs {}),
                &format!("roll back release {}", rollout.sequence),
                UPGRADE_NOT_AFTER,
                0,
                Some(&format!("rollout:{id}:{}:rollback", n.node_id)),
            )?;
            store.record_rollout_command(id, &n.node_id, "rollback_id", &row.id)?;
            rolled_back.push(n.node_id.clone());
        }
    }
    Ok(rolled_back)
}

/// One pass of the controller over the running rollouts. Returns the nodes
/// given a command (the gateway wakes their sessions).
pub fn tick(store: &Store, key: &ring::signature::Ed25519KeyPair) -> Result<Vec<String>, TxError> {
    let mut woken = Vec::new();
    let running: Vec<String> = store
        .list_rollouts()?
        .into_iter()
        .filter(|r| r.state == "running")
        .map(|r| r.id)
        .collect();
    for id in running {
        let Some(r) = store.rollout(&id)? else {
            continue;
        };
        let statuses: Vec<NodeStatus> = r.nodes.iter().map(|n| n.status).collect();
        match decide(&r.waves, r.wave, r.max_failures, &statuses) {
            Step::Issue(positions) => {
                for i in positions {
                    let n = &r.nodes[i];
                    if n.release_floor >= r.sequence {
                        store.skip_rollout_node(&id, &n.node_id)?;
                        continue;
                    }
                    let (row, created) = crate::commands::create_signed(
                        store,
                        key,
                        &n.node_id,
                        Kind::DaemonUpgrade,
                        command_payload::Args::Upgrade(UpgradeArgs {
                            sequence: r.sequence,
                        }),
                        &format!("release {}", r.sequence),
                        UPGRADE_NOT_AFTER,
                        0,
                        Some(&format!("rollout:{id}:{}", n.node_id)),
                    )?;
                    store.record_rollout_command(&id, &n.node_id, "command_id", &row.id)?;
                    if created {
                        info!(rollout = %id, node = %n.node_id, cmd = %row.id, "upgrade issued");
                        woken.push(n.node_id.clone());
                    }
                }
            }
            Step::Advance(to) => {
                if store.advance_rollout(&id, r.wave, to)? {
                    info!(rollout = %id, wave = to, pct = r.waves[to], "next wave");
                }
            }
            Step::Halt(reason) => {
                if store.set_rollout_state(&id, &["running"], "halted", &reason)? {
                    warn!(rollout = %id, %reason, "rollout halted");
                }
            }
            Step::Done => {
                if store.set_rollout_state(&id, &["running"], "done", "")? {
                    info!(rollout = %id, "rollout done");
                }
            }
            Step::Wait => {}
        }
    }
    Ok(woken)
}

#[cfg(test)]
mod tests {
    use super::*;
    use NodeStatus::*;

    #[test]
    fn waves_round_up_and_cover_everyone_at_100() {
        assert_eq!(wave_end(1000, 1), 10);
        assert_eq!(wave_end(10, 1), 1);
        assert_eq!(wave_end(10, 15), 2);
        assert_eq!(wave_end(10, 100), 10);
        assert_eq!(wave_end(0, 50), 0);
        assert_eq!(
            parse_waves("1%,10%,50%,100%").unwrap(),
            vec![1, 10, 50, 100]
        );
        assert_eq!(parse_waves("100").unwrap(), vec![100]);
        for bad in ["", "10%,5%,100%", "1%,50%", "0%,100%", "x,100%"] {
            assert!(parse_waves(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_wave_issues_then_waits_then_advances() {
        let waves = [10, 100];
        let mut nodes = vec![Waiting; 10];
        assert_eq!(decide(&waves, 0, 0, &nodes), Step::Issue(vec![0]));
        nodes[0] = Upgrading;
        assert_eq!(decide(&waves, 0, 0, &nodes), Step::Wait);
        nodes[0] = Confirmed;
        assert_eq!(decide(&waves, 0, 0, &nodes), Step::Advance(1));
        assert_eq!(decide(&waves, 1, 0, &nodes), Step::Issue((1..10).collect()));
        for n in &mut nodes[1..] {
            *n = Confirmed;
        }
        nodes[3] = Skipped;
        assert_eq!(decide(&waves, 1, 0, &nodes), Step::Done);
    }

    #[test]
    fn the_failure_budget_halts() {
        let waves = [50, 100];
        let mut nodes = vec![Waiting; 4];
        nodes[0] = Failed;
        nodes[1] = Upgrading;
        assert_eq!(decide(&waves, 0, 1, &nodes), Step::Wait, "within budget");
        nodes[1] = Failed;
        assert!(matches!(decide(&waves, 0, 1, &nodes), Step::Halt(_)));
        // Nodes past the halted wave never got anything.
        assert_eq!(nodes[2], Waiting);
    }

    #[test]
    fn command_states_map_to_statuses() {
        assert_eq!(NodeStatus::of_command(None, ""), Waiting);
        for s in ["pending", "dispatched", "acked", "running"] {
            assert_eq!(NodeStatus::of_command(Some(s), ""), Upgrading);
        }
        assert_eq!(NodeStatus::of_command(Some("succeeded"), ""), Confirmed);
        assert_eq!(
            NodeStatus::of_command(Some("failed"), "update-failed"),
            Failed
        );
        assert_eq!(
            NodeStatus::of_command(Some("expired"), CANCELLED),
            Cancelled
        );
    }

    #[test]
    fn selectors() {
        let n = Candidate {
            node_id: "n1".into(),
            hostname: "gpu-a-07".into(),
            version: "0.1.0".into(),
        };
        assert!(selects("", &n).unwrap());
        assert!(selects("all", &n).unwrap());
        assert!(selects("hostname=gpu-a-*", &n).unwrap());
        assert!(selects("hostname=*-07,version=0.1.0", &n).unwrap());
        assert!(!selects("hostname=gpu-b-*", &n).unwrap());
        assert!(!selects("node=n2", &n).unwrap());
        assert!(selects("rack=1", &n).is_err());
        assert!(selects("hostname", &n).is_err());
        assert!(glob("*", ""));
        assert!(glob("a*b*c", "aXbYc"));
        assert!(!glob("a*b", "ab-"));
    }

    fn store() -> (tempfile::TempDir, Store) {
        let d = tempfile::tempdir().unwrap();
        let s = Store::open(&d.path().join("store.db")).unwrap();
        (d, s)
    }

    #[test]
    fn a_rollout_needs_a_release_and_a_node() {
        let (_d, s) = store();
        let err = s.start_rollout(3, "", &[100], 0).unwrap_err();
        assert!(err.to_string().contains("no release 3"), "{err}");
    }
}
