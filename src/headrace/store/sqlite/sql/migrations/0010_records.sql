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
