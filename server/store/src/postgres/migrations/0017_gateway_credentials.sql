-- Credentials of gateway processes that hold no key (as SQLite's
-- migration 0017): the SHA-256 of each gateway's secret, when it was
-- added, and when it was revoked.
CREATE TABLE gateway_credentials (
    name          TEXT PRIMARY KEY,
    secret_sha256 TEXT NOT NULL,
    created_at    BIGINT NOT NULL,
    revoked_at    BIGINT
);
