-- Step 3: where each instance's proxy serves /metrics (issue 12).
-- Never edit this file once merged. Nullable with no default: rows from before this step, an
-- instance started without `metrics`, and a binary without -metrics-listen all read NULL,
-- meaning "no metrics listener known". The `ready` event records it (host:port from the ready
-- file), alongside `listen`.
ALTER TABLE instances ADD COLUMN metrics TEXT;
