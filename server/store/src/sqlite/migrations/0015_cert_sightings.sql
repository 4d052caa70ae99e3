-- The boot ids each certificate was presented from, in turn (a row when
-- the boot id changes), for the clone watch (bc_store::clones): kept for
-- the window it judges over.
CREATE TABLE cert_sightings (
    id      INTEGER PRIMARY KEY AUTOINCREMENT,
    serial  TEXT NOT NULL REFERENCES node_certs(serial),
    boot_id TEXT NOT NULL,
    at      INTEGER NOT NULL
) STRICT;
CREATE INDEX cert_sightings_serial ON cert_sightings(serial, id);
