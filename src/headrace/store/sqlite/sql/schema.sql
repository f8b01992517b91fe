-- The current headrace SQLite schema: what sqlite/migrations/ produce from an empty file (a test
-- proves it). Read it to know the tables; change the schema with a new migration, then here.

CREATE TABLE tasks (
    id              INTEGER PRIMARY KEY,
    kind            TEXT    NOT NULL,
    ref             TEXT    NOT NULL,
    gates           TEXT    NOT NULL,  -- the task's gates as submitted, a JSON array
    gate_key        TEXT    NOT NULL,  -- the same names sorted: tasks alike for admission
    flow            TEXT    NOT NULL,
    grp             TEXT,
    tier            INTEGER NOT NULL,  -- 0 rush, 1 normal, 2 low; aging lowers it
    submitted_tier  INTEGER NOT NULL,
    cost            REAL    NOT NULL,
    key             TEXT,
    state           TEXT    NOT NULL CHECK (state IN (
                        'pending', 'ready', 'running', 'waiting',
                        'succeeded', 'dead', 'cancelled')),
    attempt         INTEGER NOT NULL DEFAULT 0,
    max_attempts    INTEGER NOT NULL,
    tag             REAL    NOT NULL,  -- start-time fair queueing tag
    created_at      REAL    NOT NULL,
    run_at          REAL    NOT NULL,
    ready_since     REAL,  -- when it last became ready to run (store/ages.py)
    promoted_at     REAL,
    finished_at     REAL,
    worker          TEXT,
    lease_until     REAL,
    lease_token     INTEGER NOT NULL DEFAULT 0,
    remote_id       TEXT,
    poll_every      REAL,
    remote_deadline REAL,
    error_code      TEXT,
    expiries        INTEGER NOT NULL DEFAULT 0,
    unmet           INTEGER NOT NULL DEFAULT 0,  -- dependencies not yet succeeded
    attempt_base    INTEGER NOT NULL DEFAULT 0,  -- attempts not counted against max_attempts
    solo INTEGER NOT NULL DEFAULT 0,  -- lost a lease beside others: runs alone until it ends
    lost_by TEXT,  -- the worker that last lost its lease
    lost_at REAL,  -- when
    payload_digest  TEXT,  -- a keyed task's payload digest (store/idempotency.py), else NULL
    remote_jobs INTEGER NOT NULL DEFAULT 0,  -- remote jobs it submitted that failed
    lane TEXT,  -- its fair-queueing lane when not its flow (an item's next stage)
    memory INTEGER NOT NULL DEFAULT 0  -- bytes charged against its worker's memory budget
);

CREATE UNIQUE INDEX tasks_key ON tasks (key) WHERE key <> '';
CREATE INDEX tasks_claim_order ON tasks (tier, tag, id) WHERE state = 'ready';
CREATE INDEX tasks_ready_run_at ON tasks (run_at) WHERE state = 'ready';
CREATE INDEX tasks_ready_aging ON tasks (tier, ready_since) WHERE state = 'ready';
CREATE INDEX tasks_running_lease ON tasks (lease_until) WHERE state = 'running';
CREATE INDEX tasks_waiting_polls ON tasks (run_at, id) WHERE state = 'waiting';
-- Tasks waiting to run by kind (a stage's bound, its ready tasks by how long they have
-- waited) and by group (a stage's cap per group); dead tasks by group. Only in those states: a
-- lease and an outcome change a task's state without touching these.
CREATE INDEX tasks_queued_by_kind ON tasks (kind, state, ready_since)
WHERE state IN ('pending', 'ready');
CREATE INDEX tasks_queued_by_group ON tasks (grp, kind) WHERE state IN ('pending', 'ready');
CREATE INDEX tasks_dead_by_group ON tasks (grp, id) WHERE state = 'dead';
CREATE INDEX tasks_lost_by ON tasks (lost_by) WHERE lost_by IS NOT NULL;
CREATE INDEX tasks_finished ON tasks (state, finished_at, id) WHERE finished_at IS NOT NULL;

-- `task_id` waits on `dep_id`; kept after the outcome (a redrive may restore dependents),
-- removed when the pruner removes either task.
CREATE TABLE task_deps (
    dep_id  INTEGER NOT NULL REFERENCES tasks (id),
    task_id INTEGER NOT NULL REFERENCES tasks (id),
    PRIMARY KEY (dep_id, task_id)
) WITHOUT ROWID;

CREATE INDEX task_deps_task ON task_deps (task_id);

-- One row per ticket a gate granted a task, held until the task's outcome. `started`: its call
-- start is stamped (always, on a gate without a rate).
CREATE TABLE tickets (
    task_id INTEGER NOT NULL REFERENCES tasks (id),
    gate    TEXT    NOT NULL, started INTEGER NOT NULL DEFAULT 1
);

CREATE INDEX tickets_task ON tickets (task_id);

-- Each gate's `GateState`; a gate has a row once it granted, refused, released or was penalised.
CREATE TABLE gates (
    name                   TEXT    PRIMARY KEY,
    in_flight              INTEGER NOT NULL,
    starts                 TEXT    NOT NULL,  -- JSON array: the newest start times
    penalized_until        REAL,              -- NULL: never penalised
    granted                INTEGER NOT NULL,
    blocked_by_token       INTEGER NOT NULL,
    blocked_by_concurrency INTEGER NOT NULL,
    rate_limited           INTEGER NOT NULL,
    peak_in_flight         INTEGER NOT NULL,
    first_blocked_at       REAL, unstarted INTEGER NOT NULL DEFAULT 0,  -- starts not stamped yet
    spec TEXT  -- the declaration it comes from: its name, or its template's (`session:*`)
) WITHOUT ROWID;

-- Each flow's finish tag (where its next task's start tag begins) and when it was last served
-- (the dispatch count then), so flows take turns within a round of equal tags; the same for
-- each lane (a flow at one stage: policy/fairness.py).
CREATE TABLE flows (
    flow       TEXT PRIMARY KEY,
    finish_tag REAL NOT NULL, served INTEGER NOT NULL DEFAULT 0
) WITHOUT ROWID;

-- Store-wide numbers, e.g. the fair-queueing virtual time.
CREATE TABLE meta (
    name  TEXT PRIMARY KEY,
    value REAL NOT NULL
) WITHOUT ROWID;

CREATE TABLE attempts (
    task_id     INTEGER NOT NULL REFERENCES tasks (id),
    number      INTEGER NOT NULL,
    worker      TEXT    NOT NULL,
    started_at  REAL    NOT NULL,
    ended_at    REAL,
    outcome     TEXT    NOT NULL,
    error_class TEXT,
    code        TEXT,
    message     TEXT,
    PRIMARY KEY (task_id, number)
) WITHOUT ROWID;

-- Units spent by succeeded tasks, per group ('' for none) and kind.
CREATE TABLE ledger (
    grp   TEXT NOT NULL,
    kind  TEXT NOT NULL,
    units REAL NOT NULL,
    PRIMARY KEY (grp, kind)
) WITHOUT ROWID;

-- Records kept beside the tasks (store/records.py): items, tokens, first answers, deliveries.
-- `seq` orders them by their last change of state; writers are serialised, so max + 1 is safe.
CREATE TABLE records (
    kind       TEXT    NOT NULL,
    id         TEXT    NOT NULL,
    scope      TEXT    NOT NULL,
    state      TEXT    NOT NULL,
    body       TEXT    NOT NULL,
    seq        INTEGER NOT NULL UNIQUE,
    created_at REAL    NOT NULL,
    changed_at REAL    NOT NULL,
    PRIMARY KEY (kind, id)
) WITHOUT ROWID;
CREATE INDEX records_by_scope ON records (kind, scope, state, seq);
-- Who did what to which record, and whether it applied: append only.
CREATE TABLE audit (
    id        INTEGER PRIMARY KEY,
    at        REAL NOT NULL,
    kind      TEXT NOT NULL,
    record_id TEXT NOT NULL,
    scope     TEXT NOT NULL,
    action    TEXT NOT NULL,
    actor     TEXT NOT NULL,
    outcome   TEXT NOT NULL,
    detail    TEXT NOT NULL
);
CREATE INDEX audit_by_record ON audit (kind, record_id);
CREATE INDEX audit_by_scope ON audit (scope);
CREATE INDEX audit_at ON audit (at, id);
-- Notifications owed by changes, written with them, kept until a relay delivers them.
CREATE TABLE outbox (
    id           INTEGER PRIMARY KEY,
    at           REAL NOT NULL,
    topic        TEXT NOT NULL,
    kind         TEXT NOT NULL,
    record_id    TEXT NOT NULL,
    scope        TEXT NOT NULL,
    body         TEXT NOT NULL,
    delivered_at REAL
);
CREATE INDEX outbox_pending ON outbox (id) WHERE delivered_at IS NULL;
CREATE INDEX outbox_delivered ON outbox (delivered_at, id) WHERE delivered_at IS NOT NULL;

-- A group's pruned tasks per state, which its report adds to what its kept tasks count.
CREATE TABLE group_rollup (
    grp   TEXT    NOT NULL,
    state TEXT    NOT NULL,
    n     INTEGER NOT NULL,
    PRIMARY KEY (grp, state)
) WITHOUT ROWID;

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

-- The pruner's lease (store/pruning.py): one process prunes at a time, and a run starts once
-- the last one ended long enough ago.
CREATE TABLE pruner (
    name    TEXT    PRIMARY KEY,
    holder  TEXT    NOT NULL,
    until   REAL    NOT NULL,
    done_at REAL,
    removed INTEGER NOT NULL DEFAULT 0
) WITHOUT ROWID;

-- Named leases (`Store.take_lease`): one process at a time does what the name says (`metrics`:
-- it exports the store-wide figures at /metrics) for as long as it renews its lease.
CREATE TABLE leases (
    name   TEXT PRIMARY KEY,
    holder TEXT NOT NULL,
    until  REAL NOT NULL
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
