-- A task whose lease expired beside others' runs alone until it ends (`solo`). Each lost lease
-- records who lost it and when (`lost_by`, `lost_at`): the reaper asks what else a worker lost.
ALTER TABLE tasks ADD COLUMN solo INTEGER NOT NULL DEFAULT 0;
ALTER TABLE tasks ADD COLUMN lost_by TEXT;
ALTER TABLE tasks ADD COLUMN lost_at REAL;
CREATE INDEX tasks_lost_by ON tasks (lost_by) WHERE lost_by IS NOT NULL;
