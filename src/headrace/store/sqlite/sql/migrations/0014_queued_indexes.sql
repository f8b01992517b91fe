-- Tasks by kind and by group, only while they wait to run (pending or ready). A lease and an
-- outcome change a task's state, and a row whose indexed column changes gets an entry in every
-- index that covers it: indexes over every state took two entries a task at each of those
-- changes and kept one for every task in the history. What reads them asks for waiting tasks
-- (a stage's bound and caps, its oldest ready task), for dead ones (dead letters, a group's
-- failures), and for running or waiting ones (`stage_counts`, through the lease and poll
-- indexes).
DROP INDEX tasks_kind_state_since;
DROP INDEX tasks_group_state;
CREATE INDEX tasks_queued_by_kind ON tasks (kind, state, coalesce(ready_since, created_at))
WHERE state IN ('pending', 'ready');
CREATE INDEX tasks_queued_by_group ON tasks (grp, kind) WHERE state IN ('pending', 'ready');
CREATE INDEX tasks_dead_by_group ON tasks (grp, id) WHERE state = 'dead';
