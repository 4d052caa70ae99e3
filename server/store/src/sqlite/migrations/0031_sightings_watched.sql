-- The clone watch marks the sightings it has read (as PostgreSQL's
-- migration 0031), and reads those it has not, whatever their ids: a row
-- of a huge id, or one that commits after a higher one, is read like any
-- other. A gateway that writes a sighting marked read only hides it,
-- which it could by not writing it at all; the watch re-reads and
-- re-verifies every sighting of a certificate it looks at.
ALTER TABLE cert_sightings ADD COLUMN watched INTEGER NOT NULL DEFAULT 0;
CREATE INDEX cert_sightings_unwatched ON cert_sightings (id) WHERE watched = 0;
