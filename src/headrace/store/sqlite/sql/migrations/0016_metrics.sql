-- What /metrics needs to count each figure once across processes. Named leases
-- (`Store.take_lease`): one process at a time does what the name says (`metrics`: it exports the
-- store-wide figures) for as long as it renews its lease. And a gate's `spec`: the declaration
-- it was made from (its name, or its template's), so that a process that does not declare it
-- (`headrace serve` beside workers of another app) reports it under that name.
CREATE TABLE leases (
    name   TEXT PRIMARY KEY,
    holder TEXT NOT NULL,
    until  REAL NOT NULL
) WITHOUT ROWID;
ALTER TABLE gates ADD COLUMN spec TEXT;
