-- Credentials of gateway processes that hold no key: a gateway proves
-- its secret (kept here as its SHA-256) to the process holding the fleet
-- CA and gets a serving certificate naming it. A revoked credential
-- certifies nothing more, and certificates issued before a name was
-- added again are refused.
CREATE TABLE gateway_credentials (
    name          TEXT PRIMARY KEY,
    secret_sha256 TEXT NOT NULL,
    created_at    INTEGER NOT NULL,
    revoked_at    INTEGER
) STRICT;
