"""What the start's upstream check costs a start of 4 instances whose upstreams answer (issue 18).

Owns this one comparison: ``start_h2_ping_sidecar`` of four instances against the lab's TLS
HTTP/2 origin with ``upstream_check: warn`` (the default: wait for each proxy's first dial)
and with ``off`` (no wait), in interleaved rounds whose order alternates, so the noise of this
shared machine falls on both alike. The cost is the difference of the medians; the check's own
time is what the proxies report (``ok: TLS and HTTP/2 in ...``), also summarised. Writes
bench/results/upcheck.md and its summary into bench/README.md (bench:upcheck).

Must not bind anything but loopback or leave a process behind: each run is stopped, and the
origin too, in a finally.

Run: .venv/bin/python bench/upcheck.py [--reps 7] [--no-readme]   (about half a minute)
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import statistics
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
from sidecar_fsm.lab import TlsH2Origin, make_ca_and_cert  # noqa: E402
from sidecar_fsm.launcher import start_h2_ping_sidecar  # noqa: E402

INSTANCES = 4
_OK = re.compile(r" ok: TLS and HTTP/2 in ([0-9.]+)s$")


def one_start(mode: str, origin: TlsH2Origin, work: Path, cache: Path) -> tuple[float, list[float]]:
    """Seconds ``start_h2_ping_sidecar`` took in ``mode``, and the dial times the proxies reported."""
    config = OmegaConf.create(
        {
            "cache_dir": str(cache),
            "sidecar": {
                "enabled": True,
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
    dials = [float(m.group(1)) for line in out.getvalue().splitlines() if (m := _OK.search(line))]
    if mode == "warn" and len(dials) != INSTANCES:
        raise SystemExit(f"warn: expected {INSTANCES} ok lines, got:\n{out.getvalue()}")
    return took, dials


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=7, help="rounds of each mode (default 7)")
    parser.add_argument("--no-readme", action="store_true", help="do not update bench/README.md")
    args = parser.parse_args(argv)
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="bench-upcheck-") as tmp:
        work = Path(tmp)
        origin = TlsH2Origin(make_ca_and_cert(work / "ca")).start()
        try:
            cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "sidecar-fsm"
            one_start("off", origin, work, cache)  # build or find the binary, warm the caches
            times: dict[str, list[float]] = {"warn": [], "off": []}
            dials: list[float] = []
            for rep in range(args.reps):
                for mode in ("warn", "off") if rep % 2 == 0 else ("off", "warn"):
                    took, reported = one_start(mode, origin, work, cache)
                    times[mode].append(took)
                    dials += reported
        finally:
            origin.stop()
    load_after = os.getloadavg()[0]
    warn, off = statistics.median(times["warn"]), statistics.median(times["off"])
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    summary = (
        f"`.venv/bin/python bench/upcheck.py --reps {args.reps}` ({when}; load average {load_before:.2f} "
        f"before, {load_after:.2f} after): a start of {INSTANCES} instances against the lab origin, "
        f"`upstream_check: warn` and `off` in {args.reps} alternating rounds each.\n\n"
        f"| upstream_check | start, median | slowest |\n|---|--:|--:|\n"
        f"| off | {off * 1000:.0f} ms | {max(times['off']) * 1000:.0f} ms |\n"
        f"| warn (default) | {warn * 1000:.0f} ms | {max(times['warn']) * 1000:.0f} ms |\n\n"
        f"The check adds {(warn - off) * 1000:.0f} ms to the start (difference of the medians): the "
        f"proxies dial when the launcher asks for the verdict (GET /upstream), once all four are "
        f"ready; TCP, TLS and ALPN h2 take "
        f"{statistics.median(dials) * 1000:.1f} ms (median of {len(dials)} reported dials, slowest "
        f"{max(dials) * 1000:.1f} ms); all four are awaited together."
    )
    results_path("upcheck").write_text(
        "# What the upstream check costs a start (bench/upcheck.py)\n\n"
        + summary
        + "\n\nPer round (ms): warn "
        + ", ".join(f"{t * 1000:.0f}" for t in times["warn"])
        + "; off "
        + ", ".join(f"{t * 1000:.0f}" for t in times["off"])
        + "\n"
    )
    if not args.no_readme:
        update_readme("upcheck", summary)
    print(summary)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
