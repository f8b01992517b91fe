-- Named leases (`Store.take_lease`): one process at a time does what the name says (`metrics`:
-- it exports the store-wide figures at /metrics) for as long as it renews its lease.
CREATE TABLE leases (
    name   TEXT PRIMARY KEY,
    holder TEXT NOT NULL,
    until  REAL NOT NULL
) WITHOUT ROWID;
