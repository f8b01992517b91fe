-- headrace on SQLite, schema version 1: tasks and their dependencies, gate states and tickets,
-- fair-queueing tags, attempt history and the cost ledger. Times are the store clock's seconds.

CREATE TABLE tasks (
    id              INTEGER PRIMARY KEY,
    kind            TEXT    NOT NULL,
    ref             TEXT    NOT NULL,
    gates           TEXT    NOT NULL,  -- the task's gates as submitted, space-joined
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
    ready_since     REAL,
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
    unmet           INTEGER NOT NULL DEFAULT 0  -- dependencies not yet succeeded
);

CREATE UNIQUE INDEX tasks_key ON tasks (key) WHERE key <> '';
CREATE INDEX tasks_claim_order ON tasks (tier, tag, id) WHERE state = 'ready';
CREATE INDEX tasks_ready_run_at ON tasks (run_at) WHERE state = 'ready';
CREATE INDEX tasks_ready_aging ON tasks (tier, ready_since) WHERE state = 'ready';
CREATE INDEX tasks_running_lease ON tasks (lease_until) WHERE state = 'running';
CREATE INDEX tasks_waiting_polls ON tasks (run_at, id) WHERE state = 'waiting';
CREATE INDEX tasks_kind_state ON tasks (kind, state);
CREATE INDEX tasks_group_state ON tasks (grp, state);

-- A row while `task_id` waits on `dep_id`; removed when `dep_id` reaches an outcome.
CREATE TABLE task_deps (
    dep_id  INTEGER NOT NULL REFERENCES tasks (id),
    task_id INTEGER NOT NULL REFERENCES tasks (id),
    PRIMARY KEY (dep_id, task_id)
) WITHOUT ROWID;

-- One row per ticket a gate granted a task, held until the task's outcome.
CREATE TABLE tickets (
    task_id INTEGER NOT NULL REFERENCES tasks (id),
    gate    TEXT    NOT NULL
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
    first_blocked_at       REAL
) WITHOUT ROWID;

-- Each flow's finish tag: where its next task's start tag begins.
CREATE TABLE flows (
    flow       TEXT PRIMARY KEY,
    finish_tag REAL NOT NULL
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
