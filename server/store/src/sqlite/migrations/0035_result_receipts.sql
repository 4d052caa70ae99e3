-- Receipts for node-signed results (as PostgreSQL's migration 0035): the
-- key holder verifies each result its node signed and keeps a
-- worker-signed receipt beside it, which the node's gateway hands on so
-- the node may forget the result. NULL: not judged yet; empty: judged and
-- given none (no node signed it). Results that
-- finished before receipts are judged too, once, as the key holder gets to
-- them.
ALTER TABLE commands ADD COLUMN receipt BLOB;
CREATE INDEX commands_unreceipted ON commands (id)
    WHERE receipt IS NULL AND result_signature IS NOT NULL;
