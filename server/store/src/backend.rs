//! The interface every store backend implements.
//!
//! Every method is exactly one transaction: it commits in full or changes
//! nothing, and no caller holds a transaction across calls (an operation
//! that must be atomic is one method, e.g. [`GatewayBackend::gateway_shutdown`]).
//! The decisions inside a transaction (certificate validity, token
//! admission, the Hello's settlement of in-flight commands, binding
//! judgement, liveness rules) are the pure functions of this crate's domain
//! modules; their statements are written once for both databases in
//! `crate::sql`.
//!
//! Each operation is declared once, in the list of whoever may call it
//! (`gateway_operations!`, `key_holder_operations!`): its doc, the kind
//! of its transaction, its signature and its body over a `sql::Db`.
//! The traits below and both backends' implementations are made from those
//! lists; a backend writes by hand only what its database runs its own way
//! (each trait's `own` block).
//!
//! Times are unix milliseconds on the store's clock (`compute_now()`);
//! callers hand in ages and durations, never timestamps of their own.
//! Methods that can turn a request down return [`TxError`]; the others
//! fail only with [`StoreError`].

// What the operations name: the backends import it all from here
// (`use crate::backend::*`), where the lists expand.
pub(crate) use std::time::Duration;

pub(crate) use async_trait::async_trait;

pub(crate) use crate::audit::{AuditHistory, AuditSnapshot, Settling};
pub(crate) use crate::backups::{BackupRow, Dump, NewBackup};
pub(crate) use crate::bindings::{BindingInput, BindingOutcome, BindingRow, VerifySignature};
pub(crate) use crate::commands::{
    CommandRow, Dispatch, NewCommand, ResultApplied, ResultInput, SealCommand,
};
pub(crate) use crate::error::{StoreError, TxError};
pub(crate) use crate::events::{EventInput, EventRow};
pub(crate) use crate::gateways::{GatewayCert, GatewayCredential, SignedRevocations};
pub(crate) use crate::id::{
    CommandId, GatewayId, ImageId, NodeId, OperatorId, ReleaseSeq, TokenId,
};
pub(crate) use crate::images::{
    AllowedMac, Assigned, BootRecord, BootRow, ImageRow, Minted, NewImage,
};
pub(crate) use crate::inventory::{InventoryInput, InventoryRow};
pub(crate) use crate::leases::{Held, LeaseRow};
pub(crate) use crate::liveness::{LivenessRules, SweepOutcome};
pub(crate) use crate::machines::{Enrolled, Enrolment, NewEnrolment};
pub(crate) use crate::nodes::{NodeList, RenewCert, Revocation, SealStatement, Signed, ValidCert};
pub(crate) use crate::releases::{NewRelease, ReleaseFiles, ReleaseHead, ReleaseRow};
pub(crate) use crate::rollouts::{NewRollout, Rollout, RolloutCommand, RolloutState};
pub(crate) use crate::sessions::{
    Ended, FleetSize, HelloInput, HelloOutcome, Seen, SessionKey, SessionRow, Sighting,
};
pub(crate) use crate::specs::{
    ChangeSpec, FactApplied, OpenSpec, SealSpec, SpecBody, SpecView, StateReportInput,
};
pub(crate) use crate::tokens::{
    IssueCert, JoinInput, Joined, NewOperator, NewToken, OperatorRow, PreviousProof,
    SealRevocation, TokenInfo,
};

/// Declares one of the store's interfaces from its list of operations
/// ([`gateway_operations`], [`key_holder_operations`]): the methods each
/// backend implements itself (`own`), then one method for each operation.
macro_rules! declare {
    (
        ($(#[$attr:meta])* ($($head:tt)*) { $($own:tt)* })
        $(
            $(#[$doc:meta])*
            $mode:ident $name:ident($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty
                = |$db:ident| $body:expr;
        )*
    ) => {
        $(#[$attr])*
        #[async_trait]
        $($head)* {
            $($own)*
            $(
                $(#[$doc])*
                async fn $name(&self, $($arg: $ty),*) -> $ret;
            )*
        }
    };
}

/// Implements one of the store's interfaces for `$backend` from its list:
/// the methods given (`own`), then one for each operation, whose body
/// `$run!` runs in a transaction of the operation's kind (each backend's
/// own macro: `lite_run`, `pg_run`).
macro_rules! implement {
    (
        ($backend:ident, $run:ident, $trait:ident { $($own:tt)* })
        $(
            $(#[$doc:meta])*
            $mode:ident $name:ident($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty
                = |$db:ident| $body:expr;
        )*
    ) => {
        #[async_trait]
        impl $trait for $backend {
            $($own)*
            $(
                async fn $name(&self, $($arg: $ty),*) -> $ret {
                    committed!($mode, $run!(self, $mode, |$db| $body, $($arg: $ty),*))
                }
            )*
        }
    };
}
pub(crate) use implement;

/// An operation's answer once its transaction ended: as the body gave it,
/// but for a `recording` operation, a write whose body answers a refusal inside
/// `Ok` so that what it recorded commits; the refusal is its error after.
macro_rules! committed {
    (recording, $done:expr) => {
        $done?.map_err(TxError::from)
    };
    ($mode:ident, $done:expr) => {
        $done
    };
}
pub(crate) use committed;

/// The gateway's operations, each written once: its signature and its
/// transaction's body over `db` (a [`crate::sql::Db`]), run by each
/// backend in one transaction of the kind its word names: `read`,
/// `write`, `snapshot` (a read that sees every table at one instant:
/// repeatable read on PostgreSQL) or `recording` (a write whose refusal
/// must still commit what it recorded: a body's `Err` rolls back, so its body
/// answers `Ok(Err(refusal))`, the error once committed). A new operation is a line here and a
/// function in [`crate::sql`]; what one backend runs its own way is
/// declared in the `own` block of [`GatewayBackend`] and written in each
/// backend. `$then` is the macro that turns the list into a
/// trait (`declare`) or an implementation (`implement`, given the
/// backend's own `$run`: `lite_run`, `pg_run`).
macro_rules! gateway_operations {
    ($then:ident!($($own:tt)*)) => {
        $then! {
            ($($own)*)

            /// The node a certificate belongs to, if it is valid now.
            read check_cert(fingerprint: &str) -> Result<ValidCert, TxError>
                = |db| sql::nodes::check_cert(db, fingerprint);

            /// Certificates revoked at or after `since_ms`, oldest first.
            read revoked_since(since_ms: i64) -> Result<Vec<Revocation>, StoreError>
                = |db| sql::nodes::revoked_since(db, since_ms);

            /// The newest signed list of revoked gateway certificates, if the key
            /// holder signed one.
            read gateway_revocations() -> Result<Option<SignedRevocations>, StoreError>
                = |db| sql::gateways::revocations(db);

            /// The key holder's receipts for `node`'s security events of journal
            /// `journal_id` among `keys` (each event as stored, and its signed
            /// receipt): one at most for each, whatever else was planted under its
            /// id.
            read event_receipts(
                node: &NodeId,
                journal_id: &str,
                keys: &[crate::events::EventKey],
            ) -> Result<Vec<(crate::events::EventKey, Vec<u8>)>, StoreError>
                = |db| sql::events::receipts(db, node, journal_id, keys);

            /// The key holder's receipts for results of `node`'s commands among
            /// `ids` (command id, signed receipt; empty where the key holder
            /// judged the result and gives none), and for its unknown results
            /// with those ids; commands not judged yet are left out.
            read result_receipts(
                node: &NodeId,
                ids: &[CommandId],
            ) -> Result<Vec<(CommandId, Vec<u8>)>, StoreError>
                = |db| sql::commands::result_receipts(db, node, ids);

            /// Keeps a result its node signed for a command the store does not
            /// know, for the key holder to receipt ([`crate::commands::UnknownResult`]).
            /// False when it is not kept: the node holds
            /// [`crate::commands::UNKNOWN_RESULTS_PER_NODE`] already.
            write put_unknown_result(r: &crate::commands::UnknownResult) -> Result<bool, StoreError>
                = |db| sql::commands::put_unknown_result(db, r);

            /// Marks each session disconnected (since it ended) if its epoch is
            /// still the node's, in one transaction. Returns those that applied.
            write disconnect(ended: &[Ended]) -> Result<Vec<SessionKey>, StoreError>
                = |db| sql::sessions::disconnect(db, ended);

            /// Records when each of a gateway's sessions was last heard. Returns the
            /// sessions that are no longer current (a newer Hello ran): the gateway
            /// closes them.
            write flush_liveness(
                gateway_id: &GatewayId,
                seen: &[Seen],
            ) -> Result<Vec<SessionKey>, StoreError>
                = |db| sql::sessions::flush_liveness(db, gateway_id, seen);

            /// An orderly gateway stop: disconnects its remaining sessions (cause
            /// `gateway-shutdown`) and releases its lease, together.
            write gateway_shutdown(
                gateway_id: &GatewayId,
                sessions: &[SessionKey],
            ) -> Result<(), StoreError>
                = |db| sql::sessions::gateway_shutdown(db, gateway_id, sessions);

            /// The spec generation of every node connected through `gateway_id`:
            /// the gateway compares each with the one its session sent, so a spec
            /// whose transaction committed long after its `updated_at` stamp still
            /// goes out, whatever the clocks say.
            read spec_generations(gateway_id: &GatewayId) -> Result<Vec<(NodeId, u64)>, StoreError>
                = |db| sql::sessions::spec_generations(db, gateway_id);

            /// Nodes connected through `gateway_id` with work waiting: a pending
            /// command, or a spec changed at or after `specs_since_ms`.
            read nodes_with_work(
                gateway_id: &GatewayId,
                specs_since_ms: i64,
            ) -> Result<Vec<NodeId>, StoreError>
                = |db| sql::sessions::nodes_with_work(db, gateway_id, specs_since_ms);

            /// The liveness controller's sweep (see [`crate::liveness`]), under
            /// its lease (written only while `held` holds).
            write sweep_liveness(
                rules: &LivenessRules,
                held: &Held,
            ) -> Result<SweepOutcome, StoreError>
                = |db| async {
                    sql::leases::check_held(db, held).await?;
                    sql::liveness::sweep(db, rules).await
                };

            /// How many sessions are connected, how many gateways hold a live
            /// lease and what they reported they absorb: what a whole fleet
            /// redialing at once would bring, and how fast it is taken.
            read fleet_size() -> Result<FleetSize, StoreError>
                = |db| sql::sessions::fleet_size(db);

            /// Removes leases expired longer than `dead_after` ago (their holders
            /// are gone); returns their names. Under the sweeper's lease.
            write remove_dead_leases(
                dead_after: Duration,
                held: &Held,
            ) -> Result<Vec<String>, StoreError>
                = |db| async {
                    sql::leases::check_held(db, held).await?;
                    sql::reconcile::remove_dead_leases(db, dead_after).await
                };

            /// Stores an inventory section the node signed, if it verifies
            /// ([`crate::nodes::judge_signed`]) and names the session `epoch`, which
            /// must be the node's current one; a forgery is recorded.
            write put_inventory(
                node_id: &NodeId,
                epoch: u64,
                section: &Signed<InventoryInput>,
                verify: VerifySignature,
            ) -> Result<FactApplied, StoreError>
                = |db| sql::inventory::put(db, node_id, epoch, section, verify);

            /// Takes the node's dispatchable commands (see
            /// [`crate::commands::dispatchable`]) for the session `epoch` on
            /// `gateway_id`, marking them dispatched; nothing if the node is routed
            /// elsewhere.
            write take_dispatchable(
                gateway_id: &GatewayId,
                node_id: &NodeId,
                epoch: u64,
            ) -> Result<Vec<Dispatch>, StoreError>
                = |db| sql::commands::take_dispatchable(db, gateway_id, node_id, epoch);

            /// The node acknowledged a dispatch (ACCEPTED) or reported it running,
            /// on its session under `epoch` through `gateway_id`. Fenced: it applies
            /// only while that session is the node's current one and the command is
            /// in flight on it, and only forward (dispatched to acked, dispatched or
            /// acked to running), so a zombie gateway's late or replayed ack moves
            /// nothing.
            write command_ack(
                route: &crate::commands::Route,
                id: &CommandId,
                running: bool,
            ) -> Result<bool, StoreError>
                = |db| sql::commands::ack(db, route, id, running);

            /// Applies a result the node signed, if it verifies (a forgery is
            /// recorded and applied nowhere): the first terminal result wins, from
            /// any epoch. A confirmed upgrade raises the node's release floor.
            write command_result(
                node_id: &NodeId,
                r: &Signed<ResultInput>,
                verify: VerifySignature,
            ) -> Result<ResultApplied, StoreError>
                = |db| sql::commands::result(db, node_id, r, verify);

            /// How many commands are in each state (only states that have some).
            read command_states() -> Result<Vec<(String, u64)>, StoreError>
                = |db| sql::commands::states(db);

            /// Expires pending commands past their deadline; returns them. Under
            /// the sweeper's lease.
            write sweep_commands(held: &Held) -> Result<Vec<CommandId>, StoreError>
                = |db| async {
                    sql::leases::check_held(db, held).await?;
                    sql::commands::sweep(db).await
                };

            /// The signed spec to send a node, with its generation.
            read signed_spec(node_id: &NodeId) -> Result<Option<(u64, Vec<u8>)>, StoreError>
                = |db| sql::specs::signed(db, node_id);

            /// Records a state report the node signed, if it verifies (a forgery is
            /// recorded) and is not from an older session than the last applied.
            write put_state_report(
                node_id: &NodeId,
                report: &Signed<StateReportInput>,
                verify: VerifySignature,
            ) -> Result<FactApplied, StoreError>
                = |db| sql::specs::put_state_report(db, node_id, report, verify);

            /// Judges a node's signed binding report (see [`crate::bindings`]).
            write record_binding(
                b: &BindingInput,
                verify: VerifySignature,
            ) -> Result<BindingOutcome, StoreError>
                = |db| sql::bindings::record(db, b, verify);

            /// Stores a batch of a node's events (idempotently); returns the id to
            /// acknowledge up to.
            write put_events(
                node_id: &NodeId,
                journal_id: &str,
                events: &[EventInput],
            ) -> Result<u64, StoreError>
                = |db| sql::events::put(db, node_id, journal_id, events);

            /// A release's signed manifest and its binary's length, without
            /// reading the binary.
            read release_head(sequence: ReleaseSeq) -> Result<Option<ReleaseHead>, StoreError>
                = |db| sql::releases::head(db, sequence);

            /// One image by its whole id, with its signed manifest (its
            /// assignments not read); `None` if none has that id.
            read image(image_id: &ImageId) -> Result<Option<(ImageRow, Vec<u8>)>, StoreError>
                = |db| sql::images::get(db, image_id);

            /// A release's manifest and binary, whole.
            read release(sequence: ReleaseSeq) -> Result<Option<ReleaseFiles>, StoreError>
                = |db| sql::releases::files(db, sequence);
        }
    };
}
pub(crate) use gateway_operations;

gateway_operations!(declare!(
    /// What a gateway may do with the store: the facts of sessions and
    /// liveness, node-signed records it hands on, and reads. A gateway-only
    /// process holds a [`crate::GatewayStore`], which offers nothing else;
    /// on PostgreSQL its database role is granted exactly what these
    /// methods write ([`crate::postgres::grants`]).
    (pub trait GatewayBackend: Send + Sync + std::fmt::Debug)
    {
        /// `compute_now()`: the store's clock.
        async fn now(&self) -> Result<i64, StoreError>;

        /// The schema version: how many migrations the store has applied.
        async fn schema_version(&self) -> Result<u32, StoreError>;

        /// The Hello transaction (see [`crate::sessions`]).
        async fn hello(&self, h: &HelloInput) -> Result<HelloOutcome, TxError>;

        /// Records on this gateway's own lease the Hellos a second it measured
        /// it absorbs (nothing when it does not hold the lease).
        async fn report_absorption(&self, gateway_id: &GatewayId, per_s: u32) -> Result<(), StoreError>;

        /// Takes or renews a lease for `owner`: what it holds (the store's now
        /// and the lease's generation), `None` when another owner holds it
        /// unexpired.
        async fn hold_lease(
            &self,
            name: &str,
            owner: &str,
            ttl: Duration,
        ) -> Result<Option<Held>, StoreError>;

        /// [`Self::hold_lease`], answering only the store's now.
        async fn renew_lease(
            &self,
            name: &str,
            owner: &str,
            ttl: Duration,
        ) -> Result<Option<i64>, StoreError> {
            Ok(self.hold_lease(name, owner, ttl).await?.map(|h| h.now_ms))
        }

        async fn release_lease(&self, name: &str, owner: &str) -> Result<(), StoreError>;

        /// Up to `len` bytes (at most [`releases::MAX_CHUNK`](crate::releases::MAX_CHUNK))
        /// of a release's binary from `offset`, reading only those bytes:
        /// fewer at its end, none past it; `None` when no such release is
        /// registered.
        async fn release_chunk(
            &self,
            sequence: ReleaseSeq,
            offset: u64,
            len: u32,
        ) -> Result<Option<Vec<u8>>, StoreError>;

        /// At most `len` bytes (capped at `releases::MAX_CHUNK`) of an
        /// artifact from `offset`; empty past its end, `None` for an unknown
        /// one.
        async fn image_artifact_chunk(
            &self,
            sha256: &str,
            offset: u64,
            len: u32,
        ) -> Result<Option<Vec<u8>>, StoreError>;
    }
));

/// The key holder's operations, written once as
/// [`gateway_operations`] are.
macro_rules! key_holder_operations {
    ($then:ident!($($own:tt)*)) => {
        $then! {
            ($($own)*)

            // ------------------------------------------------ tokens, operators
            /// Records an operator and its certificate; refused if the name is
            /// taken (revoked operators keep theirs).
            write add_operator(o: &NewOperator) -> Result<(), TxError>
                = |db| sql::tokens::add_operator(db, o);

            /// Every operator, revoked ones included, oldest first.
            read list_operators() -> Result<Vec<OperatorRow>, StoreError>
                = |db| sql::tokens::list_operators(db);

            /// The operator a client certificate (its SHA-256) was issued to.
            read operator_by_cert(cert_sha256: &str) -> Result<Option<OperatorRow>, StoreError>
                = |db| sql::tokens::operator_by_cert(db, cert_sha256);

            /// Revokes an operator's certificate (once; again is no change),
            /// keeping beside it what `seal` signs of the row and the time.
            write revoke_operator(id: &OperatorId, seal: SealRevocation) -> Result<OperatorRow, TxError>
                = |db| sql::tokens::revoke_operator(db, id, seal);

            // ------------------------------------------------ secrets
            /// Puts a secret's first version (`Put::New`; a live name is refused)
            /// or its next (`Put::Rotate`; an unknown name is refused), sealed by
            /// `seal` for the version decided here, by operator `by`.
            write put_secret(
                name: &str,
                put: crate::secrets::Put,
                by: &str,
                seal: crate::secrets::SealSecret,
            ) -> Result<crate::secrets::SecretSummary, TxError>
                = |db| sql::secrets::put(db, name, put, by, seal);

            /// One version of a secret, unless it was deleted.
            read secret(
                name: &str,
                version: u64,
            ) -> Result<Option<crate::secrets::SecretRow>, StoreError>
                = |db| sql::secrets::get(db, name, version);

            /// Every live secret's newest version, by name.
            read list_secrets() -> Result<Vec<crate::secrets::SecretSummary>, StoreError>
                = |db| sql::secrets::list(db);

            /// Wipes every version of a secret; its newest, as it was.
            write delete_secret(name: &str) -> Result<crate::secrets::SecretSummary, TxError>
                = |db| sql::secrets::delete(db, name);

            // ------------------------------------------------ gateway credentials
            /// Adds a gateway credential (the SHA-256 of its secret); returns when
            /// it was added. A name that is live already is refused.
            write add_gateway_credential(name: &GatewayId, secret_sha256: &str) -> Result<i64, TxError>
                = |db| sql::gateways::add(db, name, secret_sha256);

            read gateway_credential(name: &GatewayId) -> Result<Option<GatewayCredential>, StoreError>
                = |db| sql::gateways::get(db, name);

            read list_gateway_credentials() -> Result<Vec<GatewayCredential>, StoreError>
                = |db| sql::gateways::list(db);

            /// Revokes a live credential; false if there is none by that name.
            write revoke_gateway_credential(name: &GatewayId) -> Result<bool, StoreError>
                = |db| sql::gateways::revoke(db, name);

            /// Records a serving certificate just issued to a gateway.
            write record_gateway_cert(cert: &GatewayCert) -> Result<(), StoreError>
                = |db| sql::gateways::record_cert(db, cert);

            /// The recorded gateway certificates still within their life that
            /// their name's credential no longer admits (revoked, replaced by a
            /// name added again, or gone), oldest first.
            read revoked_gateway_certs() -> Result<Vec<GatewayCert>, StoreError>
                = |db| sql::gateways::revoked_certs(db);

            /// Nodes' security events the key holder has not judged for a
            /// receipt yet, at most `limit`.
            read security_events_unreceipted(
                limit: u32,
            ) -> Result<Vec<crate::events::SecurityEvent>, StoreError>
                = |db| sql::events::unreceipted(db, limit);

            /// Keeps the key holder's receipt beside a node's security event (once
            /// only), and forgets that node's security events receipted more than
            /// [`crate::events::SECURITY_EVENTS_KEPT_MS`] ago.
            write put_event_receipt(
                event: &crate::events::SecurityEvent,
                receipt: &[u8],
            ) -> Result<(), StoreError>
                = |db| sql::events::put_receipt(db, event, receipt);

            /// Commands whose result a node signed that the key holder has not
            /// judged for a receipt yet, at most `limit`.
            read results_unreceipted(limit: u32) -> Result<Vec<CommandId>, StoreError>
                = |db| sql::commands::results_unreceipted(db, limit);

            /// Unknown results the key holder has not judged yet, at most `limit`.
            read unknown_results_unreceipted(
                limit: u32,
            ) -> Result<Vec<crate::commands::UnknownResult>, StoreError>
                = |db| sql::commands::unknown_results_unreceipted(db, limit);

            /// Keeps the key holder's judgement beside an unknown result (its
            /// receipt, or an empty one where it gives none; once only), and
            /// forgets that node's unknown results judged with none (so they take
            /// no room) or receipted more than
            /// [`crate::events::SECURITY_EVENTS_KEPT_MS`] ago.
            write put_unknown_result_receipt(
                r: &crate::commands::UnknownResult,
                receipt: &[u8],
            ) -> Result<(), StoreError>
                = |db| sql::commands::put_unknown_result_receipt(db, r, receipt);

            /// Records the key holder's judgement of a command's signed result:
            /// its receipt, or an empty one where it gives none. Once only.
            write put_result_receipt(id: &CommandId, receipt: &[u8]) -> Result<(), StoreError>
                = |db| sql::commands::put_result_receipt(db, id, receipt);

            /// Stores a newly signed list of revoked gateway certificates in place
            /// of the last one, and forgets the records of certificates long past
            /// their end ([`crate::gateways::CERT_KEPT_PAST_END_MS`]).
            write put_gateway_revocations(list: &SignedRevocations) -> Result<(), StoreError>
                = |db| sql::gateways::put_revocations(db, list);

            /// Creates a join token; returns its expiry.
            write create_token(t: &NewToken) -> Result<i64, StoreError>
                = |db| sql::tokens::create_token(db, t);

            /// Join tokens, newest first, at most [`crate::tokens::LIST_LIMIT`]:
            /// the live ones (unexpired, uses left), or every one with `all`.
            read list_tokens(all: bool) -> Result<Vec<TokenInfo>, StoreError>
                = |db| sql::tokens::list_tokens(db, all);

            /// Makes a token expire now (no later join can spend it; the nodes
            /// that joined with it keep their identities); `None` if no token has
            /// that id. Revoking a spent or expired token changes nothing.
            write revoke_token(id: &TokenId) -> Result<Option<TokenInfo>, StoreError>
                = |db| sql::tokens::revoke_token(db, id);

            /// Checks and spends one use of a token, creates the node and records
            /// the certificate `issue` builds for it.
            write join(j: &JoinInput, issue: IssueCert) -> Result<Joined, TxError>
                = |db| sql::tokens::join(db, j, issue);

            /// Checks a token and the proof of a previous identity, spends one use
            /// of the token and re-enrols the proven node: the same id at the next
            /// identity generation, every earlier certificate revoked with the
            /// statement `seal` signs, the certificate `issue` builds recorded, a
            /// fleet event kept. A refused token or proof changes nothing.
            write reenrol(
                j: &JoinInput,
                proof: &PreviousProof,
                issue: IssueCert,
                seal: SealStatement,
            ) -> Result<Joined, TxError>
                = |db| sql::tokens::reenrol(db, j, proof, issue, seal);

            /// Checks and spends one use of a token and joins the machine whose
            /// TPM's EK has `ek_sha256` (hex): the node bound to that EK and not
            /// deleted again, at its next identity generation with every earlier
            /// certificate revoked (the statement `seal` signs) and a fleet event
            /// kept; else a new node bound to the EK. A refused token changes
            /// nothing.
            write join_attested(
                j: &JoinInput,
                ek_sha256: &str,
                issue: IssueCert,
                seal: SealStatement,
            ) -> Result<Joined, TxError>
                = |db| sql::tokens::join_attested(db, j, ek_sha256, issue, seal);

            /// Joins the machine whose TPM's EK has `ek_sha256` with no token
            /// (`crate::machines::admit_tokenless`): the node bound to the EK at
            /// its next identity generation (earlier certificates revoked, the
            /// statement `seal` signs), else a new node bound to it when the EK is
            /// enrolled, or when `ek_ca` (the enrolment of the EK CA the join
            /// service found to certify it) is still enrolled. Spends nothing; a
            /// refusal changes nothing.
            ///
            /// `boot_id` (the joining machine's) is a sighting for the clone watch
            /// (`crate::clones`, keyed by the node): a reclaim whose sightings
            /// alternate between machines quarantines the node instead
            /// ([`Enrolled::Quarantined`], committed), and a quarantined node is
            /// refused until a join with a token reclaims it.
            ///
            /// A reclaim needs a certificate of the bound node that `proves` it is
            /// the attested machine; without one the join is
            /// [`Enrolled::Forged`] (recorded, committed) and reclaims nothing.
            #[allow(clippy::too_many_arguments)]
            write join_enrolled(
                j: &JoinInput,
                ek_sha256: &str,
                ek_ca: Option<&str>,
                boot_id: &str,
                issue: IssueCert,
                seal: SealStatement,
                proves: crate::machines::ProvesMachine,
            ) -> Result<Enrolled, TxError>
                = |db| sql::tokens::join_enrolled(
                    db,
                    j,
                    ek_sha256,
                    ek_ca,
                    boot_id,
                    (issue, seal),
                    proves,
                );

            /// Enrols a machine by its EK, or an EK CA; refused when that one is
            /// enrolled already.
            write enrol_machine(e: &NewEnrolment) -> Result<Enrolment, TxError>
                = |db| sql::machines::enrol(db, e);

            /// Every enrolment, EKs first.
            read list_enrolments() -> Result<Vec<Enrolment>, StoreError>
                = |db| sql::machines::list(db);

            /// Removes the enrolment `id` (a node already bound stays bound).
            write remove_enrolment(id: &str) -> Result<Enrolment, TxError>
                = |db| sql::machines::remove(db, id);

            /// As [`Backend::renew`], taking a certificate that ran out at most
            /// `expired_grace_ms` ago as well (x509pop; never a revoked one, nor
            /// one of a deleted node: `nodes::check_renewable`).
            write renew_within(
                fingerprint: &str,
                issue: RenewCert,
                expired_grace_ms: i64,
            ) -> Result<Joined, TxError>
                = |db| sql::nodes::renew(db, fingerprint, issue, expired_grace_ms);

            /// Every certificate the store holds for `node_id` (DER), revoked and
            /// superseded ones too: what a reader checks against the fleet CA
            /// before it verifies something the node signed with one.
            read node_certificates(node_id: &NodeId) -> Result<Vec<Vec<u8>>, StoreError>
                = |db| sql::nodes::certificates(db, node_id);

            // ------------------------------------------------------ clone watch
            /// Sightings the watch has not marked read, in id order, at most
            /// `limit`.
            read sightings_unwatched(limit: u32) -> Result<Vec<Sighting>, StoreError>
                = |db| sql::clones::unwatched(db, limit);

            /// Marks sightings read by the watch: they are not read again by
            /// [`Backend::sightings_unwatched`] (a certificate's sightings are,
            /// by [`Backend::sightings_of`]).
            write mark_sightings_watched(ids: &[i64]) -> Result<(), StoreError>
                = |db| sql::clones::mark_watched(db, ids);

            /// A certificate's sightings recorded at or after `since_ms` (the
            /// store's clock, as the recording gateway said), oldest first.
            read sightings_of(serial: &str, since_ms: i64) -> Result<Vec<Sighting>, StoreError>
                = |db| sql::clones::of(db, serial, since_ms);

            /// Deletes sightings whose proofs did not verify, publishing for each
            /// a `security.hello.forged` event that says why.
            write drop_forged_sightings(forged: &[(Sighting, String)]) -> Result<(), StoreError>
                = |db| sql::clones::drop_forged(db, forged);

            /// Revokes, as superseded, `node_id`'s valid certificates no newer
            /// than `serial` (which the node proved it uses); their serials.
            write supersede(node_id: &NodeId, serial: &str) -> Result<Vec<String>, StoreError>
                = |db| sql::clones::supersede(db, node_id, serial);

            /// Succeeded upgrades whose result the key holder has not judged for
            /// the node's release floor, at most `limit` (their command ids).
            read upgrades_unjudged(limit: u32) -> Result<Vec<CommandId>, StoreError>
                = |db| sql::commands::upgrades_unjudged(db, limit);

            /// Marks the succeeded upgrade `command_id` judged and, when the key
            /// holder verified the node signed its result (`believed`), raises the
            /// node's release floor to its release; the floor it raised to. A
            /// gateway's result raises no floor: the node's signature is believed
            /// only where the key holder checked it.
            write judge_upgrade_floor(
                command_id: &CommandId,
                believed: bool,
            ) -> Result<Option<u64>, StoreError>
                = |db| sql::commands::judge_upgrade_floor(db, command_id, believed);

            /// From now on `node_id`'s Hellos without a proof are refused
            /// (`Refusal::HelloUnproved`): the watch verified a proof under its
            /// valid certificate `serial` signed by a confirmed release. True when
            /// this set it; false when it was set already, or `serial` is not a
            /// valid certificate of the node (a re-enrolment since revoked it).
            write require_hello_proofs(node_id: &NodeId, serial: &str) -> Result<bool, StoreError>
                = |db| sql::clones::require_hello_proofs(db, node_id, serial);

            /// Quarantines `node_id` as a cloned identity (seen on `serial`, with
            /// `alternations` in its verified proofs): every valid certificate
            /// revoked with the statement `seal` signs, `security.node.quarantined`
            /// published. False when it already was.
            write quarantine_clone(
                node_id: &NodeId,
                serial: &str,
                alternations: u32,
                seal: SealStatement,
            ) -> Result<bool, TxError>
                = |db| sql::clones::quarantine(db, node_id, serial, alternations, seal);

            read list_nodes() -> Result<NodeList, StoreError>
                = |db| sql::nodes::list_nodes(db);

            /// `list_nodes` of one node: empty when there is no such live node.
            read node(node_id: &NodeId) -> Result<NodeList, StoreError>
                = |db| sql::nodes::nodes_matching(db, Some(node_id));

            /// Deletes a node and revokes its certificates, keeping the statement
            /// `seal` signs of it with them; false if there was no such node.
            write delete_node(node_id: &NodeId, seal: SealStatement) -> Result<bool, StoreError>
                = |db| sql::nodes::delete_node(db, node_id, seal);

            // ----------------------------------------------------------- sessions
            read session(node_id: &NodeId) -> Result<Option<SessionRow>, StoreError>
                = |db| sql::sessions::session(db, node_id);

            /// Nodes connected through `gateway_id`.
            read connected_to(gateway_id: &GatewayId) -> Result<Vec<NodeId>, StoreError>
                = |db| sql::sessions::connected_to(db, gateway_id);

            // ------------------------------------------------------------- leases
            /// Every lease, live or expired, by name.
            read leases() -> Result<Vec<LeaseRow>, StoreError>
                = |db| sql::leases::list(db);

            /// Removes the oldest security events and boot records past `limits`.
            /// Under the history controller's lease.
            write prune_history(
                limits: crate::reconcile::HistoryLimits,
                held: &Held,
            ) -> Result<crate::reconcile::Pruned, StoreError>
                = |db| async {
                    sql::leases::check_held(db, held).await?;
                    sql::reconcile::prune_history(db, limits).await
                };

            // ---------------------------------------------------------- inventory
            read inventory(
                node_id: &NodeId,
                section: bcd_core::report::InventorySection,
            ) -> Result<Option<InventoryRow>, StoreError>
                = |db| sql::inventory::get(db, node_id, section);

            // ----------------------------------------------------------- commands
            /// Creates a command under the node's next sequence number, sealed by
            /// `seal`; a repeated idempotency key returns the first command and
            /// false.
            write create_command(
                cmd: &NewCommand,
                seal: SealCommand,
            ) -> Result<(CommandRow, bool), TxError>
                = |db| sql::commands::create(db, cmd, seal);

            read get_command(id: &CommandId) -> Result<Option<CommandRow>, StoreError>
                = |db| sql::commands::row(db, id);

            /// Newest first.
            read list_commands(
                node_id: Option<&NodeId>,
                limit: u32,
            ) -> Result<Vec<CommandRow>, StoreError>
                = |db| sql::commands::list(db, node_id, limit);

            /// Expires a command still pending with `reason`; false if it left.
            write cancel_pending_command(id: &CommandId, reason: &str) -> Result<bool, StoreError>
                = |db| sql::commands::cancel_pending(db, id, reason);

            // -------------------------------------------------------------- specs
            /// Changes a node's spec: `open` verifies the stored signed spec and
            /// gives the body it holds (never the unsigned columns), `change` edits
            /// it (or refuses), the generation grows by one, and `seal` signs the
            /// new spec, which lives [`crate::specs::LIFETIME`]. A stored spec that
            /// does not open is recorded as [`crate::specs::SPEC_FORGED`] and the
            /// change refused ([`crate::specs::forged_refusal`]): nothing is signed.
            /// Its refusal commits that event: the body answers it inside
            /// `Ok` (`recording`), and it becomes the error once committed.
            recording update_spec(
                node_id: &NodeId,
                change: ChangeSpec,
                open: OpenSpec,
                seal: SealSpec,
            ) -> Result<(u64, SpecBody), TxError>
                = |db| sql::specs::update(db, node_id, change, open, seal);

            /// Nodes (not deleted) whose signed spec expires within `within`: the
            /// worker signs a new generation for each.
            read specs_expiring(within: Duration) -> Result<Vec<NodeId>, StoreError>
                = |db| sql::specs::expiring(db, within);

            /// Every live node's signed spec, by node id: what label selectors and
            /// cordons are read from (opened and verified by the caller).
            read signed_specs() -> Result<Vec<(NodeId, Vec<u8>)>, StoreError>
                = |db| sql::specs::signed_all(db);

            /// Desired against applied; `None` for a node that does not exist.
            read spec_view(node_id: &NodeId) -> Result<Option<SpecView>, StoreError>
                = |db| sql::specs::view(db, node_id);

            // ----------------------------------------------------------- bindings
            read bindings(node_id: &NodeId) -> Result<Vec<BindingRow>, StoreError>
                = |db| sql::bindings::list(db, node_id);

            /// A node's recent fleet events, newest first: `kind: detail`.
            read fleet_events(node_id: &NodeId, limit: u32) -> Result<Vec<String>, StoreError>
                = |db| sql::bindings::fleet_events(db, node_id, limit);

            /// The fleet's events that `q` selects, oldest first.
            read list_fleet_events(
                q: &crate::events::EventQuery,
            ) -> Result<Vec<crate::events::FleetEvent>, StoreError>
                = |db| sql::bindings::list_fleet_events(db, q);

            /// Publishes a fleet event about a node, at the store's now (e.g.
            /// `security.renew.refused`, once the node proved its key). Bounded as
            /// every fleet event is: reconcile keeps the newest per node.
            write publish_fleet_event(
                kind: &str,
                node_id: &NodeId,
                detail: &str,
            ) -> Result<(), StoreError>
                = |db| sql::bindings::publish(db, kind, node_id, detail);

            // ------------------------------------------------------------- events
            /// A node's events, oldest first.
            read node_events(node_id: &NodeId) -> Result<Vec<EventRow>, StoreError>
                = |db| sql::events::list(db, node_id);

            // ----------------------------------------------------------- releases
            /// Stores a verified release; a sequence registered before is refused.
            write register_release(r: &NewRelease) -> Result<ReleaseRow, TxError>
                = |db| sql::releases::register(db, r);

            /// Newest first.
            read list_releases() -> Result<Vec<ReleaseRow>, StoreError>
                = |db| sql::releases::list(db);

            // ------------------------------------------------------------- images
            /// Registers a verified image; false when it was there already.
            write register_image(i: &NewImage) -> Result<bool, StoreError>
                = |db| sql::images::register(db, i);

            read list_images() -> Result<Vec<ImageRow>, StoreError>
                = |db| sql::images::list(db);

            /// Each image's id and signed manifest, as registered.
            read image_manifests() -> Result<Vec<(String, Vec<u8>)>, StoreError>
                = |db| sql::images::manifests(db);

            /// An image by id, unique id prefix, or name (the latest registered of
            /// that name).
            read resolve_image(what: &str) -> Result<ImageId, TxError>
                = |db| sql::images::resolve(db, what);

            /// Sets (or with `None` clears) what `target` boots; `mint_ttl_ms`
            /// set: the boot endpoint mints a join token of that life per script.
            write assign_image(
                target: &str,
                image_id: Option<&ImageId>,
                append: &str,
                mint_ttl_ms: Option<i64>,
            ) -> Result<(), StoreError>
                = |db| sql::images::assign(db, target, image_id, append, mint_ttl_ms);

            /// What `mac` boots (`crate::images::resolve`): its own assignment,
            /// else that of the node that reported it (not deleted), else its
            /// pool's (the node's, else its allow-list entry's), else the fleet
            /// default.
            read image_for_mac(mac: &str) -> Result<Option<Assigned>, StoreError>
                = |db| sql::images::for_mac(db, mac);

            /// Mints the join token `t` for `mac` if the MAC is on the boot
            /// allow-list: into the allow-list entry's pool, else `t.pool`; the
            /// unspent token minted for the MAC before is deleted. `None`: the MAC
            /// is not allowed, and nothing changed.
            write mint_boot_token(mac: &str, t: &NewToken) -> Result<Option<Minted>, StoreError>
                = |db| sql::images::mint(db, mac, t);

            /// Puts `mac` on the boot allow-list (again: its pool replaced).
            write allow_boot_mac(mac: &str, pool: Option<&str>) -> Result<(), StoreError>
                = |db| sql::images::allow_mac(db, mac, pool);

            /// Takes `mac` off the boot allow-list and deletes the unspent token
            /// minted for it; false when it was not on it.
            write disallow_boot_mac(mac: &str) -> Result<bool, StoreError>
                = |db| sql::images::disallow_mac(db, mac);

            /// The boot allow-list, by MAC.
            read boot_macs() -> Result<Vec<AllowedMac>, StoreError>
                = |db| sql::images::allowed_macs(db);

            /// A kernel or initrd by its SHA-256.
            read image_artifact(sha256: &str) -> Result<Option<Vec<u8>>, StoreError>
                = |db| sql::images::artifact(db, sha256);

            /// An artifact's length, without reading it.
            read image_artifact_size(sha256: &str) -> Result<Option<u64>, StoreError>
                = |db| sql::images::artifact_size(db, sha256);

            /// Records a request for a boot script; keeps the last boots of each
            /// MAC.
            write record_boot(b: &BootRecord) -> Result<(), StoreError>
                = |db| sql::images::record_boot(db, b);

            /// Newest first.
            read boots(mac: Option<&str>, limit: u32) -> Result<Vec<BootRow>, StoreError>
                = |db| sql::images::boots(db, mac, limit);

            // ----------------------------------------------------------- rollouts
            /// Starts a rollout (see [`crate::rollouts::plan`]).
            write start_rollout(r: &NewRollout) -> Result<Rollout, TxError>
                = |db| sql::rollouts::start(db, r);

            read rollout(id: &str) -> Result<Option<Rollout>, StoreError>
                = |db| sql::rollouts::get(db, id);

            /// Newest first.
            read list_rollouts() -> Result<Vec<Rollout>, StoreError>
                = |db| sql::rollouts::list(db);

            /// Moves a rollout from one of `from` to `to`; false if it was in none.
            write set_rollout_state(
                id: &str,
                from: &[RolloutState],
                to: RolloutState,
                reason: &str,
            ) -> Result<bool, StoreError>
                = |db| sql::rollouts::set_state(db, id, from, to, reason);

            /// Moves a running rollout from wave `from` to `to`; false if it was
            /// not there. Under the rollout controller's lease.
            write advance_rollout(
                id: &str,
                from: usize,
                to: usize,
                held: &Held,
            ) -> Result<bool, StoreError>
                = |db| async {
                    sql::leases::check_held(db, held).await?;
                    sql::rollouts::advance(db, id, from, to).await
                };

            write record_rollout_command(
                id: &str,
                node_id: &NodeId,
                which: RolloutCommand,
                command_id: &CommandId,
            ) -> Result<(), StoreError>
                = |db| sql::rollouts::record_command(db, id, node_id, which, command_id);

            /// Marks a node skipped: it already runs the release or a later one.
            /// Under the rollout controller's lease.
            write skip_rollout_node(id: &str, node_id: &NodeId, held: &Held) -> Result<(), StoreError>
                = |db| async {
                    sql::leases::check_held(db, held).await?;
                    sql::rollouts::skip(db, id, node_id).await
                };

            // -------------------------------------------------------------- audit
            /// The audit history and the current tables, in one read.
            snapshot audit_snapshot() -> Result<AuditSnapshot, StoreError>
                = |db| sql::audit::snapshot(db);

            /// The audit history and chain heads alone, in one read.
            snapshot audit_history() -> Result<AuditHistory, StoreError>
                = |db| sql::audit::history(db);

            read settling() -> Result<Settling, StoreError>
                = |db| sql::audit::settling(db);

            // ------------------------------------------------------------ backups
            /// Records a backup set CREATING (see [`crate::backups`]).
            write begin_backup(b: &NewBackup) -> Result<BackupRow, StoreError>
                = |db| sql::backups::begin(db, b);

            /// CREATING to COMPLETE, restore eligible; false if it was not
            /// CREATING (a set that failed never completes).
            write finish_backup(id: &str, files: u64, bytes: u64) -> Result<bool, StoreError>
                = |db| sql::backups::finish(db, id, files, bytes);

            /// CREATING to FAILED with `reason`; false if it was not CREATING.
            write fail_backup(id: &str, reason: &str) -> Result<bool, StoreError>
                = |db| sql::backups::fail(db, id, reason);

            /// Newest first.
            read backups() -> Result<Vec<BackupRow>, StoreError>
                = |db| sql::backups::list(db);

            read backup(id: &str) -> Result<Option<BackupRow>, StoreError>
                = |db| sql::backups::get(db, id);

            /// The reconcile every start runs (see [`crate::reconcile`]), audited
            /// as `owner`'s.
            write reconcile(
                owner: &str,
                dead_after: Duration,
            ) -> Result<crate::reconcile::Reconciled, StoreError>
                = |db| sql::reconcile::run(db, owner, dead_after);
        }
    };
}
pub(crate) use key_holder_operations;

key_holder_operations!(declare!(
    /// Everything else: intent, identity and keys, what only the key holder
    /// does.
    (pub trait Backend: GatewayBackend)
    {
        /// On PostgreSQL, what to run (as a user who may create roles) so that
        /// gateway `name` connects as a role of its own with exactly a
        /// gateway's privileges ([`crate::postgres::grants`]); `None` on
        /// SQLite, where every process shares the file.
        async fn gateway_role_sql(&self, name: &GatewayId) -> Result<Option<String>, StoreError>;

        // ------------------------------------------------- nodes, certificates
        /// Issues a next certificate to the node whose valid certificate has
        /// `fingerprint`, and records it.
        async fn renew(&self, fingerprint: &str, issue: RenewCert) -> Result<Joined, TxError> {
            self.renew_within(fingerprint, issue, 0).await
        }

        /// Every table, in one consistent read transaction, while the store is
        /// in use.
        async fn dump(&self) -> Result<Dump, StoreError>;

        /// Replaces everything in the store with `dump`, in one transaction: for
        /// a stopped control plane. A dump of another backend or schema version
        /// is refused.
        async fn restore(&self, dump: Dump) -> Result<(), TxError>;

        /// Blocks every writer for `duration`, as a stalled database would: the
        /// fleet simulator's store fault.
        async fn stall(&self, duration: Duration) -> Result<(), StoreError>;
    }
));
