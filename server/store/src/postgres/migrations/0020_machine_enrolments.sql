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
