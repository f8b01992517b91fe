-- Dead letters can be redriven: attempts count from the last redrive.
ALTER TABLE tasks ADD COLUMN attempt_base INTEGER NOT NULL DEFAULT 0;
