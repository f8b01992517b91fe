-- A task that carries an item on to its next stage is tagged, and takes its turns, in its flow's
-- lane for that stage (policy/fairness.py); NULL: its lane is its flow.
ALTER TABLE tasks ADD COLUMN lane TEXT;
