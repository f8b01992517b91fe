-- Finished tasks by state and by when they finished: what the pruner walks (store/pruning.py).
CREATE INDEX tasks_finished ON tasks (state, finished_at, id) WHERE finished_at IS NOT NULL;
-- What a task waits on, from its side: the pruner asks it of every task it would remove.
CREATE INDEX task_deps_task ON task_deps (task_id);
-- Audit rows and delivered notices by age.
CREATE INDEX audit_at ON audit (at, id);
CREATE INDEX outbox_delivered ON outbox (delivered_at, id) WHERE delivered_at IS NOT NULL;
-- A group's pruned tasks per state, which its report adds to what its kept tasks count.
CREATE TABLE group_rollup (
    grp   TEXT    NOT NULL,
    state TEXT    NOT NULL,
    n     INTEGER NOT NULL,
    PRIMARY KEY (grp, state)
) WITHOUT ROWID;
-- The pruner's lease: one process prunes at a time, and a run starts once the last one ended
-- long enough ago.
CREATE TABLE pruner (
    name    TEXT    PRIMARY KEY,
    holder  TEXT    NOT NULL,
    until   REAL    NOT NULL,
    done_at REAL,
    removed INTEGER NOT NULL DEFAULT 0
) WITHOUT ROWID;
