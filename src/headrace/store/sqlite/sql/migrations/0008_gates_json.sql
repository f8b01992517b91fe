-- A task's gates as a JSON array (they were space-joined), as every list the store keeps; the
-- store-wide counters exist from the start, as on PostgreSQL.
UPDATE tasks SET gates = (
    WITH RECURSIVE split (rest, name) AS (
        SELECT tasks.gates || ' ', NULL
        UNION ALL
        SELECT substr(rest, instr(rest, ' ') + 1), substr(rest, 1, instr(rest, ' ') - 1)
        FROM split WHERE rest <> ''
    )
    SELECT json_group_array(name) FROM split WHERE name <> ''
);

INSERT OR IGNORE INTO meta (name, value) VALUES ('dispatches', 0), ('virtual_time', 0);
