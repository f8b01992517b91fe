-- The bytes a task's attempt may use at its peak, charged against the memory budget of the
-- worker that claims it (0: not charged).
ALTER TABLE tasks ADD COLUMN memory INTEGER NOT NULL DEFAULT 0;
