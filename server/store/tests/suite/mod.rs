//! The store suite: the behaviour every backend must have, written against
//! [`Store`] alone. A backend runs it by defining a fixture function and
//! invoking [`store_suite!`] with it (see `tests/sqlite.rs` and
//! `tests/postgres.rs`).
//!
//! Time moves only through the fixture's [`ManualClock`]; nothing here
//! sleeps to let time pass.

#![allow(dead_code)]

pub mod audit;
pub mod backups;
pub mod bindings;
pub mod commands;
pub mod events;
pub mod facts;
pub mod gateways;
pub mod images;
pub mod liveness;
pub mod races;
pub mod recovery;
pub mod reenrol;
pub mod releases;
pub mod rollouts;
pub mod secrets;
pub mod sessions;
pub mod specs;
pub mod tokens;

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use bc_store::NodeId;
use bc_store::nodes::{IssuedCert, Signed};
use bc_store::sessions::HelloInput;
use bc_store::specs::{
    Access, Assignment, OpenSpec, OpenedSpec, SealSpec, SectionReport, SpecBody, StateReportInput,
};
use bc_store::tokens::{JoinInput, NewToken};
use bc_store::{ManualClock, Store};

/// The clock's start in every fixture: a time in 2027.
pub const T0: i64 = 1_800_000_000_000;

type Reopen = Box<dyn Fn() -> Pin<Box<dyn Future<Output = Store> + Send>> + Send + Sync>;

/// Runs SQL on the store's database behind the store's back, as whoever
/// holds its credentials (a gateway's database role, a hand edit) would.
pub type Tamper =
    Box<dyn Fn(String) -> Pin<Box<dyn Future<Output = Result<(), String>> + Send>> + Send + Sync>;

/// Runs SQL in a transaction of its own, on the database directly, and
/// keeps that transaction open (its locks held) until the sender it
/// answers with is used or dropped.
pub type Hold = Box<
    dyn Fn(String) -> Pin<Box<dyn Future<Output = tokio::sync::oneshot::Sender<()>> + Send>>
        + Send
        + Sync,
>;

/// Resolves once at least `n` transactions on the store's database wait
/// for a lock (so a race test starts its second side only once the first
/// is blocked where the test means it to be).
pub type Waiting = Box<dyn Fn(usize) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

/// A fresh, empty store on a manual clock, with the gateways the tests
/// name holding their leases for an hour.
pub struct Fixture {
    pub store: Store,
    pub clock: ManualClock,
    reopen: Reopen,
    tamper: Tamper,
    hold: Hold,
    waiting: Waiting,
    _keep: Box<dyn std::any::Any + Send + Sync>,
}

impl Fixture {
    /// `keep` lives as long as the fixture (a temporary directory, a
    /// database); `reopen` opens another handle on the same store, as a
    /// second process would.
    pub async fn new(
        store: Store,
        clock: ManualClock,
        (reopen, tamper, hold, waiting): (Reopen, Tamper, Hold, Waiting),
        keep: Box<dyn std::any::Any + Send + Sync>,
    ) -> Fixture {
        for gw in ["gw", "gw2", "gw-a", "gw-b"] {
            lease(&store, gw, Duration::from_secs(3600)).await;
        }
        Fixture {
            store,
            clock,
            reopen,
            tamper,
            hold,
            waiting,
            _keep: keep,
        }
    }

    /// Another handle on the same store.
    pub async fn reopen(&self) -> Store {
        (self.reopen)().await
    }

    /// Runs `sql` (statements both backends read alike) on the database
    /// directly, outside every check of the store's.
    pub async fn tamper(&self, sql: &str) {
        if let Err(e) = (self.tamper)(sql.to_string()).await {
            panic!("{sql}: {e}")
        }
    }

    /// [`Fixture::tamper`], answering the database's refusal.
    pub async fn try_tamper(&self, sql: &str) -> Result<(), String> {
        (self.tamper)(sql.to_string()).await
    }

    /// Runs `sql` in a transaction left open, as a stalled writer would
    /// hold its locks: they go when the answer is sent or dropped.
    pub async fn hold(&self, sql: &str) -> tokio::sync::oneshot::Sender<()> {
        (self.hold)(sql.to_string()).await
    }

    /// Waits until `n` transactions on the database wait for a lock.
    pub async fn until_waiting(&self, n: usize) {
        (self.waiting)(n).await
    }

    pub fn advance(&self, by: Duration) {
        self.clock.advance(by);
    }
}

/// Takes (or renews) `gateway:<gw>` for `gw`.
pub async fn lease(s: &Store, gw: &str, ttl: Duration) {
    s.renew_lease(&bc_store::leases::gateway_lease(gw), gw, ttl)
        .await
        .unwrap()
        .expect("the lease is free");
}

/// The suite's controller lease (`controller:suite`, held for a century of
/// the manual clock), as a controller's pass names it in its writes.
pub async fn controller(s: &Store) -> bc_store::leases::Held {
    s.hold_lease(
        &bc_store::leases::controller_lease("suite"),
        "suite",
        Duration::from_secs(100 * 365 * 86_400),
    )
    .await
    .unwrap()
    .expect("the suite's controller lease is free")
}

/// Ends `node`'s session under `epoch` now, as its gateway writes it (the
/// node last heard `seen_age` ago); whether it applied.
pub async fn disconnect(s: &Store, node: &str, epoch: u64, seen_age: Duration) -> bool {
    let ended = bc_store::sessions::Ended {
        node_id: node.into(),
        epoch,
        seen_age,
        ended_age: Duration::ZERO,
        cause: "stream-ended".into(),
    };
    !s.disconnect(&[ended]).await.unwrap().is_empty()
}

pub fn fake_cert(n: u8) -> IssuedCert {
    IssuedCert {
        der: vec![n],
        serial: format!("serial{n}"),
        fingerprint: format!("fp{n}"),
        not_before_ms: 0,
        not_after_ms: i64::MAX / 2,
    }
}

pub fn token(id: &str, ttl: Duration, uses: u32) -> NewToken {
    NewToken {
        id: id.into(),
        secret_sha256: "h".into(),
        ttl,
        uses,
        description: String::new(),
        pool: None,
    }
}

pub fn join_input(token_id: &str, secret: &str) -> JoinInput {
    JoinInput {
        token_id: token_id.into(),
        secret_sha256: secret.into(),
        hostname: "host".into(),
        ramdisk: false,
        macs: Vec::new(),
    }
}

/// A node joined with certificate `fake_cert(cert)`; returns its id.
pub async fn joined(s: &Store, cert: u8) -> NodeId {
    joined_with(s, fake_cert(cert)).await
}

pub async fn joined_with(s: &Store, cert: IssuedCert) -> NodeId {
    let id = format!("t-{}", cert.serial);
    s.create_token(&token(&id, Duration::from_secs(60), 1))
        .await
        .unwrap();
    s.join(&join_input(&id, "h"), Box::new(move |_, _| Ok(cert)))
        .await
        .unwrap()
        .node_id
}

pub fn hello(node: &str, cert: u8, gw: &str, last_epoch: u64) -> HelloInput {
    HelloInput {
        node_id: node.into(),
        cert_fingerprint: format!("fp{cert}"),
        cert_serial: format!("serial{cert}"),
        gateway_id: gw.into(),
        incarnation_id: "i".into(),
        boot_id: "b".into(),
        journal_id: "j".into(),
        agent_version: "0".into(),
        last_epoch,
        inventory_hashes: vec![("gpus".into(), "abc".into())],
        journal_running: vec![],
        journal_done: vec![],
        daemon_exits: 0,
        proof: None,
    }
}

/// `h` with a proof of count `seq` (the store keeps proofs; the key holder
/// verifies them, outside the store).
pub fn proved(h: HelloInput, seq: u64) -> HelloInput {
    let payload = format!("{}/{}/{seq}", h.cert_serial, h.boot_id).into_bytes();
    HelloInput {
        proof: Some(bc_store::sessions::HelloProved {
            seq,
            command_floor: u64::MAX,
            release_confirmed: false,
            signature: sign(b"key", &payload),
            payload,
        }),
        ..h
    }
}

/// A signature is good when it is the certificate's bytes followed by the
/// message: enough to tell the node's key from any other.
pub fn verify(cert: &[u8], message: &[u8], signature: &[u8]) -> bool {
    signature.len() == cert.len() + message.len()
        && signature.starts_with(cert)
        && signature.ends_with(message)
}

pub fn sign(cert: &[u8], message: &[u8]) -> Vec<u8> {
    [cert, message].concat()
}

/// `fact` as a node with certificate `fake_cert(cert)` signs it.
pub fn signed<T: std::fmt::Debug>(cert: u8, fact: T) -> Signed<T> {
    let payload = format!("{fact:?}").into_bytes();
    Signed {
        signature: sign(&fake_cert(cert).der, &payload),
        fact: Some(fact),
        payload,
    }
}

/// A state report of `node` (certificate `cert`), sent under `epoch`.
pub fn state(
    node: &str,
    cert: u8,
    epoch: u64,
    applied_generation: u64,
    sections: Vec<SectionReport>,
) -> Signed<StateReportInput> {
    signed(
        cert,
        StateReportInput {
            node_id: node.into(),
            epoch,
            applied_generation,
            sections,
        },
    )
}

/// `node`'s session under `epoch` through `gw`.
pub fn route(gw: &str, node: &str, epoch: u64) -> bc_store::commands::Route {
    bc_store::commands::Route {
        gateway_id: gw.into(),
        node_id: node.into(),
        epoch,
    }
}

/// A stand-in for the worker's signature over a spec: the node, the
/// generation and the body as JSON, which [`open_spec`] reads back. What
/// the suite checks is that a change starts from these bytes, never from
/// the columns beside them.
pub fn seal_spec(node: &str) -> SealSpec {
    let node = node.to_string();
    Box::new(move |seal, body| {
        serde_json::to_vec(&(&node, seal.generation, &body.assignments, &body.access)).unwrap()
    })
}

/// Opens what [`seal_spec`] sealed for `node`; anything else is not a
/// worker's spec.
pub fn open_spec(node: &str) -> OpenSpec {
    let node = node.to_string();
    Box::new(move |bytes| {
        let (named, generation, assignments, access): (String, u64, Vec<Assignment>, Access) =
            serde_json::from_slice(bytes).map_err(|_| "not a sealed spec".to_string())?;
        if named != node {
            return Err(format!("sealed for node {named}"));
        }
        Ok(OpenedSpec {
            generation,
            body: SpecBody {
                assignments,
                access,
                intent: Default::default(),
            },
        })
    })
}

/// Runs each suite test against the fixture function `$fixture` (an async
/// fn returning a [`Fixture`]).
macro_rules! store_suite {
    ($fixture:path) => {
        store_suite!(@each $fixture;
            audit::triggers_stamp_history_with_the_store_clock,
            audit::a_snapshot_reads_the_history_and_the_tables,
            backups::a_set_leaves_creating_once_and_every_state_is_audited,
            backups::a_dump_restores_exactly_over_a_store_that_moved_on,
            bindings::only_the_nodes_current_key_binds_and_replays_are_refused,
            bindings::a_forged_report_marks_an_active_binding_lost,
            commands::results_first_one_wins_and_unknown_ones_change_nothing,
            commands::dispatch_follows_the_route_and_the_applied_generation,
            commands::dispatch_needs_the_gateways_lease,
            commands::idempotency_keys_return_the_first_command,
            commands::the_sweeper_expires_only_pending_commands_past_their_deadline,
            commands::a_confirmed_upgrade_raises_the_release_floor,
            commands::signed_results_wait_for_one_receipt_that_only_their_node_reads,
            commands::unknown_results_are_kept_for_one_receipt_and_bounded,
            commands::commands_for_unknown_nodes_are_refused,
            commands::a_late_or_stale_ack_moves_nothing,
            facts::forged_facts_are_recorded_and_applied_nowhere,
            facts::a_signed_host_inventory_replaces_the_macs_the_join_reported,
            facts::a_report_from_an_older_session_changes_nothing,
            facts::deleting_a_node_keeps_a_signed_statement_with_its_certificates,
            gateways::a_gateway_credential_is_live_once_and_a_revoked_name_starts_over,
            gateways::revoked_gateway_certificates_are_listed_until_their_end_and_the_newest_list_is_kept,
            secrets::secret_versions_are_written_once_and_a_deleted_name_goes_on_counting,
            specs::expiring_specs_are_found_for_signing_again,
            specs::a_rewritten_spec_row_signs_nothing,
            commands::command_states_are_counted,
            commands::a_row_naming_no_known_kind_or_state_still_reads,
            events::events_are_kept_once_and_acknowledged_up_to_the_highest,
            events::security_events_are_kept_apart_until_their_one_receipt,
            events::a_planted_security_event_keeps_the_nodes_own_out_no_longer,
            events::fleet_events_are_read_by_node_kind_age_and_position,
            images::assignments_prefer_the_mac_over_the_default_and_boots_are_kept,
            images::images_resolve_by_id_name_or_prefix,
            images::an_artifact_reads_in_chunks,
            images::a_mac_boots_its_nodes_then_its_pools_assignment_and_minted_tokens_are_bounded,
            liveness::gateway_loss_then_unreachable_releases_nothing_and_hello_clears_it,
            liveness::a_sweep_gap_holds_timed_transitions,
            liveness::leases_have_one_owner_until_they_expire,
            liveness::a_controller_writes_only_under_the_lease_it_holds,
            liveness::leases_are_listed_with_owner_and_expiry,
            liveness::the_fleet_size_counts_connected_sessions_and_live_gateways,
            liveness::the_fleet_absorbs_what_its_live_gateways_reported,
            races::two_hellos_for_one_node_get_distinct_epochs,
            races::two_hellos_for_one_node_queue_on_the_nodes_row,
            races::an_ack_against_an_epoch_bump_moves_nothing,
            races::a_hello_against_a_lease_takeover_never_routes_without_the_lease,
            races::dispatch_against_an_epoch_bump_is_replayed_or_left_pending,
            races::of_two_results_the_first_wins,
            races::concurrent_writes_are_each_their_own_transaction,
            recovery::the_audit_history_is_one_chain_across_handles_and_reopenings,
            recovery::reconcile_clears_dead_leases_keeps_live_ones_and_is_idempotent,
            recovery::the_sweeper_removes_only_leases_dead_past_the_grace,
            recovery::racing_joins_never_burn_one_token_on_two_identities,
            recovery::a_hello_after_a_crash_loop_shows_it_and_the_next_clears_it,
            recovery::history_peers_can_add_to_is_pruned_to_its_limits,
            commands::no_result_becomes_legacy_after_the_migration,
            releases::a_release_registers_once,
            releases::a_release_reads_in_chunks,
            rollouts::a_rollout_fixes_its_nodes_and_follows_their_commands,
            rollouts::a_rollout_needs_a_release_and_no_other_active,
            sessions::hello_bumps_the_epoch_and_stale_writes_change_nothing,
            sessions::epoch_rises_above_what_the_node_saw,
            sessions::deleted_nodes_and_foreign_certificates_are_refused,
            sessions::a_gateway_without_its_lease_routes_nothing,
            sessions::hello_settles_in_flight_commands,
            sessions::a_gateway_shutdown_disconnects_and_releases_together,
            sessions::a_gateway_writes_the_sessions_that_ended_together,
            sessions::a_hello_says_whether_work_waits_for_the_node,
            sessions::certificates_renew_expire_and_are_revoked_with_their_node,
            sessions::an_expired_certificate_renews_only_within_the_grace,
            sessions::published_fleet_events_are_read_back_newest_first,
            sessions::the_first_hello_with_a_renewed_certificate_supersedes_the_old_one,
            sessions::two_machines_alternating_on_one_certificate_are_quarantined,
            specs::spec_changes_are_sealed_and_refusals_change_nothing,
            specs::state_reports_move_the_applied_generation_forward_or_to_zero,
            reenrol::re_enrolment_keeps_the_node_and_revokes_its_earlier_certificates,
            reenrol::refused_proofs_change_nothing_and_spend_nothing,
            reenrol::racing_re_enrolments_of_one_node_make_one_identity,
            reenrol::a_rewritten_ek_binding_reclaims_nothing,
            reenrol::a_revocation_is_never_undone,
            reenrol::unproved_hellos_are_refused_once_a_confirmed_release_proved_them,
            commands::a_finished_commands_ending_is_written_once,
            reenrol::racing_first_attested_joins_of_one_ek_make_one_node,
            reenrol::attested_joins_bind_the_ek_and_reclaim_its_node,
            reenrol::enrolled_machines_join_with_no_token,
            reenrol::racing_tokenless_joins_of_one_ek_make_one_node,
            reenrol::machines_alternating_on_one_tpm_identity_are_quarantined,
            tokens::tokens_are_single_use_and_expire,
            tokens::tokens_are_listed_without_secrets_and_a_revoked_one_joins_nothing,
            tokens::operators_are_found_by_their_certificate_and_revoked_for_every_process,
        );
    };
    (@each $fixture:path; $($module:ident :: $test:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $test() {
                suite::$module::$test($fixture().await).await
            }
        )*
    };
}
