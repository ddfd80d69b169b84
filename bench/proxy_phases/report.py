"""The proxy benchmark's report: results/proxy.md (the table, how each figure was measured, the
profiles) and the README's bench:proxy section (the table, the command, the conditions).

Owns the words around the figures. Hand-written notes below ``NOTES_MARKER`` in the report
survive a rerun: the figures are regenerated, the reading of them is not. Must not measure
anything, and must write the report atomically (a reader never sees half of it).
"""

from __future__ import annotations

import contextlib
import os
import platform
import time
from pathlib import Path
from typing import Any

from bench.harness.tables import REPO, tool_version
from bench.harness.targets import INSTALL_HINT
from bench.proxy_phases.table import render_md

NOTES_MARKER = "<!-- notes: kept across runs -->"


def readme_summary(r: dict[str, Any], rows: list[list[str]], command: str, report: Path) -> str:
    """The README's proxy section: the table, the command and the conditions; details in ``report``."""
    try:  # the link is read from bench/README.md, so relative to bench/
        where = report.resolve().relative_to(REPO / "bench")
    except ValueError:
        where = report
    return "\n".join(
        [
            f"`{command}` ({time.strftime('%Y-%m-%d %H:%M %Z')}, {r['wall_s']:.0f} s, go/ at"
            f" {r.get('go_rev', '?')}; load average {r['load_before']} before, {r['load_after']} after;"
            f" HAProxy nbthread {r.get('haproxy_threads', '?')}, the sidecar's GOMAXPROCS)",
            "",
            render_md(rows),
            "",
            f"Method, per-repetition ranges, the profiles and the notes (paired front-end runs, what"
            f" missed its target and why): [{where}]({where}).",
        ]
    )


def write_report(path: Path, r: dict[str, Any], rows: list[list[str]], command: str, go: str) -> None:
    cpu_model = next(
        (
            ln.split(":", 1)[1].strip()
            for ln in Path("/proc/cpuinfo").read_text().splitlines()
            if ln.startswith("model name")
        ),
        "?",
    )
    lines = [
        "# bench/proxy.py figures",
        "",
        f"Run {time.strftime('%Y-%m-%d %H:%M:%S %Z')} by `{command}` (from the repo root;"
        f" {r['wall_s']:.0f} s), go/ at {r.get('go_rev', '?')}.",
        f"Machine: {os.cpu_count()} CPUs ({cpu_model}), {platform.system()} {platform.release()};"
        f" load average before/after: {r['load_before']} / {r['load_after']} (shared machine: other"
        " sessions ran too, so absolute figures are noisy; the ratios come from interleaved runs).",
        f"Tools: {tool_version([go, 'version'])}; {tool_version(['haproxy', '-v'])};"
        f" {tool_version(['wrk', '-v'])} (`{INSTALL_HINT}`). The origin is bench/origin (Go, standard"
        " library), built through the product's build cache.",
        "",
        render_md(rows),
        "",
        "How it was measured:",
    ]
    for part in (
        _throughput_method,
        _scale_method,
        _scale_metrics_method,
        _goaway_method,
        _start_method,
        _longwait_method,
        _profile_sections,
    ):
        lines += part(r)
    if r.get("failed_phases"):
        lines += ["", "Phases that failed to run: " + "; ".join(r["failed_phases"])]
    # Hand-written notes below NOTES_MARKER survive a re-run: the figures are regenerated, the
    # reading of them is not.
    notes = ""
    with contextlib.suppress(FileNotFoundError):
        old = path.read_text()
        if NOTES_MARKER in old:
            notes = old[old.index(NOTES_MARKER) :]
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("\n".join(lines) + "\n" + ("\n" + notes if notes else ""))
    tmp.replace(path)  # a reader (the lead, the proxy's author) never sees half a report


def _throughput_method(r: dict[str, Any]) -> list[str]:
    tp = r.get("throughput")
    if not tp:
        return []
    lines: list[str] = []
    cs = sorted(tp["sidecar"])
    ck = 16 if 16 in cs else cs[len(cs) // 2]
    oc = {t: tp[t][ck]["origin_cpu"] for t in tp}

    def rng(key: str) -> str:
        s16 = tp["sidecar"][ck]
        return f"{s16.get(key + '_ratio_min', 0):.2f}-{s16.get(key + '_ratio_max', 0):.2f}x"

    lines += [
        f"- Throughput: wrk, HTTP/1.1 keep-alive, GET / (3-byte body), {r['reps']} x {r['duration']:g} s"
        f" per cell, median shown; order of targets rotated each repetition. `sidecar` and `haproxy`"
        f" speak h2 over TLS to the same Go origin (MaxConcurrentStreams 100), `direct` is that origin's"
        " own HTTP/1.1 listener. CPU us/req = utime+stime of the proxy process (/proc/<pid>/stat) /"
        " requests."
        f" HAProxy: nbthread {r['haproxy_threads']} (= the sidecar's GOMAXPROCS), `http-reuse always`,"
        " `ssl verify required ca-file`,"
        f" `alpn h2`. Ratio = sidecar/haproxy, the median of the {r['reps']} per-repetition ratios (runs"
        f" seconds apart); at c={ck} they ranged {rng('rps')} (req/s), {rng('p99_ms')} (p99),"
        f" {rng('cpu_us')} (CPU). The origin is not the bottleneck: at c={ck} it used"
        f" {oc['sidecar'] * 100:.0f} % / {oc['haproxy'] * 100:.0f} % / {oc['direct'] * 100:.0f} % of one"
        " core (sidecar / haproxy / direct runs).",
    ]
    return lines


def _scale_method(r: dict[str, Any]) -> list[str]:
    sc = r.get("scale")
    if not sc:
        return []
    lines: list[str] = []
    lines.append(
        f"- Scale: {sc['n']} asyncio clients, one HTTP/1.1 connection each, all opened first,"
        " then every GET /wait?first_byte=5s written in one pass; origin behind a relay that drops"
        f" connections idle 3 s; sidecar `-ping-interval 1s`. Wall {sc['wall_s']:.1f} s, latency"
        " (write to last byte) p50"
        f" {sc['p50_s']:.2f} s, p99 {sc['p99_s']:.2f} s, sidecar CPU {sc['cpu_s']:.2f} s, relay drops"
        f" {sc['relay_drops']}, errors {sc['errors'] or 'none'}. Peak RSS = VmHWM of the sidecar"
        f" ({sc['peak_rss_mib'] * 1024 / sc['n']:.0f} KiB per request in flight). Handshakes ="
        " ClientHellos the origin saw; used conns = TLS connections that carried >= 1 request."
    )
    return lines


def _scale_metrics_method(r: dict[str, Any]) -> list[str]:
    sm = r.get("scale-metrics")
    if not sm:
        return []
    lines: list[str] = []
    d, a = sm["during"], sm["after"]
    scraped = (
        f"Scrapes started once all {sm['n']} were seen in flight, 0.5 s apart, connect to last byte"
        f" (urllib, a fresh connection each): {', '.join(f'{x:.2f}' for x in d['scrape_ms'])} ms;"
        f" the first showed {d['in_flight']:.0f} in flight, the oldest {d['oldest_age_s']:.2f} s old."
        f" The scrape that first saw all {sm['n']} had been started while the proxy was still"
        f" taking the last requests in and took {d['intake_scrape_ms']:.2f} ms. An idle sidecar"
        " (metrics on, no request) scraped right after each: "
        + ", ".join(f"{x:.2f}" for x in d["control_ms"])
        + " ms, the machine's own share of those times."
        if d.get("reached")
        else f"/metrics never showed all {sm['n']} in flight (at most {d.get('in_flight_max', 0):.0f})."
    )
    lines.append(
        f"- Scale, metrics on: as the scale phase, {sm['n']} waits of {sm['wait']}, sidecar"
        " `-ping-interval 1s -metrics-listen 127.0.0.1:0`; every client connection opened first"
        " (256 connects at a time), then every request written in one pass, so the proxy holds"
        f" all at once. Wall {sm['wall_s']:.1f} s, latency (write to last byte) p50 {sm['p50_s']:.2f} s,"
        f" p99 {sm['p99_s']:.2f} s, sidecar CPU {sm['cpu_s']:.2f} s, relay drops {sm['relay_drops']},"
        f" errors {sm['errors'] or 'none'}; peak RSS {sm['peak_rss_mib'] * 1024 / sm['n']:.0f} KiB per"
        f" request in flight. /metrics polled every 50 ms during the wait and parsed by"
        f" prometheus-client's parser. {scraped} After the last answer: {a['requests']:.0f} requests"
        f" counted, {a['responses_200']:.0f} answered 200, {a['in_flight']:.0f} in flight, upstream"
        f" dials {a['dials_ok']:.0f} ok / {a['dials_error']:.0f} failed (the start-up dial included:"
        f" its connection is pooled and carries requests), PINGs {a['pings_sent']:.0f} sent /"
        f" {a['ping_acks']:.0f} acknowledged."
    )
    return lines


def _goaway_method(r: dict[str, Any]) -> list[str]:
    ga = r.get("goaway")
    if not ga:
        return []
    lines: list[str] = []
    s, h = ga["sidecar"], ga["haproxy"]
    lines.append(
        f"- GOAWAY: origin serves each TLS connection with its own http.Server and calls Shutdown() after"
        f" the 5th request (graceful GOAWAY, NO_ERROR, last-stream-id = highest seen; bench/origin's"
        " own test checks that it is graceful)."
        f" After one warm-up request, 50 keep-alive asyncio connections, 1000 POST /echo of 1 KiB random"
        f" bytes,"
        f" body compared; {s['n'] // 1000} runs per proxy, fresh processes each. sidecar:"
        f" {s['goaways']} GOAWAYs, p99 per run {s['p99s']} s, p50 {s['p50_s'] * 1000:.1f} ms,"
        f" errors {s['errors'] or 'none'}, duplicates at the origin {s['dup']}; haproxy: p99 per"
        f" run {h['p99s']} s (of the requests that succeeded), errors {h['errors'] or 'none'}"
        " (502s and client connections closed without a response: requests caught by a GOAWAY"
        " were not re-sent)."
        + (
            f" The same load on the sidecar without GOAWAY: p99 per run {ga['calm']['p99s']} s, median"
            f" wall {ga['calm']['wall_s']:.2f} s per 1000 (with GOAWAY: {s['wall_s']:.2f} s,"
            f" {s['handshakes']} upstream TLS handshakes in all)."
            if "calm" in ga
            else ""
        )
    )
    return lines


def _start_method(r: dict[str, Any]) -> list[str]:
    st = r.get("start")
    if not st:
        return []
    lines: list[str] = []
    lines.append(
        f"- Start: {st['starts']} starts; time from just before fork/exec (Python Popen) to the ready"
        f" file's rename seen by inotify (p90 {st['exec_to_ready_p90_ms']:.2f} ms); from Popen's return"
        f" (exec done) to the ready file: median {st['exec_done_to_ready_ms']:.2f} ms, of which the"
        f" sidecar's threads spent {st.get('start_cpu_ms', 0):.2f} ms on a CPU and"
        f" {st.get('start_runq_ms', 0):.2f} ms waiting for one (schedstat, summed over threads; the"
        f" machine is shared). Floor by the same measure: an empty Go program that only writes a"
        f" file by temp + rename takes {st.get('floor_ms', float('nan')):.2f} ms (median)."
        f" The first request after ready (on the connection the start-up dial pooled) took"
        f" {st.get('first_request_ms', 0):.1f} ms (median of 3). Idle RSS = VmRSS 1 s after ready, no"
        " request (median of 3)."
    )
    return lines


def _longwait_method(r: dict[str, Any]) -> list[str]:
    lw = r.get("longwait")
    if not lw:
        return []
    lines: list[str] = []
    lines.append(
        f"- Long wait: {lw['sidecar']['n']} concurrent GET /wait?first_byte={3 * r['longwait_idle']:g}s"
        f" through a relay dropping connections idle {r['longwait_idle']:g} s; sidecar `-ping-interval"
        f" {r['longwait_idle'] * 0.3:g}s`. `direct` = HTTP/1.1 over TLS through the relay (the control,"
        f" must fail); lost/duplicated from the origin's per-id counters. Relay drops: sidecar"
        f" {lw['sidecar']['relay_drops']}, haproxy {lw['haproxy']['relay_drops']}, direct"
        f" {lw['direct']['relay_drops']}."
    )
    return lines


def _profile_sections(r: dict[str, Any]) -> list[str]:
    pr = r.get("profile")
    if not pr:
        return []
    lines: list[str] = []
    lines += [
        "",
        f"## Where the time goes (sidecar, wrk c=16, {pr['total_s']:.1f} CPU s sampled)",
        "",
        "pprof CPU profile of a build of go/ plus net/http/pprof (built from a copy; go/ unchanged),"
        " flat time grouped by package:",
        "",
    ]
    lines += [f"- {label}: {pct:.0f} %" for label, pct in pr["buckets"]]
    lines += ["", "Top functions (flat):", ""]
    lines += [f"- {pct:.1f} % {name}" for name, pct in pr["flat_top"]]
    lines += ["", "Top functions (cumulative, runtime and syscall wrappers left out):", ""]
    lines += [f"- {pct:.1f} % {name}" for name, pct in pr["cum_top"]]
    mem = pr.get("mem")
    if mem and "HeapInuse" in mem:
        mib = 1 << 20
        lines += [
            "",
            f"## Where the memory goes ({mem['n']} requests in flight, sidecar with pprof, no relay)",
            "",
            f"3.5 s into {mem['n']} concurrent 5-s waits ({mem['ok']}/{mem['n']} ok): VmRSS"
            f" {mem['rss_mib']:.1f} MiB, Go Sys {mem['Sys'] / mib:.1f} MiB, heap in use"
            f" {mem['HeapInuse'] / mib:.1f} MiB (live objects {mem['HeapAlloc'] / mib:.1f} MiB),"
            f" goroutine stacks {mem['StackInuse'] / mib:.1f} MiB for {mem['goroutines']} goroutines"
            f" ({mem['goroutines'] / max(1, mem['n']):.1f} per request), {mem['NumGC']} GCs so far."
            " Goroutines by entry function: "
            + ", ".join(f"{c} {e}" for c, e in mem.get("goroutine_kinds", []))
            + ".",
            "",
            "Heap in use by allocation site (flat, cum):",
            "",
            "```",
            *mem["heap_top"],
            "```",
        ]
    if pr["cum_main"]:
        lines += ["", "The sidecar's own functions (cumulative):", ""]
        lines += [f"- {pct:.1f} % {name}" for name, pct in pr["cum_main"]]
    return lines
