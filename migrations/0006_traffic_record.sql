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
-- at the end (a version-1 record has none: 0). One sum per figure: every reader of the figures
-- (history, status --all, query) reads this view.
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
    p.upstream_errors,
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
    p.upstream_errors_dial,
    p.upstream_errors_tls,
    p.upstream_errors_alpn,
    p.upstream_errors_ping_timeout,
    p.upstream_errors_reset,
    p.upstream_errors_other,
    p.responses_other,
    p.rotations,
    p.final,
    p.processes,
    p.nvcf_followed,
    p.nvcf_polls,
    p.nvcf_budget_exceeded
FROM instances AS i
JOIN runs AS r ON r.run_id = i.run_id
LEFT JOIN traffic_quantiles AS q ON q.instance_id = i.id
LEFT JOIN (
    SELECT
        instance_id,
        sum(json_extract(record, '$.requests')) AS requests,
        sum(json_extract(record, '$.responses_2xx')) AS responses_2xx,
        sum(json_extract(record, '$.responses_4xx')) AS responses_4xx,
        sum(json_extract(record, '$.responses_5xx')) AS responses_5xx,
        sum(json_extract(record, '$.responses_502')) AS responses_502,
        sum(json_extract(record, '$.responses_other')) AS responses_other,
        sum(json_extract(record, '$.client_disconnects')) AS client_disconnects,
        -- Every kind the record has, so a kind added to the proxy is counted here unnamed.
        sum((SELECT sum(e.value) FROM json_each(record, '$.upstream_errors') AS e)) AS upstream_errors,
        sum(json_extract(record, '$.upstream_errors.dial')) AS upstream_errors_dial,
        sum(json_extract(record, '$.upstream_errors.tls')) AS upstream_errors_tls,
        sum(json_extract(record, '$.upstream_errors.alpn')) AS upstream_errors_alpn,
        sum(json_extract(record, '$.upstream_errors.ping_timeout')) AS upstream_errors_ping_timeout,
        sum(json_extract(record, '$.upstream_errors.reset')) AS upstream_errors_reset,
        sum(json_extract(record, '$.upstream_errors.other')) AS upstream_errors_other,
        sum(json_extract(record, '$.pings_sent')) AS pings_sent,
        sum(json_extract(record, '$.ping_acks')) AS ping_acks,
        sum(json_extract(record, '$.goaways')) AS goaways,
        sum(json_extract(record, '$.retries')) AS retries,
        sum(json_extract(record, '$.rotations')) AS rotations,
        sum(coalesce(json_extract(record, '$.nvcf_followed'), 0)) AS nvcf_followed,
        sum(coalesce(json_extract(record, '$.nvcf_polls'), 0)) AS nvcf_polls,
        sum(coalesce(json_extract(record, '$.nvcf_budget_exceeded'), 0)) AS nvcf_budget_exceeded,
        sum(json_extract(record, '$.ttfb_seconds.count')) AS ttfb_count,
        sum(json_extract(record, '$.duration_seconds.count')) AS duration_count,
        max(json_extract(record, '$.duration_max_s') + 0.0) AS duration_max_s,
        max(as_of) AS as_of,
        min(json_extract(record, '$.final')) AS final,
        count(*) AS processes
    FROM traffic
    GROUP BY instance_id
) AS p ON p.instance_id = i.id;
