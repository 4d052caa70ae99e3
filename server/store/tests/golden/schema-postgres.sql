-- schema version 42

-- columns
audit.id: bigint NOT NULL DEFAULT nextval('audit_id_seq'::regclass)
audit.at: bigint NOT NULL
audit.node_id: text NOT NULL
audit.kind: text NOT NULL
audit.epoch: bigint NOT NULL DEFAULT 0
audit.gateway_id: text NOT NULL DEFAULT ''::text
audit.value: bigint NOT NULL DEFAULT 0
audit.detail: text NOT NULL DEFAULT ''::text
audit.seq: bigint
audit.prev_hash: text
audit.hash: text
audit.chain: bigint
audit_head.chain: bigint NOT NULL
audit_head.seq: bigint NOT NULL
audit_head.hash: text NOT NULL
backups.id: text NOT NULL
backups.state: text NOT NULL
backups.reason: text NOT NULL DEFAULT ''::text
backups.restore_eligible: boolean NOT NULL DEFAULT false
backups.created_at: bigint NOT NULL
backups.finished_at: bigint
backups.location: text NOT NULL
backups.host: text NOT NULL
backups.process: text NOT NULL
backups.files: bigint NOT NULL DEFAULT 0
backups.bytes: bigint NOT NULL DEFAULT 0
bc_schema.version: bigint NOT NULL
binding_nonces.node_id: text NOT NULL
binding_nonces.nonce: text NOT NULL
bindings.node_id: text NOT NULL
bindings.allocation_id: text NOT NULL
bindings.gpus: text NOT NULL
bindings.state: text NOT NULL
bindings.spec_generation: bigint NOT NULL
bindings.updated_at: bigint NOT NULL
boot_allowed_macs.mac: text NOT NULL
boot_allowed_macs.pool: text
boot_allowed_macs.added_at: bigint NOT NULL
boots.id: bigint NOT NULL DEFAULT nextval('boots_id_seq'::regclass)
boots.mac: text NOT NULL
boots.image_id: text
boots.remote: text NOT NULL
boots.outcome: text NOT NULL
boots.at: bigint NOT NULL
cert_sightings.id: bigint NOT NULL DEFAULT nextval('cert_sightings_id_seq'::regclass)
cert_sightings.serial: text NOT NULL
cert_sightings.boot_id: text NOT NULL
cert_sightings.at: bigint NOT NULL
cert_sightings.seq: bigint NOT NULL DEFAULT 0
cert_sightings.proof: bytea
cert_sightings.proof_signature: bytea
cert_sightings.watched: boolean NOT NULL DEFAULT false
commands.id: text NOT NULL
commands.node_id: text NOT NULL
commands.seq: bigint NOT NULL
commands.kind: text NOT NULL
commands.summary: text NOT NULL
commands.signed: bytea NOT NULL
commands.not_after: bigint NOT NULL
commands.min_generation: bigint NOT NULL DEFAULT 0
commands.idempotency_key: text
commands.state: text NOT NULL
commands.epoch: bigint NOT NULL DEFAULT 0
commands.created_at: bigint NOT NULL
commands.updated_at: bigint NOT NULL
commands.reason: text NOT NULL DEFAULT ''::text
commands.exit_code: integer
commands.output: bytea
commands.output_truncated: boolean NOT NULL DEFAULT false
commands.result_at: bigint
commands.result_payload: bytea
commands.result_signature: bytea
commands.floor_judged: boolean NOT NULL DEFAULT false
commands.receipt: bytea
controller_state.name: text NOT NULL
controller_state.value: bigint NOT NULL
ek_sightings.id: bigint NOT NULL DEFAULT nextval('ek_sightings_id_seq'::regclass)
ek_sightings.node_id: text NOT NULL
ek_sightings.boot_id: text NOT NULL
ek_sightings.at: bigint NOT NULL
fleet_events.id: bigint NOT NULL DEFAULT nextval('fleet_events_id_seq'::regclass)
fleet_events.at: bigint NOT NULL
fleet_events.kind: text NOT NULL
fleet_events.node_id: text NOT NULL
fleet_events.detail: text NOT NULL
gateway_certs.sha256: text NOT NULL
gateway_certs.name: text NOT NULL
gateway_certs.issued_at: bigint NOT NULL
gateway_certs.not_after: bigint NOT NULL
gateway_credentials.name: text NOT NULL
gateway_credentials.secret_sha256: text NOT NULL
gateway_credentials.created_at: bigint NOT NULL
gateway_credentials.revoked_at: bigint
gateway_revocations.id: integer NOT NULL
gateway_revocations.issued_at: bigint NOT NULL
gateway_revocations.envelope: bytea NOT NULL
image_artifacts.sha256: text NOT NULL
image_artifacts.bytes: bytea NOT NULL
image_assignments.target: text NOT NULL
image_assignments.image_id: text NOT NULL
image_assignments.append: text NOT NULL DEFAULT ''::text
image_assignments.assigned_at: bigint NOT NULL
image_assignments.mint_ttl_ms: bigint
images.image_id: text NOT NULL
images.name: text NOT NULL
images.key_id: text NOT NULL
images.kernel_version: text NOT NULL
images.bcd_version: text NOT NULL
images.cmdline: text NOT NULL
images.kernel_sha256: text NOT NULL
images.kernel_size: bigint NOT NULL
images.initrd_sha256: text NOT NULL
images.initrd_size: bigint NOT NULL
images.signed_manifest: bytea NOT NULL
images.registered_at: bigint NOT NULL
inventory.node_id: text NOT NULL
inventory.section: text NOT NULL
inventory.sha256: text NOT NULL
inventory.body: bytea
inventory.updated_at: bigint NOT NULL
join_tokens.id: text NOT NULL
join_tokens.secret_sha256: text NOT NULL
join_tokens.created_at: bigint NOT NULL
join_tokens.expires_at: bigint NOT NULL
join_tokens.uses_total: bigint NOT NULL
join_tokens.uses_left: bigint NOT NULL
join_tokens.description: text NOT NULL DEFAULT ''::text
join_tokens.pool: text
join_tokens.minted_for_mac: text
leases.name: text NOT NULL
leases.owner: text NOT NULL
leases.expires_at: bigint NOT NULL
leases.renewed_at: bigint NOT NULL
leases.generation: bigint NOT NULL DEFAULT 1
leases.absorbs_per_s: bigint NOT NULL DEFAULT 0
legacy_results.command_id: text NOT NULL
machine_enrolments.id: text NOT NULL
machine_enrolments.kind: text NOT NULL
machine_enrolments.ek_sha256: text
machine_enrolments.ca_der: bytea
machine_enrolments.subject: text NOT NULL DEFAULT ''::text
machine_enrolments.description: text NOT NULL DEFAULT ''::text
machine_enrolments.created_at: bigint NOT NULL
machine_enrolments.ca_intermediates: bytea
node_certs.serial: text NOT NULL
node_certs.node_id: text NOT NULL
node_certs.fingerprint: text NOT NULL
node_certs.identity_generation: bigint NOT NULL
node_certs.not_before: bigint NOT NULL
node_certs.not_after: bigint NOT NULL
node_certs.revoked_at: bigint
node_certs.revoke_reason: text
node_certs.der: bytea
node_certs.statement: bytea
node_events.node_id: text NOT NULL
node_events.journal_id: text NOT NULL
node_events.event_id: bigint NOT NULL
node_events.kind: text NOT NULL
node_events.body: bytea NOT NULL
node_events.at: bigint NOT NULL
node_macs.mac: text NOT NULL
node_macs.node_id: text NOT NULL
node_macs.reported_at: bigint NOT NULL
node_security_events.node_id: text NOT NULL
node_security_events.journal_id: text NOT NULL
node_security_events.event_id: bigint NOT NULL
node_security_events.kind: text NOT NULL
node_security_events.body: bytea NOT NULL
node_security_events.at: bigint NOT NULL
node_security_events.receipt: bytea
node_security_events.receipted_at: bigint
node_security_events.body_sha256: text NOT NULL
node_sessions.node_id: text NOT NULL
node_sessions.epoch: bigint NOT NULL
node_sessions.gateway_id: text NOT NULL
node_sessions.state: text NOT NULL
node_sessions.state_since: bigint NOT NULL
node_sessions.disconnect_cause: text NOT NULL DEFAULT ''::text
node_sessions.incarnation_id: text NOT NULL
node_sessions.boot_id: text NOT NULL
node_sessions.journal_id: text NOT NULL
node_sessions.cert_serial: text NOT NULL
node_sessions.connected_at: bigint NOT NULL
node_sessions.last_seen: bigint NOT NULL
node_sessions.hello_seq: bigint NOT NULL DEFAULT 0
node_specs.node_id: text NOT NULL
node_specs.generation: bigint NOT NULL
node_specs.signed: bytea NOT NULL
node_specs.assignments: text NOT NULL
node_specs.updated_at: bigint NOT NULL
node_specs.access: text NOT NULL DEFAULT '{}'::text
node_specs.not_after: bigint NOT NULL DEFAULT 0
node_state.node_id: text NOT NULL
node_state.applied_generation: bigint NOT NULL
node_state.sections: text NOT NULL
node_state.reported_at: bigint NOT NULL
node_state.report_epoch: bigint NOT NULL DEFAULT 0
nodes.id: text NOT NULL
nodes.hostname: text NOT NULL
nodes.created_at: bigint NOT NULL
nodes.deleted_at: bigint
nodes.identity_generation: bigint NOT NULL
nodes.ramdisk: boolean NOT NULL DEFAULT false
nodes.join_token: text NOT NULL
nodes.agent_version: text NOT NULL DEFAULT ''::text
nodes.conditions: text NOT NULL DEFAULT '[]'::text
nodes.taints: text NOT NULL DEFAULT '[]'::text
nodes.next_seq: bigint NOT NULL DEFAULT 1
nodes.release_floor: bigint NOT NULL DEFAULT 0
nodes.ek_sha256: text
nodes.quarantined_at: bigint
nodes.pool: text
nodes.hello_proofs_since: bigint
operators.id: text NOT NULL
operators.created_at: bigint NOT NULL
operators.role: text NOT NULL
operators.cert_sha256: text
operators.cert_serial: text
operators.not_after: bigint
operators.revoked_at: bigint
operators.revocation: bytea
releases.sequence: bigint NOT NULL
releases.version: text NOT NULL
releases.target: text NOT NULL
releases.size: bigint NOT NULL
releases.sha256: text NOT NULL
releases.key_id: text NOT NULL
releases.signed_manifest: bytea NOT NULL
releases.binary: bytea NOT NULL
releases.registered_at: bigint NOT NULL
rollout_nodes.rollout_id: text NOT NULL
rollout_nodes.node_id: text NOT NULL
rollout_nodes.position: bigint NOT NULL
rollout_nodes.command_id: text
rollout_nodes.rollback_id: text
rollout_nodes.skipped: boolean NOT NULL DEFAULT false
rollouts.id: text NOT NULL
rollouts.sequence: bigint NOT NULL
rollouts.selector: text NOT NULL
rollouts.waves: text NOT NULL
rollouts.max_failures: bigint NOT NULL
rollouts.state: text NOT NULL
rollouts.wave: bigint NOT NULL
rollouts.reason: text NOT NULL DEFAULT ''::text
rollouts.created_at: bigint NOT NULL
rollouts.updated_at: bigint NOT NULL
secrets.name: text NOT NULL
secrets.version: bigint NOT NULL
secrets.sealed: bytea NOT NULL
secrets.created_at: bigint NOT NULL
secrets.created_by: text NOT NULL
secrets.deleted_at: bigint
unknown_results.node_id: text NOT NULL
unknown_results.command_id: text NOT NULL
unknown_results.payload: bytea NOT NULL
unknown_results.signature: bytea NOT NULL
unknown_results.payload_sha256: text NOT NULL
unknown_results.at: bigint NOT NULL
unknown_results.receipt: bytea
unknown_results.receipted_at: bigint

-- constraints
audit audit_chain: TRIGGER DEFERRABLE INITIALLY DEFERRED
audit audit_pkey: PRIMARY KEY (id)
audit_head audit_head_chain_check: CHECK (((chain >= 0) AND (chain <= 16)))
audit_head audit_head_pkey: PRIMARY KEY (chain)
backups backups_pkey: PRIMARY KEY (id)
binding_nonces binding_nonces_pkey: PRIMARY KEY (node_id, nonce)
bindings bindings_node_id_fkey: FOREIGN KEY (node_id) REFERENCES nodes(id)
bindings bindings_pkey: PRIMARY KEY (node_id, allocation_id)
bindings bindings_state_check: CHECK ((state = ANY (ARRAY['active'::text, 'lost'::text])))
boot_allowed_macs boot_allowed_macs_pkey: PRIMARY KEY (mac)
boots boots_pkey: PRIMARY KEY (id)
cert_sightings cert_sightings_pkey: PRIMARY KEY (id)
cert_sightings cert_sightings_serial_fkey: FOREIGN KEY (serial) REFERENCES node_certs(serial)
commands commands_idempotency_key_key: UNIQUE (idempotency_key)
commands commands_node_id_fkey: FOREIGN KEY (node_id) REFERENCES nodes(id)
commands commands_node_id_seq_key: UNIQUE (node_id, seq)
commands commands_pkey: PRIMARY KEY (id)
controller_state controller_state_pkey: PRIMARY KEY (name)
ek_sightings ek_sightings_node_id_fkey: FOREIGN KEY (node_id) REFERENCES nodes(id)
ek_sightings ek_sightings_pkey: PRIMARY KEY (id)
fleet_events fleet_events_pkey: PRIMARY KEY (id)
gateway_certs gateway_certs_pkey: PRIMARY KEY (sha256)
gateway_credentials gateway_credentials_pkey: PRIMARY KEY (name)
gateway_revocations gateway_revocations_id_check: CHECK ((id = 1))
gateway_revocations gateway_revocations_pkey: PRIMARY KEY (id)
image_artifacts image_artifacts_pkey: PRIMARY KEY (sha256)
image_assignments image_assignments_image_id_fkey: FOREIGN KEY (image_id) REFERENCES images(image_id)
image_assignments image_assignments_pkey: PRIMARY KEY (target)
images images_pkey: PRIMARY KEY (image_id)
inventory inventory_node_id_fkey: FOREIGN KEY (node_id) REFERENCES nodes(id)
inventory inventory_pkey: PRIMARY KEY (node_id, section)
join_tokens join_tokens_pkey: PRIMARY KEY (id)
leases leases_pkey: PRIMARY KEY (name)
legacy_results legacy_results_pkey: PRIMARY KEY (command_id)
machine_enrolments machine_enrolments_check: CHECK (((kind = 'ek'::text) = (ek_sha256 IS NOT NULL)))
machine_enrolments machine_enrolments_check1: CHECK (((kind = 'ek-ca'::text) = (ca_der IS NOT NULL)))
machine_enrolments machine_enrolments_kind_check: CHECK ((kind = ANY (ARRAY['ek'::text, 'ek-ca'::text])))
machine_enrolments machine_enrolments_pkey: PRIMARY KEY (id)
node_certs node_certs_fingerprint_key: UNIQUE (fingerprint)
node_certs node_certs_node_id_fkey: FOREIGN KEY (node_id) REFERENCES nodes(id)
node_certs node_certs_pkey: PRIMARY KEY (serial)
node_events node_events_node_id_fkey: FOREIGN KEY (node_id) REFERENCES nodes(id)
node_events node_events_pkey: PRIMARY KEY (node_id, journal_id, event_id)
node_macs node_macs_node_id_fkey: FOREIGN KEY (node_id) REFERENCES nodes(id)
node_macs node_macs_pkey: PRIMARY KEY (mac)
node_security_events node_security_events_node_id_fkey: FOREIGN KEY (node_id) REFERENCES nodes(id)
node_security_events node_security_events_pkey: PRIMARY KEY (node_id, journal_id, event_id, kind, body_sha256)
node_sessions node_sessions_node_id_fkey: FOREIGN KEY (node_id) REFERENCES nodes(id)
node_sessions node_sessions_pkey: PRIMARY KEY (node_id)
node_sessions node_sessions_state_check: CHECK ((state = ANY (ARRAY['connected'::text, 'disconnected'::text, 'unreachable'::text])))
node_specs node_specs_node_id_fkey: FOREIGN KEY (node_id) REFERENCES nodes(id)
node_specs node_specs_pkey: PRIMARY KEY (node_id)
node_state node_state_node_id_fkey: FOREIGN KEY (node_id) REFERENCES nodes(id)
node_state node_state_pkey: PRIMARY KEY (node_id)
nodes nodes_pkey: PRIMARY KEY (id)
operators operators_cert_serial_key: UNIQUE (cert_serial)
operators operators_cert_sha256_key: UNIQUE (cert_sha256)
operators operators_pkey: PRIMARY KEY (id)
operators operators_role_check: CHECK ((role = ANY (ARRAY['admin'::text, 'read-only'::text])))
releases releases_pkey: PRIMARY KEY (sequence)
rollout_nodes rollout_nodes_pkey: PRIMARY KEY (rollout_id, node_id)
rollout_nodes rollout_nodes_rollout_id_fkey: FOREIGN KEY (rollout_id) REFERENCES rollouts(id)
rollouts rollouts_pkey: PRIMARY KEY (id)
rollouts rollouts_sequence_fkey: FOREIGN KEY (sequence) REFERENCES releases(sequence)
secrets secrets_pkey: PRIMARY KEY (name, version)
unknown_results unknown_results_node_id_fkey: FOREIGN KEY (node_id) REFERENCES nodes(id)
unknown_results unknown_results_pkey: PRIMARY KEY (node_id, command_id, payload_sha256)

-- indexes
audit_chain_seq: CREATE UNIQUE INDEX audit_chain_seq ON public.audit USING btree (chain, seq)
audit_head_pkey: CREATE UNIQUE INDEX audit_head_pkey ON public.audit_head USING btree (chain)
audit_node: CREATE INDEX audit_node ON public.audit USING btree (node_id, id)
audit_pkey: CREATE UNIQUE INDEX audit_pkey ON public.audit USING btree (id)
audit_unsealed: CREATE INDEX audit_unsealed ON public.audit USING btree (id) WHERE (seq IS NULL)
backups_pkey: CREATE UNIQUE INDEX backups_pkey ON public.backups USING btree (id)
binding_nonces_pkey: CREATE UNIQUE INDEX binding_nonces_pkey ON public.binding_nonces USING btree (node_id, nonce)
bindings_pkey: CREATE UNIQUE INDEX bindings_pkey ON public.bindings USING btree (node_id, allocation_id)
boot_allowed_macs_pkey: CREATE UNIQUE INDEX boot_allowed_macs_pkey ON public.boot_allowed_macs USING btree (mac)
boots_mac: CREATE INDEX boots_mac ON public.boots USING btree (mac, id)
boots_pkey: CREATE UNIQUE INDEX boots_pkey ON public.boots USING btree (id)
cert_sightings_pkey: CREATE UNIQUE INDEX cert_sightings_pkey ON public.cert_sightings USING btree (id)
cert_sightings_serial: CREATE INDEX cert_sightings_serial ON public.cert_sightings USING btree (serial, id)
cert_sightings_unwatched: CREATE INDEX cert_sightings_unwatched ON public.cert_sightings USING btree (id) WHERE (NOT watched)
commands_floor_unjudged: CREATE INDEX commands_floor_unjudged ON public.commands USING btree (id) WHERE ((kind = 'daemon.upgrade'::text) AND (state = 'succeeded'::text) AND (NOT floor_judged))
commands_idempotency_key_key: CREATE UNIQUE INDEX commands_idempotency_key_key ON public.commands USING btree (idempotency_key)
commands_node_id_seq_key: CREATE UNIQUE INDEX commands_node_id_seq_key ON public.commands USING btree (node_id, seq)
commands_node_state: CREATE INDEX commands_node_state ON public.commands USING btree (node_id, state, seq)
commands_pkey: CREATE UNIQUE INDEX commands_pkey ON public.commands USING btree (id)
commands_state_deadline: CREATE INDEX commands_state_deadline ON public.commands USING btree (state, not_after)
commands_unreceipted: CREATE INDEX commands_unreceipted ON public.commands USING btree (id) WHERE ((receipt IS NULL) AND (result_signature IS NOT NULL))
controller_state_pkey: CREATE UNIQUE INDEX controller_state_pkey ON public.controller_state USING btree (name)
ek_sightings_node: CREATE INDEX ek_sightings_node ON public.ek_sightings USING btree (node_id, id)
ek_sightings_pkey: CREATE UNIQUE INDEX ek_sightings_pkey ON public.ek_sightings USING btree (id)
fleet_events_node: CREATE INDEX fleet_events_node ON public.fleet_events USING btree (node_id, id)
fleet_events_pkey: CREATE UNIQUE INDEX fleet_events_pkey ON public.fleet_events USING btree (id)
gateway_certs_by_end: CREATE INDEX gateway_certs_by_end ON public.gateway_certs USING btree (not_after)
gateway_certs_pkey: CREATE UNIQUE INDEX gateway_certs_pkey ON public.gateway_certs USING btree (sha256)
gateway_credentials_pkey: CREATE UNIQUE INDEX gateway_credentials_pkey ON public.gateway_credentials USING btree (name)
gateway_revocations_pkey: CREATE UNIQUE INDEX gateway_revocations_pkey ON public.gateway_revocations USING btree (id)
image_artifacts_pkey: CREATE UNIQUE INDEX image_artifacts_pkey ON public.image_artifacts USING btree (sha256)
image_assignments_pkey: CREATE UNIQUE INDEX image_assignments_pkey ON public.image_assignments USING btree (target)
images_pkey: CREATE UNIQUE INDEX images_pkey ON public.images USING btree (image_id)
inventory_pkey: CREATE UNIQUE INDEX inventory_pkey ON public.inventory USING btree (node_id, section)
join_tokens_minted: CREATE INDEX join_tokens_minted ON public.join_tokens USING btree (minted_for_mac) WHERE (minted_for_mac IS NOT NULL)
join_tokens_pkey: CREATE UNIQUE INDEX join_tokens_pkey ON public.join_tokens USING btree (id)
leases_pkey: CREATE UNIQUE INDEX leases_pkey ON public.leases USING btree (name)
legacy_results_pkey: CREATE UNIQUE INDEX legacy_results_pkey ON public.legacy_results USING btree (command_id)
machine_enrolments_pkey: CREATE UNIQUE INDEX machine_enrolments_pkey ON public.machine_enrolments USING btree (id)
node_certs_fingerprint_key: CREATE UNIQUE INDEX node_certs_fingerprint_key ON public.node_certs USING btree (fingerprint)
node_certs_node: CREATE INDEX node_certs_node ON public.node_certs USING btree (node_id)
node_certs_pkey: CREATE UNIQUE INDEX node_certs_pkey ON public.node_certs USING btree (serial)
node_certs_revoked: CREATE INDEX node_certs_revoked ON public.node_certs USING btree (revoked_at) WHERE (revoked_at IS NOT NULL)
node_events_node_at: CREATE INDEX node_events_node_at ON public.node_events USING btree (node_id, at, event_id)
node_events_pkey: CREATE UNIQUE INDEX node_events_pkey ON public.node_events USING btree (node_id, journal_id, event_id)
node_macs_node: CREATE INDEX node_macs_node ON public.node_macs USING btree (node_id)
node_macs_pkey: CREATE UNIQUE INDEX node_macs_pkey ON public.node_macs USING btree (mac)
node_security_events_pkey: CREATE UNIQUE INDEX node_security_events_pkey ON public.node_security_events USING btree (node_id, journal_id, event_id, kind, body_sha256)
node_security_events_unreceipted: CREATE INDEX node_security_events_unreceipted ON public.node_security_events USING btree (node_id) WHERE (receipt IS NULL)
node_sessions_away: CREATE INDEX node_sessions_away ON public.node_sessions USING btree (state) WHERE (state <> 'connected'::text)
node_sessions_gateway: CREATE INDEX node_sessions_gateway ON public.node_sessions USING btree (gateway_id, state)
node_sessions_pkey: CREATE UNIQUE INDEX node_sessions_pkey ON public.node_sessions USING btree (node_id)
node_specs_not_after: CREATE INDEX node_specs_not_after ON public.node_specs USING btree (not_after)
node_specs_pkey: CREATE UNIQUE INDEX node_specs_pkey ON public.node_specs USING btree (node_id)
node_state_pkey: CREATE UNIQUE INDEX node_state_pkey ON public.node_state USING btree (node_id)
nodes_ek_sha256: CREATE UNIQUE INDEX nodes_ek_sha256 ON public.nodes USING btree (ek_sha256) WHERE ((ek_sha256 IS NOT NULL) AND (deleted_at IS NULL))
nodes_pkey: CREATE UNIQUE INDEX nodes_pkey ON public.nodes USING btree (id)
operators_cert_serial_key: CREATE UNIQUE INDEX operators_cert_serial_key ON public.operators USING btree (cert_serial)
operators_cert_sha256_key: CREATE UNIQUE INDEX operators_cert_sha256_key ON public.operators USING btree (cert_sha256)
operators_pkey: CREATE UNIQUE INDEX operators_pkey ON public.operators USING btree (id)
releases_pkey: CREATE UNIQUE INDEX releases_pkey ON public.releases USING btree (sequence)
rollout_nodes_pkey: CREATE UNIQUE INDEX rollout_nodes_pkey ON public.rollout_nodes USING btree (rollout_id, node_id)
rollouts_pkey: CREATE UNIQUE INDEX rollouts_pkey ON public.rollouts USING btree (id)
secrets_pkey: CREATE UNIQUE INDEX secrets_pkey ON public.secrets USING btree (name, version)
unknown_results_pkey: CREATE UNIQUE INDEX unknown_results_pkey ON public.unknown_results USING btree (node_id, command_id, payload_sha256)
unknown_results_unreceipted: CREATE INDEX unknown_results_unreceipted ON public.unknown_results USING btree (node_id) WHERE (receipt IS NULL)

-- triggers
audit_backup: CREATE TRIGGER audit_backup AFTER UPDATE OF state ON public.backups FOR EACH ROW WHEN ((new.state <> old.state)) EXECUTE FUNCTION audit_backup()
audit_backup_new: CREATE TRIGGER audit_backup_new AFTER INSERT ON public.backups FOR EACH ROW EXECUTE FUNCTION audit_backup()
audit_binding: CREATE TRIGGER audit_binding AFTER UPDATE OF state ON public.bindings FOR EACH ROW WHEN ((new.state <> old.state)) EXECUTE FUNCTION audit_binding()
audit_binding_gone: CREATE TRIGGER audit_binding_gone AFTER DELETE ON public.bindings FOR EACH ROW EXECUTE FUNCTION audit_binding()
audit_chain: CREATE CONSTRAINT TRIGGER audit_chain AFTER INSERT ON public.audit DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION audit_seal()
audit_floor: CREATE TRIGGER audit_floor AFTER UPDATE OF release_floor ON public.nodes FOR EACH ROW WHEN ((new.release_floor <> old.release_floor)) EXECUTE FUNCTION audit_floor()
audit_generation: CREATE TRIGGER audit_generation AFTER UPDATE OF generation ON public.node_specs FOR EACH ROW WHEN ((new.generation <> old.generation)) EXECUTE FUNCTION audit_generation()
audit_generation_new: CREATE TRIGGER audit_generation_new AFTER INSERT ON public.node_specs FOR EACH ROW EXECUTE FUNCTION audit_generation()
audit_lease: CREATE TRIGGER audit_lease AFTER UPDATE ON public.leases FOR EACH ROW WHEN ((new.name ~~ 'gateway:%'::text)) EXECUTE FUNCTION audit_lease()
audit_lease_gone: CREATE TRIGGER audit_lease_gone AFTER DELETE ON public.leases FOR EACH ROW WHEN ((old.name ~~ 'gateway:%'::text)) EXECUTE FUNCTION audit_lease()
audit_lease_new: CREATE TRIGGER audit_lease_new AFTER INSERT ON public.leases FOR EACH ROW WHEN ((new.name ~~ 'gateway:%'::text)) EXECUTE FUNCTION audit_lease()
audit_liveness: CREATE TRIGGER audit_liveness AFTER UPDATE OF state ON public.node_sessions FOR EACH ROW WHEN (((new.state <> old.state) AND (new.state <> 'connected'::text))) EXECUTE FUNCTION audit_liveness()
audit_result: CREATE TRIGGER audit_result AFTER UPDATE OF state ON public.commands FOR EACH ROW WHEN (((new.state <> old.state) AND (new.state = ANY (ARRAY['succeeded'::text, 'failed'::text, 'expired'::text, 'rejected'::text])))) EXECUTE FUNCTION audit_result()
audit_route: CREATE TRIGGER audit_route AFTER UPDATE OF epoch, gateway_id ON public.node_sessions FOR EACH ROW WHEN (((new.epoch <> old.epoch) OR (new.gateway_id <> old.gateway_id))) EXECUTE FUNCTION audit_route()
audit_route_new: CREATE TRIGGER audit_route_new AFTER INSERT ON public.node_sessions FOR EACH ROW EXECUTE FUNCTION audit_route()
ending_written_once: CREATE TRIGGER ending_written_once BEFORE UPDATE OF state, reason, exit_code, output, output_truncated, result_at, result_payload, result_signature ON public.commands FOR EACH ROW WHEN (((old.state = ANY (ARRAY['succeeded'::text, 'failed'::text, 'expired'::text, 'rejected'::text])) AND ((new.state IS DISTINCT FROM old.state) OR (new.reason IS DISTINCT FROM old.reason) OR (new.exit_code IS DISTINCT FROM old.exit_code) OR (new.output IS DISTINCT FROM old.output) OR (new.output_truncated IS DISTINCT FROM old.output_truncated) OR (new.result_at IS DISTINCT FROM old.result_at) OR (new.result_payload IS DISTINCT FROM old.result_payload) OR (new.result_signature IS DISTINCT FROM old.result_signature)))) EXECUTE FUNCTION ending_written_once()
legacy_results_written_once: CREATE TRIGGER legacy_results_written_once BEFORE INSERT OR UPDATE ON public.legacy_results FOR EACH ROW EXECUTE FUNCTION legacy_results_written_once()
quarantine_stays: CREATE TRIGGER quarantine_stays BEFORE UPDATE OF quarantined_at ON public.nodes FOR EACH ROW WHEN (((old.quarantined_at IS NOT NULL) AND (new.quarantined_at IS DISTINCT FROM old.quarantined_at))) EXECUTE FUNCTION quarantine_stays()
revocation_stays: CREATE TRIGGER revocation_stays BEFORE UPDATE OF revoked_at, revoke_reason ON public.node_certs FOR EACH ROW WHEN (((old.revoked_at IS NOT NULL) AND ((new.revoked_at IS DISTINCT FROM old.revoked_at) OR (new.revoke_reason IS DISTINCT FROM old.revoke_reason)))) EXECUTE FUNCTION revocation_stays()

-- storage
node_sessions: fillfactor=50

-- functions
audit_backup: CREATE OR REPLACE FUNCTION public.audit_backup()
 RETURNS trigger
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'public', 'pg_temp'
AS $function$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO audit (at, node_id, kind, value, detail)
        VALUES (compute_now(), '', 'backup', CASE WHEN NEW.restore_eligible THEN 1 ELSE 0 END,
                json_build_object('backup', NEW.id, 'from', '', 'state', NEW.state,
                                  'reason', NEW.reason)::text);
    ELSE
        INSERT INTO audit (at, node_id, kind, value, detail)
        VALUES (compute_now(), '', 'backup', CASE WHEN NEW.restore_eligible THEN 1 ELSE 0 END,
                json_build_object('backup', NEW.id, 'from', OLD.state, 'state', NEW.state,
                                  'reason', NEW.reason)::text);
    END IF;
    RETURN NULL;
END $function$
audit_binding: CREATE OR REPLACE FUNCTION public.audit_binding()
 RETURNS trigger
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'public', 'pg_temp'
AS $function$
BEGIN
    IF TG_OP = 'DELETE' THEN
        INSERT INTO audit (at, node_id, kind, detail)
        VALUES (compute_now(), OLD.node_id, 'binding',
                json_build_object('allocation', OLD.allocation_id, 'state', 'deleted')::text);
    ELSE
        INSERT INTO audit (at, node_id, kind, detail)
        VALUES (compute_now(), NEW.node_id, 'binding',
                json_build_object('allocation', NEW.allocation_id, 'state', NEW.state)::text);
    END IF;
    RETURN NULL;
END $function$
audit_chain_of: CREATE OR REPLACE FUNCTION public.audit_chain_of(node_id text, gateway_id text)
 RETURNS bigint
 LANGUAGE sql
 STABLE
AS $function$
    SELECT 1 + get_byte(sha256(convert_to(
        CASE WHEN node_id = '' THEN gateway_id ELSE node_id END, 'UTF8')), 0)::bigint % 16
$function$
audit_floor: CREATE OR REPLACE FUNCTION public.audit_floor()
 RETURNS trigger
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'public', 'pg_temp'
AS $function$
BEGIN
    INSERT INTO audit (at, node_id, kind, value)
    VALUES (compute_now(), NEW.id, 'floor', NEW.release_floor);
    RETURN NULL;
END $function$
audit_generation: CREATE OR REPLACE FUNCTION public.audit_generation()
 RETURNS trigger
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'public', 'pg_temp'
AS $function$
BEGIN
    INSERT INTO audit (at, node_id, kind, value)
    VALUES (compute_now(), NEW.node_id, 'generation', NEW.generation);
    RETURN NULL;
END $function$
audit_hash: CREATE OR REPLACE FUNCTION public.audit_hash(prev text, seq bigint, at bigint, node_id text, kind text, epoch bigint, gateway_id text, value bigint, detail text)
 RETURNS text
 LANGUAGE sql
 IMMUTABLE STRICT
AS $function$
    SELECT encode(sha256(convert_to(
        'bc-audit-v1' || chr(10) || prev || chr(10) || seq::text || chr(10) || at::text
        || chr(10) || length(node_id)::text || ':' || node_id
        || chr(10) || length(kind)::text || ':' || kind
        || chr(10) || epoch::text
        || chr(10) || length(gateway_id)::text || ':' || gateway_id
        || chr(10) || value::text
        || chr(10) || length(detail)::text || ':' || detail, 'UTF8')), 'hex')
$function$
audit_hash_v2: CREATE OR REPLACE FUNCTION public.audit_hash_v2(chain bigint, prev text, seq bigint, at bigint, node_id text, kind text, epoch bigint, gateway_id text, value bigint, detail text)
 RETURNS text
 LANGUAGE sql
 STABLE
AS $function$
    SELECT encode(sha256(convert_to(
        'bc-audit-v2' || chr(10) || chain::text
        || chr(10) || prev || chr(10) || seq::text || chr(10) || at::text
        || chr(10) || length(node_id)::text || ':' || node_id
        || chr(10) || length(kind)::text || ':' || kind
        || chr(10) || epoch::text
        || chr(10) || length(gateway_id)::text || ':' || gateway_id
        || chr(10) || value::text
        || chr(10) || length(detail)::text || ':' || detail, 'UTF8')), 'hex')
$function$
audit_lease: CREATE OR REPLACE FUNCTION public.audit_lease()
 RETURNS trigger
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'public', 'pg_temp'
AS $function$
BEGIN
    IF TG_OP = 'DELETE' THEN
        INSERT INTO audit (at, node_id, kind, gateway_id, value)
        VALUES (compute_now(), '', 'lease', OLD.owner, 0);
    ELSE
        INSERT INTO audit (at, node_id, kind, gateway_id, value)
        VALUES (compute_now(), '', 'lease', NEW.owner, NEW.expires_at);
    END IF;
    RETURN NULL;
END $function$
audit_liveness: CREATE OR REPLACE FUNCTION public.audit_liveness()
 RETURNS trigger
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'public', 'pg_temp'
AS $function$
BEGIN
    INSERT INTO audit (at, node_id, kind, epoch, gateway_id, value, detail)
    VALUES (compute_now(), NEW.node_id, NEW.state, NEW.epoch, NEW.gateway_id, NEW.last_seen,
            NEW.disconnect_cause);
    RETURN NULL;
END $function$
audit_result: CREATE OR REPLACE FUNCTION public.audit_result()
 RETURNS trigger
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'public', 'pg_temp'
AS $function$
BEGIN
    INSERT INTO audit (at, node_id, kind, epoch, detail)
    VALUES (compute_now(), NEW.node_id, 'result', NEW.epoch,
            json_build_object('command', NEW.id, 'kind', NEW.kind, 'from', OLD.state,
                              'state', NEW.state, 'reason', NEW.reason)::text);
    RETURN NULL;
END $function$
audit_route: CREATE OR REPLACE FUNCTION public.audit_route()
 RETURNS trigger
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'public', 'pg_temp'
AS $function$
BEGIN
    INSERT INTO audit (at, node_id, kind, epoch, gateway_id, value)
    VALUES (compute_now(), NEW.node_id, 'route', NEW.epoch, NEW.gateway_id, NEW.last_seen);
    RETURN NULL;
END $function$
audit_seal: CREATE OR REPLACE FUNCTION public.audit_seal()
 RETURNS trigger
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'public', 'pg_temp'
AS $function$
DECLARE
    c BIGINT := audit_chain_of(NEW.node_id, NEW.gateway_id);
    h RECORD;
    sealed TEXT;
BEGIN
    -- Every head this transaction's records need, in chain order (held
    -- already from its first record on). Records are sealed in the order
    -- they were written, so this transaction's unsealed ones (the only
    -- unsealed ones it sees but any written around the store) start at
    -- this one.
    PERFORM 1 FROM audit_head
    WHERE chain IN (SELECT audit_chain_of(a.node_id, a.gateway_id) FROM audit a
                    WHERE a.seq IS NULL AND a.id >= NEW.id)
    ORDER BY chain FOR UPDATE;
    SELECT seq, hash INTO h FROM audit_head WHERE chain = c FOR UPDATE;
    sealed := audit_hash_v2(c, h.hash, h.seq + 1, NEW.at, NEW.node_id, NEW.kind, NEW.epoch,
                            NEW.gateway_id, NEW.value, NEW.detail);
    UPDATE audit SET chain = c, seq = h.seq + 1, prev_hash = h.hash, hash = sealed
    WHERE id = NEW.id;
    UPDATE audit_head SET seq = h.seq + 1, hash = sealed WHERE chain = c;
    RETURN NULL;
END $function$
compute_now: CREATE OR REPLACE FUNCTION public.compute_now()
 RETURNS bigint
 LANGUAGE sql
AS $function$
    SELECT COALESCE(NULLIF(current_setting('bc.now_ms', true), '')::BIGINT,
                    floor(extract(epoch FROM clock_timestamp()) * 1000)::BIGINT)
$function$
ending_written_once: CREATE OR REPLACE FUNCTION public.ending_written_once()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
    RAISE EXCEPTION 'command % finished %: a finished command''s ending is written once',
        OLD.id, OLD.state USING ERRCODE = 'insufficient_privilege';
END $function$
legacy_results_written_once: CREATE OR REPLACE FUNCTION public.legacy_results_written_once()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
    RAISE EXCEPTION 'legacy results are written once, by migrations 0026 and 0029';
END $function$
quarantine_stays: CREATE OR REPLACE FUNCTION public.quarantine_stays()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
    IF NOT pg_has_role(current_user, (SELECT relowner FROM pg_class WHERE oid = TG_RELID),
                       'MEMBER') THEN
        RAISE EXCEPTION 'node % is quarantined: only the key holder lifts a quarantine', OLD.id
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN NEW;
END $function$
revocation_stays: CREATE OR REPLACE FUNCTION public.revocation_stays()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
    RAISE EXCEPTION 'certificate % was revoked: a revocation is never undone', OLD.serial
        USING ERRCODE = 'insufficient_privilege';
END $function$
