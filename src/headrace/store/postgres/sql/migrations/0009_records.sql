-- Records kept beside the tasks (store/records.py): items, tokens, first answers, deliveries.
-- `seq` orders them by their last change of state, numbered by a sequence (no lock).
CREATE SEQUENCE record_changes AS bigint;
CREATE TABLE records (
    kind       text             NOT NULL,
    id         text             NOT NULL,
    scope      text             NOT NULL,
    state      text             NOT NULL,
    body       jsonb            NOT NULL,
    seq        bigint           NOT NULL UNIQUE,
    created_at double precision NOT NULL,
    changed_at double precision NOT NULL,
    PRIMARY KEY (kind, id)
);
CREATE INDEX records_by_scope ON records (kind, scope, state, seq);
-- Who did what to which record, and whether it applied: append only.
CREATE TABLE audit (
    id        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at        double precision NOT NULL,
    kind      text  NOT NULL,
    record_id text  NOT NULL,
    scope     text  NOT NULL,
    action    text  NOT NULL,
    actor     text  NOT NULL,
    outcome   text  NOT NULL,
    detail    jsonb NOT NULL
);
CREATE INDEX audit_by_record ON audit (kind, record_id);
CREATE INDEX audit_by_scope ON audit (scope);
-- Notifications owed by changes, written with them, kept until a relay delivers them.
CREATE TABLE outbox (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at           double precision NOT NULL,
    topic        text  NOT NULL,
    kind         text  NOT NULL,
    record_id    text  NOT NULL,
    scope        text  NOT NULL,
    body         jsonb NOT NULL,
    delivered_at double precision
);
CREATE INDEX outbox_pending ON outbox (id) WHERE delivered_at IS NULL;
