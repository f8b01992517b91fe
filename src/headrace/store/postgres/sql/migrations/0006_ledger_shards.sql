-- The ledger keeps a row per group, kind and worker, summed when read: workers finishing tasks
-- of one group no longer wait on each other's row until their commits.
ALTER TABLE ledger ADD COLUMN worker text NOT NULL DEFAULT '';
ALTER TABLE ledger DROP CONSTRAINT ledger_pkey;
ALTER TABLE ledger ADD PRIMARY KEY (grp, kind, worker);
