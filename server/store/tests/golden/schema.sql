-- schema version 42

-- index audit_chain_seq
CREATE UNIQUE INDEX audit_chain_seq ON audit(chain, seq);

-- index audit_node
CREATE INDEX audit_node ON audit(node_id, id);

-- index boots_mac
CREATE INDEX boots_mac ON boots(mac, id);

-- index cert_sightings_serial
CREATE INDEX cert_sightings_serial ON cert_sightings(serial, id);

-- index cert_sightings_unwatched
CREATE INDEX cert_sightings_unwatched ON cert_sightings (id) WHERE watched = 0;

-- index commands_floor_unjudged
CREATE INDEX commands_floor_unjudged ON commands (id)
    WHERE kind = 'daemon.upgrade' AND state = 'succeeded' AND floor_judged = 0;

-- index commands_node_state
CREATE INDEX commands_node_state ON commands(node_id, state, seq);

-- index commands_state_deadline
CREATE INDEX commands_state_deadline ON commands(state, not_after);

-- index commands_unreceipted
CREATE INDEX commands_unreceipted ON commands (id)
    WHERE receipt IS NULL AND result_signature IS NOT NULL;

-- index ek_sightings_node
CREATE INDEX ek_sightings_node ON ek_sightings(node_id, id);

-- index fleet_events_node
CREATE INDEX fleet_events_node ON fleet_events(node_id, id);

-- index gateway_certs_by_end
CREATE INDEX gateway_certs_by_end ON gateway_certs (not_after);

-- index join_tokens_minted
CREATE INDEX join_tokens_minted ON join_tokens(minted_for_mac)
        WHERE minted_for_mac IS NOT NULL;

-- index node_certs_node
CREATE INDEX node_certs_node ON node_certs(node_id);

-- index node_macs_node
CREATE INDEX node_macs_node ON node_macs(node_id);

-- index node_security_events_unreceipted
CREATE INDEX node_security_events_unreceipted ON node_security_events (node_id)
    WHERE receipt IS NULL;

-- index node_sessions_gateway
CREATE INDEX node_sessions_gateway ON node_sessions(gateway_id, state);

-- index node_specs_not_after
CREATE INDEX node_specs_not_after ON node_specs(not_after);

-- index nodes_ek_sha256
CREATE UNIQUE INDEX nodes_ek_sha256 ON nodes (ek_sha256)
    WHERE ek_sha256 IS NOT NULL AND deleted_at IS NULL;

-- index unknown_results_unreceipted
CREATE INDEX unknown_results_unreceipted ON unknown_results (node_id)
    WHERE receipt IS NULL;

-- table audit
CREATE TABLE audit (
        id         INTEGER PRIMARY KEY AUTOINCREMENT,
        at         INTEGER NOT NULL,
        node_id    TEXT NOT NULL,
        kind       TEXT NOT NULL,
        epoch      INTEGER NOT NULL DEFAULT 0,
        gateway_id TEXT NOT NULL DEFAULT '',
        value      INTEGER NOT NULL DEFAULT 0,
        detail     TEXT NOT NULL DEFAULT ''
    , seq INTEGER, prev_hash TEXT, hash TEXT, chain INTEGER) STRICT;

-- table audit_head
CREATE TABLE audit_head (
    chain INTEGER PRIMARY KEY CHECK (chain BETWEEN 0 AND 16),
    seq   INTEGER NOT NULL,
    hash  TEXT NOT NULL
) STRICT;

-- table backups
CREATE TABLE backups (
    id               TEXT PRIMARY KEY,
    state            TEXT NOT NULL,
    reason           TEXT NOT NULL DEFAULT '',
    restore_eligible INTEGER NOT NULL DEFAULT 0,
    created_at       INTEGER NOT NULL,
    finished_at      INTEGER,
    location         TEXT NOT NULL,
    host             TEXT NOT NULL,
    process          TEXT NOT NULL,
    files            INTEGER NOT NULL DEFAULT 0,
    bytes            INTEGER NOT NULL DEFAULT 0
) STRICT;

-- table binding_nonces
CREATE TABLE binding_nonces (
        node_id TEXT NOT NULL,
        nonce   TEXT NOT NULL,
        PRIMARY KEY (node_id, nonce)
    ) STRICT;

-- table bindings
CREATE TABLE bindings (
        node_id         TEXT NOT NULL REFERENCES nodes(id),
        allocation_id   TEXT NOT NULL,
        gpus            TEXT NOT NULL,
        state           TEXT NOT NULL CHECK (state IN ('active', 'lost')),
        spec_generation INTEGER NOT NULL,
        updated_at      INTEGER NOT NULL,
        PRIMARY KEY (node_id, allocation_id)
    ) STRICT;

-- table boot_allowed_macs
CREATE TABLE boot_allowed_macs (
        mac      TEXT PRIMARY KEY,
        pool     TEXT,
        added_at INTEGER NOT NULL
    ) STRICT;

-- table boots
CREATE TABLE boots (
        id       INTEGER PRIMARY KEY AUTOINCREMENT,
        mac      TEXT NOT NULL,
        image_id TEXT,
        remote   TEXT NOT NULL,
        outcome  TEXT NOT NULL,
        at       INTEGER NOT NULL
    ) STRICT;

-- table cert_sightings
CREATE TABLE cert_sightings (
    id      INTEGER PRIMARY KEY AUTOINCREMENT,
    serial  TEXT NOT NULL REFERENCES node_certs(serial),
    boot_id TEXT NOT NULL,
    at      INTEGER NOT NULL
, seq INTEGER NOT NULL DEFAULT 0, proof BLOB, proof_signature BLOB, watched INTEGER NOT NULL DEFAULT 0) STRICT;

-- table commands
CREATE TABLE commands (
        id               TEXT PRIMARY KEY,
        node_id          TEXT NOT NULL REFERENCES nodes(id),
        seq              INTEGER NOT NULL,
        kind             TEXT NOT NULL,
        summary          TEXT NOT NULL,
        signed           BLOB NOT NULL,
        not_after        INTEGER NOT NULL,
        min_generation   INTEGER NOT NULL DEFAULT 0,
        idempotency_key  TEXT UNIQUE,
        state            TEXT NOT NULL,
        epoch            INTEGER NOT NULL DEFAULT 0,
        created_at       INTEGER NOT NULL,
        updated_at       INTEGER NOT NULL,
        reason           TEXT NOT NULL DEFAULT '',
        exit_code        INTEGER,
        output           BLOB,
        output_truncated INTEGER NOT NULL DEFAULT 0,
        result_at        INTEGER, result_payload BLOB, result_signature BLOB, floor_judged INTEGER NOT NULL DEFAULT 0, receipt BLOB,
        UNIQUE (node_id, seq)
    ) STRICT;

-- table controller_state
CREATE TABLE controller_state (
        name  TEXT PRIMARY KEY,
        value INTEGER NOT NULL
    ) STRICT;

-- table ek_sightings
CREATE TABLE ek_sightings (
    id      INTEGER PRIMARY KEY AUTOINCREMENT,
    node_id TEXT NOT NULL REFERENCES nodes(id),
    boot_id TEXT NOT NULL,
    at      INTEGER NOT NULL
) STRICT;

-- table fleet_events
CREATE TABLE fleet_events (
        id      INTEGER PRIMARY KEY AUTOINCREMENT,
        at      INTEGER NOT NULL,
        kind    TEXT NOT NULL,
        node_id TEXT NOT NULL,
        detail  TEXT NOT NULL
    ) STRICT;

-- table gateway_certs
CREATE TABLE gateway_certs (
    sha256 TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    issued_at INTEGER NOT NULL,
    not_after INTEGER NOT NULL
);

-- table gateway_credentials
CREATE TABLE gateway_credentials (
    name          TEXT PRIMARY KEY,
    secret_sha256 TEXT NOT NULL,
    created_at    INTEGER NOT NULL,
    revoked_at    INTEGER
) STRICT;

-- table gateway_revocations
CREATE TABLE gateway_revocations (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    issued_at INTEGER NOT NULL,
    envelope BLOB NOT NULL
);

-- table image_artifacts
CREATE TABLE image_artifacts (
        sha256 TEXT PRIMARY KEY,
        bytes  BLOB NOT NULL
    ) STRICT;

-- table image_assignments
CREATE TABLE image_assignments (
        target      TEXT PRIMARY KEY,
        image_id    TEXT NOT NULL REFERENCES images(image_id),
        append      TEXT NOT NULL DEFAULT '',
        assigned_at INTEGER NOT NULL
    , mint_ttl_ms INTEGER) STRICT;

-- table images
CREATE TABLE images (
        image_id        TEXT PRIMARY KEY,
        name            TEXT NOT NULL,
        key_id          TEXT NOT NULL,
        kernel_version  TEXT NOT NULL,
        bcd_version     TEXT NOT NULL,
        cmdline         TEXT NOT NULL,
        kernel_sha256   TEXT NOT NULL,
        kernel_size     INTEGER NOT NULL,
        initrd_sha256   TEXT NOT NULL,
        initrd_size     INTEGER NOT NULL,
        signed_manifest BLOB NOT NULL,
        registered_at   INTEGER NOT NULL
    ) STRICT;

-- table inventory
CREATE TABLE inventory (
        node_id    TEXT NOT NULL REFERENCES nodes(id),
        section    TEXT NOT NULL,
        sha256     TEXT NOT NULL,
        body       BLOB,
        updated_at INTEGER NOT NULL,
        PRIMARY KEY (node_id, section)
    ) STRICT;

-- table join_tokens
CREATE TABLE join_tokens (
        id            TEXT PRIMARY KEY,
        secret_sha256 TEXT NOT NULL,
        created_at    INTEGER NOT NULL,
        expires_at    INTEGER NOT NULL,
        uses_total    INTEGER NOT NULL,
        uses_left     INTEGER NOT NULL,
        description   TEXT NOT NULL DEFAULT ''
    , pool TEXT, minted_for_mac TEXT) STRICT;

-- table leases
CREATE TABLE leases (
        name       TEXT PRIMARY KEY,
        owner      TEXT NOT NULL,
        expires_at INTEGER NOT NULL,
        renewed_at INTEGER NOT NULL
    , generation INTEGER NOT NULL DEFAULT 1, absorbs_per_s INTEGER NOT NULL DEFAULT 0) STRICT;

-- table legacy_results
CREATE TABLE legacy_results (
    command_id TEXT PRIMARY KEY
) STRICT;

-- table machine_enrolments
CREATE TABLE machine_enrolments (
    id          TEXT PRIMARY KEY,
    kind        TEXT NOT NULL CHECK (kind IN ('ek', 'ek-ca')),
    ek_sha256   TEXT,
    ca_der      BLOB,
    subject     TEXT NOT NULL DEFAULT '',
    description TEXT NOT NULL DEFAULT '',
    created_at  INTEGER NOT NULL, ca_intermediates BLOB,
    CHECK ((kind = 'ek') = (ek_sha256 IS NOT NULL)),
    CHECK ((kind = 'ek-ca') = (ca_der IS NOT NULL))
) STRICT;

-- table node_certs
CREATE TABLE node_certs (
        serial              TEXT PRIMARY KEY,
        node_id             TEXT NOT NULL REFERENCES nodes(id),
        fingerprint         TEXT NOT NULL UNIQUE,
        identity_generation INTEGER NOT NULL,
        not_before          INTEGER NOT NULL,
        not_after           INTEGER NOT NULL,
        revoked_at          INTEGER,
        revoke_reason       TEXT
    , der BLOB, statement BLOB) STRICT;

-- table node_events
CREATE TABLE node_events (
        node_id    TEXT NOT NULL REFERENCES nodes(id),
        journal_id TEXT NOT NULL,
        event_id   INTEGER NOT NULL,
        kind       TEXT NOT NULL,
        body       BLOB NOT NULL,
        at         INTEGER NOT NULL,
        PRIMARY KEY (node_id, journal_id, event_id)
    ) STRICT;

-- table node_macs
CREATE TABLE node_macs (
        mac         TEXT PRIMARY KEY,
        node_id     TEXT NOT NULL REFERENCES nodes(id),
        reported_at INTEGER NOT NULL
    ) STRICT;

-- table node_security_events
CREATE TABLE "node_security_events" (
    node_id      TEXT NOT NULL REFERENCES nodes(id),
    journal_id   TEXT NOT NULL,
    event_id     INTEGER NOT NULL,
    kind         TEXT NOT NULL,
    body         BLOB NOT NULL,
    body_sha256  TEXT NOT NULL,
    at           INTEGER NOT NULL,
    receipt      BLOB,
    receipted_at INTEGER,
    PRIMARY KEY (node_id, journal_id, event_id, kind, body_sha256)
) STRICT;

-- table node_sessions
CREATE TABLE node_sessions (
        node_id        TEXT PRIMARY KEY REFERENCES nodes(id),
        epoch          INTEGER NOT NULL,
        gateway_id     TEXT NOT NULL,
        state          TEXT NOT NULL CHECK (state IN ('connected', 'disconnected', 'unreachable')),
        state_since    INTEGER NOT NULL,
        disconnect_cause TEXT NOT NULL DEFAULT '',
        incarnation_id TEXT NOT NULL,
        boot_id        TEXT NOT NULL,
        journal_id     TEXT NOT NULL,
        cert_serial    TEXT NOT NULL,
        connected_at   INTEGER NOT NULL,
        last_seen      INTEGER NOT NULL
    , hello_seq INTEGER NOT NULL DEFAULT 0) STRICT;

-- table node_specs
CREATE TABLE node_specs (
        node_id     TEXT PRIMARY KEY REFERENCES nodes(id),
        generation  INTEGER NOT NULL,
        signed      BLOB NOT NULL,
        assignments TEXT NOT NULL,
        updated_at  INTEGER NOT NULL
    , access TEXT NOT NULL DEFAULT '{}', not_after INTEGER NOT NULL DEFAULT 0) STRICT;

-- table node_state
CREATE TABLE node_state (
        node_id            TEXT PRIMARY KEY REFERENCES nodes(id),
        applied_generation INTEGER NOT NULL,
        sections           TEXT NOT NULL,
        reported_at        INTEGER NOT NULL
    , report_epoch INTEGER NOT NULL DEFAULT 0) STRICT;

-- table nodes
CREATE TABLE nodes (
        id                  TEXT PRIMARY KEY,
        hostname            TEXT NOT NULL,
        created_at          INTEGER NOT NULL,
        deleted_at          INTEGER,
        identity_generation INTEGER NOT NULL,
        ramdisk             INTEGER NOT NULL DEFAULT 0,
        join_token          TEXT NOT NULL,
        agent_version       TEXT NOT NULL DEFAULT '',
        conditions          TEXT NOT NULL DEFAULT '[]',
        taints              TEXT NOT NULL DEFAULT '[]'
    , next_seq INTEGER NOT NULL DEFAULT 1, release_floor INTEGER NOT NULL DEFAULT 0, ek_sha256 TEXT, quarantined_at INTEGER, pool TEXT, hello_proofs_since INTEGER) STRICT;

-- table operators
CREATE TABLE "operators" (
    id          TEXT PRIMARY KEY,
    role        TEXT NOT NULL CHECK (role IN ('admin', 'read-only')),
    cert_sha256 TEXT UNIQUE,
    cert_serial TEXT UNIQUE,
    created_at  INTEGER NOT NULL,
    not_after   INTEGER,
    revoked_at  INTEGER
, revocation BLOB) STRICT;

-- table releases
CREATE TABLE releases (
        sequence        INTEGER PRIMARY KEY,
        version         TEXT NOT NULL,
        target          TEXT NOT NULL,
        size            INTEGER NOT NULL,
        sha256          TEXT NOT NULL,
        key_id          TEXT NOT NULL,
        signed_manifest BLOB NOT NULL,
        binary          BLOB NOT NULL,
        registered_at   INTEGER NOT NULL
    ) STRICT;

-- table rollout_nodes
CREATE TABLE rollout_nodes (
        rollout_id  TEXT NOT NULL REFERENCES rollouts(id),
        node_id     TEXT NOT NULL,
        position    INTEGER NOT NULL,
        command_id  TEXT,
        rollback_id TEXT,
        skipped     INTEGER NOT NULL DEFAULT 0,
        PRIMARY KEY (rollout_id, node_id)
    ) STRICT;

-- table rollouts
CREATE TABLE rollouts (
        id           TEXT PRIMARY KEY,
        sequence     INTEGER NOT NULL REFERENCES releases(sequence),
        selector     TEXT NOT NULL,
        waves        TEXT NOT NULL,
        max_failures INTEGER NOT NULL,
        state        TEXT NOT NULL,
        wave         INTEGER NOT NULL,
        reason       TEXT NOT NULL DEFAULT '',
        created_at   INTEGER NOT NULL,
        updated_at   INTEGER NOT NULL
    ) STRICT;

-- table secrets
CREATE TABLE secrets (
    name        TEXT NOT NULL,
    version     INTEGER NOT NULL,
    sealed      BLOB NOT NULL,
    created_at  INTEGER NOT NULL,
    created_by  TEXT NOT NULL,
    deleted_at  INTEGER,
    PRIMARY KEY (name, version)
) STRICT;

-- table sqlite_sequence
CREATE TABLE sqlite_sequence(name,seq);

-- table unknown_results
CREATE TABLE unknown_results (
    node_id        TEXT NOT NULL REFERENCES nodes(id),
    command_id     TEXT NOT NULL,
    payload        BLOB NOT NULL,
    signature      BLOB NOT NULL,
    payload_sha256 TEXT NOT NULL,
    at             INTEGER NOT NULL,
    receipt        BLOB,
    receipted_at   INTEGER,
    PRIMARY KEY (node_id, command_id, payload_sha256)
) STRICT;

-- trigger audit_backup
CREATE TRIGGER audit_backup AFTER UPDATE OF state ON backups
WHEN NEW.state != OLD.state BEGIN
    INSERT INTO audit (at, node_id, kind, value, detail)
    VALUES (compute_now(), '', 'backup', NEW.restore_eligible,
            json_object('backup', NEW.id, 'from', OLD.state, 'state', NEW.state,
                        'reason', NEW.reason));
END;

-- trigger audit_backup_new
CREATE TRIGGER audit_backup_new AFTER INSERT ON backups BEGIN
    INSERT INTO audit (at, node_id, kind, value, detail)
    VALUES (compute_now(), '', 'backup', NEW.restore_eligible,
            json_object('backup', NEW.id, 'from', '', 'state', NEW.state,
                        'reason', NEW.reason));
END;

-- trigger audit_binding
CREATE TRIGGER audit_binding AFTER UPDATE OF state ON bindings
    WHEN NEW.state != OLD.state BEGIN
        INSERT INTO audit (at, node_id, kind, detail)
        VALUES (compute_now(), NEW.node_id, 'binding',
                json_object('allocation', NEW.allocation_id, 'state', NEW.state));
    END;

-- trigger audit_binding_gone
CREATE TRIGGER audit_binding_gone AFTER DELETE ON bindings BEGIN
        INSERT INTO audit (at, node_id, kind, detail)
        VALUES (compute_now(), OLD.node_id, 'binding',
                json_object('allocation', OLD.allocation_id, 'state', 'deleted'));
    END;

-- trigger audit_chain
CREATE TRIGGER audit_chain AFTER INSERT ON audit BEGIN
    UPDATE audit SET chain = h.chain, seq = h.seq + 1, prev_hash = h.hash
    FROM audit_head h
    WHERE audit.id = NEW.id AND h.chain = audit_chain_of(NEW.node_id, NEW.gateway_id);
    UPDATE audit SET hash = audit_hash_v2(chain, prev_hash, seq, at, node_id, kind, epoch,
                                          gateway_id, value, detail)
    WHERE id = NEW.id;
    UPDATE audit_head SET seq = a.seq, hash = a.hash
    FROM audit a
    WHERE a.id = NEW.id AND audit_head.chain = a.chain;
END;

-- trigger audit_floor
CREATE TRIGGER audit_floor AFTER UPDATE OF release_floor ON nodes
    WHEN NEW.release_floor != OLD.release_floor BEGIN
        INSERT INTO audit (at, node_id, kind, value)
        VALUES (compute_now(), NEW.id, 'floor',
                NEW.release_floor);
    END;

-- trigger audit_generation
CREATE TRIGGER audit_generation AFTER UPDATE OF generation ON node_specs
    WHEN NEW.generation != OLD.generation BEGIN
        INSERT INTO audit (at, node_id, kind, value)
        VALUES (compute_now(), NEW.node_id, 'generation',
                NEW.generation);
    END;

-- trigger audit_generation_new
CREATE TRIGGER audit_generation_new AFTER INSERT ON node_specs BEGIN
        INSERT INTO audit (at, node_id, kind, value)
        VALUES (compute_now(), NEW.node_id, 'generation',
                NEW.generation);
    END;

-- trigger audit_lease
CREATE TRIGGER audit_lease AFTER UPDATE ON leases WHEN NEW.name LIKE 'gateway:%' BEGIN
        INSERT INTO audit (at, node_id, kind, gateway_id, value)
        VALUES (compute_now(), '', 'lease', NEW.owner,
                NEW.expires_at);
    END;

-- trigger audit_lease_gone
CREATE TRIGGER audit_lease_gone AFTER DELETE ON leases WHEN OLD.name LIKE 'gateway:%' BEGIN
        INSERT INTO audit (at, node_id, kind, gateway_id, value)
        VALUES (compute_now(), '', 'lease', OLD.owner, 0);
    END;

-- trigger audit_lease_new
CREATE TRIGGER audit_lease_new AFTER INSERT ON leases WHEN NEW.name LIKE 'gateway:%' BEGIN
        INSERT INTO audit (at, node_id, kind, gateway_id, value)
        VALUES (compute_now(), '', 'lease', NEW.owner,
                NEW.expires_at);
    END;

-- trigger audit_liveness
CREATE TRIGGER audit_liveness AFTER UPDATE OF state ON node_sessions
    WHEN NEW.state != OLD.state AND NEW.state != 'connected' BEGIN
        INSERT INTO audit (at, node_id, kind, epoch, gateway_id, value, detail)
        VALUES (compute_now(), NEW.node_id, NEW.state,
                NEW.epoch, NEW.gateway_id, NEW.last_seen, NEW.disconnect_cause);
    END;

-- trigger audit_result
CREATE TRIGGER audit_result AFTER UPDATE OF state ON commands
    WHEN NEW.state != OLD.state
        AND NEW.state IN ('succeeded', 'failed', 'expired', 'rejected') BEGIN
        INSERT INTO audit (at, node_id, kind, epoch, detail)
        VALUES (compute_now(), NEW.node_id, 'result',
                NEW.epoch, json_object('command', NEW.id, 'kind', NEW.kind,
                    'from', OLD.state, 'state', NEW.state, 'reason', NEW.reason));
    END;

-- trigger audit_route
CREATE TRIGGER audit_route AFTER UPDATE OF epoch, gateway_id ON node_sessions
    WHEN NEW.epoch != OLD.epoch OR NEW.gateway_id != OLD.gateway_id BEGIN
        INSERT INTO audit (at, node_id, kind, epoch, gateway_id, value)
        VALUES (compute_now(), NEW.node_id, 'route',
                NEW.epoch, NEW.gateway_id, NEW.last_seen);
    END;

-- trigger audit_route_new
CREATE TRIGGER audit_route_new AFTER INSERT ON node_sessions BEGIN
        INSERT INTO audit (at, node_id, kind, epoch, gateway_id, value)
        VALUES (compute_now(), NEW.node_id, 'route',
                NEW.epoch, NEW.gateway_id, NEW.last_seen);
    END;

-- trigger ending_written_once
CREATE TRIGGER ending_written_once BEFORE UPDATE OF state, reason, exit_code, output,
        output_truncated, result_at, result_payload, result_signature ON commands
    WHEN OLD.state IN ('succeeded', 'failed', 'expired', 'rejected')
        AND (NEW.state IS NOT OLD.state OR NEW.reason IS NOT OLD.reason
             OR NEW.exit_code IS NOT OLD.exit_code OR NEW.output IS NOT OLD.output
             OR NEW.output_truncated IS NOT OLD.output_truncated
             OR NEW.result_at IS NOT OLD.result_at
             OR NEW.result_payload IS NOT OLD.result_payload
             OR NEW.result_signature IS NOT OLD.result_signature)
BEGIN
    SELECT RAISE(ABORT, 'a finished command''s ending is written once');
END;

-- trigger legacy_results_kept
CREATE TRIGGER legacy_results_kept BEFORE UPDATE ON legacy_results
BEGIN
    SELECT RAISE(ABORT, 'legacy results are written once, by migrations 0026 and 0029');
END;

-- trigger legacy_results_written_once
CREATE TRIGGER legacy_results_written_once BEFORE INSERT ON legacy_results
BEGIN
    SELECT RAISE(ABORT, 'legacy results are written once, by migrations 0026 and 0029');
END;

-- trigger revocation_stays
CREATE TRIGGER revocation_stays BEFORE UPDATE OF revoked_at, revoke_reason ON node_certs
    WHEN OLD.revoked_at IS NOT NULL
        AND (NEW.revoked_at IS NOT OLD.revoked_at OR NEW.revoke_reason IS NOT OLD.revoke_reason)
BEGIN
    SELECT RAISE(ABORT, 'a certificate revocation is never undone');
END;
