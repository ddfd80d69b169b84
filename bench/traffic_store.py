"""Benchmark of the traffic figures' database side: one import, and the reads over a full database.

    .venv/bin/python bench/traffic_store.py [--instances 100,1000,4000] [--repeat 5]

Prints one table, medians side by side per database size: ``import`` (read and check one
traffic file, upsert it: what ``check()`` costs once a minute per instance, and stop, restart and
reap once), ``history`` (``traffic_summary`` of one run, what ``history RUN`` reads),
``totals`` (``status --all``'s requests and 502s of every run, from every run's rows) and ``query``
(``SELECT * FROM traffic_summary`` through ``sidecar-fsm query``'s code: every instance's six
percentiles). Each database holds two instances per run, one process each; the bounds are a
real traffic file's with ``--file``, else 28 made-up ones (the proxy has 19). Real files and a
real SQLite database under a temp dir; nothing is mocked.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from sidecar_fsm.run import traffic  # noqa: E402
from sidecar_fsm.state import query  # noqa: E402
from sidecar_fsm.state.fsm import InstanceMachine  # noqa: E402
from sidecar_fsm.state.store import Store  # noqa: E402
from sidecar_fsm.view import traffic as view_traffic  # noqa: E402


def document(pid: int, bounds: list[float]) -> dict[str, Any]:
    counts = [index % 5 for index in range(len(bounds) + 1)]
    histogram = {"bounds": bounds, "counts": counts, "sum": 12.5, "count": sum(counts)}
    errors = {"dial": 0, "tls": 0, "alpn": 0, "ping_timeout": 1, "reset": 0, "other": 0}
    return {
        "version": 1,
        "pid": pid,
        "started_at": "2026-12-01T20:00:00.000Z",
        "as_of": "2026-12-01T20:05:00.000Z",
        "final": True,
        **dict.fromkeys(["requests", "responses_2xx", "responses_4xx", "responses_5xx", "responses_502"], 3),
        **dict.fromkeys(["responses_other", "client_disconnects", "goaways", "retries", "rotations"], 0),
        "upstream_errors": errors,
        "pings_sent": 10,
        "ping_acks": 10,
        "ttfb_seconds": histogram,
        "duration_seconds": histogram,
        "duration_max_s": 512.25,
    }


def median_ms(action: Callable[[], Any], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        action()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def measure(instances: int, repeat: int, bounds: list[float], root: Path) -> dict[str, float]:
    log_dir = root / f"n{instances}"
    figures = traffic.parse(json.dumps(document(4242, bounds)))
    with Store.open(log_dir, host="bench") as store:
        with store.transaction():
            for run in range(instances // 2):
                store.create_run(f"run{run}", 1, 1.0, {})
                for name in ("policy", "judge"):
                    record = store.create_instance(
                        f"run{run}", name, "127.0.0.1:0", "https://x", None, None, None
                    )
                    store.record_traffic(record.id, figures)
        log = str(log_dir / "h2ping-extra-bench-extra.log")
        store.create_run("extra", 1, 1.0, {})
        record = store.create_instance("extra", "policy", "127.0.0.1:0", "https://x", "/b", log, None)
        machine = InstanceMachine(store, record.id)
        machine.fire("build")
        machine.fire("spawn", pid=4242, pid_start_time=1.0)
        inst = store.get_instance(record.id)
        assert inst is not None
        path = Path(traffic.traffic_path(log))
        as_of = [0]

        def one_import() -> None:
            # A newer as_of each time: the import writes, as a live run's minute does.
            as_of[0] += 1
            text = document(4242, bounds)
            text["as_of"] = f"2026-12-01T21:{as_of[0] // 60 % 60:02d}:{as_of[0] % 60:02d}.000Z"
            path.write_text(json.dumps(text))
            path.chmod(0o600)
            traffic.import_instances(store, [inst])

        middle = f"run{instances // 4}"
        return {
            "import": median_ms(one_import, repeat),
            "history": median_ms(lambda: view_traffic.instance_traffic(store, middle), repeat),
            "totals": median_ms(lambda: view_traffic.run_totals([store]), repeat),
            "query": median_ms(lambda: query.run_query(log_dir, "SELECT * FROM traffic_summary"), repeat),
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--instances", default="100,1000,4000")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--file", type=Path, help="a real traffic file whose bounds to use")
    args = parser.parse_args()
    if args.file is not None:
        bounds = [float(bound) for bound in json.loads(args.file.read_text())["duration_seconds"]["bounds"]]
    else:
        bounds = [0.001 * 1.5**index for index in range(28)]
    sizes = [int(size) for size in args.instances.split(",")]
    with tempfile.TemporaryDirectory() as temp:
        results = {size: measure(size, args.repeat, bounds, Path(temp)) for size in sizes}
    print(f"traffic figures in the database, {len(bounds)} bounds, median of {args.repeat} (ms)")
    print(f"{'instances':>10}  {'import':>8}  {'history':>8}  {'totals':>8}  {'query':>9}")
    for size, figures in results.items():
        print(
            f"{size:>10}  {figures['import']:>8.2f}  {figures['history']:>8.2f}  "
            f"{figures['totals']:>8.2f}  {figures['query']:>9.1f}"
        )


if __name__ == "__main__":
    main()
