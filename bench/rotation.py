"""Log rotation under a long run (issue 28): one proxy with `-log-file`, `-access-log`,
`-log-max-bytes 1 MiB` and `-log-backups 5`, a steady paced load for `--minutes` (the issue's
figure is 30), the log folder's size sampled five times a second: never above the bound
`max x (backups + 1)` per log, every kept line whole, the newest lines all there.

Owns this one figure; the origin, sidecar start and child cleanup are bench/harness's. The load
is paced (`--rate` requests/s from one keep-alive connection), not wrk's flat out, so a long run
shares this 2-core machine. Writes bench/results/rotation.md and the README's bench:rotation.

Must not touch go/, bind anything but loopback, or leave a process behind.

Run: .venv/bin/python bench/rotation.py [--minutes 30] [--rate 200] [--no-readme]
"""

from __future__ import annotations

import argparse
import http.client
import json
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
from bench.harness.binaries import origin_binary, sidecar_binary  # noqa: E402
from bench.harness.children import Children  # noqa: E402
from bench.harness.tables import load_average  # noqa: E402
from bench.harness.targets import start_origin, start_sidecar  # noqa: E402
from bench.harness.waits import BenchError  # noqa: E402
from bench.readme import update_readme  # noqa: E402

REPORT = REPO / "bench" / "results" / "rotation.md"
MAX_BYTES = 1 << 20
BACKUPS = 5


def folder_bytes(work: Path, stem: str) -> int:
    return sum(p.stat().st_size for p in work.glob(f"{stem}*") if p.is_file())


def paced_load(listen: str, rate: float, stop: threading.Event, sent: list[int]) -> None:
    """GET /n/<i> at `rate` per second on one keep-alive connection until `stop`. The origin
    answers 404 (no such page), which is all the access line needs: the path numbers it (the
    query never reaches the access log)."""
    host, port = listen.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    start = time.monotonic()
    i = 0
    while not stop.is_set():
        conn.request("GET", f"/n/{i}")
        r = conn.getresponse()
        r.read()
        if r.status != 404:
            raise BenchError(f"request {i}: status {r.status}")
        i += 1
        sent[0] = i
        delay = start + i / rate - time.monotonic()
        if delay > 0:
            stop.wait(delay)
    conn.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0, help="length of the run (default 30)")
    parser.add_argument("--rate", type=float, default=200.0, help="requests per second (default 200)")
    parser.add_argument("--out", type=Path, default=REPORT, help=f"report (default {REPORT})")
    parser.add_argument(
        "--no-readme", action="store_true", help="do not write the table into bench/README.md"
    )
    args = parser.parse_args(argv)
    command = " ".join([".venv/bin/python bench/rotation.py", *(sys.argv[1:] if argv is None else argv)])
    load_before = load_average()
    work = Path(tempfile.mkdtemp(prefix="bench-rotation-"))
    bound = MAX_BYTES * (BACKUPS + 1)
    peak = {"log": 0, "access": 0}
    rotations = 0
    try:
        with Children() as kids:
            origin = start_origin(kids, origin_binary(), work)
            log, access = work / "sidecar.log", work / "sidecar.access.log"
            sc = start_sidecar(
                kids,
                sidecar_binary(),
                work,
                origin.tls,
                origin.ca,
                *("-log-file", str(log), "-access-log", str(access)),
                *("-log-max-bytes", str(MAX_BYTES), "-log-backups", str(BACKUPS)),
                name="sidecar",
            )
            stop, sent = threading.Event(), [0]
            errors: list[BaseException] = []

            def load() -> None:
                try:
                    paced_load(sc.listen, args.rate, stop, sent)
                except BaseException as e:  # reported below: a failed request fails the run
                    errors.append(e)

            thread = threading.Thread(target=load, daemon=True)
            thread.start()
            deadline = time.monotonic() + args.minutes * 60
            last_size = 0
            while time.monotonic() < deadline and not errors:
                peak["log"] = max(peak["log"], folder_bytes(work, "sidecar.log"))
                peak["access"] = max(peak["access"], folder_bytes(work, "sidecar.access.log"))
                size = access.stat().st_size if access.exists() else 0
                rotations += size < last_size
                last_size = size
                time.sleep(0.2)
            stop.set()
            thread.join(15)
            if errors:
                raise BenchError(f"load: {errors[0]}")
            if kids.stop(sc.proc) != 0:
                raise BenchError("sidecar: did not exit 0 after SIGTERM")
            names = sorted(p.name for p in work.glob("sidecar.access.log*"))
            kept: list[int] = []
            for name in [f"sidecar.access.log.{i}" for i in range(BACKUPS, 0, -1)] + ["sidecar.access.log"]:
                path = work / name
                if path.exists():
                    kept += [int(json.loads(line)["path"].removeprefix("/n/")) for line in path.open()]
            in_order = kept == list(range(kept[0], kept[0] + len(kept))) if kept else False
    except BenchError as e:
        print(f"bench: {e}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(work, ignore_errors=True)
    ok = peak["log"] <= bound and peak["access"] <= bound
    rows = [
        "| figure | value | target | pass? |",
        "|---|--:|--:|--:|",
        f"| requests (access lines written) | {sent[0]:,} |  |  |",
        f"| access log rotations seen | {rotations:,} |  |  |",
        f"| access log files after the run | {', '.join(names)} | at most {BACKUPS + 1} |"
        f" {'yes' if len(names) <= BACKUPS + 1 else 'NO'} |",
        f"| access log files, peak bytes | {peak['access']:,} | <= {bound:,}"
        f" | {'yes' if peak['access'] <= bound else 'NO'} |",
        f"| proxy log files, peak bytes | {peak['log']:,} | <= {bound:,}"
        f" | {'yes' if peak['log'] <= bound else 'NO'} |",
        f"| kept lines whole, newest last, none missing between files | {len(kept):,}"
        f" (up to request {kept[-1] if kept else '-'}) | consecutive | {'yes' if in_order else 'NO'} |",
    ]
    summary = [
        f"`{command}` ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; load average {load_before}"
        f" before, {load_average()} after): one proxy, `-log-max-bytes {MAX_BYTES}` `-log-backups"
        f" {BACKUPS}`, {args.rate:g} requests/s for {args.minutes:g} min, the folder sampled every 0.2 s.",
        "",
        *rows,
    ]
    text = "\n".join(["# Log rotation under a long run (bench/rotation.py)", "", *summary, ""])
    args.out.write_text(text)
    print(text)
    if not args.no_readme:
        update_readme("rotation", "\n".join(summary))
        print("table written to bench/README.md")
    return 0 if ok and in_order else 1


if __name__ == "__main__":
    sys.exit(main())
