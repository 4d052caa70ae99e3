//! The interface every store backend implements.
//!
//! Every method is exactly one transaction: it commits in full or changes
//! nothing, and no caller holds a transaction across calls (an operation
//! that must be atomic is one method, e.g. [`Backend::gateway_shutdown`]).
//! The decisions inside a transaction (certificate validity, token
//! admission, the Hello's settlement of in-flight commands, binding
//! judgement, liveness rules) are the pure functions of this crate's domain
//! modules; a backend owns only its SQL.
//!
//! Times are unix milliseconds on the store's clock (`compute_now()`);
//! callers hand in ages and durations, never timestamps of their own.
//! Methods that can turn a request down return [`TxError`]; the others
//! fail only with [`StoreError`].

use std::time::Duration;

use async_trait::async_trait;

use crate::audit::{AuditHistory, AuditSnapshot, Settling};
use crate::backups::{BackupRow, Dump, NewBackup};
use crate::bindings::{BindingInput, BindingOutcome, BindingRow, VerifySignature};
use crate::commands::{CommandRow, Dispatch, NewCommand, ResultApplied, ResultInput, SealCommand};
use crate::error::{StoreError, TxError};
use crate::events::{EventInput, EventRow};
use crate::gateways::{GatewayCert, GatewayCredential, SignedRevocations};
use crate::images::{AllowedMac, Assigned, BootRecord, BootRow, ImageRow, Minted, NewImage};
use crate::inventory::{InventoryInput, InventoryRow};
use crate::leases::{Held, LeaseRow};
use crate::liveness::{LivenessRules, SweepOutcome};
use crate::machines::{Enrolled, Enrolment, NewEnrolment};
use crate::nodes::{NodeList, RenewCert, Revocation, SealStatement, Signed, ValidCert};
use crate::releases::{NewRelease, ReleaseFiles, ReleaseHead, ReleaseRow};
use crate::rollouts::{NewRollout, Rollout, RolloutCommand, RolloutState};
use crate::sessions::{
    Ended, FleetSize, HelloInput, HelloOutcome, Seen, SessionKey, SessionRow, Sighting,
};
use crate::specs::{
    ChangeSpec, FactApplied, OpenSpec, SealSpec, SpecBody, SpecView, StateReportInput,
};
use crate::tokens::{
    IssueCert, JoinInput, Joined, NewOperator, NewToken, OperatorRow, PreviousProof,
    SealRevocation, TokenInfo,
};

/// What a gateway may do with the store: the facts of sessions and
/// liveness, node-signed records it hands on, and reads. A gateway-only
/// process holds a [`crate::GatewayStore`], which offers nothing else;
/// on PostgreSQL its database role is granted exactly what these
/// methods write ([`crate::postgres::grants`]).
#[async_trait]
pub trait GatewayBackend: Send + Sync + std::fmt::Debug {
    /// `compute_now()`: the store's clock.
    async fn now(&self) -> Result<i64, StoreError>;

    /// The schema version: how many migrations the store has applied.
    async fn schema_version(&self) -> Result<u32, StoreError>;

    /// The node a certificate belongs to, if it is valid now.
    async fn check_cert(&self, fingerprint: &str) -> Result<ValidCert, TxError>;

    /// Certificates revoked at or after `since_ms`, oldest first.
    async fn revoked_since(&self, since_ms: i64) -> Result<Vec<Revocation>, StoreError>;

    /// The newest signed list of revoked gateway certificates, if the key
    /// holder signed one.
    async fn gateway_revocations(&self) -> Result<Option<SignedRevocations>, StoreError>;

    /// The key holder's receipts for `node`'s security events of journal
    /// `journal_id` among `keys` (each event as stored, and its signed
    /// receipt): one at most for each, whatever else was planted under its
    /// id.
    async fn event_receipts(
        &self,
        node: &str,
        journal_id: &str,
        keys: &[crate::events::EventKey],
    ) -> Result<Vec<(crate::events::EventKey, Vec<u8>)>, StoreError>;

    /// The key holder's receipts for results of `node`'s commands among
    /// `ids` (command id, signed receipt; empty where the key holder
    /// judged the result and gives none), and for its unknown results
    /// with those ids; commands not judged yet are left out.
    async fn result_receipts(
        &self,
        node: &str,
        ids: &[String],
    ) -> Result<Vec<(String, Vec<u8>)>, StoreError>;

    /// Keeps a result its node signed for a command the store does not
    /// know, for the key holder to receipt ([`crate::commands::UnknownResult`]).
    /// False when it is not kept: the node holds
    /// [`crate::commands::UNKNOWN_RESULTS_PER_NODE`] already.
    async fn put_unknown_result(
        &self,
        r: &crate::commands::UnknownResult,
    ) -> Result<bool, StoreError>;

    /// The Hello transaction (see [`crate::sessions`]).
    async fn hello(&self, h: &HelloInput) -> Result<HelloOutcome, TxError>;

    /// Marks each session disconnected (since it ended) if its epoch is
    /// still the node's, in one transaction. Returns those that applied.
    async fn disconnect(&self, ended: &[Ended]) -> Result<Vec<SessionKey>, StoreError>;

    /// Records when each of a gateway's sessions was last heard. Returns the
    /// sessions that are no longer current (a newer Hello ran): the gateway
    /// closes them.
    async fn flush_liveness(
        &self,
        gateway_id: &str,
        seen: &[Seen],
    ) -> Result<Vec<SessionKey>, StoreError>;

    /// An orderly gateway stop: disconnects its remaining sessions (cause
    /// `gateway-shutdown`) and releases its lease, together.
    async fn gateway_shutdown(
        &self,
        gateway_id: &str,
        sessions: &[SessionKey],
    ) -> Result<(), StoreError>;

    /// The spec generation of every node connected through `gateway_id`:
    /// the gateway compares each with the one its session sent, so a spec
    /// whose transaction committed long after its `updated_at` stamp still
    /// goes out, whatever the clocks say.
    async fn spec_generations(&self, gateway_id: &str) -> Result<Vec<(String, u64)>, StoreError>;

    /// Nodes connected through `gateway_id` with work waiting: a pending
    /// command, or a spec changed at or after `specs_since_ms`.
    async fn nodes_with_work(
        &self,
        gateway_id: &str,
        specs_since_ms: i64,
    ) -> Result<Vec<String>, StoreError>;

    /// The liveness controller's sweep (see [`crate::liveness`]), under
    /// its lease (written only while `held` holds).
    async fn sweep_liveness(
        &self,
        rules: &LivenessRules,
        held: &Held,
    ) -> Result<SweepOutcome, StoreError>;

    /// How many sessions are connected, how many gateways hold a live
    /// lease and what they reported they absorb: what a whole fleet
    /// redialing at once would bring, and how fast it is taken.
    async fn fleet_size(&self) -> Result<FleetSize, StoreError>;

    /// Records on this gateway's own lease the Hellos a second it measured
    /// it absorbs (nothing when it does not hold the lease).
    async fn report_absorption(&self, gateway_id: &str, per_s: u32) -> Result<(), StoreError>;

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

    /// Removes leases expired longer than `dead_after` ago (their holders
    /// are gone); returns their names. Under the sweeper's lease.
    async fn remove_dead_leases(
        &self,
        dead_after: Duration,
        held: &Held,
    ) -> Result<Vec<String>, StoreError>;

    /// Stores an inventory section the node signed, if it verifies
    /// ([`crate::nodes::judge_signed`]) and names the session `epoch`, which
    /// must be the node's current one; a forgery is recorded.
    async fn put_inventory(
        &self,
        node_id: &str,
        epoch: u64,
        section: &Signed<InventoryInput>,
        verify: VerifySignature,
    ) -> Result<FactApplied, StoreError>;

    /// Takes the node's dispatchable commands (see
    /// [`crate::commands::dispatchable`]) for the session `epoch` on
    /// `gateway_id`, marking them dispatched; nothing if the node is routed
    /// elsewhere.
    async fn take_dispatchable(
        &self,
        gateway_id: &str,
        node_id: &str,
        epoch: u64,
    ) -> Result<Vec<Dispatch>, StoreError>;

    /// The node acknowledged a dispatch (ACCEPTED) or reported it running,
    /// on its session under `epoch` through `gateway_id`. Fenced: it applies
    /// only while that session is the node's current one and the command is
    /// in flight on it, and only forward (dispatched to acked, dispatched or
    /// acked to running), so a zombie gateway's late or replayed ack moves
    /// nothing.
    async fn command_ack(
        &self,
        route: &crate::commands::Route,
        id: &str,
        running: bool,
    ) -> Result<bool, StoreError>;

    /// Applies a result the node signed, if it verifies (a forgery is
    /// recorded and applied nowhere): the first terminal result wins, from
    /// any epoch. A confirmed upgrade raises the node's release floor.
    async fn command_result(
        &self,
        node_id: &str,
        r: &Signed<ResultInput>,
        verify: VerifySignature,
    ) -> Result<ResultApplied, StoreError>;

    /// How many commands are in each state (only states that have some).
    async fn command_states(&self) -> Result<Vec<(String, u64)>, StoreError>;

    /// Expires pending commands past their deadline; returns them. Under
    /// the sweeper's lease.
    async fn sweep_commands(&self, held: &Held) -> Result<Vec<String>, StoreError>;

    /// The signed spec to send a node, with its generation.
    async fn signed_spec(&self, node_id: &str) -> Result<Option<(u64, Vec<u8>)>, StoreError>;

    /// Records a state report the node signed, if it verifies (a forgery is
    /// recorded) and is not from an older session than the last applied.
    async fn put_state_report(
        &self,
        node_id: &str,
        report: &Signed<StateReportInput>,
        verify: VerifySignature,
    ) -> Result<FactApplied, StoreError>;

    /// Judges a node's signed binding report (see [`crate::bindings`]).
    async fn record_binding(
        &self,
        b: &BindingInput,
        verify: VerifySignature,
    ) -> Result<BindingOutcome, StoreError>;

    /// Stores a batch of a node's events (idempotently); returns the id to
    /// acknowledge up to.
    async fn put_events(
        &self,
        node_id: &str,
        journal_id: &str,
        events: &[EventInput],
    ) -> Result<u64, StoreError>;

    /// A release's signed manifest and its binary's length, without
    /// reading the binary.
    async fn release_head(&self, sequence: u64) -> Result<Option<ReleaseHead>, StoreError>;

    /// Up to `len` bytes (at most [`releases::MAX_CHUNK`](crate::releases::MAX_CHUNK))
    /// of a release's binary from `offset`, reading only those bytes:
    /// fewer at its end, none past it; `None` when no such release is
    /// registered.
    async fn release_chunk(
        &self,
        sequence: u64,
        offset: u64,
        len: u32,
    ) -> Result<Option<Vec<u8>>, StoreError>;

    /// One image by its whole id, with its signed manifest (its
    /// assignments not read); `None` if none has that id.
    async fn image(&self, image_id: &str) -> Result<Option<(ImageRow, Vec<u8>)>, StoreError>;

    /// At most `len` bytes (capped at `releases::MAX_CHUNK`) of an
    /// artifact from `offset`; empty past its end, `None` for an unknown
    /// one.
    async fn image_artifact_chunk(
        &self,
        sha256: &str,
        offset: u64,
        len: u32,
    ) -> Result<Option<Vec<u8>>, StoreError>;

    /// A release's manifest and binary, whole.
    async fn release(&self, sequence: u64) -> Result<Option<ReleaseFiles>, StoreError>;
}

/// Everything else: intent, identity and keys, what only the key holder
/// does.
#[async_trait]
pub trait Backend: GatewayBackend {
    // ------------------------------------------------ tokens, operators

    /// Records an operator and its certificate; refused if the name is
    /// taken (revoked operators keep theirs).
    async fn add_operator(&self, o: &NewOperator) -> Result<(), TxError>;

    /// Every operator, revoked ones included, oldest first.
    async fn list_operators(&self) -> Result<Vec<OperatorRow>, StoreError>;

    /// The operator a client certificate (its SHA-256) was issued to.
    async fn operator_by_cert(&self, cert_sha256: &str) -> Result<Option<OperatorRow>, StoreError>;

    /// Revokes an operator's certificate (once; again is no change),
    /// keeping beside it what `seal` signs of the row and the time.
    async fn revoke_operator(&self, id: &str, seal: SealRevocation)
    -> Result<OperatorRow, TxError>;

    // ------------------------------------------------ secrets

    /// Puts a secret's first version (`Put::New`; a live name is refused)
    /// or its next (`Put::Rotate`; an unknown name is refused), sealed by
    /// `seal` for the version decided here, by operator `by`.
    async fn put_secret(
        &self,
        name: &str,
        put: crate::secrets::Put,
        by: &str,
        seal: crate::secrets::SealSecret,
    ) -> Result<crate::secrets::SecretSummary, TxError>;

    /// One version of a secret, unless it was deleted.
    async fn secret(
        &self,
        name: &str,
        version: u64,
    ) -> Result<Option<crate::secrets::SecretRow>, StoreError>;

    /// Every live secret's newest version, by name.
    async fn list_secrets(&self) -> Result<Vec<crate::secrets::SecretSummary>, StoreError>;

    /// Wipes every version of a secret; its newest, as it was.
    async fn delete_secret(&self, name: &str) -> Result<crate::secrets::SecretSummary, TxError>;

    // ------------------------------------------------ gateway credentials

    /// Adds a gateway credential (the SHA-256 of its secret); returns when
    /// it was added. A name that is live already is refused.
    async fn add_gateway_credential(&self, name: &str, secret_sha256: &str)
    -> Result<i64, TxError>;

    async fn gateway_credential(&self, name: &str)
    -> Result<Option<GatewayCredential>, StoreError>;

    async fn list_gateway_credentials(&self) -> Result<Vec<GatewayCredential>, StoreError>;

    /// Revokes a live credential; false if there is none by that name.
    async fn revoke_gateway_credential(&self, name: &str) -> Result<bool, StoreError>;

    /// Records a serving certificate just issued to a gateway.
    async fn record_gateway_cert(&self, cert: &GatewayCert) -> Result<(), StoreError>;

    /// The recorded gateway certificates still within their life that
    /// their name's credential no longer admits (revoked, replaced by a
    /// name added again, or gone), oldest first.
    async fn revoked_gateway_certs(&self) -> Result<Vec<GatewayCert>, StoreError>;

    /// Nodes' security events the key holder has not judged for a
    /// receipt yet, at most `limit`.
    async fn security_events_unreceipted(
        &self,
        limit: u32,
    ) -> Result<Vec<crate::events::SecurityEvent>, StoreError>;

    /// Keeps the key holder's receipt beside a node's security event (once
    /// only), and forgets that node's security events receipted more than
    /// [`crate::events::SECURITY_EVENTS_KEPT_MS`] ago.
    async fn put_event_receipt(
        &self,
        event: &crate::events::SecurityEvent,
        receipt: &[u8],
    ) -> Result<(), StoreError>;

    /// Commands whose result a node signed that the key holder has not
    /// judged for a receipt yet, at most `limit`.
    async fn results_unreceipted(&self, limit: u32) -> Result<Vec<String>, StoreError>;

    /// Unknown results the key holder has not judged yet, at most `limit`.
    async fn unknown_results_unreceipted(
        &self,
        limit: u32,
    ) -> Result<Vec<crate::commands::UnknownResult>, StoreError>;

    /// Keeps the key holder's judgement beside an unknown result (its
    /// receipt, or an empty one where it gives none; once only), and
    /// forgets that node's unknown results judged with none (so they take
    /// no room) or receipted more than
    /// [`crate::events::SECURITY_EVENTS_KEPT_MS`] ago.
    async fn put_unknown_result_receipt(
        &self,
        r: &crate::commands::UnknownResult,
        receipt: &[u8],
    ) -> Result<(), StoreError>;

    /// Records the key holder's judgement of a command's signed result:
    /// its receipt, or an empty one where it gives none. Once only.
    async fn put_result_receipt(&self, id: &str, receipt: &[u8]) -> Result<(), StoreError>;

    /// Stores a newly signed list of revoked gateway certificates in place
    /// of the last one, and forgets the records of certificates long past
    /// their end ([`crate::gateways::CERT_KEPT_PAST_END_MS`]).
    async fn put_gateway_revocations(&self, list: &SignedRevocations) -> Result<(), StoreError>;

    /// On PostgreSQL, what to run (as a user who may create roles) so that
    /// gateway `name` connects as a role of its own with exactly a
    /// gateway's privileges ([`crate::postgres::grants`]); `None` on
    /// SQLite, where every process shares the file.
    async fn gateway_role_sql(&self, name: &str) -> Result<Option<String>, StoreError>;

    /// Creates a join token; returns its expiry.
    async fn create_token(&self, t: &NewToken) -> Result<i64, StoreError>;

    /// Join tokens, newest first, at most [`crate::tokens::LIST_LIMIT`]:
    /// the live ones (unexpired, uses left), or every one with `all`.
    async fn list_tokens(&self, all: bool) -> Result<Vec<TokenInfo>, StoreError>;

    /// Makes a token expire now (no later join can spend it; the nodes
    /// that joined with it keep their identities); `None` if no token has
    /// that id. Revoking a spent or expired token changes nothing.
    async fn revoke_token(&self, id: &str) -> Result<Option<TokenInfo>, StoreError>;

    /// Checks and spends one use of a token, creates the node and records
    /// the certificate `issue` builds for it.
    async fn join(&self, j: &JoinInput, issue: IssueCert) -> Result<Joined, TxError>;

    /// Checks a token and the proof of a previous identity, spends one use
    /// of the token and re-enrols the proven node: the same id at the next
    /// identity generation, every earlier certificate revoked with the
    /// statement `seal` signs, the certificate `issue` builds recorded, a
    /// fleet event kept. A refused token or proof changes nothing.
    async fn reenrol(
        &self,
        j: &JoinInput,
        proof: &PreviousProof,
        issue: IssueCert,
        seal: SealStatement,
    ) -> Result<Joined, TxError>;

    /// Checks and spends one use of a token and joins the machine whose
    /// TPM's EK has `ek_sha256` (hex): the node bound to that EK and not
    /// deleted again, at its next identity generation with every earlier
    /// certificate revoked (the statement `seal` signs) and a fleet event
    /// kept; else a new node bound to the EK. A refused token changes
    /// nothing.
    async fn join_attested(
        &self,
        j: &JoinInput,
        ek_sha256: &str,
        issue: IssueCert,
        seal: SealStatement,
    ) -> Result<Joined, TxError>;

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
    async fn join_enrolled(
        &self,
        j: &JoinInput,
        ek_sha256: &str,
        ek_ca: Option<&str>,
        boot_id: &str,
        issue: IssueCert,
        seal: SealStatement,
        proves: crate::machines::ProvesMachine,
    ) -> Result<Enrolled, TxError>;

    /// Enrols a machine by its EK, or an EK CA; refused when that one is
    /// enrolled already.
    async fn enrol_machine(&self, e: &NewEnrolment) -> Result<Enrolment, TxError>;

    /// Every enrolment, EKs first.
    async fn list_enrolments(&self) -> Result<Vec<Enrolment>, StoreError>;

    /// Removes the enrolment `id` (a node already bound stays bound).
    async fn remove_enrolment(&self, id: &str) -> Result<Enrolment, TxError>;

    // ------------------------------------------------- nodes, certificates

    /// Issues a next certificate to the node whose valid certificate has
    /// `fingerprint`, and records it.
    async fn renew(&self, fingerprint: &str, issue: RenewCert) -> Result<Joined, TxError> {
        self.renew_within(fingerprint, issue, 0).await
    }

    /// As [`Backend::renew`], taking a certificate that ran out at most
    /// `expired_grace_ms` ago as well (x509pop; never a revoked one, nor
    /// one of a deleted node: `nodes::check_renewable`).
    async fn renew_within(
        &self,
        fingerprint: &str,
        issue: RenewCert,
        expired_grace_ms: i64,
    ) -> Result<Joined, TxError>;

    /// Every certificate the store holds for `node_id` (DER), revoked and
    /// superseded ones too: what a reader checks against the fleet CA
    /// before it verifies something the node signed with one.
    async fn node_certificates(&self, node_id: &str) -> Result<Vec<Vec<u8>>, StoreError>;

    // ------------------------------------------------------ clone watch
    // (`crate::clones`: gateways record sightings; the key holder believes
    // them only once it verified their proofs)

    /// Sightings the watch has not marked read, in id order, at most
    /// `limit`.
    async fn sightings_unwatched(&self, limit: u32) -> Result<Vec<Sighting>, StoreError>;

    /// Marks sightings read by the watch: they are not read again by
    /// [`Backend::sightings_unwatched`] (a certificate's sightings are,
    /// by [`Backend::sightings_of`]).
    async fn mark_sightings_watched(&self, ids: &[i64]) -> Result<(), StoreError>;

    /// A certificate's sightings recorded at or after `since_ms` (the
    /// store's clock, as the recording gateway said), oldest first.
    async fn sightings_of(&self, serial: &str, since_ms: i64) -> Result<Vec<Sighting>, StoreError>;

    /// Deletes sightings whose proofs did not verify, publishing for each
    /// a `security.hello.forged` event that says why.
    async fn drop_forged_sightings(&self, forged: &[(Sighting, String)]) -> Result<(), StoreError>;

    /// Revokes, as superseded, `node_id`'s valid certificates no newer
    /// than `serial` (which the node proved it uses); their serials.
    async fn supersede(&self, node_id: &str, serial: &str) -> Result<Vec<String>, StoreError>;

    /// Succeeded upgrades whose result the key holder has not judged for
    /// the node's release floor, at most `limit` (their command ids).
    async fn upgrades_unjudged(&self, limit: u32) -> Result<Vec<String>, StoreError>;

    /// Marks the succeeded upgrade `command_id` judged and, when the key
    /// holder verified the node signed its result (`believed`), raises the
    /// node's release floor to its release; the floor it raised to. A
    /// gateway's result raises no floor: the node's signature is believed
    /// only where the key holder checked it.
    async fn judge_upgrade_floor(
        &self,
        command_id: &str,
        believed: bool,
    ) -> Result<Option<u64>, StoreError>;

    /// From now on `node_id`'s Hellos without a proof are refused
    /// (`Refusal::HelloUnproved`): the watch verified a proof under its
    /// valid certificate `serial` signed by a confirmed release. True when
    /// this set it; false when it was set already, or `serial` is not a
    /// valid certificate of the node (a re-enrolment since revoked it).
    async fn require_hello_proofs(&self, node_id: &str, serial: &str) -> Result<bool, StoreError>;

    /// Quarantines `node_id` as a cloned identity (seen on `serial`, with
    /// `alternations` in its verified proofs): every valid certificate
    /// revoked with the statement `seal` signs, `security.node.quarantined`
    /// published. False when it already was.
    async fn quarantine_clone(
        &self,
        node_id: &str,
        serial: &str,
        alternations: u32,
        seal: SealStatement,
    ) -> Result<bool, TxError>;

    async fn list_nodes(&self) -> Result<NodeList, StoreError>;

    /// `list_nodes` of one node: empty when there is no such live node.
    async fn node(&self, node_id: &str) -> Result<NodeList, StoreError>;

    /// Deletes a node and revokes its certificates, keeping the statement
    /// `seal` signs of it with them; false if there was no such node.
    async fn delete_node(&self, node_id: &str, seal: SealStatement) -> Result<bool, StoreError>;

    // ----------------------------------------------------------- sessions
    async fn session(&self, node_id: &str) -> Result<Option<SessionRow>, StoreError>;

    /// Nodes connected through `gateway_id`.
    async fn connected_to(&self, gateway_id: &str) -> Result<Vec<String>, StoreError>;

    // ------------------------------------------------------------- leases
    /// Every lease, live or expired, by name.
    async fn leases(&self) -> Result<Vec<LeaseRow>, StoreError>;

    /// Removes the oldest security events and boot records past `limits`.
    /// Under the history controller's lease.
    async fn prune_history(
        &self,
        limits: crate::reconcile::HistoryLimits,
        held: &Held,
    ) -> Result<crate::reconcile::Pruned, StoreError>;

    // ---------------------------------------------------------- inventory
    async fn inventory(
        &self,
        node_id: &str,
        section: &str,
    ) -> Result<Option<InventoryRow>, StoreError>;

    // ----------------------------------------------------------- commands

    /// Creates a command under the node's next sequence number, sealed by
    /// `seal`; a repeated idempotency key returns the first command and
    /// false.
    async fn create_command(
        &self,
        c: &NewCommand,
        seal: SealCommand,
    ) -> Result<(CommandRow, bool), TxError>;

    async fn get_command(&self, id: &str) -> Result<Option<CommandRow>, StoreError>;

    /// Newest first.
    async fn list_commands(
        &self,
        node_id: Option<&str>,
        limit: u32,
    ) -> Result<Vec<CommandRow>, StoreError>;

    /// Expires a command still pending with `reason`; false if it left.
    async fn cancel_pending_command(&self, id: &str, reason: &str) -> Result<bool, StoreError>;

    // -------------------------------------------------------------- specs

    /// Changes a node's spec: `open` verifies the stored signed spec and
    /// gives the body it holds (never the unsigned columns), `change` edits
    /// it (or refuses), the generation grows by one, and `seal` signs the
    /// new spec, which lives [`crate::specs::LIFETIME`]. A stored spec that
    /// does not open is recorded as [`crate::specs::SPEC_FORGED`] and the
    /// change refused ([`crate::specs::forged_refusal`]): nothing is signed.
    async fn update_spec(
        &self,
        node_id: &str,
        change: ChangeSpec,
        open: OpenSpec,
        seal: SealSpec,
    ) -> Result<(u64, SpecBody), TxError>;

    /// Nodes (not deleted) whose signed spec expires within `within`: the
    /// worker signs a new generation for each.
    async fn specs_expiring(&self, within: Duration) -> Result<Vec<String>, StoreError>;

    /// Desired against applied; `None` for a node that does not exist.
    /// Every live node's signed spec, by node id: what label selectors and
    /// cordons are read from (opened and verified by the caller).
    async fn signed_specs(&self) -> Result<Vec<(String, Vec<u8>)>, StoreError>;

    async fn spec_view(&self, node_id: &str) -> Result<Option<SpecView>, StoreError>;

    // ----------------------------------------------------------- bindings
    async fn bindings(&self, node_id: &str) -> Result<Vec<BindingRow>, StoreError>;

    /// A node's recent fleet events, newest first: `kind: detail`.
    async fn fleet_events(&self, node_id: &str, limit: u32) -> Result<Vec<String>, StoreError>;

    /// The fleet's events that `q` selects, oldest first.
    async fn list_fleet_events(
        &self,
        q: &crate::events::EventQuery,
    ) -> Result<Vec<crate::events::FleetEvent>, StoreError>;

    /// Publishes a fleet event about a node, at the store's now (e.g.
    /// `security.renew.refused`, once the node proved its key). Bounded as
    /// every fleet event is: reconcile keeps the newest per node.
    async fn publish_fleet_event(
        &self,
        kind: &str,
        node_id: &str,
        detail: &str,
    ) -> Result<(), StoreError>;

    // ------------------------------------------------------------- events
    /// A node's events, oldest first.
    async fn node_events(&self, node_id: &str) -> Result<Vec<EventRow>, StoreError>;

    // ----------------------------------------------------------- releases

    /// Stores a verified release; a sequence registered before is refused.
    async fn register_release(&self, r: &NewRelease) -> Result<ReleaseRow, TxError>;

    /// Newest first.
    async fn list_releases(&self) -> Result<Vec<ReleaseRow>, StoreError>;

    // ------------------------------------------------------------- images

    /// Registers a verified image; false when it was there already.
    async fn register_image(&self, i: &NewImage) -> Result<bool, StoreError>;

    async fn list_images(&self) -> Result<Vec<ImageRow>, StoreError>;

    /// Each image's id and signed manifest, as registered.
    async fn image_manifests(&self) -> Result<Vec<(String, Vec<u8>)>, StoreError>;

    /// An image by id, unique id prefix, or name (the latest registered of
    /// that name).
    async fn resolve_image(&self, what: &str) -> Result<String, TxError>;

    /// Sets (or with `None` clears) what `target` boots; `mint_ttl_ms`
    /// set: the boot endpoint mints a join token of that life per script.
    async fn assign_image(
        &self,
        target: &str,
        image_id: Option<&str>,
        append: &str,
        mint_ttl_ms: Option<i64>,
    ) -> Result<(), StoreError>;

    /// What `mac` boots (`crate::images::resolve`): its own assignment,
    /// else that of the node that reported it (not deleted), else its
    /// pool's (the node's, else its allow-list entry's), else the fleet
    /// default.
    async fn image_for_mac(&self, mac: &str) -> Result<Option<Assigned>, StoreError>;

    /// Mints the join token `t` for `mac` if the MAC is on the boot
    /// allow-list: into the allow-list entry's pool, else `t.pool`; the
    /// unspent token minted for the MAC before is deleted. `None`: the MAC
    /// is not allowed, and nothing changed.
    async fn mint_boot_token(&self, mac: &str, t: &NewToken) -> Result<Option<Minted>, StoreError>;

    /// Puts `mac` on the boot allow-list (again: its pool replaced).
    async fn allow_boot_mac(&self, mac: &str, pool: Option<&str>) -> Result<(), StoreError>;

    /// Takes `mac` off the boot allow-list and deletes the unspent token
    /// minted for it; false when it was not on it.
    async fn disallow_boot_mac(&self, mac: &str) -> Result<bool, StoreError>;

    /// The boot allow-list, by MAC.
    async fn boot_macs(&self) -> Result<Vec<AllowedMac>, StoreError>;

    /// A kernel or initrd by its SHA-256.
    async fn image_artifact(&self, sha256: &str) -> Result<Option<Vec<u8>>, StoreError>;

    /// An artifact's length, without reading it.
    async fn image_artifact_size(&self, sha256: &str) -> Result<Option<u64>, StoreError>;

    /// Records a request for a boot script; keeps the last boots of each
    /// MAC.
    async fn record_boot(&self, b: &BootRecord) -> Result<(), StoreError>;

    /// Newest first.
    async fn boots(&self, mac: Option<&str>, limit: u32) -> Result<Vec<BootRow>, StoreError>;

    // ----------------------------------------------------------- rollouts

    /// Starts a rollout (see [`crate::rollouts::plan`]).
    async fn start_rollout(&self, r: &NewRollout) -> Result<Rollout, TxError>;

    async fn rollout(&self, id: &str) -> Result<Option<Rollout>, StoreError>;

    /// Newest first.
    async fn list_rollouts(&self) -> Result<Vec<Rollout>, StoreError>;

    /// Moves a rollout from one of `from` to `to`; false if it was in none.
    async fn set_rollout_state(
        &self,
        id: &str,
        from: &[RolloutState],
        to: RolloutState,
        reason: &str,
    ) -> Result<bool, StoreError>;

    /// Moves a running rollout from wave `from` to `to`; false if it was
    /// not there. Under the rollout controller's lease.
    async fn advance_rollout(
        &self,
        id: &str,
        from: usize,
        to: usize,
        held: &Held,
    ) -> Result<bool, StoreError>;

    async fn record_rollout_command(
        &self,
        id: &str,
        node_id: &str,
        which: RolloutCommand,
        command_id: &str,
    ) -> Result<(), StoreError>;

    /// Marks a node skipped: it already runs the release or a later one.
    /// Under the rollout controller's lease.
    async fn skip_rollout_node(
        &self,
        id: &str,
        node_id: &str,
        held: &Held,
    ) -> Result<(), StoreError>;

    // -------------------------------------------------------------- audit

    /// The audit history and the current tables, in one read.
    async fn audit_snapshot(&self) -> Result<AuditSnapshot, StoreError>;

    /// The audit history and chain heads alone, in one read.
    async fn audit_history(&self) -> Result<AuditHistory, StoreError>;

    async fn settling(&self) -> Result<Settling, StoreError>;

    // ------------------------------------------------------------ backups

    /// Records a backup set CREATING (see [`crate::backups`]).
    async fn begin_backup(&self, b: &NewBackup) -> Result<BackupRow, StoreError>;

    /// CREATING to COMPLETE, restore eligible; false if it was not
    /// CREATING (a set that failed never completes).
    async fn finish_backup(&self, id: &str, files: u64, bytes: u64) -> Result<bool, StoreError>;

    /// CREATING to FAILED with `reason`; false if it was not CREATING.
    async fn fail_backup(&self, id: &str, reason: &str) -> Result<bool, StoreError>;

    /// Newest first.
    async fn backups(&self) -> Result<Vec<BackupRow>, StoreError>;

    async fn backup(&self, id: &str) -> Result<Option<BackupRow>, StoreError>;

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

    /// The reconcile every start runs (see [`crate::reconcile`]), audited
    /// as `owner`'s.
    async fn reconcile(
        &self,
        owner: &str,
        dead_after: Duration,
    ) -> Result<crate::reconcile::Reconciled, StoreError>;
}
