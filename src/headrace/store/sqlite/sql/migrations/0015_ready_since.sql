-- A ready task's `ready_since` is when it last became ready to run (store/ages.py), set by
-- every move into `ready`; a retry, a lost lease and a redrive used to leave it as it was, so a
-- task redriven after 20 minutes dead read 20 minutes old at once. Each of those moves set the
-- task's `run_at` to when it may run again, so a task ready now became ready at the later of
-- the two. Every ready task has one from here on: the ages are read from it alone.
UPDATE tasks SET ready_since = max(coalesce(ready_since, created_at), run_at)
WHERE state = 'ready';
DROP INDEX tasks_queued_by_kind;
CREATE INDEX tasks_queued_by_kind ON tasks (kind, state, ready_since)
WHERE state IN ('pending', 'ready');
