-- The statements of the SQLite store (store/sqlite.py), by name. Parameters are named; `:now` is
-- always the store clock's time, read once at the start of the verb's transaction.

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

-- name: user_version
-- The schema version this file was migrated to.
PRAGMA user_version;

-- name: set_user_version
-- Record the schema version; formatted with an int, since a pragma takes no bound parameters.
PRAGMA user_version = {version:d};

-- name: task_by_id
-- One task.
SELECT * FROM tasks WHERE id = :id;

-- name: task_id_by_key
-- The task an idempotency key names, and the digest of the payload it was submitted with.
SELECT id, payload_digest FROM tasks WHERE key = :key AND key <> '';

-- name: count_queued
-- Tasks of a kind still waiting to run (pending or ready): what a stage's bound limits.
SELECT count(*) AS n FROM tasks WHERE kind = :kind AND state IN ('pending', 'ready');

-- name: insert_task
-- Create a task; nothing when another writer took its idempotency key first.
INSERT INTO tasks (
    kind, ref, gates, gate_key, flow, grp, tier, submitted_tier, cost, key, state,
    max_attempts, tag, created_at, run_at, ready_since, unmet, payload_digest
) VALUES (
    :kind, :ref, :gates, :gate_key, :flow, :grp, :tier, :tier, :cost, :key, :state,
    :max_attempts, :tag, :now, :run_at, :ready_since, :unmet, :payload_digest
)
ON CONFLICT (key) WHERE key <> '' DO NOTHING
RETURNING id;

-- name: insert_dependency
-- Make a task wait on one of its dependencies.
INSERT OR IGNORE INTO task_deps (dep_id, task_id) VALUES (:dep_id, :task_id);

-- name: unblock_dependents
-- A dependency succeeded: count it met, and make dependents with none left ready.
UPDATE tasks
SET unmet = unmet - 1,
    state = CASE WHEN unmet = 1 AND state = 'pending' THEN 'ready' ELSE state END,
    ready_since = CASE WHEN unmet = 1 AND state = 'pending' THEN :now ELSE ready_since END
WHERE id IN (SELECT task_id FROM task_deps WHERE dep_id = :dep_id);

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
SET state = 'ready', run_at = :now, ready_since = coalesce(ready_since, :now),
    attempt_base = attempt, expiries = 0, solo = 0, error_code = NULL, finished_at = NULL
WHERE id = :id AND state = 'dead'
RETURNING id;

-- name: restore_dependent
-- A task cancelled only because it waited on a dead one waits again.
UPDATE tasks SET state = 'pending', finished_at = NULL, error_code = NULL
WHERE id = :id AND state = 'cancelled' AND error_code = 'upstream_failed'
RETURNING id;

-- name: virtual_time
-- The fair-queueing virtual time: the largest tag dispatched so far.
SELECT value FROM meta WHERE name = 'virtual_time';

-- name: save_virtual_time
-- Move the fair-queueing virtual time.
INSERT INTO meta (name, value) VALUES ('virtual_time', :value)
ON CONFLICT (name) DO UPDATE SET value = excluded.value;

-- name: flow_finish
-- A flow's finish tag: where its next task's start tag begins.
SELECT finish_tag FROM flows WHERE flow = :flow;

-- name: save_flow_finish
-- Move a flow's finish tag after tagging one of its tasks.
INSERT INTO flows (flow, finish_tag) VALUES (:flow, :finish)
ON CONFLICT (flow) DO UPDATE SET finish_tag = excluded.finish_tag;

-- name: flow_served
-- When a flow was last served (a dispatch count; 0 = never).
SELECT served FROM flows WHERE flow = :flow;

-- name: save_flow_served
-- Mark a flow served by dispatch number :served.
UPDATE flows SET served = :served WHERE flow = :flow;

-- name: dispatches
-- How many tasks have been dispatched: numbers each dispatch for flows' turns.
SELECT value FROM meta WHERE name = 'dispatches';

-- name: save_dispatches
-- Count dispatches.
INSERT INTO meta (name, value) VALUES ('dispatches', :value)
ON CONFLICT (name) DO UPDATE SET value = excluded.value;

-- name: expired_leases
-- Running tasks whose lease ran out: the reaper's work (unordered, so the lease index serves).
SELECT * FROM tasks WHERE state = 'running' AND lease_until <= :now;

-- name: count_expiry
-- Count one more lease a task's worker lost, and say who lost it when.
UPDATE tasks SET expiries = expiries + 1, lost_by = worker, lost_at = :now WHERE id = :id;

-- name: requeue_expired
-- A lost lease makes the task ready again at once (`solo`: to run alone, that attempt uncounted).
UPDATE tasks
SET state = 'ready', run_at = :now, worker = NULL, lease_until = NULL, error_code = :code,
    expiries = expiries + 1, solo = solo OR :solo, attempt_base = attempt_base + :solo,
    lost_by = worker, lost_at = :now
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

-- name: aging_candidates
-- Ready tasks of a tier that may have waited an aging step (the caller decides with aged_tier).
SELECT id, tier, ready_since FROM tasks
WHERE state = 'ready' AND tier = :tier AND ready_since <= :cutoff;

-- name: promote
-- Raise a waiting task's tier by aging.
UPDATE tasks SET tier = :tier, promoted_at = :now WHERE id = :id;

-- name: ready_candidates
-- One claim batch: due ready tasks after a (tier, tag, id) key; kinds and refused keys are JSON.
SELECT * FROM tasks
WHERE state = 'ready'
  AND (tier, tag, id) > (:tier, :tag, :id)
  AND run_at <= :now
  AND (:kinds IS NULL OR kind IN (SELECT value FROM json_each(:kinds)))
  AND gate_key NOT IN (SELECT value FROM json_each(:refused))
ORDER BY tier, tag, id
LIMIT :batch;

-- name: lease_task
-- Hand a ready task to a worker: a new attempt under a new fencing token.
UPDATE tasks
SET state = 'running', attempt = attempt + 1, worker = :worker, lease_until = :until,
    lease_token = lease_token + 1
WHERE id = :id
RETURNING *;

-- name: insert_attempt
-- Start the history entry of an attempt.
INSERT INTO attempts (task_id, number, worker, started_at, outcome)
VALUES (:task_id, :number, :worker, :now, 'running');

-- name: end_attempt
-- Close the open attempt of a task (running, or waiting on its remote job) with its outcome.
UPDATE attempts
SET ended_at = :now, outcome = :outcome, error_class = :error_class, code = :code,
    message = :message
WHERE task_id = :task_id AND number = :number AND outcome IN ('running', 'waiting');

-- name: next_ready_run_at
-- The earliest future run_at of a ready task: when a claim may find new work.
SELECT min(run_at) AS at FROM tasks WHERE state = 'ready' AND run_at > :now;

-- name: insert_ticket
-- A gate granted a task one ticket (`started` 0: it reserves a start on a rated gate).
INSERT INTO tickets (task_id, gate, started) VALUES (:task_id, :gate, :started);

-- name: unstarted_tickets
-- The tickets of a task whose call start is not stamped yet, by gate.
SELECT gate FROM tickets WHERE task_id = :task_id AND NOT started ORDER BY gate;

-- name: mark_started
-- A ticket's call start is stamped.
UPDATE tickets SET started = 1 WHERE task_id = :task_id AND gate = :gate;

-- name: ticket_counts
-- The tickets a task holds, per gate.
SELECT gate, count(*) AS n FROM tickets WHERE task_id = :task_id GROUP BY gate ORDER BY gate;

-- name: delete_tickets
-- Return every ticket a task holds.
DELETE FROM tickets WHERE task_id = :task_id;

-- name: gate_state
-- One gate's state.
SELECT * FROM gates WHERE name = :name;

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

-- name: lease_poll
-- Hand a waiting task to a poller under a new fencing token.
UPDATE tasks SET worker = :worker, lease_until = :until, lease_token = lease_token + 1
WHERE id = :id
RETURNING *;

-- name: next_poll_at
-- The earliest future poll time of a waiting task.
SELECT min(run_at) AS at FROM tasks WHERE state = 'waiting' AND run_at > :now;

-- name: renew_lease
-- Extend a lease its holder still holds (same token, not expired); no row when it is lost.
UPDATE tasks SET lease_until = :until
WHERE id = :id AND state IN ('running', 'waiting') AND lease_token = :token
  AND lease_until > :now
RETURNING *;

-- name: poll_again
-- The remote job still runs (or its check failed): poll it again at run_at, by any poller.
UPDATE tasks
SET run_at = :run_at, lease_until = NULL, worker = NULL, error_code = coalesce(:code, error_code)
WHERE id = :id;

-- name: mark_succeeded
-- Record a task's success.
UPDATE tasks
SET state = 'succeeded', finished_at = :now, lease_until = NULL, error_code = NULL
WHERE id = :id;

-- name: add_to_ledger
-- Add a succeeded task's units to its group's ledger.
INSERT INTO ledger (grp, kind, units) VALUES (:grp, :kind, :units)
ON CONFLICT (grp, kind) DO UPDATE SET units = units + excluded.units;

-- name: mark_retry
-- Queue a task for another attempt at run_at; a waiting task's remote job has ended in failure.
UPDATE tasks
SET state = 'ready', run_at = :run_at, worker = NULL, lease_until = NULL, remote_id = NULL,
    poll_every = NULL, remote_deadline = NULL, error_code = :code,
    remote_jobs = remote_jobs + (state = 'waiting')
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
-- How many tasks are in each state, of the kinds given (a JSON array) or all.
SELECT state, count(*) AS n FROM tasks
WHERE :kinds IS NULL OR kind IN (SELECT value FROM json_each(:kinds))
GROUP BY state;

-- name: stage_stats
-- Per kind with unfinished tasks (of the kinds given as a JSON array, or all): its tasks per state and when its oldest ready task became ready.
SELECT kind,
       count(*) FILTER (WHERE state = 'pending') AS pending,
       count(*) FILTER (WHERE state = 'ready') AS ready,
       count(*) FILTER (WHERE state = 'running') AS running,
       count(*) FILTER (WHERE state = 'waiting') AS waiting,
       min(coalesce(ready_since, created_at)) FILTER (WHERE state = 'ready') AS oldest_ready
FROM tasks
WHERE state IN ('pending', 'ready', 'running', 'waiting')
  AND (:kinds IS NULL OR kind IN (SELECT value FROM json_each(:kinds)))
GROUP BY kind
ORDER BY kind;

-- name: group_names
-- Every group that names at least one task.
SELECT DISTINCT grp FROM tasks WHERE grp IS NOT NULL;

-- name: group_counts
-- How many tasks of a group are in each state.
SELECT state, count(*) AS n FROM tasks WHERE grp = :grp GROUP BY state;

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
