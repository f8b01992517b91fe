-- The statements of the SQLite store (store/sqlite/), by name, as store/machine/ asks for
-- them. Parameters are named; lists come as JSON arrays, and `:now` is the transaction's time.
-- A statement may be several, run in order: its rows are the last one's. A column named
-- "x [headrace_json]" is read as JSON, under the name x. Parallel arrays are read by position,
-- the first with json_each and the others with json_extract (whose parse SQLite keeps for the
-- statement): a join of two json_each scans on their keys reads one whole array per element.

-- name: begin_write
-- Open a write transaction holding the file's write lock from the start (no upgrade deadlocks).
BEGIN IMMEDIATE;

-- name: begin_read
-- Open a read transaction: one consistent snapshot for a reading verb.
BEGIN;

-- name: commit
-- Commit the verb's transaction.
COMMIT;

-- name: rollback
-- Undo the verb's transaction after an error.
ROLLBACK;

-- name: data_version
-- Changes whenever another connection commits to the file.
PRAGMA data_version;

-- name: journal_wal
-- Readers never block the writer and the writer never blocks readers.
PRAGMA journal_mode = WAL;

-- name: synchronous_normal
-- In WAL mode a commit survives a process crash; only an OS crash may lose the last commits.
PRAGMA synchronous = NORMAL;

-- name: foreign_keys_on
-- Enforce the REFERENCES clauses of the schema.
PRAGMA foreign_keys = ON;

-- name: temp_store_memory
-- Keep the temporary b-trees statements build (IN lists, DISTINCT, UNION, a sort no index gives) in memory: kept in a temporary file's pager, each one set up and torn down costs its statement about 20 us.
PRAGMA temp_store = MEMORY;

-- name: checkpoint_backstop
-- A commit checkpoints the log itself only past this many pages: the store's checkpointer
-- (store/sqlite/checkpoint.py) copies it back long before, off the claims' path.
PRAGMA wal_autocheckpoint = 20000;

-- name: checkpoint
-- Copy what the log holds back into the database, waiting for no reader or writer.
PRAGMA wal_checkpoint(PASSIVE);

-- name: user_version
-- The schema version this file was migrated to.
PRAGMA user_version;

-- name: set_user_version
-- Record the schema version; formatted with an int, since a pragma takes no bound parameters.
PRAGMA user_version = {version:d};

-- name: task_by_id
-- One task.
SELECT * FROM tasks WHERE id = :id;

-- name: count_queued
-- Tasks of a kind still waiting to run (pending or ready): what a stage's bound limits.
SELECT count(*) AS n FROM tasks WHERE kind = :kind AND state IN ('pending', 'ready');

-- name: count_queued_of_flow
-- Tasks of a kind and flow still waiting to run: what a stage's cap per flow limits.
SELECT count(*) AS n FROM tasks
WHERE kind = :kind AND state IN ('pending', 'ready') AND flow = :flow;

-- name: count_queued_of_group
-- Tasks of a kind and group still waiting to run: what a stage's cap per group limits.
SELECT count(*) AS n FROM tasks WHERE grp = :grp AND state IN ('pending', 'ready') AND kind = :kind;

-- name: stage_counts
-- Of the kinds given (a JSON array): tasks waiting to run, and running or waiting on a remote job: their tallies, which the triggers keep in the transaction that moves a task (counting the tasks took 275 us a claim with 3,000 waiting).
SELECT kind,
       sum(CASE WHEN state IN ('pending', 'ready') THEN n ELSE 0 END) AS queued,
       sum(CASE WHEN state IN ('running', 'waiting') THEN n ELSE 0 END) AS active
FROM kind_tally
WHERE kind IN (SELECT value FROM json_each(:kinds))
GROUP BY kind;

-- name: mark_deferred
-- A success a full stage had no room for: ready again at run_at, that attempt not counted.
UPDATE tasks
SET state = 'ready', run_at = :run_at, ready_since = :ready_since, worker = NULL,
    lease_until = NULL, error_code = :code, attempt_base = attempt_base + 1
WHERE id = :id;

-- name: dependents
-- Who waits on a task (kept after its outcome: a redrive may restore them).
SELECT task_id FROM task_deps WHERE dep_id = :dep_id ORDER BY task_id;

-- name: failed_deps
-- How many of a task's dependencies are dead or cancelled.
SELECT count(*) AS n FROM task_deps AS d JOIN tasks AS t ON t.id = d.dep_id
WHERE d.task_id = :id AND t.state IN ('dead', 'cancelled');

-- name: dead_letters
-- Dead tasks, optionally by ids (a JSON array), group and kind.
SELECT * FROM tasks
WHERE state = 'dead'
  AND (:ids IS NULL OR id IN (SELECT value FROM json_each(:ids)))
  AND (:grp IS NULL OR grp = :grp)
  AND (:kind IS NULL OR kind = :kind)
ORDER BY id;

-- name: redrive_task
-- Re-enqueue a dead task with a fresh attempt budget; no row if it is no longer dead.
UPDATE tasks
SET state = 'ready', run_at = :now, ready_since = :ready_since,
    attempt_base = attempt, expiries = 0, solo = 0, error_code = NULL, finished_at = NULL
WHERE id = :id AND state = 'dead'
RETURNING id;

-- name: restore_dependent
-- A task cancelled only because it waited on a dead one waits again.
UPDATE tasks SET state = 'pending', finished_at = NULL, error_code = NULL
WHERE id = :id AND state = 'cancelled' AND error_code = 'upstream_failed'
RETURNING id;

-- name: count_expiry
-- Count one more lease a task's worker lost, and say who lost it when.
UPDATE tasks SET expiries = expiries + 1, lost_by = worker, lost_at = :now WHERE id = :id;

-- name: requeue_expired
-- A lost lease makes the task ready again at once (`solo`: to run alone, that attempt uncounted).
UPDATE tasks
SET state = 'ready', run_at = :now, ready_since = :ready_since, worker = NULL,
    lease_until = NULL, error_code = :code, expiries = expiries + 1, solo = solo OR :solo,
    attempt_base = attempt_base + :solo, lost_by = worker, lost_at = :now
WHERE id = :id;

-- name: crash_companions
-- How many other tasks a worker still runs, or lost after a task's attempt began (which it lost).
SELECT (
    SELECT count(*) FROM tasks
    WHERE state = 'running' AND worker = :worker AND id <> :task_id
) + (
    SELECT count(*) FROM tasks
    WHERE lost_by = :worker AND id <> :task_id AND lost_at > (
        SELECT started_at FROM attempts WHERE task_id = :task_id AND number = :number
    )
) AS n;

-- name: end_attempt
-- Close the open attempt of a task (running, or waiting on its remote job) with its outcome.
UPDATE attempts
SET ended_at = :now, outcome = :outcome, error_class = :error_class, code = :code,
    message = :message
WHERE task_id = :task_id AND number = :number AND outcome IN ('running', 'waiting');

-- name: delete_tickets
-- Return every ticket a task holds.
DELETE FROM tickets WHERE task_id = :task_id;

-- name: save_gate
-- Write one gate's state.
INSERT INTO gates (
    name, in_flight, starts, penalized_until, granted, blocked_by_token,
    blocked_by_concurrency, rate_limited, peak_in_flight, first_blocked_at, unstarted
) VALUES (
    :name, :in_flight, :starts, :penalized_until, :granted, :blocked_by_token,
    :blocked_by_concurrency, :rate_limited, :peak_in_flight, :first_blocked_at, :unstarted
)
ON CONFLICT (name) DO UPDATE SET
    in_flight = excluded.in_flight,
    unstarted = excluded.unstarted,
    starts = excluded.starts,
    penalized_until = excluded.penalized_until,
    granted = excluded.granted,
    blocked_by_token = excluded.blocked_by_token,
    blocked_by_concurrency = excluded.blocked_by_concurrency,
    rate_limited = excluded.rate_limited,
    peak_in_flight = excluded.peak_in_flight,
    first_blocked_at = excluded.first_blocked_at;

-- name: all_gates
-- Every gate's state, by name.
SELECT * FROM gates ORDER BY name;

-- name: due_polls
-- Waiting tasks whose remote poll is due and not leased to a live poller, oldest first.
SELECT * FROM tasks
WHERE state = 'waiting' AND run_at <= :now
  AND (lease_until IS NULL OR lease_until <= :now)
  AND (:kinds IS NULL OR kind IN (SELECT value FROM json_each(:kinds)))
ORDER BY run_at, id
LIMIT :limit;

-- name: next_poll_at
-- The earliest future poll time of a waiting task.
SELECT min(run_at) AS at FROM tasks WHERE state = 'waiting' AND run_at > :now;

-- name: poll_again
-- The remote job still runs (or its check failed): poll it again at run_at, by any poller.
UPDATE tasks
SET run_at = :run_at, lease_until = NULL, worker = NULL, error_code = coalesce(:code, error_code)
WHERE id = :id;

-- name: add_to_ledger
-- Add succeeded tasks' units to their group's ledger (one row per group and kind: writers take turns on the file, so the worker's shard is not needed).
INSERT INTO ledger (grp, kind, units) VALUES (:grp, :kind, :units)
ON CONFLICT (grp, kind) DO UPDATE SET units = units + excluded.units;

-- name: mark_retry
-- Queue a task for another attempt at run_at; a waiting task's remote job has ended in failure.
UPDATE tasks
SET state = 'ready', run_at = :run_at, ready_since = :ready_since, worker = NULL,
    lease_until = NULL, remote_id = NULL, poll_every = NULL, remote_deadline = NULL, error_code = :code,
    remote_jobs = remote_jobs + (state = 'waiting'), attempt_base = attempt_base + :uncounted
WHERE id = :id;

-- name: mark_waiting
-- A task's remote job runs: it keeps its tickets, frees its worker, and is polled at run_at.
UPDATE tasks
SET state = 'waiting', remote_id = :remote_id, poll_every = :poll_every,
    remote_deadline = :deadline, run_at = :run_at, worker = NULL, lease_until = NULL
WHERE id = :id;

-- name: mark_ended
-- Record a task's end without success (dead or cancelled) and why; a dead one's remote job failed.
UPDATE tasks
SET state = :state, finished_at = :now, worker = NULL, lease_until = NULL, error_code = :code,
    remote_jobs = remote_jobs + (state = 'waiting' AND :state = 'dead')
WHERE id = :id;

-- name: list_tasks
-- Tasks by id, optionally of one group, state and kind.
SELECT * FROM tasks
WHERE (:grp IS NULL OR grp = :grp)
  AND (:state IS NULL OR state = :state)
  AND (:kind IS NULL OR kind = :kind)
ORDER BY id
LIMIT :limit;

-- name: task_attempts
-- A task's attempt history, first attempt first.
SELECT * FROM attempts WHERE task_id = :task_id ORDER BY number;

-- name: count_by_state
-- How many tasks are in each state, of the kinds given (a JSON array) or all: their tallies.
SELECT state, sum(n) AS n FROM kind_tally
WHERE :kinds IS NULL OR kind IN (SELECT value FROM json_each(:kinds))
GROUP BY state;

-- name: stage_stats
-- Per kind with unfinished tasks (of the kinds given as a JSON array, or all): its tasks per state (tallies) and when its oldest ready task became ready (the index).
SELECT s.kind, s.pending, s.ready, s.running, s.waiting,
       CASE WHEN s.ready > 0 THEN (
           SELECT t.ready_since FROM tasks AS t
           WHERE t.kind = s.kind AND t.state = 'ready' AND t.state IN ('pending', 'ready')
           ORDER BY t.ready_since
           LIMIT 1
       ) END AS oldest_ready
FROM (
    SELECT kind,
           coalesce(sum(n) FILTER (WHERE state = 'pending'), 0) AS pending,
           coalesce(sum(n) FILTER (WHERE state = 'ready'), 0) AS ready,
           coalesce(sum(n) FILTER (WHERE state = 'running'), 0) AS running,
           coalesce(sum(n) FILTER (WHERE state = 'waiting'), 0) AS waiting
    FROM kind_tally
    WHERE state IN ('pending', 'ready', 'running', 'waiting')
      AND (:kinds IS NULL OR kind IN (SELECT value FROM json_each(:kinds)))
    GROUP BY kind
    HAVING sum(n) > 0
) AS s
ORDER BY s.kind;

-- name: ready_counts
-- Per kind with ready tasks (of the kinds given as a JSON array, or all), how many: their tallies.
SELECT kind, n FROM kind_tally
WHERE state = 'ready' AND n > 0
  AND (:kinds IS NULL OR kind IN (SELECT value FROM json_each(:kinds)))
ORDER BY kind;

-- name: oldest_ready
-- When the oldest ready tasks of a kind became ready, as one JSON array (the index, read from its start).
SELECT json_group_array(since) AS "since [headrace_json]"
FROM (
    SELECT ready_since AS since FROM tasks
    -- the second term names tasks_queued_by_kind's own, which SQLite needs to use it
    WHERE kind = :kind AND state = 'ready' AND state IN ('pending', 'ready')
    ORDER BY ready_since, id
    LIMIT :limit
);

-- name: newest_ready
-- When the newest ready tasks of a kind became ready, as one JSON array (the index, read from its end).
SELECT json_group_array(since) AS "since [headrace_json]"
FROM (
    SELECT ready_since AS since FROM tasks
    -- the second term names tasks_queued_by_kind's own, which SQLite needs to use it
    WHERE kind = :kind AND state = 'ready' AND state IN ('pending', 'ready')
    ORDER BY ready_since DESC, id DESC
    LIMIT :limit
);

-- name: group_names
-- Every group that names at least one task, kept or pruned: its tallies and the rollup of pruned tasks.
SELECT grp FROM (
    SELECT grp, n FROM group_tally
    UNION ALL
    SELECT grp, n FROM group_rollup
)
GROUP BY grp HAVING sum(n) > 0;

-- name: group_counts
-- How many tasks of a group are in each state: its tallies.
SELECT state, n FROM group_tally WHERE grp = :grp;

-- name: fold_tallies
-- Drop the tallies that count nothing (a group whose tasks were all deleted); writers take turns, so there are no shards to fold.
DELETE FROM kind_tally WHERE n = 0;
DELETE FROM group_tally WHERE n = 0;

-- name: group_ledger
-- A group's units per kind.
SELECT kind, units FROM ledger WHERE grp = :grp;

-- name: group_failures
-- A group's dead tasks with their safe error codes.
SELECT id, kind, ref, error_code, attempt FROM tasks
WHERE grp = :grp AND state = 'dead'
ORDER BY id;

-- name: savepoint
-- Open a savepoint around one outcome of a batch.
SAVEPOINT outcome;

-- name: rollback_to_savepoint
-- Undo what one refused outcome of a batch wrote.
ROLLBACK TO SAVEPOINT outcome;

-- name: release_savepoint
-- Close one outcome's savepoint.
RELEASE SAVEPOINT outcome;

-- name: expired_leases
-- Running tasks whose lease ran out, in id order (through the running tasks' index: by id order the planner would read every task ever kept).
SELECT * FROM tasks INDEXED BY tasks_running_lease
WHERE state = 'running' AND lease_until <= :now
ORDER BY id;

-- name: aging_candidates
-- Ready tasks below the ceiling that may have waited an aging step (aged_tier decides).
SELECT id, tier, ready_since FROM tasks
WHERE state = 'ready' AND tier > :ceiling AND ready_since <= :cutoff;

-- name: promote
-- Raise waiting tasks' tiers by aging (parallel JSON arrays).
UPDATE tasks SET tier = p.tier, promoted_at = :now
FROM (
    SELECT i.value AS id, json_extract(:tiers, '$[' || i.key || ']') AS tier
    FROM json_each(:ids) AS i
) AS p
WHERE tasks.id = p.id;

-- name: mark_started
-- The call starts of a task's tickets on these gates are stamped.
UPDATE tickets SET started = 1
WHERE task_id = :task_id AND gate IN (SELECT value FROM json_each(:gates)) AND NOT started;

-- name: ticket_counts
-- The tickets a task holds, per gate, and how many have no call start stamped yet.
SELECT gate, count(*) AS n, sum(NOT started) AS unstarted
FROM tickets WHERE task_id = :task_id
GROUP BY gate ORDER BY gate;

-- name: ticket_counts_many
-- The tickets tasks hold, per task and gate, and how many have no call start stamped yet.
SELECT task_id, gate, count(*) AS n, sum(NOT started) AS unstarted
FROM tickets WHERE task_id IN (SELECT value FROM json_each(:task_ids))
GROUP BY task_id, gate;

-- name: ticket_gates
-- The gates tasks hold tickets on.
SELECT DISTINCT gate FROM tickets WHERE task_id IN (SELECT value FROM json_each(:task_ids));

-- name: lock_gates
-- Gate states by name (the file's write lock already keeps other writers out).
SELECT * FROM gates WHERE name IN (SELECT value FROM json_each(:names)) ORDER BY name;

-- name: try_lock_gates
-- Gate states by name: as lock_gates, since no other writer can hold one.
SELECT * FROM gates WHERE name IN (SELECT value FROM json_each(:names)) ORDER BY name;

-- name: add_gates
-- Rows for gates asked for the first time, each with the declaration it comes from (parallel JSON arrays).
INSERT OR IGNORE INTO gates (
    name, in_flight, starts, granted, blocked_by_token, blocked_by_concurrency, rate_limited,
    peak_in_flight, spec
)
SELECT value, 0, '[]', 0, 0, 0, 0, 0, json_extract(:specs, '$[' || key || ']')
FROM json_each(:names);

-- name: missing_gates
-- Which of these gates have no row yet.
SELECT value AS name FROM json_each(:names) WHERE value NOT IN (SELECT name FROM gates);

-- name: add_flows
-- Flows seen for the first time.
INSERT OR IGNORE INTO flows (flow, finish_tag) SELECT value, 0 FROM json_each(:flows);

-- name: lock_flows
-- Flows' finish tags by name, while their new tasks are tagged.
SELECT flow, finish_tag FROM flows WHERE flow IN (SELECT value FROM json_each(:flows)) ORDER BY flow;

-- name: advisory_lock
-- Serialise with writers taking the same named lock: the file's write lock does already.
SELECT :lock AS lock;

-- name: lock_task
-- One task, whose holder's write is checked against it.
SELECT * FROM tasks WHERE id = :id;

-- name: lock_for_outcomes
-- Tasks, what waits on those succeeding (directly) or dying (in a tree), in id order.
WITH RECURSIVE tree (id) AS (
    SELECT value FROM json_each(:dead)
    UNION
    SELECT d.task_id FROM task_deps AS d JOIN tree ON d.dep_id = tree.id
)
SELECT * FROM tasks
WHERE id IN (
    SELECT value FROM json_each(:ids)
    UNION SELECT id FROM tree
    UNION SELECT task_id FROM task_deps WHERE dep_id IN (SELECT value FROM json_each(:succeeded))
)
ORDER BY id;

-- name: share_tasks
-- The states of tasks named as dependencies.
SELECT id, state FROM tasks WHERE id IN (SELECT value FROM json_each(:ids)) ORDER BY id;

-- name: lock_keys
-- Serialise writers of the same idempotency keys: the file's write lock does already.
SELECT json_array_length(:keys) AS n;

-- name: task_ids_by_keys
-- The tasks idempotency keys name, with the digests of the payloads they were submitted with (a key is never empty: saying so lets the keys' partial index serve it).
SELECT id, key, payload_digest FROM tasks
WHERE key IN (SELECT value FROM json_each(:keys)) AND key <> '';

-- name: meta_values
-- The store-wide numbers: the fair-queueing virtual time and the dispatch count.
SELECT name, value FROM meta;

-- name: next_task_ids
-- Ids for the tasks of a batch, so that siblings can name each other before they are written.
WITH RECURSIVE seq (i) AS (
    SELECT 1 WHERE :n >= 1
    UNION ALL
    SELECT i + 1 FROM seq WHERE i < :n
)
SELECT (SELECT coalesce(max(id), 0) FROM tasks) + i AS id FROM seq;

-- name: submit_start
-- A batch's flows made if new, then their finish tags (in name order), its ids, the virtual time and the clock.
-- The finish tags are written out with 17 digits: SQLite's JSON writes a REAL with 15, which would round each new task's tag away from the one `fairness.tag` gives.
INSERT OR IGNORE INTO flows (flow, finish_tag) SELECT value, 0 FROM json_each(:flows);
WITH RECURSIVE seq (i) AS (
    SELECT 1 WHERE :n >= 1
    UNION ALL
    SELECT i + 1 FROM seq WHERE i < :n
), taken AS (
    SELECT flow, finish_tag FROM flows
    WHERE flow IN (SELECT value FROM json_each(:flows))
    ORDER BY flow
)
SELECT (SELECT json_group_array(flow) FROM taken) AS "flows [headrace_json]",
       (SELECT json_group_array(json(printf('%!.17g', finish_tag))) FROM taken)
           AS "finish_tags [headrace_json]",
       (
           SELECT json_group_array((SELECT coalesce(max(id), 0) FROM tasks) + i) FROM seq
       ) AS "ids [headrace_json]",
       (SELECT value FROM meta WHERE name = 'virtual_time') AS virtual_time,
       :clock AS now;

-- name: insert_tasks
-- Create a batch of tasks (a JSON array of rows), and move their flows' finish tags.
UPDATE flows SET finish_tag = f.finish
FROM (
    SELECT n.value AS flow, json_extract(:flow_finishes, '$[' || n.key || ']') AS finish
    FROM json_each(:flow_names) AS n
) AS f
WHERE flows.flow = f.flow;
INSERT INTO tasks (
    id, kind, ref, gates, gate_key, flow, grp, tier, submitted_tier, cost, key, state,
    max_attempts, tag, created_at, run_at, ready_since, unmet, payload_digest, lane, memory
)
SELECT
    json_extract(t.value, '$.id'), json_extract(t.value, '$.kind'),
    json_extract(t.value, '$.ref'), json_extract(t.value, '$.gates'),
    json_extract(t.value, '$.gate_key'), json_extract(t.value, '$.flow'),
    json_extract(t.value, '$.grp'), json_extract(t.value, '$.tier'),
    json_extract(t.value, '$.tier'), json_extract(t.value, '$.cost'),
    json_extract(t.value, '$.key'), json_extract(t.value, '$.state'),
    json_extract(t.value, '$.max_attempts'), json_extract(t.value, '$.tag'), :now,
    json_extract(t.value, '$.run_at'), json_extract(t.value, '$.ready_since'),
    json_extract(t.value, '$.unmet'), json_extract(t.value, '$.payload_digest'),
    json_extract(t.value, '$.lane'), json_extract(t.value, '$.memory')
FROM json_each(:tasks) AS t;

-- name: insert_dependencies
-- Make tasks wait on their dependencies (parallel JSON arrays).
INSERT OR IGNORE INTO task_deps (dep_id, task_id)
SELECT d.value, json_extract(:task_ids, '$[' || d.key || ']') FROM json_each(:dep_ids) AS d;

-- name: claim_start
-- A claim's time, the counters, the earliest future run_at of a ready task and the earliest lease to run out (or run out, not reaped yet); no sweep check (SQLite sweeps inside the claim's own transaction, with nothing to save).
SELECT :clock AS now,
       (SELECT value FROM meta WHERE name = 'dispatches') AS dispatches,
       (SELECT value FROM meta WHERE name = 'virtual_time') AS virtual_time,
       (SELECT min(run_at) FROM tasks WHERE state = 'ready' AND run_at > :clock) AS next_at,
       (SELECT min(lease_until) FROM tasks WHERE state = 'running') AS lease_ends,
       NULL AS sweep_due;

-- name: claim_batch
-- One claim batch: due ready tasks after a (tier, tag, id) key, its first `batch` in claim order and the rest of the last round they reach (a round is never cut), with their flows' and lanes' turns, the batch's size and end, and its gates' states (and `now`, as PostgreSQL's batch reads its clock); the first `take` of them in turn order (`fairness.take_turns`: in a round, the lane served least recently first, with the claim's own turns given as `served`).
WITH peek AS MATERIALIZED (  -- the batch's range in claim order
    SELECT id, kind, tier, tag, flow, coalesce(lane, flow) AS lane, gates, solo, memory
    FROM tasks
    WHERE state = 'ready'
      AND (tier, tag, id) > (:tier, :tag, :id)
      AND run_at <= :now
      AND (:kinds IS NULL OR kind IN (SELECT value FROM json_each(:kinds)))
      AND (:memory IS NULL OR memory <= :memory)  -- what the worker's memory left may take
      AND gate_key NOT IN (SELECT value FROM json_each(:refused))
      -- the claim has its limit: only tasks that may wait in the worker (no gate, no memory)
      AND (NOT :waiting OR (gate_key = '' AND memory = 0 AND solo = 0))
      AND id NOT IN (SELECT value FROM json_each(:skip))  -- a round's tasks read already
    ORDER BY tier, tag, id
    -- Some stages asked for (a borrowing claim's): the walk in claim order passes every other
    -- stage's ready task, so it is made only if one of theirs may be taken, looked up by stage
    -- (tasks_queued_by_kind). Found nowhere: a batch of 0, no walk (700 us -> 30 us past 3,500
    -- ready tasks of other stages).
    LIMIT CASE WHEN :kinds IS NULL OR EXISTS (
        SELECT 1 FROM tasks AS k INDEXED BY tasks_queued_by_kind
        WHERE k.kind IN (SELECT value FROM json_each(:kinds))
          AND k.state IN ('pending', 'ready')  -- the index's own condition, for the planner
          AND k.state = 'ready'
          AND (k.tier, k.tag, k.id) > (:tier, :tag, :id)
          AND k.run_at <= :now
          AND (:memory IS NULL OR k.memory <= :memory)
          AND k.gate_key NOT IN (SELECT value FROM json_each(:refused))
          AND (NOT :waiting OR (k.gate_key = '' AND k.memory = 0 AND k.solo = 0))
    ) THEN :batch ELSE 0 END
), last AS (
    SELECT tier, tag, id FROM peek ORDER BY tier DESC, tag DESC, id DESC LIMIT 1
), rest AS MATERIALIZED (  -- the rest of the range's last round
    SELECT t.id, t.kind, t.tier, t.tag, t.flow, coalesce(t.lane, t.flow) AS lane, t.gates,
           t.solo, t.memory
    FROM tasks AS t INDEXED BY tasks_claim_order
    WHERE t.state = 'ready'
      -- one round, past the range: equal (tier, tag) and an id range bound the index walk
      AND t.tier = (SELECT tier FROM last) AND t.tag = (SELECT tag FROM last)
      AND t.id > (SELECT id FROM last)
      AND t.run_at <= :now
      AND (:kinds IS NULL OR t.kind IN (SELECT value FROM json_each(:kinds)))
      AND (:memory IS NULL OR t.memory <= :memory)
      AND t.gate_key NOT IN (SELECT value FROM json_each(:refused))
      AND (NOT :waiting OR (t.gate_key = '' AND t.memory = 0 AND t.solo = 0))
      AND t.id NOT IN (SELECT value FROM json_each(:skip))
), span AS (  -- the range to the end of its last round
    SELECT * FROM peek UNION ALL SELECT * FROM rest
), served AS MATERIALIZED (  -- the turns this claim has taken so far, by flow or lane
    SELECT n.value AS flow, json_extract(:served_at, '$[' || n.key || ']') AS served
    FROM json_each(:served_names) AS n
), turned AS (
    SELECT p.*, f.served AS flow_served, coalesce(l.served, f.served) AS lane_served,
           coalesce(ol.served, l.served, f.served) AS lane_turn,
           coalesce(o.served, f.served) AS flow_turn
    FROM span AS p
    LEFT JOIN flows AS f ON f.flow = p.flow
    LEFT JOIN flows AS l ON p.lane <> p.flow AND l.flow = p.lane
    LEFT JOIN served AS o ON o.flow = p.flow
    LEFT JOIN served AS ol ON ol.flow = p.lane
), taken AS MATERIALIZED (  -- what the claim still needs, as the PostgreSQL batch locks no more
    SELECT * FROM turned ORDER BY tier, tag, lane_turn, flow_turn, id LIMIT :take
), wanted AS (
    SELECT DISTINCT g.value AS name
    FROM (SELECT DISTINCT gates FROM span) AS s, json_each(s.gates) AS g  -- a round's are alike
    WHERE g.value NOT IN (SELECT value FROM json_each(:held))
)
SELECT (SELECT count(*) FROM peek) AS peeked,
       (SELECT tier FROM last) AS last_tier,
       (SELECT tag FROM last) AS last_tag,
       -- the batch's gates on its first row only: built and decoded once, not once per task
       CASE WHEN row_number() OVER w = 1 THEN (
           SELECT json_group_array(json_object(
               'name', g.name, 'in_flight', g.in_flight, 'starts', json(g.starts),
               'penalized_until', g.penalized_until, 'granted', g.granted,
               'blocked_by_token', g.blocked_by_token,
               'blocked_by_concurrency', g.blocked_by_concurrency,
               'rate_limited', g.rate_limited, 'peak_in_flight', g.peak_in_flight,
               'first_blocked_at', g.first_blocked_at, 'unstarted', g.unstarted
           ))
           FROM gates AS g WHERE g.name IN (SELECT name FROM wanted)
       ) END AS "gate_rows [headrace_json]",
       CASE WHEN row_number() OVER w = 1 THEN (
           SELECT json_group_array(name) FROM wanted
       ) END AS "wanted [headrace_json]",
       NULL AS now,  -- the store's clock is the host's: given, not read here
       -- what a claim weighs a task by: its leased row comes back with its lease
       p.id, p.kind, p.tier, p.tag, p.flow, p.lane, p.gates, p.solo, p.memory,
       p.flow_served, p.lane_served
FROM (SELECT 1) AS one
LEFT JOIN taken AS p ON true
WINDOW w AS (ORDER BY p.tier, p.tag, p.lane_turn, p.flow_turn, p.id)
ORDER BY p.tier, p.tag, p.lane_turn, p.flow_turn, p.id;

-- name: lease_tasks
-- Lease ready tasks under new fencing tokens, with attempts and tickets, and serve their flows: a dispatch counted for each task, each flow's turn numbered up to `base` taking its own.
-- The tasks are updated last, their rows returned by the update: not looked up again.
UPDATE meta
SET value = CASE name
    WHEN 'dispatches' THEN value + json_array_length(:ids)
    ELSE max(value, :virtual_time)
END
WHERE name IN ('dispatches', 'virtual_time');
UPDATE flows
SET served = f.served - :base + (SELECT value FROM meta WHERE name = 'dispatches')
FROM (
    SELECT n.value AS flow, json_extract(:served, '$[' || n.key || ']') AS served
    FROM json_each(:flows) AS n
) AS f
WHERE flows.flow = f.flow;
INSERT INTO attempts (task_id, number, worker, started_at, outcome)
SELECT id, attempt + 1, :worker, :now, 'running' FROM tasks
WHERE id IN (SELECT value FROM json_each(:ids));
INSERT INTO tickets (task_id, gate, started)
SELECT t.id, g.value, g.value NOT IN (SELECT value FROM json_each(:rated))
FROM tasks AS t, json_each(t.gates) AS g
WHERE t.id IN (SELECT value FROM json_each(:ids));
UPDATE tasks
SET state = 'running', attempt = attempt + 1, worker = :worker, lease_until = :until,
    lease_token = lease_token + 1
WHERE id IN (SELECT value FROM json_each(:ids))
RETURNING *;

-- name: lease_polls
-- Hand waiting tasks to a poller, each under a new fencing token.
UPDATE tasks SET worker = :worker, lease_until = :until, lease_token = lease_token + 1
WHERE id IN (SELECT value FROM json_each(:ids))
RETURNING *;

-- name: renew_leases
-- Extend leases their holders still hold (same token, not expired); lost ones return no row.
UPDATE tasks SET lease_until = :until
FROM (
    SELECT i.value AS id, json_extract(:tokens, '$[' || i.key || ']') AS token
    FROM json_each(:ids) AS i
) AS l
WHERE tasks.id = l.id AND tasks.lease_token = l.token
  AND tasks.state IN ('running', 'waiting') AND tasks.lease_until > :now
RETURNING *;

-- name: succeed_task
-- Record a success: close the attempt, drop the tickets, make dependents with nothing left ready.
UPDATE attempts
SET ended_at = :now, outcome = 'succeeded', error_class = NULL, code = NULL, message = NULL
WHERE task_id = :id AND number = :number AND outcome IN ('running', 'waiting');
DELETE FROM tickets WHERE task_id = :id;
UPDATE tasks
SET unmet = unmet - 1,
    state = CASE WHEN unmet = 1 AND state = 'pending' THEN 'ready' ELSE state END,
    -- ready from now, or from its run_at when later (ages.ready_since)
    ready_since = CASE
        WHEN unmet = 1 AND state = 'pending' THEN max(:now, run_at) ELSE ready_since
    END
WHERE id IN (SELECT task_id FROM task_deps WHERE dep_id = :id);
UPDATE tasks
SET state = 'succeeded', finished_at = :now, lease_until = NULL, error_code = NULL
WHERE id = :id;

-- name: succeed_tasks
-- `succeed_task` for distinct held tasks at once (a dependent waiting on k of them counts k met).
UPDATE attempts
SET ended_at = :now, outcome = 'succeeded', error_class = NULL, code = NULL, message = NULL
FROM (
    SELECT i.value AS id, json_extract(:numbers, '$[' || i.key || ']') AS number
    FROM json_each(:ids) AS i
) AS done
WHERE attempts.task_id = done.id AND attempts.number = done.number
  AND attempts.outcome IN ('running', 'waiting');
DELETE FROM tickets WHERE task_id IN (SELECT value FROM json_each(:ids));
UPDATE tasks
SET unmet = tasks.unmet - met.n,
    state = CASE WHEN tasks.unmet = met.n AND tasks.state = 'pending' THEN 'ready' ELSE tasks.state END,
    ready_since = CASE
        WHEN tasks.unmet = met.n AND tasks.state = 'pending' THEN max(:now, tasks.run_at)
        ELSE tasks.ready_since
    END
FROM (
    SELECT task_id, count(*) AS n FROM task_deps
    WHERE dep_id IN (SELECT value FROM json_each(:ids))
      AND task_id NOT IN (SELECT value FROM json_each(:ids))
    GROUP BY task_id
) AS met
WHERE tasks.id = met.task_id;
UPDATE tasks
SET state = 'succeeded', finished_at = :now, lease_until = NULL, error_code = NULL
WHERE id IN (SELECT value FROM json_each(:ids));

-- name: insert_record
-- A new record, numbered after every other; no row when one of that kind and id exists.
INSERT INTO records (kind, id, scope, state, body, seq, created_at, changed_at)
VALUES (:kind, :id, :scope, :state, :body,
        (SELECT coalesce(max(seq), 0) + 1 FROM records), :now, :now)
ON CONFLICT (kind, id) DO NOTHING
RETURNING *;

-- name: number_records
-- The records a transaction made or moved, as numbered: the file's single writer commits seqs in the order they are taken.
SELECT r.kind, r.id, r.seq
FROM json_each(:kinds) AS k
JOIN records AS r ON r.kind = k.value AND r.id = json_extract(:ids, '$[' || k.key || ']');

-- name: record_by_id
-- One record.
SELECT * FROM records WHERE kind = :kind AND id = :id;

-- name: lock_record
-- One record, about to be changed (writers are serialised: no lock to take).
SELECT * FROM records WHERE kind = :kind AND id = :id;

-- name: move_record
-- A record's new state and body, numbered after every other change.
UPDATE records
SET state = :state, body = :body, changed_at = :now,
    seq = (SELECT coalesce(max(seq), 0) + 1 FROM records)
WHERE kind = :kind AND id = :id
RETURNING *;

-- name: rewrite_record
-- A record's new body, its state and place in order kept.
UPDATE records SET body = :body, changed_at = :now
WHERE kind = :kind AND id = :id
RETURNING *;

-- name: list_records
-- Records of a kind past a seq, in seq order, optionally of one scope and state.
SELECT * FROM records
WHERE kind = :kind
  AND (:scope IS NULL OR scope = :scope)
  AND (:state IS NULL OR state = :state)
  AND seq > :after
ORDER BY seq
LIMIT :limit;

-- name: count_records
-- How many records of a kind are past a seq, optionally of one scope and state.
SELECT count(*) AS n FROM records
WHERE kind = :kind
  AND (:scope IS NULL OR scope = :scope)
  AND (:state IS NULL OR state = :state)
  AND seq > :after;

-- name: insert_audit
-- One audit row.
INSERT INTO audit (at, kind, record_id, scope, action, actor, outcome, detail)
VALUES (:now, :kind, :record_id, :scope, :action, :actor, :outcome, :detail);

-- name: audit_rows
-- Audit rows in the order written, optionally of one record kind, record and scope.
SELECT * FROM audit
WHERE (:kind IS NULL OR kind = :kind)
  AND (:record_id IS NULL OR record_id = :record_id)
  AND (:scope IS NULL OR scope = :scope)
ORDER BY id
LIMIT :limit;

-- name: insert_notice
-- A notification owed, in the outbox.
INSERT INTO outbox (at, topic, kind, record_id, scope, body)
VALUES (:now, :topic, :kind, :record_id, :scope, :body);

-- name: outbox_rows
-- Notifications past an id in the order written, only those not delivered when `pending`.
SELECT * FROM outbox
WHERE id > :after AND (NOT :pending OR delivered_at IS NULL)
ORDER BY id
LIMIT :limit;

-- name: mark_delivered
-- Notifications delivered now (those not marked before).
UPDATE outbox SET delivered_at = :now
WHERE id IN (SELECT value FROM json_each(:ids)) AND delivered_at IS NULL
RETURNING id;

-- name: wake_remote
-- Waiting tasks on a remote job whose check is not running, due now (a webhook said how it ended).
UPDATE tasks SET run_at = :now
WHERE state = 'waiting' AND remote_id = :remote_id AND run_at > :now
  AND (lease_until IS NULL OR lease_until <= :now)
RETURNING id;

-- name: attempt_outcomes
-- Attempts ever made, by outcome: their tallies (deleting attempts leaves them); a running one is a running task's.
SELECT outcome, n FROM attempt_tally
UNION ALL
SELECT 'running', coalesce(sum(n), 0) FROM kind_tally WHERE state = 'running';

-- name: prunable_tasks
-- Tasks in a state that finished before the cutoff, after a (finished_at, id) mark, oldest first, that nothing needs: no task still to finish waits on them, they wait on no task a redrive could bring back, and they are not the newest task (new ids count on from the largest kept).
SELECT t.id, t.finished_at FROM tasks AS t
WHERE t.state = :state AND t.finished_at IS NOT NULL AND t.finished_at < :cutoff
  AND (t.finished_at, t.id) > (:at, :after_id)
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
LIMIT :limit;

-- name: count_attempts
-- How many attempts tasks (a JSON array of ids) have.
SELECT count(*) AS n FROM attempts WHERE task_id IN (SELECT value FROM json_each(:ids));

-- name: lock_pruned_tasks
-- Of the tasks about to be pruned, those still final, with their groups and states (the file's write lock keeps other writers out).
SELECT id, grp, state FROM tasks
WHERE id IN (SELECT value FROM json_each(:ids)) AND state IN ('succeeded', 'dead', 'cancelled')
ORDER BY id;

-- name: add_to_rollup
-- Count pruned tasks in their group's rollup, per state.
INSERT INTO group_rollup (grp, state, n) VALUES (:grp, :state, :n)
ON CONFLICT (grp, state) DO UPDATE SET n = n + excluded.n;

-- name: group_rollup
-- A group's pruned tasks per state.
SELECT state, n FROM group_rollup WHERE grp = :grp;

-- name: orphan_dependents
-- Tasks cancelled because one of these dead or cancelled tasks failed them can no longer be restored by a redrive: they say so.
UPDATE tasks SET error_code = 'upstream_pruned'
WHERE state = 'cancelled' AND error_code = 'upstream_failed'
  AND id NOT IN (SELECT value FROM json_each(:ids))
  AND id IN (
      SELECT d.task_id FROM task_deps AS d JOIN tasks AS x ON x.id = d.dep_id
      WHERE d.dep_id IN (SELECT value FROM json_each(:ids)) AND x.state IN ('dead', 'cancelled')
  );

-- name: delete_attempts
-- Delete the attempts of tasks being pruned.
DELETE FROM attempts WHERE task_id IN (SELECT value FROM json_each(:ids)) RETURNING task_id;

-- name: delete_task_deps
-- Delete the dependency rows of tasks being pruned, on either side.
DELETE FROM task_deps
WHERE dep_id IN (SELECT value FROM json_each(:ids))
   OR task_id IN (SELECT value FROM json_each(:ids));

-- name: delete_tasks
-- Delete tasks being pruned (their attempts and dependency rows went first).
DELETE FROM tasks WHERE id IN (SELECT value FROM json_each(:ids)) RETURNING id;

-- name: prunable_notices
-- Notices delivered before the cutoff, after a (delivered_at, id) mark, oldest first; not the newest notice.
SELECT id, delivered_at AS at FROM outbox
WHERE delivered_at IS NOT NULL AND delivered_at < :cutoff
  AND (delivered_at, id) > (:at, :after_id)
  AND id < (SELECT max(id) FROM outbox)
ORDER BY delivered_at, id
LIMIT :limit;

-- name: delete_notices
-- Delete delivered notices.
DELETE FROM outbox
WHERE id IN (SELECT value FROM json_each(:ids)) AND delivered_at IS NOT NULL
RETURNING id;

-- name: prunable_audit
-- Audit rows written before the cutoff, after an (at, id) mark, oldest first; not the newest row.
SELECT id, at FROM audit
WHERE at < :cutoff AND (at, id) > (:at, :after_id) AND id < (SELECT max(id) FROM audit)
ORDER BY at, id
LIMIT :limit;

-- name: delete_audit
-- Delete audit rows.
DELETE FROM audit WHERE id IN (SELECT value FROM json_each(:ids)) RETURNING id;

-- name: prunable_records
-- Records of a kind last changed before the cutoff, after a seq, in seq order; not the newest record (new seqs count on from the largest kept).
SELECT id, seq FROM records
WHERE kind = :kind AND changed_at < :cutoff AND seq > :after
  AND seq < (SELECT max(seq) FROM records)
ORDER BY seq
LIMIT :limit;

-- name: delete_records
-- Delete records of a kind by id (only those in the states given as a JSON array, when given); never the newest record.
DELETE FROM records
WHERE kind = :kind AND id IN (SELECT value FROM json_each(:ids))
  AND (:states IS NULL OR state IN (SELECT value FROM json_each(:states)))
  AND seq < (SELECT max(seq) FROM records)
RETURNING id;

-- name: take_pruner
-- Hold the pruner's lease until a time: its holder renews it; another takes it once it ran out and the last run ended before `due`.
INSERT INTO pruner (name, holder, until, done_at, removed)
VALUES ('pruner', :holder, :until, NULL, 0)
ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, until = excluded.until
WHERE (pruner.holder = excluded.holder AND pruner.until > :now)
   OR (pruner.until <= :now AND (pruner.done_at IS NULL OR pruner.done_at <= :due))
RETURNING holder;

-- name: release_pruner
-- Give the pruner's lease back; a run that ended says when and how many rows it removed.
UPDATE pruner
SET until = :now,
    done_at = CASE WHEN :removed IS NULL THEN done_at ELSE :now END,
    removed = coalesce(:removed, removed)
WHERE name = 'pruner' AND holder = :holder;

-- name: pruner_state
-- The pruner's lease: who holds (or held) it, until when, when a run last ended, what it removed.
SELECT holder, until, done_at, removed FROM pruner WHERE name = 'pruner';

-- name: take_lease
-- Hold a named lease until a time: its holder renews it; another takes it once it ran out.
INSERT INTO leases (name, holder, until) VALUES (:name, :holder, :until)
ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, until = excluded.until
WHERE leases.holder = excluded.holder OR leases.until <= :now
RETURNING holder;
