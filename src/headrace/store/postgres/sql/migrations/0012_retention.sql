-- Finished tasks by state and by when they finished: what the pruner walks (store/pruning.py).
CREATE INDEX tasks_finished ON tasks (state, finished_at, id) WHERE finished_at IS NOT NULL;
-- Audit rows and delivered notices by age.
CREATE INDEX audit_at ON audit (at, id);
CREATE INDEX outbox_delivered ON outbox (delivered_at, id) WHERE delivered_at IS NOT NULL;
-- A group's pruned tasks per state, which its report adds to what its kept tasks count.
CREATE TABLE group_rollup (
    grp   text   NOT NULL,
    state text   NOT NULL,
    n     bigint NOT NULL,
    PRIMARY KEY (grp, state)
);
-- The pruner's lease: one process prunes at a time, and a run starts once the last one ended
-- long enough ago.
CREATE TABLE pruner (
    name    text             PRIMARY KEY,
    holder  text             NOT NULL,
    until   double precision NOT NULL,
    done_at double precision,
    removed bigint           NOT NULL DEFAULT 0
);
