-- Machines an operator enrolled by their TPM's endorsement key, so they
-- join with no token: kind 'ek' names one EK (the SHA-256 of its
-- TPMT_PUBLIC, as nodes.ek_sha256 does), kind 'ek-ca' an EK CA whose
-- certificates admit every EK they certify. The id is the kind and the
-- hash ('ek:<hex>', 'ek-ca:<SHA-256 of the CA certificate>').
CREATE TABLE machine_enrolments (
    id          TEXT PRIMARY KEY,
    kind        TEXT NOT NULL CHECK (kind IN ('ek', 'ek-ca')),
    ek_sha256   TEXT,
    ca_der      BLOB,
    subject     TEXT NOT NULL DEFAULT '',
    description TEXT NOT NULL DEFAULT '',
    created_at  INTEGER NOT NULL,
    CHECK ((kind = 'ek') = (ek_sha256 IS NOT NULL)),
    CHECK ((kind = 'ek-ca') = (ca_der IS NOT NULL))
) STRICT;
-- A node quarantined as a cloned identity: joins with no token are refused
-- until an operator joins the real machine with a token.
ALTER TABLE nodes ADD COLUMN quarantined_at INTEGER;
-- The boot ids a node was re-attested from with no token, in turn, for
-- the clone watch (bc_store::clones): two machines with one TPM's state
-- alternate between their boot ids.
CREATE TABLE ek_sightings (
    id      INTEGER PRIMARY KEY AUTOINCREMENT,
    node_id TEXT NOT NULL REFERENCES nodes(id),
    boot_id TEXT NOT NULL,
    at      INTEGER NOT NULL
) STRICT;
CREATE INDEX ek_sightings_node ON ek_sightings(node_id, id);
