-- Tallies: tasks per kind and state, per group and state, and attempts per outcome, kept by the
-- triggers below in the transaction that changes the rows (whatever statement changes them,
-- retention's deletes included), so that `/metrics` and `headrace status` read a few rows
-- instead of counting every task. A trigger appends what its statement changed to
-- `tally_changes` (`attempt_changes`): no index, no row another writer touches, so unrelated
-- transactions never wait on each other there. A read sums the tallies and the changes; a fold
-- (`fold_tallies`, every few seconds) moves the changes into the tallies. Attempts have no
-- delete trigger: their totals are counters, and deleting old attempts leaves them alone. A
-- running attempt is not tallied: it is a running task's (one each), so a claim's new attempts
-- cost no trigger.
CREATE TABLE kind_tally (
    kind  text   NOT NULL,
    state text   NOT NULL,
    n     bigint NOT NULL,
    PRIMARY KEY (kind, state)
);

CREATE TABLE group_tally (
    grp   text   NOT NULL,
    state text   NOT NULL,
    n     bigint NOT NULL,
    PRIMARY KEY (grp, state)
);

CREATE TABLE attempt_tally (
    outcome text   PRIMARY KEY,
    n       bigint NOT NULL
);

CREATE TABLE tally_changes (
    kind  text   NOT NULL,
    grp   text,
    state text   NOT NULL,
    n     bigint NOT NULL
);

CREATE TABLE attempt_changes (
    outcome text   NOT NULL,
    n       bigint NOT NULL
);

-- Statement-level: a claim of 16 tasks, or a batch of outcomes, appends a row per kind, group
-- and state it changed. The functions name the tables as the writer's search_path finds them:
-- a writer whose path leads elsewhere (another store's schema) is refused, not counted there.
CREATE FUNCTION tally_tasks_added() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_TABLE_SCHEMA <> current_schema() THEN
        RAISE EXCEPTION 'write %.% with the search_path set to its schema',
            TG_TABLE_SCHEMA, TG_TABLE_NAME;
    END IF;
    INSERT INTO tally_changes (kind, grp, state, n)
    SELECT kind, grp, state, count(*) FROM added GROUP BY kind, grp, state;
    RETURN NULL;
END
$$;

CREATE FUNCTION tally_tasks_moved() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_TABLE_SCHEMA <> current_schema() THEN
        RAISE EXCEPTION 'write %.% with the search_path set to its schema',
            TG_TABLE_SCHEMA, TG_TABLE_NAME;
    END IF;
    INSERT INTO tally_changes (kind, grp, state, n)
    SELECT kind, grp, state, sum(n)
    FROM (
        SELECT kind, grp, state, 1 AS n FROM added
        UNION ALL
        SELECT kind, grp, state, -1 AS n FROM removed
    ) AS moved
    GROUP BY kind, grp, state HAVING sum(n) <> 0;
    RETURN NULL;
END
$$;

CREATE FUNCTION tally_tasks_removed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_TABLE_SCHEMA <> current_schema() THEN
        RAISE EXCEPTION 'write %.% with the search_path set to its schema',
            TG_TABLE_SCHEMA, TG_TABLE_NAME;
    END IF;
    INSERT INTO tally_changes (kind, grp, state, n)
    SELECT kind, grp, state, -count(*) FROM removed GROUP BY kind, grp, state;
    RETURN NULL;
END
$$;

CREATE FUNCTION tally_attempts_moved() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_TABLE_SCHEMA <> current_schema() THEN
        RAISE EXCEPTION 'write %.% with the search_path set to its schema',
            TG_TABLE_SCHEMA, TG_TABLE_NAME;
    END IF;
    INSERT INTO attempt_changes (outcome, n)
    SELECT outcome, sum(n)
    FROM (
        SELECT outcome, 1 AS n FROM added WHERE outcome <> 'running'
        UNION ALL
        SELECT outcome, -1 AS n FROM removed WHERE outcome <> 'running'
    ) AS moved
    GROUP BY outcome HAVING sum(n) <> 0;
    RETURN NULL;
END
$$;

CREATE TRIGGER tally_added AFTER INSERT ON tasks
REFERENCING NEW TABLE AS added
FOR EACH STATEMENT EXECUTE FUNCTION tally_tasks_added();

CREATE TRIGGER tally_moved AFTER UPDATE ON tasks
REFERENCING OLD TABLE AS removed NEW TABLE AS added
FOR EACH STATEMENT EXECUTE FUNCTION tally_tasks_moved();

CREATE TRIGGER tally_removed AFTER DELETE ON tasks
REFERENCING OLD TABLE AS removed
FOR EACH STATEMENT EXECUTE FUNCTION tally_tasks_removed();

CREATE TRIGGER tally_moved AFTER UPDATE ON attempts
REFERENCING OLD TABLE AS removed NEW TABLE AS added
FOR EACH STATEMENT EXECUTE FUNCTION tally_attempts_moved();

-- A stage's ready tasks by how long they have waited: its oldest one, and the ends of the age
-- sample, are read from the index. It replaces (kind, state), which it begins with.
DROP INDEX tasks_kind_state;
CREATE INDEX tasks_kind_state_since ON tasks (kind, state, coalesce(ready_since, created_at));

-- The tallies of the rows stored already (the triggers hold the tables from their creation:
-- no writer can slip between them and these counts).
INSERT INTO kind_tally (kind, state, n)
SELECT kind, state, count(*) FROM tasks GROUP BY kind, state;

INSERT INTO group_tally (grp, state, n)
SELECT grp, state, count(*) FROM tasks WHERE grp IS NOT NULL GROUP BY grp, state;

INSERT INTO attempt_tally (outcome, n)
SELECT outcome, count(*) FROM attempts WHERE outcome <> 'running' GROUP BY outcome;
