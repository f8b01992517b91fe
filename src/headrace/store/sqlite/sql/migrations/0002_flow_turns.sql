-- Flows take turns within a fair-queueing round: remember when each flow was last served.
ALTER TABLE flows ADD COLUMN served INTEGER NOT NULL DEFAULT 0;
