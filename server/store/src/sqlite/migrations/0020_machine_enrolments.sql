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
