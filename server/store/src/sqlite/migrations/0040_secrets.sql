-- The secret broker's values (crate::secrets): each version sealed under
-- the key holder's secrets key, bound to its name and version. Deleting a
-- secret empties every version's value and keeps the rows, so a name put
-- again goes on from its last version. No grant to a gateway's role.
CREATE TABLE secrets (
    name        TEXT NOT NULL,
    version     INTEGER NOT NULL,
    sealed      BLOB NOT NULL,
    created_at  INTEGER NOT NULL,
    created_by  TEXT NOT NULL,
    deleted_at  INTEGER,
    PRIMARY KEY (name, version)
) STRICT;
