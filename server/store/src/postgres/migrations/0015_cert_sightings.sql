-- The boot ids each certificate was presented from, in turn (as SQLite's
-- migration 0015), for the clone watch (bc_store::clones).
CREATE TABLE cert_sightings (
    id      BIGSERIAL PRIMARY KEY,
    serial  TEXT NOT NULL REFERENCES node_certs(serial),
    boot_id TEXT NOT NULL,
    at      BIGINT NOT NULL
);
CREATE INDEX cert_sightings_serial ON cert_sightings(serial, id);
