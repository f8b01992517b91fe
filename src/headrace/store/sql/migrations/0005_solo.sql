-- A task whose lease expired beside others' runs alone until it ends (`solo`); the reaper asks
-- which attempts a worker was running when it died, by worker.
ALTER TABLE tasks ADD COLUMN solo INTEGER NOT NULL DEFAULT 0;
CREATE INDEX attempts_worker_open ON attempts (worker) WHERE outcome IN ('running', 'lease_expired');
