-- Named leases (`Store.take_lease`): one process at a time does what the name says (`metrics`:
-- it exports the store-wide figures at /metrics) for as long as it renews its lease.
CREATE TABLE leases (
    name   text             PRIMARY KEY,
    holder text             NOT NULL,
    until  double precision NOT NULL
);
