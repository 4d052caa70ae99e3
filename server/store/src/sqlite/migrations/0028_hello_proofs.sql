-- The node's signed Hello proofs (bcd_proto::hello). A sighting keeps the
-- proof of the Hello that recorded it and the count it carries: the key
-- holder quarantines a cloned identity only from proofs it verified (a
-- sighting from before this migration has none and counts for nothing).
-- A session keeps the highest count its node's proofs carried, told back
-- in the Welcome.
ALTER TABLE cert_sightings ADD COLUMN seq INTEGER NOT NULL DEFAULT 0;
ALTER TABLE cert_sightings ADD COLUMN proof BLOB;
ALTER TABLE cert_sightings ADD COLUMN proof_signature BLOB;
ALTER TABLE node_sessions ADD COLUMN hello_seq INTEGER NOT NULL DEFAULT 0;
