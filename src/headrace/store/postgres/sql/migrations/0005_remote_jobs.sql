-- How many remote jobs a task submitted that ended without success: the next job it submits is
-- a new one (a new idempotency key for the vendor); one whose outcome is unknown is not.
ALTER TABLE tasks ADD COLUMN remote_jobs integer NOT NULL DEFAULT 0;
