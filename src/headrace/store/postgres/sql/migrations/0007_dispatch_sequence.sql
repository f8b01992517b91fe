-- No store-wide row that every claim updates: dispatches are numbered by a sequence (drawn
-- without a lock), and the fair-queueing virtual time is the largest tag a flow has dispatched
-- (an index keeps its maximum one lookup away).
CREATE SEQUENCE dispatches AS bigint;

SELECT setval('dispatches', greatest(value, 1)::bigint, value >= 1)
FROM meta WHERE name = 'dispatches';

ALTER TABLE flows ADD COLUMN last_tag double precision NOT NULL DEFAULT 0;

UPDATE flows SET last_tag = (SELECT value FROM meta WHERE name = 'virtual_time');

CREATE INDEX flows_last_tag ON flows (last_tag);

DROP TABLE meta;
