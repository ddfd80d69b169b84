"""Benchmark of the launcher: warm start and stop of 4 sidecars, and 8 cold starts on one cache.

Run from the repo root: ``.venv/bin/python bench/launcher.py`` (``--help`` for options). Prints a
table and writes the figures with the exact command into bench/README.md and, in full, to
``bench/results/launcher.md`` (or ``--out``). Targets (issue 14): warm ``start_h2_ping_sidecar``
of 4 instances <= 30 ms median, cache lookup included; ``stop()`` of 4 idle sidecars < 20 ms
median; 8 concurrent cold starts sharing one cache < 1.3x one cold build. NeMo Gym's launcher
on the same machine class: 102-105 ms warm (100 ms ready polling plus a ``go env`` per start),
8 cold runs 98 s = 7.3x one build.

"Warm" means a built binary in the cache and this process's imports, database and page cache
warmed by three rounds first. Each timed start or floor begins after ``gc.collect()``, so
garbage the harness made (the config's deep copy, the previous round) is not collected inside
the launcher's time; the launcher's own allocations still trigger collections as they would.
"Cold" means an empty build cache and, unless ``--warm-gocache``, an empty Go build cache
(``GOCACHE``) too, so each cold figure includes compiling the standard library parts the proxy
uses, as on a fresh node. Everything runs on loopback against the lab's TLS HTTP/2 origin.

Order, because this machine's speed moves by tens of percent from one minute to the next: each
warm round takes a start and its floor (the same spawns and wait, no launcher) back to back,
the warm rounds come in blocks with a cold round (a build, 8 concurrent cold starts, one cold
start) after each, and the figures are medians over all rounds.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.readme import results_path, update_readme  # noqa: E402
from sidecar_fsm.base import procs  # noqa: E402
from sidecar_fsm.base.buildcache import build_sidecar, ensure_binary  # noqa: E402
from sidecar_fsm.base.ready import ReadyWait, wait_all_ready  # noqa: E402
from sidecar_fsm.config import H2PingSidecarConfig  # noqa: E402
from sidecar_fsm.lab import CertPaths, make_ca_and_cert  # noqa: E402
from sidecar_fsm.launcher import (  # noqa: E402
    h2_ping_sidecar_config_from_global_config,
    resolve_binary,
    sidecar_command,
    sidecar_env,
    start_h2_ping_sidecar,
)

_COLD_RUN = """
import json, sys, time
from omegaconf import OmegaConf
from sidecar_fsm.launcher import start_h2_ping_sidecar
config = OmegaConf.create(json.loads(sys.argv[1]))
manager = start_h2_ping_sidecar(config)
print("READY " + json.dumps({"run_id": manager.run_id}), flush=True)
sys.stdin.read()
manager.stop()
"""


# The origins run in a process of their own, as a real upstream runs on another machine: each
# proxy dials its upstream once right after its ready file (SPEC), and an origin on a thread of
# this process would take the launcher's GIL for four TLS handshakes in the middle of the start.
_ORIGINS_SCRIPT = """
import sys
from pathlib import Path
from sidecar_fsm.lab import CertPaths, TlsH2Origin
certs = CertPaths(*(Path(arg) for arg in sys.argv[2:5]))
origins = [TlsH2Origin(certs).start() for _ in range(int(sys.argv[1]))]
print(" ".join(origin.url for origin in origins), flush=True)
sys.stdin.read()  # until the bench closes our stdin (or dies)
for origin in origins:
    origin.stop()
"""


@dataclass(frozen=True)
class RemoteOrigin:
    url: str


@contextlib.contextmanager
def origins_in_a_process(certs: CertPaths, count: int) -> Iterator[list[RemoteOrigin]]:
    """``count`` lab TLS HTTP/2 origins served by a child process; ended when the block exits."""
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            _ORIGINS_SCRIPT,
            str(count),
            str(certs.ca_pem),
            str(certs.cert_pem),
            str(certs.key_pem),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert child.stdout is not None
        urls = child.stdout.readline().split()
        if len(urls) != count:
            raise SystemExit(f"bench: the origins process did not start ({child.poll()=})")
        yield [RemoteOrigin(url) for url in urls]
    finally:
        if child.stdin is not None:
            child.stdin.close()
        try:
            child.wait(10)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait(10)


def gym_config(origins: Sequence[RemoteOrigin], ca_file: Path, log_dir: Path, cache_dir: Path) -> DictConfig:
    instances = [
        {"name": f"model{index}", "upstream": origin.url, "listen": "127.0.0.1:0"}
        for index, origin in enumerate(origins)
    ]
    servers = {
        f"model{index}": {"responses_api_models": {"m": {"base_url": f"{origin.url}/v1"}}}
        for index, origin in enumerate(origins)
    }
    return OmegaConf.create(
        {
            "cache_dir": str(cache_dir),
            "nemo_gym_log_dir": str(log_dir),
            **servers,
            "sidecar": {
                "enabled": True,
                "instances": instances,
                "ca_file": str(ca_file),
                "shutdown_grace": "10s",
                # The launcher's own time, as before the check existed: what the check adds
                # (one TLS handshake per upstream, awaited together) is bench/upcheck.py's row.
                "upstream_check": "off",
            },
        }
    )


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """The launcher prints one line per instance and per rewrite; keep the table readable."""
    with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink):
        yield


def warm_start(config: DictConfig) -> tuple[float, float, H2PingSidecarConfig]:
    """One warm start of ``config`` and its stop: (start seconds, stop seconds, parsed block)."""
    run_config = copy.deepcopy(config)
    gc.collect()  # the harness's garbage (that deepcopy, the last round) is not the launcher's
    started = time.perf_counter()
    with quiet():
        manager = start_h2_ping_sidecar(run_config)
    ready = time.perf_counter()
    assert manager is not None
    manager.check()
    manager.stop()
    return ready - started, time.perf_counter() - ready, manager.config


def warm(configs: dict[str, DictConfig], binary: Path, log_dir: Path, repeats: int) -> dict[str, list[float]]:
    """Warm starts and stops of each config, and the floor of each, interleaved.

    Each round starts every config once and measures its floor once, so a start and its floor
    (and the 4- and 1-instance figures) are taken under the same load: this machine's speed
    moves by tens of percent within minutes, and figures measured a minute apart would compare
    the machine, not the launcher. Returns ``<name>.start``, ``<name>.stop``, ``<name>.floor``
    and ``<name>.own`` (start minus the floor of the same round) per config, and ``lookup``.
    """
    series: dict[str, list[float]] = {}
    parsed: H2PingSidecarConfig | None = None
    for round_index in range(repeats):
        for name, config in configs.items():
            start, stop, parsed = warm_start(config)
            floor_time = floor(config, binary, log_dir, f"{name}-{round_index}")
            for key, value in (("start", start), ("stop", stop), ("floor", floor_time)):
                series.setdefault(f"{name}.{key}", []).append(value)
            series.setdefault(f"{name}.own", []).append(start - floor_time)
    assert parsed is not None
    config = next(iter(configs.values()))
    for _ in range(repeats):
        started = time.perf_counter()
        resolve_binary(parsed, config)
        series.setdefault("lookup", []).append(time.perf_counter() - started)
    return series


def cold(config: DictConfig, runs: int, gocache: Path | None) -> float:
    """Seconds from launching ``runs`` launcher processes at once until every one is ready."""
    env = dict(os.environ)
    if gocache is not None:
        env["GOCACHE"] = str(gocache)
    payload = json.dumps(OmegaConf.to_container(config))
    started = time.perf_counter()
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", _COLD_RUN, payload],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=REPO,
        )
        for _ in range(runs)
    ]
    try:
        for process in processes:
            assert process.stdout is not None
            if not any(line.startswith("READY ") for line in process.stdout):
                process.wait(60)
                raise SystemExit(f"cold run failed ({process.returncode}):\n{process.stderr.read()}")  # type: ignore[union-attr]
        elapsed = time.perf_counter() - started
    finally:
        for process in processes:
            with contextlib.suppress(OSError):
                process.stdin.close()  # type: ignore[union-attr]
        for process in processes:
            process.wait(60)
    return elapsed


def floor(config: DictConfig, binary: Path, log_dir: Path, tag: str) -> float:
    """Spawn the proxies and await their ready files, nothing else: the part no launcher can skip.

    The same argv, environment and exact wait as the launcher, without the config, database,
    state machine or rewrite; ``start`` minus this is the launcher's own cost.
    """
    parsed = h2_ping_sidecar_config_from_global_config(config)
    env = sidecar_env(parsed)
    log_dir.mkdir(parents=True, exist_ok=True)
    paths = [str(log_dir / f"floor-{tag}-{index}.ready") for index in range(len(parsed.instances))]
    gc.collect()
    started = time.perf_counter()
    children = [
        procs.spawn(sidecar_command(str(binary), parsed, instance, path), env, str(log_dir / "floor.log"))
        for instance, path in zip(parsed.instances, paths, strict=True)
    ]
    waits = [
        ReadyWait(str(index), path, child)
        for index, (path, child) in enumerate(zip(paths, children, strict=True))
    ]
    outcomes = wait_all_ready(waits, 30)
    elapsed = time.perf_counter() - started
    assert all(outcome.info is not None for outcome in outcomes.values()), outcomes
    for child in children:
        child.terminate()
    for child in children:
        child.wait(30)
    return elapsed


def cold_build(output: Path, gocache: Path | None) -> float:
    """Seconds for one ``go build`` of the proxy into an empty cache (the baseline of the ratio)."""
    previous = os.environ.get("GOCACHE")
    if gocache is not None:
        os.environ["GOCACHE"] = str(gocache)
    try:
        started = time.perf_counter()
        with quiet():
            build_sidecar(output)
        return time.perf_counter() - started
    finally:
        if gocache is not None:
            if previous is None:
                os.environ.pop("GOCACHE", None)
            else:
                os.environ["GOCACHE"] = previous


def cold_round(
    origins: Sequence[RemoteOrigin], ca_file: Path, here: Path, warm_gocache: bool
) -> tuple[float, float, float]:
    """One round of the cold figures in fresh caches under ``here``: (build, 8 concurrent, 1) seconds.

    Unless ``warm_gocache``, each measure also gets a fresh Go build cache.
    """

    def gocache(name: str) -> Path | None:
        return None if warm_gocache else here / f"gocache-{name}"

    logs = here / "logs"
    build = cold_build(here / "build" / "h2-ping-sidecar", gocache("build"))
    eight = cold(gym_config(origins[:1], ca_file, logs, here / "eight"), 8, gocache("eight"))
    single = cold(gym_config(origins[:1], ca_file, logs, here / "one"), 1, gocache("one"))
    return build, eight, single


def cold_rows(rounds: list[tuple[float, float, float]]) -> list[tuple[str, str, str]]:
    """The cold rows: every round's seconds and the median of the per-round ratios.

    A cold build alone moved between 23.8 and 28 s from one minute to the next on this machine,
    so a ratio of two single measurements compared the minutes; each round's ratio comes from
    a build and an 8-start measured back to back.
    """
    builds = [build for build, _, _ in rounds]
    eights = [eight for _, eight, _ in rounds]
    singles = [single for _, _, single in rounds]
    ratios = [eight / build for build, eight, _ in rounds]
    ratios_single = [eight / single for _, eight, single in rounds]

    def seconds(values: list[float]) -> str:
        return f"{statistics.median(values):.1f} s ({', '.join(f'{v:.1f}' for v in values)})"

    def times(values: list[float]) -> str:
        return f"{statistics.median(values):.2f}x ({', '.join(f'{v:.2f}' for v in values)})"

    return [
        ("one cold go build (build_sidecar)", seconds(builds), "-"),
        ("one cold start (new process: build + start)", seconds(singles), "-"),
        ("8 concurrent cold starts, one shared cache", seconds(eights), "-"),
        ("  ratio 8 concurrent / one cold build, per round", times(ratios), "< 1.3x"),
        ("  ratio 8 concurrent / one cold start, per round", times(ratios_single), "-"),
    ]


def quartiles(values: list[float]) -> str:
    """Median and interquartile range: a difference of two noisy times has no meaningful best."""
    low, median, high = statistics.quantiles(values, n=4)
    return f"{median * 1000:.1f} ms (IQR {low * 1000:.1f}-{high * 1000:.1f})"


def ms(values: list[float]) -> str:
    """Median, and the best run in brackets: on a shared machine the gap is other people's load."""
    return f"{statistics.median(values) * 1000:.1f} ms ({min(values) * 1000:.1f})"


def measure(args: argparse.Namespace) -> list[tuple[str, str, str]]:
    """The warm rounds in blocks, a cold round after each (unless --skip-cold); the table's rows."""
    with tempfile.TemporaryDirectory(prefix="bench-launcher-") as temp:
        root = Path(temp)
        certs = make_ca_and_cert(root / "ca")
        with origins_in_a_process(certs, 4) as origins:
            warm_cache = root / "warm-cache"
            rows: list[tuple[str, str, str]] = []
            config4 = gym_config(origins, certs.ca_pem, root / "logs", warm_cache)
            config1 = gym_config(origins[:1], certs.ca_pem, root / "logs", warm_cache)
            # The same 4 instances with `gomaxprocs: 1` (GOMAXPROCS=1 in the proxies' environment,
            # the proxy's own default once it runs): shows what the runtime's start-up with a
            # second P costs. Not the headline figure, which uses the config's defaults.
            config4p1 = copy.deepcopy(config4)
            config4p1.sidecar.gomaxprocs = 1
            binary = ensure_binary(warm_cache)
            configs = {"4": config4, "1": config1, "4p1": config4p1}
            warm(configs, binary, root / "floor", 3)  # imports, page cache, database creation
            # The warm rounds come in blocks, a cold round after each: this machine's speed moves
            # by tens of percent from one minute to the next, and rounds spread over the whole
            # run give a median of its minutes, not of the one minute the warm rounds fell in.
            blocks = 1 if args.skip_cold else max(1, args.cold_rounds)
            series: dict[str, list[float]] = {}
            colds: list[tuple[float, float, float]] = []
            for block in range(blocks):
                size = args.repeats // blocks + (1 if block < args.repeats % blocks else 0)
                for key, values in warm(configs, binary, root / f"floor-{block}", size).items():
                    series.setdefault(key, []).extend(values)
                if not args.skip_cold:
                    colds.append(cold_round(origins, certs.ca_pem, root / f"cold-{block}", args.warm_gocache))
            start4 = ms(series["4.start"])
            rows.append(("warm start_h2_ping_sidecar, 4 instances (median)", start4, "<= 30 ms"))
            rows.append(("  floor: spawn 4 proxies + await ready files only", ms(series["4.floor"]), "-"))
            rows.append(("  launcher's own time: start - floor, same round", quartiles(series["4.own"]), "-"))
            rows.append(("warm stop(), 4 idle sidecars (median)", ms(series["4.stop"]), "< 20 ms"))
            rows.append(("warm start_h2_ping_sidecar, 1 instance (median)", ms(series["1.start"]), "-"))
            rows.append(("  floor: spawn 1 proxy + await its ready file only", ms(series["1.floor"]), "-"))
            rows.append(("warm stop(), 1 idle sidecar (median)", ms(series["1.stop"]), "-"))
            rows.append(("  of which cache lookup, resolve_binary (median)", ms(series["lookup"]), "-"))
            rows.append(("warm start, 4 instances, gomaxprocs: 1 (median)", ms(series["4p1.start"]), "-"))
            rows.append(("  floor with GOMAXPROCS=1", ms(series["4p1.floor"]), "-"))
            if colds:
                rows += cold_rows(colds)
    return rows


def report_lines(
    args: argparse.Namespace, rows: list[tuple[str, str, str]], command: str, load_before: str
) -> list[str]:
    """The full report; the README section is the same from its third line on."""
    gocache_note = (
        "no cold figures (--skip-cold)"
        if args.skip_cold
        else "warm Go build cache"
        if args.warm_gocache
        else "empty GOCACHE for each cold figure"
    )
    return [
        "# Launcher benchmark",
        "",
        f"Command: `{command}`",
        "",
        f"Machine: {os.cpu_count()} cores, shared with other work (load average {load_before} before, "
        f"{' / '.join(f'{x:.1f}' for x in os.getloadavg())} after); {args.repeats} warm rounds, "
        f"{0 if args.skip_cold else args.cold_rounds} cold rounds; "
        f"{gocache_note}. Warm figures: median (best run); cold figures: median (each round). "
        "Written by bench/launcher.py.",
        "",
        "| measure | result | target |",
        "| --- | --- | --- |",
        *[f"| {name.strip()} | {value} | {target} |" for name, value, target in rows],
        "",
        "NeMo Gym's launcher, same machine class: warm start 102-105 ms (1 or 4 instances); "
        "8 cold launchers 98 s = 7.3x one cold build (13.4 s).",
        "",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=21, help="warm iterations (median reported)")
    parser.add_argument("--skip-cold", action="store_true", help="only the warm figures")
    parser.add_argument("--warm-gocache", action="store_true", help="cold runs keep Go's own build cache")
    parser.add_argument("--cold-rounds", type=int, default=3, help="rounds of the cold figures (median)")
    parser.add_argument(
        "--out",
        default=str(results_path("launcher")),
        help="full markdown report, default bench/results/launcher.md ('' for none)",
    )
    parser.add_argument(
        "--no-readme", action="store_true", help="do not write the figures into bench/README.md"
    )
    args = parser.parse_args()
    command = ".venv/bin/python bench/launcher.py " + shlex.join(sys.argv[1:])
    load_before = " / ".join(f"{x:.1f}" for x in os.getloadavg())

    rows = measure(args)
    width = max(len(row[0]) for row in rows)
    value_width = max(18, *(len(row[1]) for row in rows))
    header = f"{'measure':<{width}}  {'result (best)':>{value_width}}  target"
    lines = [header, "-" * (width + value_width + 12)]
    lines += [f"{name:<{width}}  {value:>{value_width}}  {target}" for name, value, target in rows]
    table = "\n".join(lines)
    print(table)
    # Built whether or not --out is given: the README section is made of it too.
    report = report_lines(args, rows, command, load_before)
    if args.out:
        Path(args.out).write_text("\n".join(report))
    if not args.no_readme:
        update_readme("launcher", "\n".join(report[2:]))
        print("figures written to bench/README.md")


if __name__ == "__main__":
    main()
