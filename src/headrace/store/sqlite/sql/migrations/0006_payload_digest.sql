-- A keyed task keeps the digest of the payload it was submitted with, so the key submitted
-- again with another payload is refused (KeyConflict) instead of naming the first task. NULL
-- for a task without a key, and for tasks stored before this version (their keys are not
-- compared).
ALTER TABLE tasks ADD COLUMN payload_digest TEXT;
