-- Step 1: runs, their instances, and every instance's transition history.
-- Never edit this file once merged: databases in the field were made by it. Add a new step.
-- Times are unix seconds (REAL, UTC by definition); JSON is stored as TEXT.

CREATE TABLE runs (
    run_id           TEXT PRIMARY KEY,
    host             TEXT NOT NULL,
    owner_pid        INTEGER NOT NULL,
    owner_start_time REAL,
    started_at       REAL NOT NULL,
    ended_at         REAL,
    outcome          TEXT CHECK (outcome IS NULL OR outcome IN ('ended', 'failed', 'reaped')),
    config_summary   TEXT NOT NULL DEFAULT '{}'
);

CREATE TABLE instances (
    id             INTEGER PRIMARY KEY,
    run_id         TEXT NOT NULL REFERENCES runs (run_id),
    name           TEXT NOT NULL,
    listen         TEXT NOT NULL,
    upstream       TEXT NOT NULL,
    state          TEXT NOT NULL DEFAULT 'configured' CHECK (
        state IN ('configured', 'building', 'spawned', 'ready', 'draining', 'stopped', 'failed')
    ),
    state_since    REAL NOT NULL,
    pid            INTEGER,
    pid_start_time REAL,
    binary         TEXT,
    log_path       TEXT,
    ready_path     TEXT,
    exit_code      INTEGER,
    error          TEXT,
    UNIQUE (run_id, name)
);

CREATE TABLE transitions (
    id          INTEGER PRIMARY KEY,
    instance_id INTEGER NOT NULL REFERENCES instances (id),
    source      TEXT NOT NULL,
    dest        TEXT NOT NULL,
    event       TEXT NOT NULL,
    at          REAL NOT NULL,
    detail      TEXT
);
