-- Tallies: tasks per kind and state, per group and state, and attempts per outcome, kept by the
-- triggers below in the transaction that changes the rows (whatever statement changes them,
-- retention's deletes included), so that `/metrics` and `headrace status` read a few rows
-- instead of counting every task. Writers take turns on the file, so one row per key is enough.
-- Attempts have no delete trigger: their totals are counters, and deleting old attempts leaves
-- them alone. A running attempt is not tallied: it is a running task's (one each), so a claim's
-- new attempts cost no trigger.
CREATE TABLE kind_tally (
    kind  TEXT    NOT NULL,
    state TEXT    NOT NULL,
    n     INTEGER NOT NULL,
    PRIMARY KEY (kind, state)
) WITHOUT ROWID;

CREATE TABLE group_tally (
    grp   TEXT    NOT NULL,
    state TEXT    NOT NULL,
    n     INTEGER NOT NULL,
    PRIMARY KEY (grp, state)
) WITHOUT ROWID;

CREATE TABLE attempt_tally (
    outcome TEXT    PRIMARY KEY,
    n       INTEGER NOT NULL
) WITHOUT ROWID;

CREATE TRIGGER tally_task_added AFTER INSERT ON tasks
BEGIN
    INSERT INTO kind_tally (kind, state, n) VALUES (new.kind, new.state, 1)
    ON CONFLICT (kind, state) DO UPDATE SET n = n + 1;
    INSERT INTO group_tally (grp, state, n) SELECT new.grp, new.state, 1 WHERE new.grp IS NOT NULL
    ON CONFLICT (grp, state) DO UPDATE SET n = n + 1;
END;

CREATE TRIGGER tally_task_moved AFTER UPDATE OF kind, grp, state ON tasks
WHEN old.state IS NOT new.state OR old.kind IS NOT new.kind OR old.grp IS NOT new.grp
BEGIN
    UPDATE kind_tally SET n = n - 1 WHERE kind = old.kind AND state = old.state;
    INSERT INTO kind_tally (kind, state, n) VALUES (new.kind, new.state, 1)
    ON CONFLICT (kind, state) DO UPDATE SET n = n + 1;
    UPDATE group_tally SET n = n - 1 WHERE grp = old.grp AND state = old.state;
    INSERT INTO group_tally (grp, state, n) SELECT new.grp, new.state, 1 WHERE new.grp IS NOT NULL
    ON CONFLICT (grp, state) DO UPDATE SET n = n + 1;
END;

CREATE TRIGGER tally_task_removed AFTER DELETE ON tasks
BEGIN
    UPDATE kind_tally SET n = n - 1 WHERE kind = old.kind AND state = old.state;
    UPDATE group_tally SET n = n - 1 WHERE grp = old.grp AND state = old.state;
END;

CREATE TRIGGER tally_attempt_moved AFTER UPDATE OF outcome ON attempts
WHEN old.outcome IS NOT new.outcome
BEGIN
    UPDATE attempt_tally SET n = n - 1 WHERE outcome = old.outcome;  -- none for 'running'
    INSERT INTO attempt_tally (outcome, n) SELECT new.outcome, 1 WHERE new.outcome <> 'running'
    ON CONFLICT (outcome) DO UPDATE SET n = n + 1;
END;

-- A stage's ready tasks by how long they have waited: its oldest one, and the ends of the age
-- sample, are read from the index. It replaces (kind, state), which it begins with.
DROP INDEX tasks_kind_state;
CREATE INDEX tasks_kind_state_since ON tasks (kind, state, coalesce(ready_since, created_at));

-- The tallies of the rows stored already (this migration holds the file's write lock).
INSERT INTO kind_tally (kind, state, n)
SELECT kind, state, count(*) FROM tasks GROUP BY kind, state;

INSERT INTO group_tally (grp, state, n)
SELECT grp, state, count(*) FROM tasks WHERE grp IS NOT NULL GROUP BY grp, state;

INSERT INTO attempt_tally (outcome, n)
SELECT outcome, count(*) FROM attempts WHERE outcome <> 'running' GROUP BY outcome;
