//! The fleet invariants, checked after every simulated run and on a live
//! store (`better-compute check`).
//!
//! Each checker is a pure function over a [`Snapshot`]: the store's audit
//! history (written by triggers as each change commits, see
//! `bc_store::audit`),
//! its current tables, and what the nodes themselves recorded (side effects
//! counted outside the journal, server time marks sampled during a run).
//! A checker returns the violations it found, each a sentence naming what
//! broke.
//!
//! - I1 single route: a node's epochs only rise, each route was written by a
//!   gateway holding its lease at that moment, and the current route carries
//!   the highest epoch.
//! - I2 exactly once: at most one terminal result per command; a side
//!   effect that is not retry-safe ran at most once, and exactly once for a
//!   command that succeeded.
//! - I3 no double booking: no GPU in two active bindings of one node.
//! - I4 server clock: unreachable only after the node lease TTL (plus the
//!   gateway-loss grace) on the store's clock; disconnected for gateway
//!   loss only once that gateway's lease had expired; no node ever seen
//!   later than the store's now when the sighting was written (a gateway
//!   writing its own clock's times, running ahead, would show as one).
//! - I5 nothing released: no command ends and no binding changes for
//!   liveness while the node is away.
//! - I6 latency: measured by benchmarks, not checked.
//! - I7 convergence: every command is terminal or waits for a node that is
//!   not connected (or was created within the settling window); every
//!   connected node applied its desired generation and is routed to a
//!   gateway with a live lease.
//! - I8 monotonic: epochs, spec generations, release floors and the nodes'
//!   server time marks never move backward.
//!
//! And what a restart must leave behind (checked the same way):
//!
//! - audit_chain_intact: each of the audit history's hash chains is
//!   unbroken up to its head (`bc_store::audit::verify_chain`): no record
//!   edited, removed or written around the store.
//! - no orphaned lease: no lease (gateway or controller) has been dead for
//!   longer than the gateway-loss grace plus a node lease: the process that
//!   held it is gone, and reconcile (at every start, and on each sweep)
//!   clears such leases.
//! - no stranded command: no command waits, non-terminal, for a node the
//!   store no longer knows (no route can ever carry it).
//! - RS results signed: every finished command's result is one its node
//!   signed (verified from the bytes kept with it against a certificate
//!   the fleet CA issued the node), or an ending only the control plane
//!   writes (`crate::evidence`); a result a gateway wrote into the row is
//!   named. Checked where the fleet CA's certificate is at hand.
//! - BK every backup state legal: each set is CREATING (not eligible, not
//!   finished), COMPLETE (eligible, finished, no reason) or FAILED (not
//!   eligible, finished, with a reason); its audited history starts at
//!   CREATING and leaves it once, to COMPLETE or FAILED.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use bc_store::{CommandId, NodeId, Store, StoreError};
use serde::Serialize;

pub use bc_store::audit::{
    AuditRow as Audit, BindingFact as Binding, CommandFact as Command, SessionFact as Session,
};
pub use bc_store::backups::BackupRow as Backup;

/// What the nodes recorded themselves.
#[derive(Debug, Clone, Default)]
pub struct NodeFacts {
    /// Side effects counted outside the journal, by command id.
    pub effects: BTreeMap<String, u32>,
    /// Commands whose effects were counted (the rest ran nothing countable).
    pub counted: BTreeSet<String>,
    /// Server time marks sampled during the run, by node, in order.
    pub marks: BTreeMap<String, Vec<i64>>,
}

/// The liveness timings the store ran with.
#[derive(Debug, Clone, Copy)]
pub struct Timings {
    pub node_lease_ttl: Duration,
    pub gateway_loss_grace: Duration,
}

#[derive(Debug, Clone)]
pub struct Snapshot {
    pub now: i64,
    pub audit: Vec<Audit>,
    /// Every audit chain's head.
    pub heads: Vec<bc_store::audit::ChainHead>,
    /// Every lease: name → (owner, expiry).
    pub all_leases: BTreeMap<String, (String, i64)>,
    pub nodes: BTreeSet<String>,
    pub sessions: Vec<Session>,
    /// Gateway id → lease expiry.
    pub leases: BTreeMap<String, i64>,
    pub commands: Vec<Command>,
    pub bindings: Vec<Binding>,
    /// Node → desired spec generation.
    pub desired: BTreeMap<String, u64>,
    /// Node → applied spec generation it reported.
    pub applied: BTreeMap<String, u64>,
    pub backups: Vec<Backup>,
    /// Each finished command's evidence (`None`: no fleet CA to judge by).
    pub results: Option<Vec<(CommandId, NodeId, crate::evidence::Evidence)>>,
    pub timings: Timings,
    /// Commands created within this window may still be on their way.
    pub settle: Duration,
    pub facts: NodeFacts,
}

#[derive(Debug, Clone, Serialize)]
pub struct Outcome {
    pub name: &'static str,
    pub title: &'static str,
    pub checked: usize,
    /// What `checked` counts.
    pub what: &'static str,
    pub violations: Vec<String>,
}

impl Outcome {
    pub fn held(&self) -> bool {
        self.violations.is_empty()
    }
}

const TERMINAL: [&str; 4] = ["succeeded", "failed", "expired", "rejected"];

fn ms(d: Duration) -> i64 {
    d.as_millis() as i64
}

/// Each gateway's lease writes, in audit order: (audit id, expiry).
struct Leases(BTreeMap<String, Vec<(i64, i64)>>);

impl Leases {
    fn new(audit: &[Audit]) -> Leases {
        let mut m: BTreeMap<String, Vec<(i64, i64)>> = BTreeMap::new();
        for a in audit.iter().filter(|a| a.kind == "lease") {
            m.entry(a.gateway_id.to_string())
                .or_default()
                .push((a.id, a.value));
        }
        Leases(m)
    }

    /// The expiry of `gateway`'s latest lease write before audit row
    /// `before`.
    fn at(&self, gateway: &str, before: i64) -> Option<i64> {
        let rows = self.0.get(gateway)?;
        let i = rows.partition_point(|(id, _)| *id < before);
        (i > 0).then(|| rows[i - 1].1)
    }
}

fn by_node(audit: &[Audit]) -> BTreeMap<&str, Vec<&Audit>> {
    let mut m: BTreeMap<&str, Vec<&Audit>> = BTreeMap::new();
    for a in audit.iter().filter(|a| !a.node_id.is_empty()) {
        m.entry(a.node_id.as_str()).or_default().push(a);
    }
    m
}

pub fn i1(s: &Snapshot) -> Outcome {
    let mut v = Vec::new();
    let mut checked = 0;
    let leases = Leases::new(&s.audit);
    let nodes = by_node(&s.audit);
    for (node, rows) in &nodes {
        let mut last: Option<u64> = None;
        for r in rows.iter().filter(|r| r.kind == "route") {
            checked += 1;
            if let Some(e) = last
                && r.epoch <= e
            {
                v.push(format!(
                    "node {node}: routed at epoch {} by {} after epoch {e}",
                    r.epoch, r.gateway_id
                ));
            }
            last = Some(r.epoch);
            match leases.at(&r.gateway_id, r.id) {
                Some(expires) if expires >= r.at => {}
                _ => v.push(format!(
                    "node {node}: gateway {} routed it (epoch {}) without holding its lease",
                    r.gateway_id, r.epoch
                )),
            }
        }
        if let (Some(e), Some(cur)) = (last, s.sessions.iter().find(|x| x.node_id == *node))
            && cur.epoch != e
        {
            v.push(format!(
                "node {node}: its session carries epoch {}, its last route epoch {e}",
                cur.epoch
            ));
        }
    }
    Outcome {
        name: "I1",
        title: "single route",
        checked,
        what: "routes",
        violations: v,
    }
}

/// Kinds whose side effect may run more than once.
fn retry_safe(kind: &str) -> bool {
    bcd_core::command::Kind::parse(kind).is_some_and(|k| k.retry_safe())
}

pub fn i2(s: &Snapshot) -> Outcome {
    let mut v = Vec::new();
    let mut results: BTreeMap<String, u32> = BTreeMap::new();
    for a in s.audit.iter().filter(|a| a.kind == "result") {
        let id = serde_json::from_str::<serde_json::Value>(&a.detail)
            .ok()
            .and_then(|d| d["command"].as_str().map(String::from))
            .unwrap_or_default();
        *results.entry(id).or_default() += 1;
    }
    for (id, n) in &results {
        if *n > 1 {
            v.push(format!("command {id}: {n} terminal results"));
        }
    }
    for c in &s.commands {
        if !s.facts.counted.contains(c.id.as_str()) {
            continue;
        }
        let n = s.facts.effects.get(c.id.as_str()).copied().unwrap_or(0);
        if n > 1 && !retry_safe(&c.kind) {
            v.push(format!(
                "command {} ({}): its side effect ran {n} times",
                c.id, c.kind
            ));
        }
        if c.state == "succeeded" && c.exit_code == Some(0) && n == 0 {
            v.push(format!(
                "command {} succeeded but its side effect never ran",
                c.id
            ));
        }
    }
    Outcome {
        name: "I2",
        title: "exactly once",
        checked: s.commands.len(),
        what: "commands",
        violations: v,
    }
}

pub fn i3(s: &Snapshot) -> Outcome {
    let mut v = Vec::new();
    let mut held: BTreeMap<(&str, &str), &str> = BTreeMap::new();
    for b in s.bindings.iter().filter(|b| b.state == "active") {
        for g in &b.gpus {
            if let Some(other) = held.insert((&b.node_id, g), &b.allocation_id)
                && other != b.allocation_id
            {
                v.push(format!(
                    "node {}: GPU {g} is bound to {other} and {}",
                    b.node_id, b.allocation_id
                ));
            }
        }
    }
    Outcome {
        name: "I3",
        title: "no double booking",
        checked: s.bindings.len(),
        what: "bindings",
        violations: v,
    }
}

pub fn i4(s: &Snapshot) -> Outcome {
    let mut v = Vec::new();
    let mut checked = 0;
    let leases = Leases::new(&s.audit);
    let ttl = ms(s.timings.node_lease_ttl);
    let grace = ms(s.timings.gateway_loss_grace);
    for a in &s.audit {
        if matches!(a.kind.as_str(), "route" | "disconnected" | "unreachable") {
            checked += 1;
            if a.value > a.at {
                v.push(format!(
                    "node {}: seen {} ms in the store's future ({} by {})",
                    a.node_id,
                    a.value - a.at,
                    a.kind,
                    a.gateway_id
                ));
            }
        }
        match a.kind.as_str() {
            "unreachable" => {
                checked += 1;
                let need = ttl + if a.detail == "gateway-lost" { grace } else { 0 };
                if a.at - a.value < need {
                    v.push(format!(
                        "node {}: unreachable {} ms after it was last seen; the rule is {need} ms",
                        a.node_id,
                        a.at - a.value
                    ));
                }
            }
            "disconnected" if a.detail == "gateway-lost" => {
                checked += 1;
                if let Some(expires) = leases.at(&a.gateway_id, a.id)
                    && expires >= a.at
                {
                    v.push(format!(
                        "node {}: disconnected for gateway loss while {}'s lease ran {} ms more",
                        a.node_id,
                        a.gateway_id,
                        expires - a.at
                    ));
                }
            }
            _ => {}
        }
    }
    Outcome {
        name: "I4",
        title: "server clock",
        checked,
        what: "liveness transitions",
        violations: v,
    }
}

pub fn i5(s: &Snapshot) -> Outcome {
    let mut v = Vec::new();
    let mut checked = 0;
    for (node, rows) in by_node(&s.audit) {
        let mut away = false;
        for r in rows {
            match r.kind.as_str() {
                "disconnected" | "unreachable" => away = true,
                "route" => away = false,
                "binding" if away => v.push(format!(
                    "node {node}: a binding changed while the node was away ({})",
                    r.detail
                )),
                _ => {}
            }
            checked += 1;
        }
    }
    for c in &s.commands {
        let r = c.reason.to_ascii_lowercase();
        if TERMINAL.contains(&c.state.as_str())
            && ["unreachable", "disconnected", "lease"]
                .iter()
                .any(|w| r.contains(w))
        {
            v.push(format!(
                "command {}: ended {} for liveness ({})",
                c.id, c.state, c.reason
            ));
        }
    }
    Outcome {
        name: "I5",
        title: "nothing released",
        checked,
        what: "results and binding changes",
        violations: v,
    }
}

pub fn i7(s: &Snapshot) -> Outcome {
    let mut v = Vec::new();
    let connected: BTreeMap<&str, &Session> = s
        .sessions
        .iter()
        .filter(|x| x.state == "connected")
        .map(|x| (x.node_id.as_str(), x))
        .collect();
    for c in &s.commands {
        if TERMINAL.contains(&c.state.as_str()) {
            continue;
        }
        let recent = s.now - c.created_at < ms(s.settle);
        if connected.contains_key(c.node_id.as_str()) && !recent {
            v.push(format!(
                "command {} is still {} for connected node {}",
                c.id, c.state, c.node_id
            ));
        }
    }
    for (node, sess) in &connected {
        if let Some(want) = s.desired.get(*node) {
            let have = s.applied.get(*node).copied().unwrap_or(0);
            if have != *want {
                v.push(format!(
                    "node {node}: applied generation {have}, desired {want}"
                ));
            }
        }
        if s.leases
            .get(sess.gateway_id.as_str())
            .is_none_or(|e| *e < s.now)
        {
            v.push(format!(
                "node {node}: connected through {}, which holds no live lease",
                sess.gateway_id
            ));
        }
    }
    Outcome {
        name: "I7",
        title: "convergence",
        checked: s.commands.len() + connected.len(),
        what: "commands and connected nodes",
        violations: v,
    }
}

pub fn i8(s: &Snapshot) -> Outcome {
    let mut v = Vec::new();
    let mut checked = 0;
    for (node, rows) in by_node(&s.audit) {
        for kind in ["generation", "floor"] {
            let mut last: Option<i64> = None;
            for r in rows.iter().filter(|r| r.kind == kind) {
                checked += 1;
                if let Some(l) = last
                    && r.value < l
                {
                    v.push(format!("node {node}: {kind} went from {l} to {}", r.value));
                }
                last = Some(r.value);
            }
        }
    }
    for (node, marks) in &s.facts.marks {
        for w in marks.windows(2) {
            checked += 1;
            if w[1] < w[0] {
                v.push(format!(
                    "node {node}: server time mark went back from {} to {}",
                    w[0], w[1]
                ));
            }
        }
    }
    // Epochs are I1's first rule; they count here too.
    Outcome {
        name: "I8",
        title: "monotonic",
        checked,
        what: "generations, floors and time marks",
        violations: v,
    }
}

pub fn audit_chain(s: &Snapshot) -> Outcome {
    Outcome {
        name: "AC",
        title: "audit_chain_intact",
        checked: s.audit.len(),
        what: "audit records",
        violations: bc_store::audit::verify_chain(&s.audit, &s.heads),
    }
}

pub fn orphaned_leases(s: &Snapshot) -> Outcome {
    let dead_for = ms(s.timings.gateway_loss_grace) + ms(s.timings.node_lease_ttl);
    let violations = s
        .all_leases
        .iter()
        .filter(|(_, (_, expires))| s.now - expires > dead_for)
        .map(|(name, (owner, expires))| {
            format!(
                "lease {name}: held by {owner}, dead for {} s and never cleared",
                (s.now - expires) / 1000
            )
        })
        .collect();
    Outcome {
        name: "OL",
        title: "no orphaned lease",
        checked: s.all_leases.len(),
        what: "leases",
        violations,
    }
}

pub fn stranded_commands(s: &Snapshot) -> Outcome {
    let open: Vec<&Command> = s
        .commands
        .iter()
        .filter(|c| !TERMINAL.contains(&c.state.as_str()))
        .collect();
    let violations = open
        .iter()
        .filter(|c| !s.nodes.contains(c.node_id.as_str()))
        .map(|c| {
            format!(
                "command {} is still {} for node {}, which the store no longer knows",
                c.id, c.state, c.node_id
            )
        })
        .collect();
    Outcome {
        name: "SC",
        title: "no stuck command",
        checked: open.len(),
        what: "open commands",
        violations,
    }
}

pub fn backups(s: &Snapshot) -> Outcome {
    use bc_store::backups::{COMPLETE, CREATING, FAILED, STATES};
    let mut v = Vec::new();
    let mut checked = 0;
    for b in &s.backups {
        checked += 1;
        let id = &b.id;
        if !STATES.contains(&b.state.as_str()) {
            v.push(format!(
                "backup {id}: state {:?} is not a backup state",
                b.state
            ));
            continue;
        }
        let finished = b.finished_at.is_some();
        let legal = match b.state.as_str() {
            CREATING => !b.restore_eligible && !finished && b.reason.is_empty(),
            COMPLETE => b.restore_eligible && finished && b.reason.is_empty(),
            _ => !b.restore_eligible && finished && !b.reason.is_empty(),
        };
        if !legal {
            v.push(format!(
                "backup {id}: {}{} with restore eligible {} and {}",
                b.state,
                if b.reason.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", b.reason)
                },
                b.restore_eligible,
                if finished {
                    "a finish time"
                } else {
                    "no finish time"
                }
            ));
        }
        if b.finished_at.is_some_and(|f| f < b.created_at) {
            v.push(format!("backup {id}: finished before it was created"));
        }
    }
    // The history: CREATING first, then at most one move out of it.
    let mut seen: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for a in s.audit.iter().filter(|a| a.kind == "backup") {
        let d: serde_json::Value = serde_json::from_str(&a.detail).unwrap_or_default();
        let id = d["backup"].as_str().unwrap_or_default().to_string();
        let state = d["state"].as_str().unwrap_or_default().to_string();
        checked += 1;
        let states = seen.entry(id.clone()).or_default();
        let ok = match states.last().map(String::as_str) {
            None => state == CREATING,
            Some(CREATING) => state == COMPLETE || state == FAILED,
            Some(_) => false,
        };
        if !ok {
            v.push(format!(
                "backup {id}: went to {state} after {}",
                if states.is_empty() {
                    "nothing".to_string()
                } else {
                    states.join(", ")
                }
            ));
        }
        if state == COMPLETE && a.value != 1 || state != COMPLETE && a.value != 0 {
            v.push(format!(
                "backup {id}: recorded {state} with restore eligible {}",
                a.value
            ));
        }
        states.push(state);
    }
    Outcome {
        name: "BK",
        title: "backup state legal",
        checked,
        what: "backups and their moves",
        violations: v,
    }
}

/// RS: every finished command's result rests on its node's signature or
/// the control plane's own ending.
pub fn results_signed(s: &Snapshot) -> Outcome {
    let (checked, what, violations) = match &s.results {
        None => (
            0,
            "results (no fleet CA certificate here: pass the key holder's --data-dir)",
            Vec::new(),
        ),
        Some(results) => (
            results.len(),
            match results
                .iter()
                .filter(|(_, _, e)| *e == crate::evidence::Evidence::Legacy)
                .count()
            {
                0 => "results",
                _ => "results (some finished before results were signed: believed as their rows)",
            },
            results
                .iter()
                .filter_map(|(id, node, e)| match e {
                    crate::evidence::Evidence::Forged(why) => {
                        Some(format!("command {id} of node {node}: forged: {why}"))
                    }
                    _ => None,
                })
                .collect(),
        ),
    };
    Outcome {
        name: "RS",
        title: "results signed",
        checked,
        what,
        violations,
    }
}

/// Every checker, in order.
pub fn all(s: &Snapshot) -> Vec<Outcome> {
    vec![
        i1(s),
        i2(s),
        i3(s),
        i4(s),
        i5(s),
        i7(s),
        i8(s),
        audit_chain(s),
        orphaned_leases(s),
        stranded_commands(s),
        results_signed(s),
        backups(s),
    ]
}

/// Reads a snapshot from the store, in one read (alongside live gateways),
/// and judges every finished command's result against the fleet CA
/// `ca_der` (when there is one to judge by).
pub async fn snapshot(
    store: &Store,
    timings: Timings,
    settle: Duration,
    facts: NodeFacts,
    ca_der: Option<&[u8]>,
) -> Result<Snapshot, StoreError> {
    let a = store.audit_snapshot().await?;
    let results = match ca_der {
        None => None,
        Some(ca) => Some(judge_results(store, &a.commands, ca).await?),
    };
    Ok(Snapshot {
        now: a.now,
        audit: a.audit,
        heads: a.heads,
        all_leases: a.all_leases,
        nodes: a.nodes,
        sessions: a.sessions,
        leases: a.leases,
        commands: a.commands,
        bindings: a.bindings,
        desired: a.desired,
        applied: a.applied,
        backups: a.backups,
        results,
        timings,
        settle,
        facts,
    })
}

/// The evidence of each finished command among `commands`.
async fn judge_results(
    store: &Store,
    commands: &[Command],
    ca_der: &[u8],
) -> Result<Vec<(CommandId, NodeId, crate::evidence::Evidence)>, StoreError> {
    let finished: BTreeSet<&str> = commands
        .iter()
        .filter(|c| TERMINAL.contains(&c.state.as_str()))
        .map(|c| c.id.as_str())
        .collect();
    let mut certs: BTreeMap<NodeId, Vec<Vec<u8>>> = BTreeMap::new();
    let mut out = Vec::new();
    for row in store.list_commands(None, u32::MAX).await? {
        if !finished.contains(row.id.as_str()) {
            continue;
        }
        if !certs.contains_key(&row.node_id) {
            let found = store.node_certificates(&row.node_id).await?;
            certs.insert(row.node_id.clone(), found);
        }
        let e = crate::evidence::judge(&row, &certs[&row.node_id], ca_der);
        out.push((row.id, row.node_id, e));
    }
    Ok(out)
}

/// The fleet CA's certificate (DER) in a key holder's data directory, if
/// it is there.
pub fn fleet_ca(data_dir: &std::path::Path) -> Option<Vec<u8>> {
    use rustls_pki_types::pem::PemObject;
    let pem = std::fs::read(data_dir.join("ca.crt")).ok()?;
    rustls_pki_types::CertificateDer::from_pem_slice(&pem)
        .ok()
        .map(|c| c.to_vec())
}

/// One line per invariant: `I1 single route: held (1234 checked)`.
pub fn render(outcomes: &[Outcome]) -> String {
    let mut out = String::new();
    for o in outcomes {
        if o.held() {
            out.push_str(&format!(
                "{} {:<18} held ({} {} checked)\n",
                o.name, o.title, o.checked, o.what
            ));
        } else {
            out.push_str(&format!(
                "{} {:<18} VIOLATED {} times ({} {} checked)\n",
                o.name,
                o.title,
                o.violations.len(),
                o.checked,
                o.what
            ));
            for line in o.violations.iter().take(10) {
                out.push_str(&format!("   - {line}\n"));
            }
            if o.violations.len() > 10 {
                out.push_str(&format!("   - ... {} more\n", o.violations.len() - 10));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn audit(id: i64, at: i64, node: &str, kind: &str) -> Audit {
        Audit {
            id,
            chain: 0,
            seq: 0,
            at,
            node_id: node.into(),
            kind: kind.into(),
            epoch: 0,
            gateway_id: bc_store::GatewayId::default(),
            value: 0,
            detail: String::new(),
            prev_hash: String::new(),
            hash: String::new(),
        }
    }

    /// Seals `s.audit` into the chains in its order, as the store does.
    fn seal(s: &mut Snapshot) {
        s.heads = heads();
        for (i, r) in s.audit.iter_mut().enumerate() {
            r.id = i as i64 + 1;
            r.chain = bc_store::audit::chain_of(&r.node_id, &r.gateway_id);
            let head = &mut s.heads[r.chain as usize];
            r.seq = head.seq + 1;
            r.prev_hash = head.hash.clone();
            r.hash = r.expected_hash();
            head.seq = r.seq;
            head.hash = r.hash.clone();
        }
    }

    /// Every chain's head, with no record yet.
    fn heads() -> Vec<bc_store::audit::ChainHead> {
        (0..=bc_store::audit::AUDIT_CHAINS)
            .map(|chain| bc_store::audit::ChainHead {
                chain,
                seq: 0,
                hash: bc_store::audit::GENESIS.into(),
            })
            .collect()
    }

    fn route(id: i64, at: i64, node: &str, epoch: u64, gw: &str) -> Audit {
        Audit {
            epoch,
            gateway_id: gw.into(),
            ..audit(id, at, node, "route")
        }
    }

    fn lease(id: i64, at: i64, gw: &str, expires: i64) -> Audit {
        Audit {
            gateway_id: gw.into(),
            value: expires,
            ..audit(id, at, "", "lease")
        }
    }

    fn empty() -> Snapshot {
        Snapshot {
            now: 100_000,
            audit: vec![],
            heads: heads(),
            all_leases: BTreeMap::new(),
            nodes: BTreeSet::new(),
            sessions: vec![],
            leases: BTreeMap::new(),
            commands: vec![],
            bindings: vec![],
            desired: BTreeMap::new(),
            applied: BTreeMap::new(),
            backups: vec![],
            results: Some(vec![]),
            timings: Timings {
                node_lease_ttl: Duration::from_secs(40),
                gateway_loss_grace: Duration::from_secs(120),
            },
            settle: Duration::from_secs(5),
            facts: NodeFacts::default(),
        }
    }

    /// A clean history: every checker holds.
    fn clean() -> Snapshot {
        let mut s = empty();
        s.audit = vec![
            lease(1, 1_000, "gw-a", 21_000),
            route(2, 1_100, "n1", 1, "gw-a"),
            lease(3, 30_000, "gw-b", 50_000),
            route(4, 30_100, "n1", 2, "gw-b"),
        ];
        s.sessions = vec![Session {
            node_id: "n1".into(),
            epoch: 2,
            gateway_id: "gw-b".into(),
            state: "connected".into(),
        }];
        s.leases.insert("gw-b".into(), 120_000);
        s.all_leases
            .insert("gateway:gw-b".into(), ("gw-b".into(), 120_000));
        s.nodes.insert("n1".into());
        seal(&mut s);
        s
    }

    #[test]
    fn the_audit_chain_catches_an_edited_a_removed_and_a_truncated_record() {
        let s = clean();
        assert!(audit_chain(&s).held());
        // n1's two routes are records 1 and 2 of its chain.
        let (r1, r2) = (&s.audit[1], &s.audit[3]);
        assert_eq!(
            (r1.chain, r1.seq, r2.chain, r2.seq),
            (r1.chain, 1, r1.chain, 2)
        );
        let chain = r1.chain;
        let mut edited = clean();
        edited.audit[1].epoch = 7;
        let v = violated(audit_chain(&edited));
        assert!(
            v[0].contains(&format!(
                "record 1 of chain {chain} (route of node 'n1') was edited"
            )),
            "{v:?}"
        );
        let mut removed = clean();
        removed.audit.remove(1);
        let v = violated(audit_chain(&removed));
        assert!(
            v[0].contains(&format!("record 1 of chain {chain} is missing")),
            "{v:?}"
        );
        let mut truncated = clean();
        truncated.audit.pop();
        let v = violated(audit_chain(&truncated));
        assert!(v[0].contains("last records were removed"), "{v:?}");
        // Rewriting a record and its hash still breaks the next link.
        let mut rewritten = clean();
        rewritten.audit[1].epoch = 7;
        rewritten.audit[1].hash = rewritten.audit[1].expected_hash();
        let v = violated(audit_chain(&rewritten));
        assert!(
            v[0].contains(&format!("record 2 of chain {chain} does not follow")),
            "{v:?}"
        );
        // A record written around the store (never sealed).
        let mut around = clean();
        around.audit.push(audit(0, 40_000, "n1", "route"));
        let v = violated(audit_chain(&around));
        assert!(v[0].contains("never sealed"), "{v:?}");
    }

    #[test]
    fn the_audit_chain_catches_a_record_moved_inserted_or_headless() {
        let chain = bc_store::audit::chain_of("n1", "");
        // A chain none of the clean history's records is in.
        let used = ["n1", "gw-a", "gw-b"].map(|k| bc_store::audit::chain_of(k, ""));
        let other = (1..=bc_store::audit::AUDIT_CHAINS)
            .find(|c| !used.contains(c))
            .unwrap();
        // Moved to another chain, sealed there as its next record and its
        // head moved on: its own chain has a gap.
        let mut moved = clean();
        let r = &mut moved.audit[1];
        r.chain = other;
        r.seq = moved.heads[other as usize].seq + 1;
        r.prev_hash = moved.heads[other as usize].hash.clone();
        r.hash = r.expected_hash();
        moved.heads[other as usize].seq = r.seq;
        moved.heads[other as usize].hash = r.hash.clone();
        let v = violated(audit_chain(&moved));
        assert!(
            v.iter()
                .any(|v| v.contains(&format!("record 1 of chain {chain} is missing"))),
            "{v:?}"
        );
        // Relabelled without resealing: its hash names its own chain.
        let mut relabelled = clean();
        relabelled.audit[1].chain = other;
        let v = violated(audit_chain(&relabelled));
        assert!(v.iter().any(|v| v.contains("was edited")), "{v:?}");
        // A record slipped in with a number already taken.
        let mut inserted = clean();
        let mut extra = inserted.audit[3].clone();
        extra.epoch = 9;
        extra.hash = extra.expected_hash();
        inserted.audit.push(extra);
        let v = violated(audit_chain(&inserted));
        assert!(
            v.iter()
                .any(|v| v.contains(&format!("record 2 of chain {chain} appears twice"))),
            "{v:?}"
        );
        // A head removed, and its records with it: still named.
        let mut headless = clean();
        headless.audit.retain(|r| r.chain != chain);
        headless.heads.retain(|h| h.chain != chain);
        let v = violated(audit_chain(&headless));
        assert_eq!(
            v,
            vec![format!(
                "the head of audit chain {chain} is missing: it was removed"
            )]
        );
        // A record in a chain the store does not keep.
        let mut stray = clean();
        stray.audit[1].chain = bc_store::audit::AUDIT_CHAINS + 1;
        let v = violated(audit_chain(&stray));
        assert!(
            v.iter()
                .any(|v| v.contains("which the store does not keep")),
            "{v:?}"
        );
    }

    #[test]
    fn records_sealed_in_the_single_chain_stay_verifiable() {
        // As migration 0019 leaves a history sealed before it: chain 0, in
        // the first layout, then the chains after it.
        let mut s = clean();
        let mut prev = bc_store::audit::GENESIS.to_string();
        let mut old = vec![
            lease(0, 500, "gw-a", 20_000),
            route(0, 600, "n2", 1, "gw-a"),
        ];
        for (i, r) in old.iter_mut().enumerate() {
            r.chain = bc_store::audit::SEALED_CHAIN;
            r.seq = i as i64 + 1;
            r.prev_hash = prev;
            r.hash = r.expected_hash();
            prev = r.hash.clone();
        }
        s.heads[0] = bc_store::audit::ChainHead {
            chain: 0,
            seq: 2,
            hash: prev,
        };
        s.audit.splice(0..0, old);
        assert!(audit_chain(&s).held(), "{:?}", audit_chain(&s).violations);
        let mut edited = s.clone();
        edited.audit[1].epoch = 3;
        let v = violated(audit_chain(&edited));
        assert!(v[0].contains("record 2 of chain 0"), "{v:?}");
        let mut truncated = s.clone();
        truncated.audit.remove(1);
        let v = violated(audit_chain(&truncated));
        assert!(v[0].contains("audit chain 0 ends at record 1"), "{v:?}");
    }

    #[test]
    fn a_lease_dead_past_the_grace_is_orphaned() {
        let mut s = clean();
        // Dead for 100 s: within the grace (120 s) plus a node lease (40 s).
        s.all_leases
            .insert("controller:liveness".into(), ("gw-a".into(), 0));
        assert!(orphaned_leases(&s).held());
        s.now = 161_000;
        let v = violated(orphaned_leases(&s));
        assert!(
            v[0].contains("controller:liveness") && v[0].contains("gw-a"),
            "{v:?}"
        );
    }

    #[test]
    fn an_open_command_for_a_node_the_store_forgot_is_stranded() {
        let mut s = clean();
        s.commands.push(Command {
            id: "c9".into(),
            node_id: "gone".into(),
            kind: "exec.run".into(),
            state: "pending".into(),
            reason: String::new(),
            exit_code: None,
            created_at: 0,
        });
        assert!(violated(stranded_commands(&s))[0].contains("c9"));
        s.commands[0].state = "expired".into();
        assert!(stranded_commands(&s).held());
    }

    fn violated(o: Outcome) -> Vec<String> {
        assert!(!o.held(), "{} should be violated", o.name);
        o.violations
    }

    #[test]
    fn a_clean_history_holds_every_invariant() {
        for o in all(&clean()) {
            assert!(o.held(), "{}: {:?}", o.name, o.violations);
        }
    }

    #[test]
    fn i1_catches_an_epoch_routed_twice_a_route_without_a_lease_and_a_rewound_session() {
        let mut s = clean();
        s.audit.push(route(5, 30_200, "n1", 2, "gw-a"));
        let v = violated(i1(&s));
        assert!(v.iter().any(|l| l.contains("after epoch 2")), "{v:?}");
        assert!(
            v.iter().any(|l| l.contains("without holding its lease")),
            "{v:?}"
        );
        let mut s = clean();
        s.sessions[0].epoch = 1;
        assert!(violated(i1(&s))[0].contains("carries epoch 1"));
    }

    #[test]
    fn i2_catches_two_results_and_a_side_effect_run_twice() {
        let mut s = clean();
        for id in [10, 11] {
            s.audit.push(Audit {
                detail: r#"{"command":"c1"}"#.into(),
                ..audit(id, 40_000, "n1", "result")
            });
        }
        assert!(violated(i2(&s))[0].contains("2 terminal results"));
        let mut s = clean();
        s.commands.push(Command {
            id: "c2".into(),
            node_id: "n1".into(),
            kind: "exec.run".into(),
            state: "succeeded".into(),
            reason: String::new(),
            exit_code: Some(0),
            created_at: 0,
        });
        s.facts.counted.insert("c2".into());
        s.facts.effects.insert("c2".into(), 2);
        assert!(violated(i2(&s))[0].contains("ran 2 times"));
        s.facts.effects.insert("c2".into(), 0);
        assert!(violated(i2(&s))[0].contains("never ran"));
        // A retry-safe kind may run twice.
        s.commands[0].kind = "inventory.refresh".into();
        s.facts.effects.insert("c2".into(), 2);
        assert!(i2(&s).held());
    }

    #[test]
    fn i3_catches_a_gpu_in_two_allocations() {
        let mut s = clean();
        for a in ["alloc-1", "alloc-2"] {
            s.bindings.push(Binding {
                node_id: "n1".into(),
                allocation_id: a.into(),
                gpus: vec!["GPU-1".into()],
                state: "active".into(),
            });
        }
        assert!(violated(i3(&s))[0].contains("GPU-1"));
        s.bindings[1].state = "lost".into();
        assert!(i3(&s).held());
    }

    #[test]
    fn i4_catches_early_transitions() {
        let mut s = clean();
        s.audit.push(Audit {
            value: 60_000,
            detail: "gateway-lost".into(),
            ..audit(6, 90_000, "n1", "unreachable")
        });
        assert!(violated(i4(&s))[0].contains("the rule is 160000 ms"));
        let mut s = clean();
        s.audit.push(Audit {
            gateway_id: "gw-b".into(),
            detail: "gateway-lost".into(),
            ..audit(6, 45_000, "n1", "disconnected")
        });
        assert!(violated(i4(&s))[0].contains("lease ran 5000 ms more"));
        // A gateway whose clock runs ahead, writing its own times.
        let mut s = clean();
        s.audit.push(Audit {
            gateway_id: "gw-b".into(),
            value: 47_000,
            detail: "stream-ended".into(),
            ..audit(6, 45_000, "n1", "disconnected")
        });
        assert!(violated(i4(&s))[0].contains("seen 2000 ms in the store's future"));
    }

    #[test]
    fn i5_catches_a_release_while_away() {
        let mut s = clean();
        s.audit.push(audit(6, 60_000, "n1", "disconnected"));
        s.audit.push(Audit {
            detail: r#"{"allocation":"a","state":"lost"}"#.into(),
            ..audit(7, 61_000, "n1", "binding")
        });
        assert!(violated(i5(&s))[0].contains("while the node was away"));
        let mut s = clean();
        s.commands.push(Command {
            id: "c3".into(),
            node_id: "n1".into(),
            kind: "exec.run".into(),
            state: "failed".into(),
            reason: "node unreachable".into(),
            exit_code: None,
            created_at: 0,
        });
        assert!(violated(i5(&s))[0].contains("for liveness"));
    }

    #[test]
    fn i7_catches_a_stuck_command_an_unapplied_spec_and_an_orphaned_route() {
        let mut s = clean();
        s.commands.push(Command {
            id: "c4".into(),
            node_id: "n1".into(),
            kind: "exec.run".into(),
            state: "dispatched".into(),
            reason: String::new(),
            exit_code: None,
            created_at: 0,
        });
        assert!(violated(i7(&s))[0].contains("still dispatched"));
        s.commands[0].created_at = s.now - 1_000;
        assert!(i7(&s).held(), "within the settling window");
        let mut s = clean();
        s.desired.insert("n1".into(), 3);
        s.applied.insert("n1".into(), 2);
        assert!(violated(i7(&s))[0].contains("applied generation 2"));
        let mut s = clean();
        s.leases.insert("gw-b".into(), s.now - 1);
        assert!(violated(i7(&s))[0].contains("no live lease"));
    }

    #[test]
    fn i8_catches_values_moving_back() {
        let mut s = clean();
        for (id, g) in [(6, 3), (7, 2)] {
            s.audit.push(Audit {
                value: g,
                ..audit(id, 70_000, "n1", "generation")
            });
        }
        assert!(violated(i8(&s))[0].contains("generation went from 3 to 2"));
        let mut s = clean();
        s.facts.marks.insert("n1".into(), vec![5, 9, 7]);
        assert!(violated(i8(&s))[0].contains("mark went back"));
    }

    fn backup(id: &str, state: &str, reason: &str, eligible: bool, finished: bool) -> Backup {
        Backup {
            id: id.into(),
            state: state.into(),
            reason: reason.into(),
            restore_eligible: eligible,
            created_at: 1_000,
            finished_at: finished.then_some(2_000),
            location: "/b".into(),
            host: "h".into(),
            process: "1:1".into(),
            files: 0,
            bytes: 0,
        }
    }

    fn backup_audit(id: i64, backup: &str, state: &str) -> Audit {
        Audit {
            value: i64::from(state == "COMPLETE"),
            detail: serde_json::json!({"backup": backup, "state": state}).to_string(),
            ..audit(id, 1_000 + id, "", "backup")
        }
    }

    #[test]
    fn backup_states_hold_for_legal_sets_and_catch_the_rest() {
        let mut s = clean();
        s.backups = vec![
            backup("a", "CREATING", "", false, false),
            backup("b", "COMPLETE", "", true, true),
            backup("c", "FAILED", "MANIFEST_INCOMPLETE", false, true),
        ];
        s.audit.extend([
            backup_audit(10, "a", "CREATING"),
            backup_audit(11, "b", "CREATING"),
            backup_audit(12, "b", "COMPLETE"),
            backup_audit(13, "c", "CREATING"),
            backup_audit(14, "c", "FAILED"),
        ]);
        assert!(backups(&s).held(), "{:?}", backups(&s).violations);
        assert!(render(&all(&s)).contains("BK backup state legal"));

        // A failed set made eligible, a complete one with a reason, a
        // state that is none, and a failed set completed afterwards.
        s.backups.extend([
            backup("d", "FAILED", "MANIFEST_INCOMPLETE", true, true),
            backup("e", "COMPLETE", "MANIFEST_INCOMPLETE", true, true),
            backup("f", "DONE", "", true, true),
            backup("g", "CREATING", "", true, false),
        ]);
        s.audit.push(backup_audit(15, "c", "COMPLETE"));
        let v = violated(backups(&s));
        for want in [
            "backup d: FAILED",
            "backup e: COMPLETE",
            "backup f: state \"DONE\"",
            "backup g: CREATING",
            "backup c: went to COMPLETE after CREATING, FAILED",
        ] {
            assert!(v.iter().any(|l| l.contains(want)), "{want} in {v:?}");
        }
    }

    #[test]
    fn render_names_each_invariant() {
        let text = render(&all(&clean()));
        assert!(text.contains("I1 single route"));
        assert!(text.contains("held"));
    }

    #[test]
    fn a_forged_result_is_named_and_no_ca_checks_nothing_by_saying_so() {
        use crate::evidence::Evidence;
        let mut s = empty();
        s.results = Some(vec![
            ("cmd-1".into(), "n1".into(), Evidence::NodeSigned),
            ("cmd-2".into(), "n1".into(), Evidence::Decided("why")),
            (
                "cmd-3".into(),
                "n2".into(),
                Evidence::Forged("no node signed it".into()),
            ),
        ]);
        let o = results_signed(&s);
        assert_eq!(o.checked, 3);
        assert_eq!(
            o.violations,
            vec!["command cmd-3 of node n2: forged: no node signed it".to_string()]
        );
        // A result from before results were signed is held, and said.
        s.results = Some(vec![("cmd-4".into(), "n1".into(), Evidence::Legacy)]);
        let o = results_signed(&s);
        assert!(o.held() && o.what.contains("before results were signed"));
        s.results = None;
        let o = results_signed(&s);
        assert!(o.held() && o.checked == 0 && o.what.contains("no fleet CA"));
    }
}
