-- Step 5: what each proxy process carried (issue 28), and the documented view over it.
-- Never edit this file once merged. The proxy writes its own figures beside its log (the
-- traffic file, version 1); the launcher imports them (check(), the supervise loop, stop,
-- restart, reap). One row per (instance, proxy pid): a restarted instance's processes each keep
-- their row and the view sums them, so a re-import of the same file never counts twice and a
-- restart's figures add up. A row is replaced only by figures of the same process with a later
-- `as_of` (Store.record_traffic).
--
-- Times are unix seconds (REAL, UTC), as in every table. Both histograms are JSON text
-- `{"buckets": [[le, n], ..., [null, n]], "sum": s, "count": n}`: each bucket's upper bound
-- beside its count (per bucket, not cumulative; the last, null, is +Inf), as the importer turns
-- the file's `bounds` and `counts` into. The bounds travel with the counts, so nothing here
-- hard-codes the proxy's buckets.

CREATE TABLE traffic (
    instance_id        INTEGER NOT NULL REFERENCES instances (id),
    pid                INTEGER NOT NULL,
    started_at         REAL NOT NULL,
    as_of              REAL NOT NULL,
    final              INTEGER NOT NULL CHECK (final IN (0, 1)),
    requests           INTEGER NOT NULL,
    responses_2xx      INTEGER NOT NULL,
    responses_4xx      INTEGER NOT NULL,
    responses_5xx      INTEGER NOT NULL,
    responses_502      INTEGER NOT NULL,
    responses_other    INTEGER NOT NULL,
    client_disconnects INTEGER NOT NULL,
    errors_dial        INTEGER NOT NULL,
    errors_tls         INTEGER NOT NULL,
    errors_alpn        INTEGER NOT NULL,
    errors_ping_timeout INTEGER NOT NULL,
    errors_reset       INTEGER NOT NULL,
    errors_other       INTEGER NOT NULL,
    pings_sent         INTEGER NOT NULL,
    ping_acks          INTEGER NOT NULL,
    goaways            INTEGER NOT NULL,
    retries            INTEGER NOT NULL,
    rotations          INTEGER NOT NULL,
    ttfb_seconds       TEXT NOT NULL CHECK (json_valid(ttfb_seconds)),
    duration_seconds   TEXT NOT NULL CHECK (json_valid(duration_seconds)),
    duration_max_s     REAL NOT NULL,
    PRIMARY KEY (instance_id, pid)
);

-- Each instance's percentiles, its processes' buckets added together, as Store.record_traffic
-- last computed them (in the same transaction as the figures they come from): the upper bound
-- (`le`) of the first bucket whose cumulative count reaches the quantile's rank (nearest rank:
-- the q-quantile of n requests is the ceil(q*n)-th smallest); NULL when the rank falls in the
-- +Inf bucket (traffic_summary then reads `duration_max_s`) or nothing was counted. Kept as a
-- table, one instance at a time, so that reading every host's traffic_summary never re-sorts
-- every bucket of every instance (that cost seconds per thousand instances).
CREATE TABLE traffic_quantiles (
    instance_id    INTEGER PRIMARY KEY REFERENCES instances (id),
    ttfb_p50_s     REAL,
    ttfb_p90_s     REAL,
    ttfb_p99_s     REAL,
    duration_p50_s REAL,
    duration_p90_s REAL,
    duration_p99_s REAL
);

-- One row per instance of a run (an instance whose proxy never wrote figures, e.g. one run
-- with NeMo Gym's binary, has NULL figures and a NULL as_of). Counters are the sums over the
-- instance's processes; percentiles as traffic_quantiles says, a rank in the +Inf bucket
-- (which has no upper bound) reading `duration_max_s`, which no request's wait or duration
-- exceeded. `duration_max_s` is exact.
CREATE VIEW traffic_summary AS
SELECT
    r.host,
    i.run_id,
    i.name,
    i.upstream,
    p.requests,
    p.responses_2xx,
    p.responses_4xx,
    p.responses_5xx,
    p.responses_502,
    p.client_disconnects,
    p.errors_dial + p.errors_tls + p.errors_alpn + p.errors_ping_timeout + p.errors_reset
        + p.errors_other AS upstream_errors,
    p.pings_sent,
    p.ping_acks,
    p.goaways,
    p.retries,
    CASE WHEN p.ttfb_count > 0 THEN coalesce(q.ttfb_p50_s, p.duration_max_s) END AS ttfb_p50_s,
    CASE WHEN p.ttfb_count > 0 THEN coalesce(q.ttfb_p90_s, p.duration_max_s) END AS ttfb_p90_s,
    CASE WHEN p.ttfb_count > 0 THEN coalesce(q.ttfb_p99_s, p.duration_max_s) END AS ttfb_p99_s,
    CASE WHEN p.duration_count > 0 THEN coalesce(q.duration_p50_s, p.duration_max_s) END AS duration_p50_s,
    CASE WHEN p.duration_count > 0 THEN coalesce(q.duration_p90_s, p.duration_max_s) END AS duration_p90_s,
    CASE WHEN p.duration_count > 0 THEN coalesce(q.duration_p99_s, p.duration_max_s) END AS duration_p99_s,
    p.duration_max_s,
    strftime('%Y-%m-%dT%H:%M:%fZ', p.as_of, 'unixepoch') AS as_of,
    p.errors_dial AS upstream_errors_dial,
    p.errors_tls AS upstream_errors_tls,
    p.errors_alpn AS upstream_errors_alpn,
    p.errors_ping_timeout AS upstream_errors_ping_timeout,
    p.errors_reset AS upstream_errors_reset,
    p.errors_other AS upstream_errors_other,
    p.responses_other,
    p.rotations,
    p.final,
    p.processes
FROM instances AS i
JOIN runs AS r ON r.run_id = i.run_id
LEFT JOIN traffic_quantiles AS q ON q.instance_id = i.id
LEFT JOIN (
    SELECT
        instance_id,
        sum(requests) AS requests,
        sum(responses_2xx) AS responses_2xx,
        sum(responses_4xx) AS responses_4xx,
        sum(responses_5xx) AS responses_5xx,
        sum(responses_502) AS responses_502,
        sum(responses_other) AS responses_other,
        sum(client_disconnects) AS client_disconnects,
        sum(errors_dial) AS errors_dial,
        sum(errors_tls) AS errors_tls,
        sum(errors_alpn) AS errors_alpn,
        sum(errors_ping_timeout) AS errors_ping_timeout,
        sum(errors_reset) AS errors_reset,
        sum(errors_other) AS errors_other,
        sum(pings_sent) AS pings_sent,
        sum(ping_acks) AS ping_acks,
        sum(goaways) AS goaways,
        sum(retries) AS retries,
        sum(rotations) AS rotations,
        sum(json_extract(ttfb_seconds, '$.count')) AS ttfb_count,
        sum(json_extract(duration_seconds, '$.count')) AS duration_count,
        max(duration_max_s) AS duration_max_s,
        max(as_of) AS as_of,
        min(final) AS final,
        count(*) AS processes
    FROM traffic
    GROUP BY instance_id
) AS p ON p.instance_id = i.id;
