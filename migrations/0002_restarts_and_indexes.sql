-- Step 2: the restart policy's attempt counter, and the indexes the inspection queries need.
-- Never edit this file once merged. Every statement keeps existing rows: columns are added
-- with a default, indexes are built from the rows already there.

-- How many times the restart policy brought the instance back (the `restart` event sets it).
ALTER TABLE instances ADD COLUMN restart_count INTEGER NOT NULL DEFAULT 0;

-- One instance's history, oldest first, without scanning every run's transitions.
CREATE INDEX transitions_by_instance ON transitions (instance_id, id);

-- `status` lists live runs newest first; finished runs pile up for days, live ones are few,
-- so a partial index keeps that lookup independent of the history's length.
CREATE INDEX runs_live ON runs (started_at) WHERE ended_at IS NULL;
CREATE INDEX runs_by_start ON runs (started_at);

-- The launcher refuses a listen address a live instance already holds. A plain index on listen:
-- an index that mentions `state` (by column or in a partial WHERE) is rewritten by every
-- transition, and that work sits inside the write lock every launcher on the host waits for.
-- For the same reason there is no index on state: lookups by state scan the instance table,
-- which holds a few rows per run.
CREATE INDEX instances_by_listen ON instances (listen);
