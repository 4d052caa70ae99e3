-- Who may boot what: the pool a join token puts its nodes in, the MAC
-- addresses nodes report, assignments by node and by pool, join tokens the
-- boot endpoint mints for allowed MAC addresses, and that allow-list.

    ALTER TABLE join_tokens ADD COLUMN pool TEXT;
    ALTER TABLE join_tokens ADD COLUMN minted_for_mac TEXT;
    CREATE INDEX join_tokens_minted ON join_tokens(minted_for_mac)
        WHERE minted_for_mac IS NOT NULL;
    ALTER TABLE nodes ADD COLUMN pool TEXT;
    CREATE TABLE node_macs (
        mac         TEXT PRIMARY KEY,
        node_id     TEXT NOT NULL REFERENCES nodes(id),
        reported_at INTEGER NOT NULL
    ) STRICT;
    CREATE INDEX node_macs_node ON node_macs(node_id);
    ALTER TABLE image_assignments ADD COLUMN mint_ttl_ms INTEGER;
    CREATE TABLE boot_allowed_macs (
        mac      TEXT PRIMARY KEY,
        pool     TEXT,
        added_at INTEGER NOT NULL
    ) STRICT;
