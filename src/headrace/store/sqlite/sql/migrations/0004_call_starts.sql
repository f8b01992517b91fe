-- A ticket on a rated gate reserves a start until its call is stamped (or its attempt ends):
-- the gate counts the reservations, each ticket says whether its start is stamped. Tickets
-- granted before this migration had their start stamped with the grant.
ALTER TABLE gates ADD COLUMN unstarted INTEGER NOT NULL DEFAULT 0;
ALTER TABLE tickets ADD COLUMN started INTEGER NOT NULL DEFAULT 1;
