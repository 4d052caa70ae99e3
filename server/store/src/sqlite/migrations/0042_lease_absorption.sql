-- What a gateway measured it absorbs: the most Hellos it committed in one
-- second of the last five minutes, floored at what its handshake bucket
-- admits. The gateways size the fleet's first-redial window from the sum
-- over live gateway leases, not from configured rates.
ALTER TABLE leases ADD COLUMN absorbs_per_s INTEGER NOT NULL DEFAULT 0;
