-- A task whose lease expired beside others' runs alone until it ends (`solo`). Each lost lease
-- records who lost it and when (`lost_by`, `lost_at`): the reaper asks what else a worker lost.
ALTER TABLE tasks ADD COLUMN solo boolean NOT NULL DEFAULT false;
ALTER TABLE tasks ADD COLUMN lost_by text;
ALTER TABLE tasks ADD COLUMN lost_at double precision;
CREATE INDEX tasks_lost_by ON tasks (lost_by) WHERE lost_by IS NOT NULL;
