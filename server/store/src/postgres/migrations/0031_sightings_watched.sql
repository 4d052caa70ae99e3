-- The clone watch marks the sightings it has read (as SQLite's migration
-- 0031), and reads those it has not, whatever their ids: a row of a huge
-- id, or one that commits after a higher one (ids are taken before
-- commit), is read like any other. A gateway's role inserts sightings
-- without this column (its grant names the others) and never updates
-- one, so only the key holder marks them.
ALTER TABLE cert_sightings ADD COLUMN watched BOOLEAN NOT NULL DEFAULT FALSE;
CREATE INDEX cert_sightings_unwatched ON cert_sightings (id) WHERE NOT watched;
