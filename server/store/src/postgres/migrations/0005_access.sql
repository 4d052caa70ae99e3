-- Access (sshd users, user CA keys, firewall) in the desired state.

ALTER TABLE node_specs ADD COLUMN access TEXT NOT NULL DEFAULT '{}';
