-- Step 6: each proxy process's traffic record kept as the proxy wrote it (issue 37).
-- Never edit this file once merged. The record (go/traffic.go, versions 1 and 2) is the schema:
-- `traffic` keeps one JSON document per (instance, proxy pid), checked by the importer (only
-- numbers and the two times; see run/traffic.py) and otherwise untouched, and traffic_summary
-- below is the only other place a counter is named. A new counter in the record costs one line
-- here (a new step recreating the view) and its docs; the rows need nothing.
--
-- `as_of` (unix seconds, REAL) is kept beside the document because it orders the figures of one
-- process: a row is replaced only by a record with a later one (Store.record_traffic). The
-- histograms are the file's own `{"bounds": [...], "counts": [...], "sum", "count"}` (per-bucket
-- counts, one more count than bounds: the last is +Inf); traffic_quantiles is unchanged and
-- still computed by the store from them.
--
-- The rows of step 5 are turned into the documents their version-1 files held (times to the
-- millisecond, as the proxy writes them), so every figure reads as before.

DROP VIEW traffic_summary;

ALTER TABLE traffic RENAME TO traffic_step5;

CREATE TABLE traffic (
    instance_id INTEGER NOT NULL REFERENCES instances (id),
    pid         INTEGER NOT NULL,
    as_of       REAL NOT NULL,
    record      TEXT NOT NULL CHECK (json_valid(record)),
    PRIMARY KEY (instance_id, pid)
);

INSERT INTO traffic (instance_id, pid, as_of, record)
SELECT
    instance_id,
    pid,
    as_of,
    json_object(
        'version', 1,
        'pid', pid,
        'started_at', strftime('%Y-%m-%dT%H:%M:%fZ', started_at, 'unixepoch'),
        'as_of', strftime('%Y-%m-%dT%H:%M:%fZ', as_of, 'unixepoch'),
        'final', json(CASE WHEN final THEN 'true' ELSE 'false' END),
        'requests', requests,
        'responses_2xx', responses_2xx,
        'responses_4xx', responses_4xx,
        'responses_5xx', responses_5xx,
        'responses_502', responses_502,
        'responses_other', responses_other,
        'client_disconnects', client_disconnects,
        'upstream_errors', json_object(
            'dial', errors_dial, 'tls', errors_tls, 'alpn', errors_alpn,
            'ping_timeout', errors_ping_timeout, 'reset', errors_reset, 'other', errors_other
        ),
        'pings_sent', pings_sent,
        'ping_acks', ping_acks,
        'goaways', goaways,
        'retries', retries,
        'rotations', rotations,
        -- Step 5 kept each bucket as [le, n] (le null: +Inf); the file has them as two lists.
        'ttfb_seconds', json_object(
            'bounds', json((SELECT json_group_array(json_extract(b.value, '$[0]'))
                FROM json_each(ttfb_seconds, '$.buckets') AS b
                WHERE json_extract(b.value, '$[0]') IS NOT NULL)),
            'counts', json((SELECT json_group_array(json_extract(b.value, '$[1]'))
                FROM json_each(ttfb_seconds, '$.buckets') AS b)),
            'sum', json_extract(ttfb_seconds, '$.sum'),
            'count', json_extract(ttfb_seconds, '$.count')
        ),
        'duration_seconds', json_object(
            'bounds', json((SELECT json_group_array(json_extract(b.value, '$[0]'))
                FROM json_each(duration_seconds, '$.buckets') AS b
                WHERE json_extract(b.value, '$[0]') IS NOT NULL)),
            'counts', json((SELECT json_group_array(json_extract(b.value, '$[1]'))
                FROM json_each(duration_seconds, '$.buckets') AS b)),
            'sum', json_extract(duration_seconds, '$.sum'),
            'count', json_extract(duration_seconds, '$.count')
        ),
        'duration_max_s', duration_max_s
    )
FROM traffic_step5;

DROP TABLE traffic_step5;

-- As step 5's, column for column, read from the documents, with the NVCF counters of version 2
-- at the end. One line per figure, one sum each: every reader of the figures (history,
-- status --all, query) reads this view. Grouped by the instance's run as well as its id, so a
-- reader's `WHERE run_id = ?` reaches the rows before they are summed (SQLite pushes a term on a
-- grouping column down): `history` parses its run's documents only, not every one in the file.
CREATE VIEW traffic_summary AS
SELECT
    r.host,
    i.run_id,
    i.name,
    i.upstream,
    sum(json_extract(t.record, '$.requests')) AS requests,
    sum(json_extract(t.record, '$.responses_2xx')) AS responses_2xx,
    sum(json_extract(t.record, '$.responses_4xx')) AS responses_4xx,
    sum(json_extract(t.record, '$.responses_5xx')) AS responses_5xx,
    sum(json_extract(t.record, '$.responses_502')) AS responses_502,
    sum(json_extract(t.record, '$.client_disconnects')) AS client_disconnects,
    -- Every kind the record has, so a kind added to the proxy is counted here unnamed.
    sum((SELECT sum(e.value) FROM json_each(t.record, '$.upstream_errors') AS e)) AS upstream_errors,
    sum(json_extract(t.record, '$.pings_sent')) AS pings_sent,
    sum(json_extract(t.record, '$.ping_acks')) AS ping_acks,
    sum(json_extract(t.record, '$.goaways')) AS goaways,
    sum(json_extract(t.record, '$.retries')) AS retries,
    -- A percentile past the last bound (NULL in traffic_quantiles) reads the exact maximum, and
    -- none reads above it: a bucket's upper bound can overshoot (p99 30s of requests that all
    -- took 10s), and no request's time to first byte exceeds its duration.
    CASE WHEN sum(json_extract(t.record, '$.ttfb_seconds.count')) > 0
        THEN min(coalesce(q.ttfb_p50_s, max(json_extract(t.record, '$.duration_max_s') + 0.0)), max(json_extract(t.record, '$.duration_max_s') + 0.0)) END AS ttfb_p50_s,
    CASE WHEN sum(json_extract(t.record, '$.ttfb_seconds.count')) > 0
        THEN min(coalesce(q.ttfb_p90_s, max(json_extract(t.record, '$.duration_max_s') + 0.0)), max(json_extract(t.record, '$.duration_max_s') + 0.0)) END AS ttfb_p90_s,
    CASE WHEN sum(json_extract(t.record, '$.ttfb_seconds.count')) > 0
        THEN min(coalesce(q.ttfb_p99_s, max(json_extract(t.record, '$.duration_max_s') + 0.0)), max(json_extract(t.record, '$.duration_max_s') + 0.0)) END AS ttfb_p99_s,
    CASE WHEN sum(json_extract(t.record, '$.duration_seconds.count')) > 0
        THEN min(coalesce(q.duration_p50_s, max(json_extract(t.record, '$.duration_max_s') + 0.0)), max(json_extract(t.record, '$.duration_max_s') + 0.0)) END AS duration_p50_s,
    CASE WHEN sum(json_extract(t.record, '$.duration_seconds.count')) > 0
        THEN min(coalesce(q.duration_p90_s, max(json_extract(t.record, '$.duration_max_s') + 0.0)), max(json_extract(t.record, '$.duration_max_s') + 0.0)) END AS duration_p90_s,
    CASE WHEN sum(json_extract(t.record, '$.duration_seconds.count')) > 0
        THEN min(coalesce(q.duration_p99_s, max(json_extract(t.record, '$.duration_max_s') + 0.0)), max(json_extract(t.record, '$.duration_max_s') + 0.0)) END AS duration_p99_s,
    max(json_extract(t.record, '$.duration_max_s') + 0.0) AS duration_max_s,
    strftime('%Y-%m-%dT%H:%M:%fZ', max(t.as_of), 'unixepoch') AS as_of,
    sum(json_extract(t.record, '$.upstream_errors.dial')) AS upstream_errors_dial,
    sum(json_extract(t.record, '$.upstream_errors.tls')) AS upstream_errors_tls,
    sum(json_extract(t.record, '$.upstream_errors.alpn')) AS upstream_errors_alpn,
    sum(json_extract(t.record, '$.upstream_errors.ping_timeout')) AS upstream_errors_ping_timeout,
    sum(json_extract(t.record, '$.upstream_errors.reset')) AS upstream_errors_reset,
    sum(json_extract(t.record, '$.upstream_errors.other')) AS upstream_errors_other,
    sum(json_extract(t.record, '$.responses_other')) AS responses_other,
    sum(json_extract(t.record, '$.rotations')) AS rotations,
    min(json_extract(t.record, '$.final')) AS final,
    nullif(count(t.pid), 0) AS processes,
    -- Not in a version-1 record: 0 there (NULL only where the instance has no record at all).
    sum(CASE WHEN t.pid IS NOT NULL THEN coalesce(json_extract(t.record, '$.nvcf_followed'), 0) END)
        AS nvcf_followed,
    sum(CASE WHEN t.pid IS NOT NULL THEN coalesce(json_extract(t.record, '$.nvcf_polls'), 0) END)
        AS nvcf_polls,
    sum(CASE WHEN t.pid IS NOT NULL THEN coalesce(json_extract(t.record, '$.nvcf_budget_exceeded'), 0) END)
        AS nvcf_budget_exceeded
FROM instances AS i
JOIN runs AS r ON r.run_id = i.run_id
LEFT JOIN traffic AS t ON t.instance_id = i.id
LEFT JOIN traffic_quantiles AS q ON q.instance_id = i.id
GROUP BY i.id, i.run_id;
