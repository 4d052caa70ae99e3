use std::collections::{BTreeMap, HashMap};

use proptest::prelude::*;

use super::*;

#[test]
fn kinds_round_trip_and_declare_their_nature() {
    for k in Kind::ALL {
        assert_eq!(Kind::parse(k.name()), Some(k));
    }
    assert!(!Kind::ExecRun.retry_safe() && !Kind::ExecRun.self_terminating());
    assert!(Kind::NodeReboot.self_terminating() && Kind::BootKexec.self_terminating());
    assert!(Kind::InventoryRefresh.retry_safe());
    assert_eq!(Kind::parse("rm.rf"), None);
    for s in [
        "pending",
        "dispatched",
        "acked",
        "running",
        "succeeded",
        "failed",
        "expired",
        "rejected",
    ] {
        assert_eq!(ServerState::parse(s).unwrap().name(), s);
    }
}

fn facts(seq: u64) -> DispatchFacts {
    DispatchFacts {
        signature: Ok(()),
        node_id: "n1".into(),
        kind: Some(Kind::ExecRun),
        seq,
        issued_at_ms: 1_000,
        not_after_ms: 10_000,
        min_generation: 0,
    }
}

fn view(highest_seq: u64, now: i64) -> NodeView<'static> {
    NodeView {
        node_id: "n1",
        highest_seq,
        seq_floor: 0,
        server_now_ms: Some(now),
        applied_generation: 0,
    }
}

#[test]
fn dispatch_rules() {
    let v = view(3, 5_000);
    assert_eq!(on_dispatch(None, &facts(4), &v), OnDispatch::Accept);
    assert_eq!(
        on_dispatch(Some(&Journaled::Accepted), &facts(4), &v),
        OnDispatch::Reattach
    );
    assert_eq!(
        on_dispatch(Some(&Journaled::Done { acked: true }), &facts(4), &v),
        OnDispatch::ResendResult
    );
    let bad = DispatchFacts {
        signature: Err("no worker key verifies it".into()),
        ..facts(4)
    };
    assert!(matches!(
        on_dispatch(None, &bad, &v),
        OnDispatch::Reject(Rejection::Signature(_))
    ));
    let other = DispatchFacts {
        node_id: "n2".into(),
        ..facts(4)
    };
    assert!(matches!(
        on_dispatch(None, &other, &v),
        OnDispatch::Reject(Rejection::WrongNode(_))
    ));
    assert_eq!(
        on_dispatch(None, &facts(3), &v),
        OnDispatch::Reject(Rejection::OutOfOrder { seq: 3, highest: 3 })
    );
    let late = on_dispatch(None, &facts(4), &view(3, 10_001));
    assert_eq!(
        late,
        OnDispatch::Reject(Rejection::Expired {
            not_after_ms: 10_000
        })
    );
    let OnDispatch::Reject(r) = late else {
        unreachable!()
    };
    assert_eq!(r.outcome(), Outcome::Expired);
    let needs_gen = DispatchFacts {
        min_generation: 2,
        ..facts(4)
    };
    assert!(matches!(
        on_dispatch(None, &needs_gen, &v),
        OnDispatch::Reject(Rejection::BelowMinGeneration { min: 2, applied: 0 })
    ));
    let unknown = DispatchFacts {
        kind: None,
        ..facts(4)
    };
    assert_eq!(
        on_dispatch(None, &unknown, &v),
        OnDispatch::Reject(Rejection::UnknownKind)
    );
    // A journal lost since: the floor refuses a replay, except of a kind
    // that is safe to run again.
    let after_loss = NodeView {
        seq_floor: 4,
        ..view(0, 5_000)
    };
    assert_eq!(
        on_dispatch(None, &facts(4), &after_loss),
        OnDispatch::Reject(Rejection::Replayed { seq: 4, floor: 4 })
    );
    let refresh = DispatchFacts {
        kind: Some(Kind::InventoryRefresh),
        ..facts(3)
    };
    assert_eq!(on_dispatch(None, &refresh, &after_loss), OnDispatch::Accept);
    assert_eq!(
        on_dispatch(None, &facts(5), &after_loss),
        OnDispatch::Accept
    );
    // A command may live 24 hours, not a millisecond more.
    let day = MAX_LIFE.as_millis() as i64;
    let long = DispatchFacts {
        issued_at_ms: 0,
        not_after_ms: day + 1,
        ..facts(4)
    };
    assert_eq!(
        on_dispatch(None, &long, &v),
        OnDispatch::Reject(Rejection::TooLong { life_ms: day + 1 })
    );
    let day_long = DispatchFacts {
        issued_at_ms: 0,
        not_after_ms: day,
        ..facts(4)
    };
    assert_eq!(on_dispatch(None, &day_long, &v), OnDispatch::Accept);
    // A known command is never re-judged: a replay of an accepted command
    // is re-attached even after its not_after passed.
    assert_eq!(
        on_dispatch(
            Some(&Journaled::Running {
                boot_id: "b".into()
            }),
            &facts(4),
            &view(9, 99_999)
        ),
        OnDispatch::Reattach
    );
}

#[test]
fn recovery_rules() {
    let running = |b: &str| Journaled::Running { boot_id: b.into() };
    assert_eq!(
        recover(Some(Kind::ExecRun), &Journaled::Accepted, "b1"),
        Recovery::Run
    );
    assert_eq!(
        recover(Some(Kind::ExecRun), &running("b1"), "b2"),
        Recovery::Finish(Outcome::Failed, reason::INTERRUPTED)
    );
    assert_eq!(
        recover(Some(Kind::NodeReboot), &running("b1"), "b2"),
        Recovery::Finish(Outcome::Succeeded, reason::REBOOTED)
    );
    assert_eq!(
        recover(Some(Kind::NodeReboot), &running("b1"), "b1"),
        Recovery::Finish(Outcome::Failed, reason::INTERRUPTED)
    );
    // A daemon upgrade restarts the process on the same boot by design: the
    // update state, not the journal, says how it ended.
    assert_eq!(
        recover(Some(Kind::DaemonUpgrade), &running("b1"), "b1"),
        Recovery::Upgrade
    );
    assert_eq!(
        recover(Some(Kind::DaemonRollback), &running("b1"), "b1"),
        Recovery::Finish(Outcome::Failed, reason::INTERRUPTED)
    );
    assert_eq!(
        recover(None, &Journaled::Done { acked: false }, "b"),
        Recovery::Resend
    );
    assert_eq!(
        recover(None, &Journaled::Done { acked: true }, "b"),
        Recovery::Nothing
    );
}

#[test]
fn hello_rules() {
    use NodeReport::{Done, Unknown};
    use ServerState::{Acked, Dispatched, Terminal};
    assert_eq!(
        on_hello(Kind::ExecRun, Dispatched, Unknown, false, false),
        HelloDecision::Replay
    );
    assert_eq!(
        on_hello(Kind::ExecRun, Acked, NodeReport::Running, false, false),
        HelloDecision::KeepRunning
    );
    assert_eq!(
        on_hello(Kind::ExecRun, Acked, Done, false, true),
        HelloDecision::AwaitResult
    );
    assert_eq!(
        on_hello(Kind::ExecRun, Acked, Unknown, true, true),
        HelloDecision::Finish(Outcome::Failed, reason::JOURNAL_LOST)
    );
    assert_eq!(
        on_hello(Kind::InventoryRefresh, Acked, Unknown, true, true),
        HelloDecision::Replay
    );
    assert_eq!(
        on_hello(Kind::NodeReboot, Acked, Unknown, true, true),
        HelloDecision::Finish(Outcome::Succeeded, reason::REBOOTED)
    );
    // Never acknowledged and the node does not know it: it was not taken.
    assert_eq!(
        on_hello(Kind::NodeReboot, Dispatched, Unknown, true, true),
        HelloDecision::Finish(Outcome::Failed, reason::JOURNAL_LOST)
    );
    assert_eq!(
        apply_result(Acked, Outcome::Failed),
        Some(Terminal(Outcome::Failed))
    );
    assert_eq!(
        apply_result(Terminal(Outcome::Succeeded), Outcome::Failed),
        None
    );
}

// ----------------------------------------------------------------- model

/// One execution step of a command the node has accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    JournalRunning,
    Effect,
    JournalDone,
}

#[derive(Debug, Default)]
struct Node {
    // Durable.
    journal: BTreeMap<usize, (Journaled, Option<Outcome>)>,
    highest_seq: u64,
    /// Kept outside the journal: a lost journal keeps it.
    seq_floor: u64,
    journal_id: u32,
    boot: u32,
    // Volatile.
    up: bool,
    connected: bool,
    work: Vec<(usize, Step)>,
}

#[derive(Debug)]
struct World {
    kinds: Vec<Kind>,
    server: Vec<ServerState>,
    terminal_transitions: Vec<u32>,
    session_journal: Option<u32>,
    session_boot: Option<u32>,
    node: Node,
    effects: Vec<u32>,
}

#[derive(Debug, Clone)]
enum Op {
    Dispatch {
        lose: bool,
    },
    Step(usize),
    SendResults {
        lose: bool,
    },
    Crash,
    Reboot,
    LoseJournal,
    Reconnect,
    /// A gateway sends an earlier dispatch again, as it kept it.
    Replay(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => Just(Op::Dispatch { lose: false }),
        1 => Just(Op::Dispatch { lose: true }),
        6 => (0usize..4).prop_map(Op::Step),
        2 => prop::bool::weighted(0.2).prop_map(|lose| Op::SendResults { lose }),
        1 => Just(Op::Crash),
        1 => Just(Op::Reboot),
        1 => Just(Op::LoseJournal),
        3 => Just(Op::Reconnect),
        2 => (0usize..8).prop_map(Op::Replay),
    ]
}

impl World {
    fn new(kinds: Vec<Kind>) -> World {
        let n = kinds.len();
        World {
            kinds,
            server: vec![ServerState::Pending; n],
            terminal_transitions: vec![0; n],
            session_journal: None,
            session_boot: None,
            node: Node {
                up: true,
                ..Node::default()
            },
            effects: vec![0; n],
        }
    }

    fn boot_id(&self) -> String {
        format!("boot{}", self.node.boot)
    }

    fn server_apply(&mut self, id: usize, outcome: Outcome) {
        if let Some(s) = apply_result(self.server[id], outcome) {
            self.server[id] = s;
            self.terminal_transitions[id] += 1;
        }
    }

    fn crash(&mut self) {
        self.node.up = false;
        self.node.connected = false;
        self.node.work.clear();
    }

    /// The node receives a dispatch of command `id`.
    fn deliver(&mut self, id: usize) {
        let journaled = self.node.journal.get(&id).map(|j| j.0.clone());
        let facts = DispatchFacts {
            signature: Ok(()),
            node_id: "n1".into(),
            kind: Some(self.kinds[id]),
            seq: id as u64 + 1,
            issued_at_ms: 0,
            not_after_ms: MAX_LIFE.as_millis() as i64,
            min_generation: 0,
        };
        let v = NodeView {
            node_id: "n1",
            highest_seq: self.node.highest_seq,
            seq_floor: self.node.seq_floor,
            server_now_ms: Some(0),
            applied_generation: 0,
        };
        match on_dispatch(journaled.as_ref(), &facts, &v) {
            OnDispatch::Accept => {
                self.node.journal.insert(id, (Journaled::Accepted, None));
                self.node.highest_seq = self.node.highest_seq.max(id as u64 + 1);
                // Durable before the side effect, beside the journal.
                self.node.seq_floor = self.node.seq_floor.max(id as u64 + 1);
                self.node.work.push((id, Step::JournalRunning));
                if self.server[id] == ServerState::Dispatched {
                    self.server[id] = ServerState::Acked;
                }
            }
            OnDispatch::Reattach | OnDispatch::ResendResult => {}
            OnDispatch::Reject(r) => {
                // Out of order (a lower sequence dispatched after a higher
                // one) or a replay below the floor: the server records it
                // (the first terminal result stands); nothing ran.
                self.server_apply(id, r.outcome());
            }
        }
    }

    fn step(&mut self, pick: usize) {
        if !self.node.up || self.node.work.is_empty() {
            return;
        }
        let i = pick % self.node.work.len();
        let (id, step) = self.node.work[i];
        match step {
            Step::JournalRunning => {
                let boot_id = self.boot_id();
                self.node
                    .journal
                    .insert(id, (Journaled::Running { boot_id }, None));
                self.node.work[i].1 = Step::Effect;
            }
            Step::Effect => {
                self.effects[id] += 1;
                if self.kinds[id].self_terminating() {
                    self.node.boot += 1;
                    self.crash();
                } else {
                    self.node.work[i].1 = Step::JournalDone;
                }
            }
            Step::JournalDone => {
                self.node.journal.insert(
                    id,
                    (Journaled::Done { acked: false }, Some(Outcome::Succeeded)),
                );
                self.node.work.remove(i);
            }
        }
    }

    fn send_results(&mut self, lose: bool) {
        if !self.node.connected {
            return;
        }
        let done: Vec<(usize, Outcome)> = self
            .node
            .journal
            .iter()
            .filter(|(_, (j, _))| matches!(j, Journaled::Done { acked: false }))
            .map(|(id, (_, o))| (*id, o.expect("done has a result")))
            .collect();
        for (id, outcome) in done {
            if lose {
                return;
            }
            self.server_apply(id, outcome);
            // The server acknowledges; the node records it.
            self.node.journal.get_mut(&id).expect("journaled").0 = Journaled::Done { acked: true };
        }
    }

    fn dispatch(&mut self, lose: bool) {
        if !self.node.connected {
            return;
        }
        let Some(id) = (0..self.server.len()).find(|&i| self.server[i] == ServerState::Pending)
        else {
            return;
        };
        self.server[id] = ServerState::Dispatched;
        if !lose {
            self.deliver(id);
        }
    }

    fn reconnect(&mut self) {
        if self.node.connected {
            return;
        }
        if !self.node.up {
            // A new process: settle what the last one left.
            self.node.up = true;
            let boot_id = self.boot_id();
            let entries: Vec<(usize, Journaled)> = self
                .node
                .journal
                .iter()
                .map(|(id, (j, _))| (*id, j.clone()))
                .collect();
            for (id, j) in entries {
                match recover(Some(self.kinds[id]), &j, &boot_id) {
                    Recovery::Run => self.node.work.push((id, Step::JournalRunning)),
                    Recovery::Finish(o, _) => {
                        self.node
                            .journal
                            .insert(id, (Journaled::Done { acked: false }, Some(o)));
                    }
                    Recovery::Resend | Recovery::Nothing | Recovery::Upgrade => {}
                }
            }
        }
        // Hello.
        self.node.connected = true;
        let new_journal = self
            .session_journal
            .is_some_and(|j| j != self.node.journal_id);
        let new_boot = self.session_boot.is_some_and(|b| b != self.node.boot);
        self.session_journal = Some(self.node.journal_id);
        self.session_boot = Some(self.node.boot);
        let mut replay = Vec::new();
        for id in 0..self.server.len() {
            if !self.server[id].in_flight() {
                continue;
            }
            let report = match self.node.journal.get(&id) {
                None => NodeReport::Unknown,
                Some((Journaled::Done { .. }, _)) => NodeReport::Done,
                Some(_) => NodeReport::Running,
            };
            match on_hello(
                self.kinds[id],
                self.server[id],
                report,
                new_journal,
                new_boot,
            ) {
                HelloDecision::Replay => replay.push(id),
                HelloDecision::KeepRunning | HelloDecision::AwaitResult => {}
                HelloDecision::Finish(o, _) => self.server_apply(id, o),
            }
        }
        // Unacked results first, then replays in sequence order.
        self.send_results(false);
        for id in replay {
            self.deliver(id);
        }
    }

    fn apply(&mut self, op: Op) {
        match op {
            Op::Dispatch { lose } => self.dispatch(lose),
            Op::Step(i) => self.step(i),
            Op::SendResults { lose } => self.send_results(lose),
            Op::Crash => self.crash(),
            Op::Reboot => {
                self.node.boot += 1;
                self.crash();
            }
            Op::LoseJournal => {
                self.node.journal.clear();
                self.node.highest_seq = 0;
                self.node.journal_id += 1;
                self.node.boot += 1;
                self.crash();
            }
            Op::Reconnect => self.reconnect(),
            Op::Replay(id) => {
                if self.node.connected
                    && id < self.server.len()
                    && self.server[id] != ServerState::Pending
                {
                    self.deliver(id);
                }
            }
        }
    }

    /// No more faults: run until every command is terminal.
    fn quiesce(&mut self) {
        for _ in 0..10_000 {
            if self.server.iter().all(|s| s.is_terminal()) {
                return;
            }
            self.reconnect();
            self.dispatch(false);
            while self.node.up && !self.node.work.is_empty() {
                self.step(0);
            }
            if !self.node.up {
                continue;
            }
            self.send_results(false);
            // A command lost in flight (dispatched, never delivered) is
            // replayed at the next Hello; model the reconnect.
            if self.server.contains(&ServerState::Dispatched) {
                self.node.connected = false;
            }
        }
        panic!("did not converge: {:?}", self.server);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Over random interleavings of dispatch, lost messages, execution
    /// steps, crashes, reboots, journal loss, reconnects and replays: no
    /// command that is not retry-safe has its side effect run twice, each
    /// command gets exactly one terminal result, and once the faults stop
    /// every command finishes.
    #[test]
    fn at_most_once_and_exactly_one_terminal_result(
        kinds in prop::collection::vec(prop_oneof![
            4 => Just(Kind::ExecRun),
            1 => Just(Kind::NodeReboot),
            1 => Just(Kind::InventoryRefresh),
        ], 1..8),
        ops in prop::collection::vec(op(), 0..200),
    ) {
        let mut w = World::new(kinds);
        w.apply(Op::Reconnect);
        for op in ops {
            w.apply(op);
            for (id, n) in w.effects.iter().enumerate() {
                prop_assert!(*n <= 1 || w.kinds[id].retry_safe(), "command {} ran {} times", id, n);
            }
        }
        w.quiesce();
        let mut outcomes: HashMap<&str, u32> = HashMap::new();
        for id in 0..w.kinds.len() {
            prop_assert!(w.server[id].is_terminal());
            prop_assert_eq!(w.terminal_transitions[id], 1, "command {} terminal once", id);
            prop_assert!(w.effects[id] <= 1 || w.kinds[id].retry_safe());
            *outcomes.entry(w.server[id].name()).or_default() += 1;
        }
    }
}
