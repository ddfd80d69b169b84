-- Step 4: the query views (issue 22): runs, instances and transitions as a person reads them.
-- Never edit this file once merged. These views are the documented query surface (docs/query.md,
-- `sidecar-fsm query`, Datasette): the tables under them stay ours to change, the views do not.
-- A later step that changes a table recreates the views it touches (DROP VIEW + CREATE VIEW)
-- with the same columns, in the same order; it may add columns at the end or add views, never
-- rename, drop or reorder a column (tests/unit/test_query_views.py holds the column lists).
--
-- Times are ISO-8601 UTC with milliseconds ('2026-12-01T14:03:07.123Z'; NULL when unknown), so
-- they sort as text and read without a conversion. Durations are seconds (REAL), named *_s.
-- "Now" for an instance still running is julianday('now'), not unixepoch(): SQLite 3.38+ only.

-- One row per run.
CREATE VIEW run_summary AS
SELECT
    r.host,
    r.run_id,
    r.owner_pid,
    strftime('%Y-%m-%dT%H:%M:%fZ', r.started_at, 'unixepoch') AS started,
    strftime('%Y-%m-%dT%H:%M:%fZ', r.ended_at, 'unixepoch') AS ended,
    r.outcome,
    r.ended_at - r.started_at AS duration_s,
    (SELECT count(*) FROM instances AS i WHERE i.run_id = r.run_id) AS instances,
    (SELECT count(*) FROM instances AS i WHERE i.run_id = r.run_id AND i.state = 'failed') AS failed,
    (SELECT coalesce(sum(i.restart_count), 0) FROM instances AS i WHERE i.run_id = r.run_id) AS restarts
FROM runs AS r;

-- One row per instance, as of its last transition, with when it first spawned and was first
-- ready, and a coarse reason for a failure (the full text stays in `error`).
CREATE VIEW instance_summary AS
SELECT
    r.host,
    i.run_id,
    i.name,
    i.upstream,
    i.state,
    strftime('%Y-%m-%dT%H:%M:%fZ', i.state_since, 'unixepoch') AS since,
    i.restart_count AS restarts,
    i.exit_code,
    i.error,
    CASE
        WHEN i.state <> 'failed' THEN NULL
        WHEN i.error LIKE 'reaped:%' THEN 'reaped'
        WHEN e.line LIKE '%already in use%' THEN 'listen address in use'
        WHEN e.line LIKE '%not ready after%' THEN 'not ready in time'
        WHEN e.line LIKE '%before it was ready%' THEN 'exited before ready'
        WHEN e.line LIKE '%exited with code % unexpectedly%' THEN 'exited while ready'
        WHEN e.line LIKE '%while draining%' OR e.line LIKE '%shutdown_grace%' THEN 'drain failed'
        WHEN e.line LIKE '%could not be started%' OR e.line LIKE '%cannot create%' THEN 'could not start'
        ELSE 'other'
    END AS reason,
    i.listen,
    i.pid,
    strftime('%Y-%m-%dT%H:%M:%fZ', t.spawned_at, 'unixepoch') AS spawned,
    strftime('%Y-%m-%dT%H:%M:%fZ', t.ready_at, 'unixepoch') AS ready,
    t.ready_at - t.spawned_at AS ready_s,
    CASE WHEN i.state IN ('stopped', 'failed')
        THEN strftime('%Y-%m-%dT%H:%M:%fZ', i.state_since, 'unixepoch') END AS ended,
    CASE WHEN i.state IN ('stopped', 'failed') THEN i.state_since
        ELSE (julianday('now') - 2440587.5) * 86400.0 END - t.spawned_at AS lived_s
FROM instances AS i
JOIN runs AS r ON r.run_id = i.run_id
-- The first line of the error: a log tail follows it, and its words must not pick the reason.
JOIN (
    SELECT id, substr(coalesce(error, ''), 1, instr(coalesce(error, '') || char(10), char(10)) - 1) AS line
    FROM instances
) AS e ON e.id = i.id
LEFT JOIN (
    SELECT
        instance_id,
        min(CASE WHEN dest = 'spawned' THEN at END) AS spawned_at,
        min(CASE WHEN dest = 'ready' THEN at END) AS ready_at
    FROM transitions
    GROUP BY instance_id
) AS t ON t.instance_id = i.id;

-- Every transition, with how long the instance had been in the state it left.
CREATE VIEW transition_log AS
SELECT
    r.host,
    i.run_id,
    i.name AS instance,
    t.source,
    t.dest,
    t.event,
    strftime('%Y-%m-%dT%H:%M:%fZ', t.at, 'unixepoch') AS at,
    t.detail,
    t.at - lag(t.at) OVER (PARTITION BY t.instance_id ORDER BY t.id) AS in_source_s,
    t.id AS seq
FROM transitions AS t
JOIN instances AS i ON i.id = t.instance_id
JOIN runs AS r ON r.run_id = i.run_id;

-- One row per start of a process (the first spawn and each restart) and where it went next:
-- `ready` (then `ready_s` is the time it took), `failed`, `draining`, or NULL while spawned.
CREATE VIEW spawn_attempts AS
SELECT
    host,
    run_id,
    instance,
    attempt,
    strftime('%Y-%m-%dT%H:%M:%fZ', at, 'unixepoch') AS spawned,
    CASE WHEN next_dest = 'ready' THEN strftime('%Y-%m-%dT%H:%M:%fZ', next_at, 'unixepoch') END AS ready,
    CASE WHEN next_dest = 'ready' THEN next_at - at END AS ready_s,
    next_dest AS next_state
FROM (
    SELECT
        r.host,
        i.run_id,
        i.name AS instance,
        t.dest,
        t.at,
        sum(t.dest = 'spawned') OVER w AS attempt,
        lead(t.dest) OVER w AS next_dest,
        lead(t.at) OVER w AS next_at
    FROM transitions AS t
    JOIN instances AS i ON i.id = t.instance_id
    JOIN runs AS r ON r.run_id = i.run_id
    WINDOW w AS (PARTITION BY t.instance_id ORDER BY t.id)
)
WHERE dest = 'spawned';
