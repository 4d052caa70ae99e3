-- Machines an operator enrolled by their TPM's endorsement key (as
-- SQLite's migration 0020): one EK by its hash, or an EK CA whose
-- certificates admit every EK they certify.
CREATE TABLE machine_enrolments (
    id          TEXT PRIMARY KEY,
    kind        TEXT NOT NULL CHECK (kind IN ('ek', 'ek-ca')),
    ek_sha256   TEXT,
    ca_der      BYTEA,
    subject     TEXT NOT NULL DEFAULT '',
    description TEXT NOT NULL DEFAULT '',
    created_at  BIGINT NOT NULL,
    CHECK ((kind = 'ek') = (ek_sha256 IS NOT NULL)),
    CHECK ((kind = 'ek-ca') = (ca_der IS NOT NULL))
);
-- A node quarantined as a cloned identity, and the boot ids nodes were
-- re-attested from with no token (as SQLite's migration 0020).
ALTER TABLE nodes ADD COLUMN quarantined_at BIGINT;
CREATE TABLE ek_sightings (
    id      BIGSERIAL PRIMARY KEY,
    node_id TEXT NOT NULL REFERENCES nodes(id),
    boot_id TEXT NOT NULL,
    at      BIGINT NOT NULL
);
CREATE INDEX ek_sightings_node ON ek_sightings(node_id, id);
