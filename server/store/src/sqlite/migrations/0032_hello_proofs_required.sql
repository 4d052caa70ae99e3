-- When the key holder first verified a Hello proof of the node signed by
-- a confirmed release (as PostgreSQL's migration 0032): from then on a
-- Hello of the node with no proof is refused (another machine with its
-- key; no release from before proofs runs under the identity again). Only
-- the key holder sets it, a re-enrolment clears it.
ALTER TABLE nodes ADD COLUMN hello_proofs_since INTEGER;
