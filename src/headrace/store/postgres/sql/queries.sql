-- The statements of the PostgreSQL store (store/postgres/), by name. Parameters are psycopg's
-- named placeholders; `%(now)s` is always the store clock's time in epoch seconds, read inside
-- the verb's transaction (after the gate rows it needs are locked, for a claim). `{schema}` and
-- `{channel}` are identifiers the store composes in; no other statement names the schema: the
-- connections' search_path is the store's schema.

-- name: server_now
-- The server's clock in epoch seconds: the store's time when no test clock is given.
SELECT extract(epoch FROM clock_timestamp())::double precision AS now;

-- name: set_search_path
-- Resolve unqualified names in the store's schema; no JIT (a queue's statements are short); an index wherever one serves.
SELECT set_config('search_path', quote_ident(%(schema)s::text), false),
       set_config('jit', 'off', false),
       -- Every statement of the store finds its rows by key or through an index. A prepared
       -- statement's generic plan is made once per connection from the statistics of that
       -- moment: one made while a table was new (never analyzed, a few pages) scans the whole
       -- table for ever after, and the table grows by a row per attempt. With sequential scans
       -- off, plans take the index whatever the statistics say; a table no index serves is
       -- still scanned.
       set_config('enable_seqscan', 'off', false);

-- name: bound_quiet_sessions
-- How long a pooled session waits on a client gone quiet. Idle inside a transaction (its host's link cut, its process frozen) for `milliseconds`, the server ends it, so the row and advisory locks it holds stop holding up every other process; its client finds the connection broken and, having committed nothing, runs the transaction again. Whatever its state, keepalive probes and a limit on unacknowledged data find a host that is gone in `probe_idle` + `probe_interval` x `probes` seconds (`unacked_ms`), not the hours of the system's defaults.
SELECT set_config('idle_in_transaction_session_timeout', %(milliseconds)s::text, false),
       set_config('tcp_keepalives_idle', %(probe_idle)s::text, false),
       set_config('tcp_keepalives_interval', %(probe_interval)s::text, false),
       set_config('tcp_keepalives_count', %(probes)s::text, false),
       set_config('tcp_user_timeout', %(unacked_ms)s::text, false);

-- name: create_schema
-- The store's own schema, created by the first migration run.
CREATE SCHEMA IF NOT EXISTS {schema};

-- name: advisory_lock
-- Serialise this transaction with others taking the same named lock (migrations, a stage bound).
SELECT pg_advisory_xact_lock(hashtext(%(lock)s::text));

-- name: create_migrations_table
-- The table that records which migrations were applied.
CREATE TABLE IF NOT EXISTS schema_migrations (
    version    integer     PRIMARY KEY,
    applied_at timestamptz NOT NULL DEFAULT now()
);

-- name: schema_version
-- The schema version: the newest migration applied (0 for an empty schema).
SELECT coalesce(max(version), 0) AS version FROM schema_migrations;

-- name: record_migration
-- Record that a migration was applied.
INSERT INTO schema_migrations (version) VALUES (%(version)s::integer);

-- name: read_snapshot
-- A reading verb sees one consistent snapshot and writes nothing.
SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY;

-- name: notify
-- Wake idle workers listening on the store's channel (delivered when the transaction commits).
SELECT pg_notify(%(channel)s::text, '');

-- name: listen
-- Receive the store's wake-ups on this connection.
LISTEN {channel};

-- name: task_by_id
-- One task.
SELECT * FROM tasks WHERE id = %(id)s::bigint;

-- name: lock_task
-- One task, locked until the end of the transaction: its holder's write is checked against it.
SELECT * FROM tasks WHERE id = %(id)s::bigint FOR UPDATE;

-- name: lock_for_outcomes
-- Lock in id order tasks, what waits on those succeeding (directly) or dying (in a tree).
WITH RECURSIVE tree (id) AS (
    SELECT unnest(%(dead)s::bigint[])
    UNION
    SELECT d.task_id FROM task_deps AS d JOIN tree ON d.dep_id = tree.id
)
SELECT * FROM tasks
WHERE id = ANY(ARRAY(  -- the primary key, whatever the planner guesses of the set's size
    SELECT unnest(%(ids)s::bigint[])
    UNION SELECT id FROM tree
    UNION SELECT task_id FROM task_deps WHERE dep_id = ANY(%(succeeded)s::bigint[])
))
ORDER BY id
FOR UPDATE;

-- name: share_tasks
-- The states of tasks named as dependencies, held still until the new dependents are written.
SELECT id, state FROM tasks WHERE id = ANY(%(ids)s::bigint[]) ORDER BY id FOR SHARE;

-- name: lock_keys
-- Serialise writers of the same idempotency keys until they commit (in the order given, sorted by every writer, so none waits in a cycle).
SELECT pg_advisory_xact_lock(hashtextextended('headrace.key:' || k.key, 0))
FROM unnest(%(keys)s::text[]) WITH ORDINALITY AS k (key, n)
ORDER BY k.n;

-- name: task_ids_by_keys
-- The tasks idempotency keys name, with the digests of the payloads they were submitted with.
SELECT id, key, payload_digest FROM tasks WHERE key = ANY(%(keys)s::text[]);

-- name: count_queued
-- Tasks of a kind still waiting to run (pending or ready): what a stage's bound limits.
SELECT count(*) AS n FROM tasks WHERE kind = %(kind)s::text AND state IN ('pending', 'ready');

-- name: count_queued_of_flow
-- Tasks of a kind and flow still waiting to run: what a stage's cap per flow limits.
SELECT count(*) AS n FROM tasks
WHERE kind = %(kind)s::text AND state IN ('pending', 'ready') AND flow = %(flow)s::text;

-- name: count_queued_of_group
-- Tasks of a kind and group still waiting to run: what a stage's cap per group limits.
SELECT count(*) AS n FROM tasks
WHERE grp = %(grp)s::text AND state IN ('pending', 'ready') AND kind = %(kind)s::text;

-- name: stage_counts
-- Of the kinds given: tasks waiting to run, and running or waiting on a remote job (each part through its states' index: none covers them all).
SELECT kind, sum(queued) AS queued, sum(active) AS active
FROM (
    SELECT kind, 1 AS queued, 0 AS active FROM tasks
    WHERE kind = ANY(%(kinds)s::text[]) AND state IN ('pending', 'ready')
    UNION ALL
    SELECT kind, 0, 1 FROM tasks WHERE kind = ANY(%(kinds)s::text[]) AND state = 'running'
    UNION ALL
    SELECT kind, 0, 1 FROM tasks WHERE kind = ANY(%(kinds)s::text[]) AND state = 'waiting'
) AS counted
GROUP BY kind;

-- name: mark_deferred
-- A success a full stage had no room for: ready again at run_at, that attempt not counted.
UPDATE tasks
SET state = 'ready', run_at = %(run_at)s::double precision,
    ready_since = %(ready_since)s::double precision, worker = NULL, lease_until = NULL,
    error_code = %(code)s::text, attempt_base = attempt_base + 1
WHERE id = %(id)s::bigint;

-- name: next_task_ids
-- Ids for the tasks of a batch, so that siblings can name each other before they are written.
SELECT nextval(pg_get_serial_sequence('tasks', 'id')) AS id
FROM generate_series(1, %(n)s::integer);

-- name: insert_tasks
-- Create a batch of tasks (a JSON array of rows), move their flows' finish tags (locked); a taken key fails it.
WITH finished AS (
    UPDATE flows SET finish_tag = f.finish
    FROM unnest(%(flow_names)s::text[], %(flow_finishes)s::double precision[]) AS f (flow, finish)
    WHERE flows.flow = f.flow
)
INSERT INTO tasks (
    id, kind, ref, gates, gate_key, flow, grp, tier, submitted_tier, cost, key, state,
    max_attempts, tag, created_at, run_at, ready_since, unmet, payload_digest, lane, memory
)
SELECT
    t.id, t.kind, t.ref, t.gates, t.gate_key, t.flow, t.grp, t.tier, t.tier, t.cost, t.key,
    t.state, t.max_attempts, t.tag, %(now)s::double precision, t.run_at, t.ready_since, t.unmet,
    t.payload_digest, t.lane, t.memory
FROM jsonb_to_recordset(%(tasks)s::jsonb) AS t (
    id bigint, kind text, ref text, gates text[], gate_key text, flow text, grp text,
    tier smallint, cost double precision, key text, state text, max_attempts integer,
    tag double precision, run_at double precision, ready_since double precision, unmet integer,
    payload_digest text, lane text, memory bigint
)
ORDER BY t.key COLLATE "C", t.id;  -- keys taken in one order by every writer: no deadlock

-- name: insert_dependencies
-- Make tasks wait on their dependencies (parallel arrays).
INSERT INTO task_deps (dep_id, task_id)
SELECT * FROM unnest(%(dep_ids)s::bigint[], %(task_ids)s::bigint[])
ON CONFLICT DO NOTHING;

-- name: dependents
-- Who waits on a task (kept after its outcome: a redrive may restore them).
SELECT task_id FROM task_deps WHERE dep_id = %(dep_id)s::bigint ORDER BY task_id;

-- name: failed_deps
-- How many of a task's dependencies are dead or cancelled.
SELECT count(*) AS n FROM task_deps AS d JOIN tasks AS t ON t.id = d.dep_id
WHERE d.task_id = %(id)s::bigint AND t.state IN ('dead', 'cancelled');

-- name: dead_letters
-- Dead tasks, optionally by ids, group and kind.
SELECT * FROM tasks
WHERE state = 'dead'
  AND (%(ids)s::bigint[] IS NULL OR id = ANY(%(ids)s::bigint[]))
  AND (%(grp)s::text IS NULL OR grp = %(grp)s::text)
  AND (%(kind)s::text IS NULL OR kind = %(kind)s::text)
ORDER BY id;

-- name: redrive_task
-- Re-enqueue a dead task with a fresh attempt budget; no row if it is no longer dead.
UPDATE tasks
SET state = 'ready', run_at = %(now)s::double precision,
    ready_since = %(ready_since)s::double precision,
    attempt_base = attempt, expiries = 0, solo = false, error_code = NULL, finished_at = NULL
WHERE id = %(id)s::bigint AND state = 'dead'
RETURNING id;

-- name: restore_dependent
-- A task cancelled only because it waited on a dead one waits again.
UPDATE tasks SET state = 'pending', finished_at = NULL, error_code = NULL
WHERE id = %(id)s::bigint AND state = 'cancelled' AND error_code = 'upstream_failed'
RETURNING id;

-- name: meta_values
-- The store-wide numbers: the fair-queueing virtual time (the largest tag a flow dispatched) and the last dispatch number.
SELECT 'dispatches' AS name, (SELECT last_value FROM dispatches)::double precision AS value
UNION ALL
SELECT 'virtual_time', (SELECT coalesce(max(last_tag), 0) FROM flows);

-- name: add_flows
-- Flows seen for the first time, in name order (the order every writer locks flows in).
INSERT INTO flows (flow)
SELECT flow FROM unnest(%(flows)s::text[]) AS f (flow) ORDER BY flow COLLATE "C"
ON CONFLICT (flow) DO NOTHING;

-- name: submit_start
-- A batch's flows made if new and locked in name order, then its ids, the virtual time and the clock.
WITH taken AS (
    INSERT INTO flows (flow)
    SELECT flow FROM unnest(%(flows)s::text[]) AS f (flow) ORDER BY flow COLLATE "C"
    ON CONFLICT (flow) DO UPDATE SET flow = excluded.flow
    RETURNING flow, finish_tag, clock_timestamp() AS locked_at
)
SELECT array_agg(flow) AS flows,
       array_agg(finish_tag) AS finish_tags,
       ARRAY(  -- one per task (so siblings can name each other), a few maybe unused
           SELECT nextval(pg_get_serial_sequence('tasks', 'id'))
           FROM generate_series(1, %(n)s::integer)
       ) AS ids,
       (SELECT coalesce(max(last_tag), 0) FROM flows) AS virtual_time,
       -- the clock once every flow is locked
       coalesce(%(clock)s::double precision, extract(epoch FROM max(locked_at))) AS now,
       -- the insert's plan is made once per connection, not at every submit
       set_config('plan_cache_mode', 'force_generic_plan', true) AS plans
FROM taken;

-- name: submit_plain
-- A batch of one task per known flow, no keys, no dependencies: locked, tagged, created and announced at once.
WITH batch AS (
    SELECT * FROM jsonb_to_recordset(%(tasks)s::jsonb) AS t (
        i integer, kind text, ref text, gates text[], gate_key text, flow text, grp text,
        tier smallint, cost double precision, max_attempts integer, delay double precision,
        service double precision, memory bigint
    )
), locked AS (  -- in name order, as every writer locks flows; a flow not made yet is missing
    SELECT flow, finish_tag, clock_timestamp() AS locked_at FROM flows
    WHERE flow IN (SELECT flow FROM batch)
    ORDER BY flow COLLATE "C"
    FOR UPDATE
), start AS (
    SELECT (SELECT count(*) FROM locked) = (SELECT count(*) FROM batch) AS complete,
           (SELECT coalesce(max(last_tag), 0) FROM flows) AS virtual_time,
           -- the clock once every flow is locked
           coalesce(
               %(clock)s::double precision,
               (SELECT extract(epoch FROM max(locked_at)) FROM locked)
           ) AS now
), ids AS (
    SELECT ARRAY(
        SELECT nextval(pg_get_serial_sequence('tasks', 'id'))
        FROM generate_series(1, (SELECT count(*) FROM batch)) WHERE (SELECT complete FROM start)
    ) AS ids
), tagged AS (  -- fairness.tag: the start is the later of the virtual time and the flow's finish
    SELECT b.*, (SELECT ids FROM ids)[b.i] AS id,
           greatest(s.virtual_time, l.finish_tag) AS tag, s.now
    FROM batch AS b
    JOIN locked AS l ON l.flow = b.flow
    CROSS JOIN start AS s
    WHERE s.complete
), finished AS (
    UPDATE flows SET finish_tag = t.tag + t.service FROM tagged AS t WHERE flows.flow = t.flow
), created AS (
    INSERT INTO tasks (
        id, kind, ref, gates, gate_key, flow, grp, tier, submitted_tier, cost, state,
        max_attempts, tag, created_at, run_at, ready_since, memory
    )
    -- ready from its run_at (ages.ready_since: a delay is never negative)
    SELECT id, kind, ref, gates, gate_key, flow, grp, tier, tier, cost, 'ready', max_attempts,
           tag, now, now + delay, now + delay, memory
    FROM tagged
    ORDER BY id
)
SELECT s.complete, (SELECT ids FROM ids) AS ids, s.now,
       (SELECT pg_notify(%(channel)s::text, '') WHERE s.complete) AS notified
FROM start AS s;

-- name: lock_flows
-- Flows' finish tags, locked in name order while their new tasks are tagged.
SELECT flow, finish_tag FROM flows WHERE flow = ANY(%(flows)s::text[])
ORDER BY flow COLLATE "C"
FOR UPDATE;

-- name: expired_leases
-- Running tasks whose lease ran out, locked; a task another writer holds is left to it.
SELECT * FROM tasks
WHERE state = 'running' AND lease_until <= %(now)s::double precision
ORDER BY id
FOR UPDATE SKIP LOCKED;

-- name: count_expiry
-- Count one more lease a task's worker lost, and say who lost it when.
UPDATE tasks
SET expiries = expiries + 1, lost_by = worker, lost_at = %(now)s::double precision
WHERE id = %(id)s::bigint;

-- name: requeue_expired
-- A lost lease makes the task ready again at once (`solo`: to run alone, that attempt uncounted).
UPDATE tasks
SET state = 'ready', run_at = %(now)s::double precision,
    ready_since = %(ready_since)s::double precision, worker = NULL, lease_until = NULL,
    error_code = %(code)s::text, expiries = expiries + 1, solo = solo OR %(solo)s::boolean,
    attempt_base = attempt_base + %(solo)s::boolean::integer,
    lost_by = worker, lost_at = %(now)s::double precision
WHERE id = %(id)s::bigint;

-- name: crash_companions
-- How many other tasks a worker still runs, or lost after a task's attempt began (which it lost).
SELECT (
    SELECT count(*) FROM tasks
    WHERE state = 'running' AND worker = %(worker)s::text AND id <> %(task_id)s::bigint
) + (
    SELECT count(*) FROM tasks
    WHERE lost_by = %(worker)s::text AND id <> %(task_id)s::bigint AND lost_at > (
        SELECT started_at FROM attempts
        WHERE task_id = %(task_id)s::bigint AND number = %(number)s::integer
    )
) AS n;

-- name: aging_candidates
-- Ready tasks below the ceiling that may have waited an aging step (aged_tier decides).
SELECT id, tier, ready_since FROM tasks
WHERE state = 'ready' AND tier > %(ceiling)s::smallint
  AND ready_since <= %(cutoff)s::double precision
FOR UPDATE SKIP LOCKED;

-- name: promote
-- Raise waiting tasks' tiers by aging (parallel arrays).
UPDATE tasks SET tier = p.tier, promoted_at = %(now)s::double precision
FROM unnest(%(ids)s::bigint[], %(tiers)s::smallint[]) AS p (id, tier)
WHERE tasks.id = p.id;

-- name: claim_start
-- A claim's time, kept for its statements as `headrace.now`, counters, next run_at, the earliest lease to run out (or run out, not reaped yet); its settings; asked to, whether a sweep would find a lease run out or a task to age (each an index probe).
SELECT c.now,
       (SELECT last_value FROM dispatches) AS dispatches,
       (SELECT coalesce(max(last_tag), 0) FROM flows) AS virtual_time,
       (SELECT min(run_at) FROM tasks WHERE state = 'ready' AND run_at > c.now) AS next_at,
       (SELECT min(lease_until) FROM tasks WHERE state = 'running') AS lease_ends,
       CASE WHEN %(sweep_check)s::boolean THEN
           EXISTS (SELECT 1 FROM tasks WHERE state = 'running' AND lease_until <= c.now)
           OR EXISTS (
               SELECT 1 FROM tasks
               WHERE state = 'ready' AND tier > %(ceiling)s::smallint
                 AND ready_since <= c.now - %(aging_step)s::double precision
                                    + %(slack)s::double precision
           )
       END AS sweep_due,
       -- the candidates walk the claim-order index, never sort the whole queue (before ANALYZE
       -- has seen a burst, the planner would); kept for the rest of the claim
       set_config('enable_sort', 'off', true) AS sort,
       set_config('enable_incremental_sort', 'off', true) AS incremental_sort,
       set_config('enable_bitmapscan', 'off', true) AS bitmapscan,
       -- its later statements' plans are made once per connection, not at every claim
       set_config('plan_cache_mode', 'force_generic_plan', true) AS plans,
       -- a claim lost in a server crash is a worker lost: its tasks run again, and its holders'
       -- writes are fenced out; any later durable commit (an outcome, a submit) flushes it
       set_config('synchronous_commit', %(commit)s::text, true) AS commit
FROM (
    SELECT set_config(
        'headrace.now',
        coalesce(%(clock)s::double precision, extract(epoch FROM clock_timestamp()))::text,
        true
    )::double precision AS now
) AS c;

-- name: claim_batch
-- One claim batch: its range read unlocked (its first `batch` tasks in claim order and the rest of the last round they reach: a round is never cut), its gates locked in name order (waiting), then as many of its tasks as the claim still needs (`take`) whose gates it holds, locked, in turn order (`fairness.take_turns`: in a round, the lane served least recently first, with the claim's own turns given as `served`); the clock once its gates are held.
WITH peek AS MATERIALIZED (  -- the batch's range in claim order, not locked
    SELECT t.id, t.ctid, t.tier, t.tag, t.flow, coalesce(t.lane, t.flow) AS lane, t.gates
    FROM tasks AS t
    WHERE t.state = 'ready'
      AND (t.tier, t.tag, t.id) > (%(tier)s::smallint, %(tag)s::double precision, %(id)s::bigint)
      AND t.run_at <= current_setting('headrace.now')::double precision  -- set by claim_start
      AND (%(kinds)s::text[] IS NULL OR t.kind = ANY(%(kinds)s::text[]))
      AND (%(memory)s::bigint IS NULL OR t.memory <= %(memory)s::bigint)  -- the worker's room
      AND t.gate_key <> ALL(%(refused)s::text[])
      -- the claim has its limit: only tasks that may wait in the worker (no gate, no memory)
      AND (NOT %(waiting)s::boolean OR (t.gate_key = '' AND t.memory = 0 AND NOT t.solo))
      AND t.id <> ALL(%(skip)s::bigint[])  -- a round's tasks read already
    ORDER BY t.tier, t.tag, t.id
    LIMIT %(batch)s::integer
), last AS (
    SELECT tier, tag, id FROM peek ORDER BY tier DESC, tag DESC, id DESC LIMIT 1
), rest AS MATERIALIZED (  -- the rest of the range's last round, not locked
    SELECT t.id, t.ctid, t.tier, t.tag, t.flow, coalesce(t.lane, t.flow) AS lane, t.gates
    FROM tasks AS t
    WHERE t.state = 'ready'
      -- one round, past the range: equal (tier, tag) and an id range bound the index walk
      -- (a row comparison as its end does not: it read the whole tier past the round)
      AND t.tier = (SELECT tier FROM last) AND t.tag = (SELECT tag FROM last)
      AND t.id > (SELECT id FROM last)
      AND t.run_at <= current_setting('headrace.now')::double precision
      AND (%(kinds)s::text[] IS NULL OR t.kind = ANY(%(kinds)s::text[]))
      AND (%(memory)s::bigint IS NULL OR t.memory <= %(memory)s::bigint)
      AND t.gate_key <> ALL(%(refused)s::text[])
      AND (NOT %(waiting)s::boolean OR (t.gate_key = '' AND t.memory = 0 AND NOT t.solo))
      AND t.id <> ALL(%(skip)s::bigint[])
    -- in claim order: the claim-order index walks the round (the claim has sorts off), where
    -- any other order would let the planner scan the whole tier
    ORDER BY t.tier, t.tag, t.id
), span AS (  -- the range to the end of its last round
    SELECT * FROM peek UNION ALL SELECT * FROM rest
), wanted AS (
    SELECT DISTINCT g.name
    FROM (SELECT DISTINCT gates FROM span) AS s, unnest(s.gates) AS g (name)  -- most alike
    WHERE g.name <> ALL(%(held)s::text[])
), waited AS MATERIALIZED (  -- waited for only after every gate held (`top`): no deadlock
    SELECT * FROM gates
    WHERE name IN (SELECT name FROM wanted) AND name COLLATE "C" > %(top)s::text COLLATE "C"
    ORDER BY name COLLATE "C"
    FOR UPDATE
), tried AS MATERIALIZED (  -- a gate named before one held: taken only if free
    SELECT * FROM gates
    WHERE name IN (SELECT name FROM wanted) AND name COLLATE "C" <= %(top)s::text COLLATE "C"
    ORDER BY name COLLATE "C"
    FOR UPDATE SKIP LOCKED
), locked AS (
    SELECT * FROM waited UNION ALL SELECT * FROM tried
), edge AS (  -- how many tasks the range holds, its last round, the gates it got
    SELECT (SELECT count(*) FROM peek) AS peeked, last.tier AS last_tier,
           last.tag AS last_tag,
           (SELECT coalesce(jsonb_agg(to_jsonb(l)), '[]') FROM locked AS l) AS gate_rows,
           ARRAY(SELECT name FROM wanted) AS wanted,
           ARRAY(SELECT name FROM locked) || %(held)s::text[] AS allowed
    FROM (SELECT 1) AS one
    LEFT JOIN last ON true
), served AS (  -- the turns this claim has taken so far, by flow or lane
    SELECT * FROM unnest(%(served_names)s::text[], %(served_at)s::bigint[]) AS s (flow, served)
), names AS (  -- the range's flows and lanes, each once
    SELECT flow AS name FROM span UNION SELECT lane FROM span
), turns AS MATERIALIZED (  -- when each was last served, and its turn in this claim
    SELECT n.name, f.served, coalesce(o.served, f.served) AS turn
    FROM names AS n
    LEFT JOIN flows AS f ON f.flow = n.name
    LEFT JOIN served AS o ON o.flow = n.name
), turned AS (  -- the range's tasks whose gates the claim holds, in turn order
    SELECT p.id, p.ctid, p.tier, p.tag, f.served AS flow_served,
           coalesce(l.served, f.served) AS lane_served,
           coalesce(l.turn, f.served) AS lane_turn, f.turn AS flow_turn
    FROM span AS p
    JOIN turns AS f ON f.name = p.flow
    JOIN turns AS l ON l.name = p.lane
    WHERE p.gates <@ (SELECT allowed FROM edge)
    ORDER BY p.tier, p.tag, lane_turn, flow_turn, p.id
), chosen AS MATERIALIZED (  -- locked in turn order until the claim has what it needs
    SELECT t.id, t.kind, t.tier, t.tag, t.flow, coalesce(t.lane, t.flow) AS lane, t.gates,
           t.solo, t.memory, r.flow_served, r.lane_served, r.lane_turn, r.flow_turn
    FROM turned AS r
    CROSS JOIN LATERAL (
        -- the task as read, by its place in the table (a version updated since is followed
        -- to its latest when locked): one page, no index walked per task. A task another
        -- claim holds is left to it; one leased meanwhile is no longer ready.
        SELECT * FROM tasks AS t
        WHERE t.ctid = r.ctid AND t.id = r.id
          AND t.state = 'ready'
          AND t.run_at <= current_setting('headrace.now')::double precision
          AND t.gates <@ (SELECT allowed FROM edge)
        FOR UPDATE SKIP LOCKED
    ) AS t
    ORDER BY r.tier, r.tag, r.lane_turn, r.flow_turn, r.id
    LIMIT %(take)s::integer  -- what the claim still needs
)
SELECT e.peeked, e.last_tier, e.last_tag,
       -- the batch's gates on its first row only: decoded once, not once per task
       CASE WHEN row_number() OVER w = 1 THEN e.gate_rows END AS gate_rows,
       CASE WHEN row_number() OVER w = 1 THEN e.wanted END AS wanted,
       -- the server's clock, read once the batch's gates are held (the claim may have waited
       -- for them): a claim's time when it holds no gate yet
       CASE WHEN row_number() OVER w = 1
           THEN extract(epoch FROM clock_timestamp())::double precision
       END AS now,
       -- what a claim weighs a task by: its leased row comes back with its lease
       c.id, c.kind, c.tier, c.tag, c.flow, c.lane, c.gates, c.solo, c.memory,
       c.flow_served, c.lane_served
FROM edge AS e LEFT JOIN chosen AS c ON true
WINDOW w AS (ORDER BY c.tier, c.tag, c.lane_turn, c.flow_turn, c.id)
ORDER BY c.tier, c.tag, c.lane_turn, c.flow_turn, c.id;

-- name: lease_tasks
-- Lease ready tasks (locked by the claim's batches) under new fencing tokens, with attempts and tickets; then serve their flows: locked in name order once the tasks are leased, a dispatch number for each task drawn from the sequence once they are locked (no row locked for it), each flow's turn numbered up to `base` taking its own, its last tag moved.
WITH leased AS (
    UPDATE tasks
    SET state = 'running', attempt = attempt + 1, worker = %(worker)s::text,
        lease_until = %(until)s::double precision, lease_token = lease_token + 1
    WHERE id = ANY(%(ids)s::bigint[])
    RETURNING *
), started AS (
    INSERT INTO attempts (task_id, number, worker, started_at, outcome)
    SELECT id, attempt, worker, %(now)s::double precision, 'running' FROM leased
), granted AS (  -- a ticket on a rated gate reserves a start, stamped later
    INSERT INTO tickets (task_id, gate, started)
    SELECT id, gate, gate <> ALL(%(rated)s::text[]) FROM leased, unnest(gates) AS g (gate)
), locked AS MATERIALIZED (
    -- after the lease (its rows all read first): other claims serving the same flows wait
    -- for them from here to the commit, not while this one leases
    SELECT flow FROM flows
    WHERE flow = ANY(%(flows)s::text[]) AND (SELECT count(*) FROM leased) >= 0
    ORDER BY flow COLLATE "C"
    FOR UPDATE
), numbered AS (  -- drawn once the flows are held: turns are numbered in the order served
    SELECT n, row_number() OVER (ORDER BY n) AS i
    FROM (
        SELECT nextval('dispatches') AS n FROM leased
        WHERE (SELECT count(*) FROM locked) >= 0
    ) AS drawn
), served AS (  -- a flow's new turn is worked out (all of them locked) before it is updated
    UPDATE flows
    SET served = (
            SELECT n FROM numbered
            WHERE i = f.served - %(base)s::bigint + cardinality(%(ids)s::bigint[])
        ),
        last_tag = greatest(flows.last_tag, f.tag)
    FROM unnest(
        %(flows)s::text[], %(served)s::bigint[], %(tags)s::double precision[]
    ) AS f (flow, served, tag)
    WHERE flows.flow = f.flow
)
SELECT * FROM leased;

-- name: end_attempt
-- Close the open attempt of a task (running, or waiting on its remote job) with its outcome.
UPDATE attempts
SET ended_at = %(now)s::double precision, outcome = %(outcome)s::text,
    error_class = %(error_class)s::text, code = %(code)s::text, message = %(message)s::text
WHERE task_id = %(task_id)s::bigint AND number = %(number)s::integer
  AND outcome IN ('running', 'waiting');

-- name: ticket_gates
-- The gates tasks hold tickets on.
SELECT DISTINCT gate FROM tickets WHERE task_id = ANY(%(task_ids)s::bigint[]);

-- name: ticket_counts_many
-- The tickets tasks hold, per task and gate, and how many have no call start stamped yet.
SELECT task_id, gate, count(*) AS n, count(*) FILTER (WHERE NOT started) AS unstarted
FROM tickets WHERE task_id = ANY(%(task_ids)s::bigint[])
GROUP BY task_id, gate;

-- name: ticket_counts
-- The tickets a task holds, per gate, and how many have no call start stamped yet.
SELECT gate, count(*) AS n, count(*) FILTER (WHERE NOT started) AS unstarted
FROM tickets WHERE task_id = %(task_id)s::bigint
GROUP BY gate ORDER BY gate;

-- name: mark_started
-- The call starts of a task's tickets on these gates are stamped.
UPDATE tickets SET started = true
WHERE task_id = %(task_id)s::bigint AND gate = ANY(%(gates)s::text[]) AND NOT started;

-- name: delete_tickets
-- Return every ticket a task holds.
DELETE FROM tickets WHERE task_id = %(task_id)s::bigint;

-- name: add_gates
-- Rows for gates asked for the first time, each with the declaration it comes from (parallel arrays), in name order (the order every writer locks gates in).
INSERT INTO gates (name, spec)
SELECT name, spec FROM unnest(%(names)s::text[], %(specs)s::text[]) AS g (name, spec)
ORDER BY name COLLATE "C"
ON CONFLICT (name) DO NOTHING;

-- name: missing_gates
-- Which of these gates have no row yet.
SELECT name FROM unnest(%(names)s::text[]) AS g (name)
WHERE NOT EXISTS (SELECT 1 FROM gates WHERE gates.name = g.name);

-- name: lock_gates
-- Gate states, locked in name order until the transaction ends: waits for other writers.
SELECT * FROM gates WHERE name = ANY(%(names)s::text[]) ORDER BY name COLLATE "C" FOR UPDATE;

-- name: try_lock_gates
-- Gate states, locked in name order, leaving out those another writer holds: never waits.
SELECT * FROM gates WHERE name = ANY(%(names)s::text[])
ORDER BY name COLLATE "C"
FOR UPDATE SKIP LOCKED;

-- name: save_gate
-- Write one (locked) gate's state.
UPDATE gates
SET in_flight = %(in_flight)s::integer,
    starts = %(starts)s::double precision[],
    penalized_until = %(penalized_until)s::double precision,
    granted = %(granted)s::bigint,
    blocked_by_token = %(blocked_by_token)s::bigint,
    blocked_by_concurrency = %(blocked_by_concurrency)s::bigint,
    rate_limited = %(rate_limited)s::bigint,
    peak_in_flight = %(peak_in_flight)s::integer,
    first_blocked_at = %(first_blocked_at)s::double precision,
    unstarted = %(unstarted)s::integer
WHERE name = %(name)s::text;

-- name: all_gates
-- Every gate that granted, refused or was penalised.
SELECT * FROM gates
WHERE granted + blocked_by_token + blocked_by_concurrency + rate_limited > 0;

-- name: due_polls
-- Waiting tasks whose remote poll is due and not leased to a live poller, oldest first, locked.
SELECT id FROM tasks
WHERE state = 'waiting' AND run_at <= %(now)s::double precision
  AND (lease_until IS NULL OR lease_until <= %(now)s::double precision)
  AND (%(kinds)s::text[] IS NULL OR kind = ANY(%(kinds)s::text[]))
ORDER BY run_at, id
LIMIT %(limit)s::integer
FOR UPDATE SKIP LOCKED;

-- name: lease_polls
-- Hand waiting tasks to a poller, each under a new fencing token.
UPDATE tasks
SET worker = %(worker)s::text, lease_until = %(until)s::double precision,
    lease_token = lease_token + 1
WHERE id = ANY(%(ids)s::bigint[])
RETURNING *;

-- name: next_poll_at
-- The earliest future poll time of a waiting task.
SELECT min(run_at) AS at FROM tasks
WHERE state = 'waiting' AND run_at > %(now)s::double precision;

-- name: renew_leases
-- Extend leases their holders still hold (same token, not expired); lost ones return no row. A lease is its task and its token, side by side in the arrays: a worker may hold an expired lease and a new one on the same task, and renews the one that holds.
WITH lease AS MATERIALIZED (  -- the pairs, unnested once
    SELECT * FROM unnest(%(ids)s::bigint[], %(tokens)s::bigint[]) AS l (id, token)
)
UPDATE tasks SET lease_until = %(until)s::double precision
WHERE id = ANY(ARRAY(SELECT id FROM lease))  -- by key
  AND (id, lease_token) IN (SELECT id, token FROM lease)
  AND state IN ('running', 'waiting') AND lease_until > %(now)s::double precision
RETURNING *;

-- name: poll_again
-- The remote job still runs (or its check failed): poll it again at run_at, by any poller.
UPDATE tasks
SET run_at = %(run_at)s::double precision, lease_until = NULL, worker = NULL,
    error_code = coalesce(%(code)s::text, error_code)
WHERE id = %(id)s::bigint;

-- name: succeed_task
-- Record a success: close the attempt, drop the tickets, make dependents with nothing left ready.
WITH ended AS (
    UPDATE attempts
    SET ended_at = %(now)s::double precision, outcome = 'succeeded', error_class = NULL,
        code = NULL, message = NULL
    WHERE task_id = %(id)s::bigint AND number = %(number)s::integer
      AND outcome IN ('running', 'waiting')
), returned AS (
    DELETE FROM tickets WHERE task_id = %(id)s::bigint
), unblocked AS (
    -- A dependency succeeded: count it met; dependents with none left become ready.
    UPDATE tasks
    SET unmet = unmet - 1,
        state = CASE WHEN unmet = 1 AND state = 'pending' THEN 'ready' ELSE state END,
        -- ready from now, or from its run_at when later (ages.ready_since)
        ready_since = CASE
            WHEN unmet = 1 AND state = 'pending'
            THEN greatest(%(now)s::double precision, run_at)
            ELSE ready_since
        END
    WHERE id = ANY(ARRAY(SELECT task_id FROM task_deps WHERE dep_id = %(id)s::bigint))
)
UPDATE tasks
SET state = 'succeeded', finished_at = %(now)s::double precision, lease_until = NULL,
    error_code = NULL
WHERE id = %(id)s::bigint;

-- name: succeed_tasks
-- `succeed_task` for distinct held tasks at once (a dependent waiting on k of them counts k met).
WITH ended AS (
    -- each task's attempt found by the primary key, its number matched by position: a join
    -- with the unnested pairs was planned (generically, ten rows guessed) as a loop unnesting
    -- them again for every attempt, a cost that grew with the square of the batch
    UPDATE attempts AS a
    SET ended_at = %(now)s::double precision, outcome = 'succeeded', error_class = NULL,
        code = NULL, message = NULL
    WHERE a.task_id = ANY(ARRAY(SELECT unnest(%(ids)s::bigint[])))
      AND a.number = (%(numbers)s::integer[])[array_position(%(ids)s::bigint[], a.task_id)]
      AND a.outcome IN ('running', 'waiting')
), returned AS (
    DELETE FROM tickets WHERE task_id = ANY(%(ids)s::bigint[])
), met AS (
    SELECT task_id, count(*)::integer AS n FROM task_deps
    -- a running task of the batch waits on nothing unmet: no row is updated twice
    WHERE dep_id = ANY(%(ids)s::bigint[]) AND task_id <> ALL(%(ids)s::bigint[])
    GROUP BY task_id
), unblocked AS (
    UPDATE tasks AS t
    SET unmet = t.unmet - met.n,
        state = CASE WHEN t.unmet = met.n AND t.state = 'pending' THEN 'ready' ELSE t.state END,
        ready_since = CASE
            WHEN t.unmet = met.n AND t.state = 'pending'
            THEN greatest(%(now)s::double precision, t.run_at)
            ELSE t.ready_since
        END
    FROM met
    WHERE t.id = ANY(ARRAY(SELECT task_id FROM met)) AND t.id = met.task_id
)
UPDATE tasks
SET state = 'succeeded', finished_at = %(now)s::double precision, lease_until = NULL,
    error_code = NULL
WHERE id = ANY(%(ids)s::bigint[]);

-- name: add_to_ledger
-- Add succeeded tasks' units to their group's ledger, in the shard of the worker that ran them.
INSERT INTO ledger (grp, kind, worker, units)
VALUES (%(grp)s::text, %(kind)s::text, %(worker)s::text, %(units)s::double precision)
ON CONFLICT (grp, kind, worker) DO UPDATE SET units = ledger.units + excluded.units;

-- name: mark_retry
-- Queue a task for another attempt at run_at; a waiting task's remote job has ended in failure.
UPDATE tasks
SET state = 'ready', run_at = %(run_at)s::double precision,
    ready_since = %(ready_since)s::double precision, worker = NULL, lease_until = NULL,
    remote_id = NULL, poll_every = NULL, remote_deadline = NULL, error_code = %(code)s::text,
    remote_jobs = remote_jobs + (state = 'waiting')::integer,
    attempt_base = attempt_base + %(uncounted)s::boolean::integer
WHERE id = %(id)s::bigint;

-- name: mark_waiting
-- A task's remote job runs: it keeps its tickets, frees its worker, and is polled at run_at.
UPDATE tasks
SET state = 'waiting', remote_id = %(remote_id)s::text,
    poll_every = %(poll_every)s::double precision,
    remote_deadline = %(deadline)s::double precision, run_at = %(run_at)s::double precision,
    worker = NULL, lease_until = NULL
WHERE id = %(id)s::bigint;

-- name: mark_ended
-- Record a task's end without success (dead or cancelled) and why; a dead one's remote job failed.
UPDATE tasks
SET state = %(state)s::text, finished_at = %(now)s::double precision, worker = NULL,
    lease_until = NULL, error_code = %(code)s::text,
    remote_jobs = remote_jobs + (state = 'waiting' AND %(state)s::text = 'dead')::integer
WHERE id = %(id)s::bigint;

-- name: list_tasks
-- Tasks by id, optionally of one group, state and kind.
SELECT * FROM tasks
WHERE (%(grp)s::text IS NULL OR grp = %(grp)s::text)
  AND (%(state)s::text IS NULL OR state = %(state)s::text)
  AND (%(kind)s::text IS NULL OR kind = %(kind)s::text)
ORDER BY id
LIMIT %(limit)s::integer;

-- name: task_attempts
-- A task's attempt history, first attempt first.
SELECT * FROM attempts WHERE task_id = %(task_id)s::bigint ORDER BY number;

-- name: count_by_state
-- How many tasks are in each state, of the kinds given or all: the tallies and the changes not folded in yet.
SELECT state, sum(n)::bigint AS n
FROM (
    SELECT kind, state, n FROM kind_tally
    UNION ALL
    SELECT kind, state, n FROM tally_changes
) AS tally
WHERE %(kinds)s::text[] IS NULL OR kind = ANY(%(kinds)s::text[])
GROUP BY state;

-- name: stage_stats
-- Per kind with unfinished tasks (of the kinds given, or all): its tasks per state (tallies) and when its oldest ready task became ready (the index).
SELECT s.kind, s.pending, s.ready, s.running, s.waiting,
       CASE WHEN s.ready > 0 THEN (
           SELECT t.ready_since FROM tasks AS t
           WHERE t.kind = s.kind AND t.state = 'ready'
           ORDER BY t.ready_since
           LIMIT 1
       ) END AS oldest_ready
FROM (
    SELECT kind,
           coalesce(sum(n) FILTER (WHERE state = 'pending'), 0)::bigint AS pending,
           coalesce(sum(n) FILTER (WHERE state = 'ready'), 0)::bigint AS ready,
           coalesce(sum(n) FILTER (WHERE state = 'running'), 0)::bigint AS running,
           coalesce(sum(n) FILTER (WHERE state = 'waiting'), 0)::bigint AS waiting
    FROM (
        SELECT kind, state, n FROM kind_tally
        UNION ALL
        SELECT kind, state, n FROM tally_changes
    ) AS tally
    WHERE state IN ('pending', 'ready', 'running', 'waiting')
      AND (%(kinds)s::text[] IS NULL OR kind = ANY(%(kinds)s::text[]))
    GROUP BY kind
    HAVING sum(n) > 0
) AS s
ORDER BY s.kind;

-- name: ready_counts
-- Per kind with ready tasks (of the kinds given, or all), how many: the tallies and the changes not folded in yet.
SELECT kind, sum(n)::bigint AS n
FROM (
    SELECT kind, state, n FROM kind_tally
    UNION ALL
    SELECT kind, state, n FROM tally_changes
) AS tally
WHERE state = 'ready' AND (%(kinds)s::text[] IS NULL OR kind = ANY(%(kinds)s::text[]))
GROUP BY kind
HAVING sum(n) > 0
ORDER BY kind;

-- name: oldest_ready
-- When the oldest ready tasks of a kind became ready, as one array (the index, read from its start).
SELECT ARRAY(
    SELECT ready_since FROM tasks
    WHERE kind = %(kind)s::text AND state = 'ready'
    ORDER BY ready_since, id
    LIMIT %(limit)s::integer
) AS since;

-- name: newest_ready
-- When the newest ready tasks of a kind became ready, as one array (the index, read from its end).
SELECT ARRAY(
    SELECT ready_since FROM tasks
    WHERE kind = %(kind)s::text AND state = 'ready'
    ORDER BY ready_since DESC, id DESC
    LIMIT %(limit)s::integer
) AS since;

-- name: group_names
-- Every group that names at least one task, kept or pruned: the tallies, the changes not folded in yet, and the rollup of pruned tasks.
SELECT grp
FROM (
    SELECT grp, n FROM group_tally
    UNION ALL
    SELECT grp, n FROM tally_changes WHERE grp IS NOT NULL
    UNION ALL
    SELECT grp, n FROM group_rollup
) AS tally
GROUP BY grp
HAVING sum(n) > 0;

-- name: group_counts
-- How many tasks of a group are in each state: the tallies and the changes not folded in yet.
SELECT state, sum(n)::bigint AS n
FROM (
    SELECT state, n FROM group_tally WHERE grp = %(grp)s::text
    UNION ALL
    SELECT state, n FROM tally_changes WHERE grp = %(grp)s::text
) AS tally
GROUP BY state;

-- name: fold_tallies
-- Move the committed changes into the tallies and drop the tallies that count nothing, one folder at a time.
WITH alone AS MATERIALIZED (
    SELECT pg_try_advisory_xact_lock(hashtext('headrace.fold:' || current_schema())) AS locked
), changes AS (
    DELETE FROM tally_changes WHERE (SELECT locked FROM alone)
    RETURNING kind, grp, state, n
), attempts AS (
    DELETE FROM attempt_changes WHERE (SELECT locked FROM alone)
    RETURNING outcome, n
), empty_kinds AS (  -- a change still to come for it would be folded into a new row
    DELETE FROM kind_tally AS z
    WHERE z.n = 0 AND (SELECT locked FROM alone) AND NOT EXISTS (
        SELECT 1 FROM tally_changes AS c WHERE c.kind = z.kind AND c.state = z.state
    )
), empty_groups AS (
    DELETE FROM group_tally AS z
    WHERE z.n = 0 AND (SELECT locked FROM alone) AND NOT EXISTS (
        SELECT 1 FROM tally_changes AS c WHERE c.grp = z.grp AND c.state = z.state
    )
), kinds AS (
    INSERT INTO kind_tally AS t (kind, state, n)
    SELECT kind, state, sum(n) FROM changes GROUP BY kind, state
    ON CONFLICT (kind, state) DO UPDATE SET n = t.n + excluded.n
), groups AS (
    INSERT INTO group_tally AS t (grp, state, n)
    SELECT grp, state, sum(n) FROM changes WHERE grp IS NOT NULL GROUP BY grp, state
    ON CONFLICT (grp, state) DO UPDATE SET n = t.n + excluded.n
)
INSERT INTO attempt_tally AS t (outcome, n)
SELECT outcome, sum(n) FROM attempts GROUP BY outcome
ON CONFLICT (outcome) DO UPDATE SET n = t.n + excluded.n;

-- name: group_ledger
-- A group's units per kind, summed over the workers' shards.
SELECT kind, sum(units) AS units FROM ledger WHERE grp = %(grp)s::text GROUP BY kind;

-- name: group_failures
-- A group's dead tasks with their safe error codes.
SELECT id, kind, ref, error_code, attempt FROM tasks
WHERE grp = %(grp)s::text AND state = 'dead'
ORDER BY id;

-- name: insert_record
-- A new record, numbered by the record sequence (again as its transaction ends: `number_records`); no row when one of that kind and id exists.
INSERT INTO records (kind, id, scope, state, body, seq, created_at, changed_at)
VALUES (%(kind)s::text, %(id)s::text, %(scope)s::text, %(state)s::text, %(body)s::jsonb,
        nextval('record_changes'), %(now)s::double precision, %(now)s::double precision)
ON CONFLICT (kind, id) DO NOTHING
RETURNING *;

-- name: number_records
-- The records a transaction made or moved, numbered again as it ends (under the seq lock, so seqs commit in the order they are taken).
UPDATE records AS r SET seq = nextval('record_changes')
FROM unnest(%(kinds)s::text[], %(ids)s::text[]) AS k (kind, id)
WHERE r.kind = k.kind AND r.id = k.id
RETURNING r.kind, r.id, r.seq;

-- name: record_by_id
-- One record.
SELECT * FROM records WHERE kind = %(kind)s::text AND id = %(id)s::text;

-- name: lock_record
-- One record, locked until the end of the transaction: concurrent changes to it take turns.
SELECT * FROM records WHERE kind = %(kind)s::text AND id = %(id)s::text FOR UPDATE;

-- name: move_record
-- A record's new state and body, numbered by the record sequence (again as its transaction ends: `number_records`).
UPDATE records
SET state = %(state)s::text, body = %(body)s::jsonb, changed_at = %(now)s::double precision,
    seq = nextval('record_changes')
WHERE kind = %(kind)s::text AND id = %(id)s::text
RETURNING *;

-- name: rewrite_record
-- A record's new body, its state and place in order kept.
UPDATE records SET body = %(body)s::jsonb, changed_at = %(now)s::double precision
WHERE kind = %(kind)s::text AND id = %(id)s::text
RETURNING *;

-- name: list_records
-- Records of a kind past a seq, in seq order, optionally of one scope and state.
SELECT * FROM records
WHERE kind = %(kind)s::text
  AND (%(scope)s::text IS NULL OR scope = %(scope)s::text)
  AND (%(state)s::text IS NULL OR state = %(state)s::text)
  AND seq > %(after)s::bigint
ORDER BY seq
LIMIT %(limit)s::integer;

-- name: count_records
-- How many records of a kind are past a seq, optionally of one scope and state.
SELECT count(*) AS n FROM records
WHERE kind = %(kind)s::text
  AND (%(scope)s::text IS NULL OR scope = %(scope)s::text)
  AND (%(state)s::text IS NULL OR state = %(state)s::text)
  AND seq > %(after)s::bigint;

-- name: insert_audit
-- One audit row.
INSERT INTO audit (at, kind, record_id, scope, action, actor, outcome, detail)
VALUES (%(now)s::double precision, %(kind)s::text, %(record_id)s::text, %(scope)s::text,
        %(action)s::text, %(actor)s::text, %(outcome)s::text, %(detail)s::jsonb);

-- name: audit_rows
-- Audit rows in the order written, optionally of one record kind, record and scope.
SELECT * FROM audit
WHERE (%(kind)s::text IS NULL OR kind = %(kind)s::text)
  AND (%(record_id)s::text IS NULL OR record_id = %(record_id)s::text)
  AND (%(scope)s::text IS NULL OR scope = %(scope)s::text)
ORDER BY id
LIMIT %(limit)s::integer;

-- name: insert_notice
-- A notification owed, in the outbox.
INSERT INTO outbox (at, topic, kind, record_id, scope, body)
VALUES (%(now)s::double precision, %(topic)s::text, %(kind)s::text, %(record_id)s::text,
        %(scope)s::text, %(body)s::jsonb);

-- name: outbox_rows
-- Notifications past an id in the order written, only those not delivered when `pending`.
SELECT * FROM outbox
WHERE id > %(after)s::bigint AND (NOT %(pending)s::boolean OR delivered_at IS NULL)
ORDER BY id
LIMIT %(limit)s::integer;

-- name: mark_delivered
-- Notifications delivered now (those not marked before).
UPDATE outbox SET delivered_at = %(now)s::double precision
WHERE id = ANY(%(ids)s::bigint[]) AND delivered_at IS NULL
RETURNING id;

-- name: wake_remote
-- Waiting tasks on a remote job whose check is not running, due now (a webhook said how it ended).
UPDATE tasks SET run_at = %(now)s::double precision
WHERE state = 'waiting' AND remote_id = %(remote_id)s::text
  AND run_at > %(now)s::double precision
  AND (lease_until IS NULL OR lease_until <= %(now)s::double precision)
RETURNING id;

-- name: attempt_outcomes
-- Attempts ever made, by outcome: the tallies and the changes not folded in yet (deleting attempts leaves them); a running one is a running task's.
SELECT outcome, sum(n)::bigint AS n
FROM (
    SELECT outcome, n FROM attempt_tally
    UNION ALL
    SELECT outcome, n FROM attempt_changes
    UNION ALL
    SELECT 'running', n FROM kind_tally WHERE state = 'running'
    UNION ALL
    SELECT 'running', n FROM tally_changes WHERE state = 'running'
) AS tally
GROUP BY outcome;

-- name: prunable_tasks
-- Tasks in a state that finished before the cutoff, after a (finished_at, id) mark, oldest first, that nothing needs: no task still to finish waits on them, they wait on no task a redrive could bring back, and they are not the newest task (as on SQLite, whose ids count on from the largest kept).
SELECT t.id, t.finished_at FROM tasks AS t
WHERE t.state = %(state)s::text AND t.finished_at IS NOT NULL
  AND t.finished_at < %(cutoff)s::double precision
  AND (t.finished_at, t.id) > (%(at)s::double precision, %(after_id)s::bigint)
  AND t.id < (SELECT max(id) FROM tasks)
  AND NOT EXISTS (
      SELECT 1 FROM task_deps AS d JOIN tasks AS w ON w.id = d.task_id
      WHERE d.dep_id = t.id AND w.state IN ('pending', 'ready', 'running', 'waiting')
  )
  AND NOT EXISTS (
      SELECT 1 FROM task_deps AS d JOIN tasks AS u ON u.id = d.dep_id
      WHERE d.task_id = t.id
        AND (u.state = 'dead' OR (u.state = 'cancelled' AND u.error_code = 'upstream_failed'))
  )
ORDER BY t.finished_at, t.id
LIMIT %(limit)s::integer;

-- name: count_attempts
-- How many attempts tasks have.
SELECT count(*) AS n FROM attempts WHERE task_id = ANY(%(ids)s::bigint[]);

-- name: lock_pruned_tasks
-- Of the tasks about to be pruned, those still final, locked in id order; one another writer holds (a redrive, a dependent's submit) is left for a later run.
SELECT id, grp, state FROM tasks
WHERE id = ANY(%(ids)s::bigint[]) AND state IN ('succeeded', 'dead', 'cancelled')
ORDER BY id
FOR UPDATE SKIP LOCKED;

-- name: add_to_rollup
-- Count pruned tasks in their group's rollup, per state (only the pruner writes it, one at a time).
INSERT INTO group_rollup (grp, state, n)
VALUES (%(grp)s::text, %(state)s::text, %(n)s::bigint)
ON CONFLICT (grp, state) DO UPDATE SET n = group_rollup.n + excluded.n;

-- name: group_rollup
-- A group's pruned tasks per state.
SELECT state, n FROM group_rollup WHERE grp = %(grp)s::text;

-- name: orphan_dependents
-- Tasks cancelled because one of these dead or cancelled tasks failed them can no longer be restored by a redrive: they say so.
UPDATE tasks SET error_code = 'upstream_pruned'
WHERE state = 'cancelled' AND error_code = 'upstream_failed'
  AND id <> ALL(%(ids)s::bigint[])
  AND id IN (
      SELECT d.task_id FROM task_deps AS d JOIN tasks AS x ON x.id = d.dep_id
      WHERE d.dep_id = ANY(%(ids)s::bigint[]) AND x.state IN ('dead', 'cancelled')
  );

-- name: delete_attempts
-- Delete the attempts of tasks being pruned.
DELETE FROM attempts WHERE task_id = ANY(%(ids)s::bigint[]) RETURNING task_id;

-- name: delete_task_deps
-- Delete the dependency rows of tasks being pruned, on either side.
DELETE FROM task_deps
WHERE dep_id = ANY(%(ids)s::bigint[]) OR task_id = ANY(%(ids)s::bigint[]);

-- name: delete_tasks
-- Delete tasks being pruned (their attempts and dependency rows went first).
DELETE FROM tasks WHERE id = ANY(%(ids)s::bigint[]) RETURNING id;

-- name: prunable_notices
-- Notices delivered before the cutoff, after a (delivered_at, id) mark, oldest first; not the newest notice.
SELECT id, delivered_at AS at FROM outbox
WHERE delivered_at IS NOT NULL AND delivered_at < %(cutoff)s::double precision
  AND (delivered_at, id) > (%(at)s::double precision, %(after_id)s::bigint)
  AND id < (SELECT max(id) FROM outbox)
ORDER BY delivered_at, id
LIMIT %(limit)s::integer;

-- name: delete_notices
-- Delete delivered notices.
DELETE FROM outbox
WHERE id = ANY(%(ids)s::bigint[]) AND delivered_at IS NOT NULL
RETURNING id;

-- name: prunable_audit
-- Audit rows written before the cutoff, after an (at, id) mark, oldest first; not the newest row.
SELECT id, at FROM audit
WHERE at < %(cutoff)s::double precision
  AND (at, id) > (%(at)s::double precision, %(after_id)s::bigint)
  AND id < (SELECT max(id) FROM audit)
ORDER BY at, id
LIMIT %(limit)s::integer;

-- name: delete_audit
-- Delete audit rows.
DELETE FROM audit WHERE id = ANY(%(ids)s::bigint[]) RETURNING id;

-- name: prunable_records
-- Records of a kind last changed before the cutoff, after a seq, in seq order; not the newest record.
SELECT id, seq FROM records
WHERE kind = %(kind)s::text AND changed_at < %(cutoff)s::double precision
  AND seq > %(after)s::bigint
  AND seq < (SELECT max(seq) FROM records)
ORDER BY seq
LIMIT %(limit)s::integer;

-- name: delete_records
-- Delete records of a kind by id (only those in the states given, when given); never the newest record.
DELETE FROM records
WHERE kind = %(kind)s::text AND id = ANY(%(ids)s::text[])
  AND (%(states)s::text[] IS NULL OR state = ANY(%(states)s::text[]))
  AND seq < (SELECT max(seq) FROM records)
RETURNING id;

-- name: take_pruner
-- Hold the pruner's lease until a time: its holder renews it; another takes it once it ran out and the last run ended before `due`.
INSERT INTO pruner (name, holder, until, done_at, removed)
VALUES ('pruner', %(holder)s::text, %(until)s::double precision, NULL, 0)
ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, until = excluded.until
WHERE (pruner.holder = excluded.holder AND pruner.until > %(now)s::double precision)
   OR (pruner.until <= %(now)s::double precision
       AND (pruner.done_at IS NULL OR pruner.done_at <= %(due)s::double precision))
RETURNING holder;

-- name: release_pruner
-- Give the pruner's lease back; a run that ended says when and how many rows it removed.
UPDATE pruner
SET until = %(now)s::double precision,
    done_at = CASE
        WHEN %(removed)s::bigint IS NULL THEN done_at ELSE %(now)s::double precision
    END,
    removed = coalesce(%(removed)s::bigint, removed)
WHERE name = 'pruner' AND holder = %(holder)s::text;

-- name: pruner_state
-- The pruner's lease: who holds (or held) it, until when, when a run last ended, what it removed.
SELECT holder, until, done_at, removed FROM pruner WHERE name = 'pruner';

-- name: take_lease
-- Hold a named lease until a time: its holder renews it; another takes it once it ran out.
INSERT INTO leases (name, holder, until)
VALUES (%(name)s::text, %(holder)s::text, %(until)s::double precision)
ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, until = excluded.until
WHERE leases.holder = excluded.holder OR leases.until <= %(now)s::double precision
RETURNING holder;
