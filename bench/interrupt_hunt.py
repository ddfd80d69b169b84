"""The Ctrl-C hunt: starts interrupted at every named step and at random moments leave nothing.

Usage: ``.venv/bin/python bench/interrupt_hunt.py [--starts 300] [--busy 3] [--seed S]
[--no-readme]``. Each start is a real launcher process with the real proxy (two instances, the
lab's TLS HTTP/2 origin as upstream, the model base_url rewritten) and its own log dir. In turn:
``start_h2_ping_sidecar`` sent SIGINT, ``sidecar-fsm start`` sent SIGINT, ``sidecar-fsm start``
sent SIGTERM, each at a random moment of its start (uniform over the start's own measured
duration; for the CLI from the start's first step, ``binary-resolved``, which the process
announces with ``SIDECAR_FSM_CRASH_AT=binary-resolved@MARK``: before it the CLI only loads and
checks the config), with ``--busy`` CPU-bound loops running the whole time. For each start: the
interrupt must come out (``KeyboardInterrupt`` from the API, exit 130 from the CLI) within 1 s
of the signal, no process of it may be left, no run of it live in the database, and the
caller's config must be what it was. A signal that lands after the start returned is ``late``
(the CLI then drains and exits 0; the API driver stops its manager) and must leave nothing too;
one that lands before the CLI reached ``main`` is ``early`` (Python's default disposition).
Prints a table; writes ``bench/results/interrupt_hunt.md`` and the README section.

The same code runs in the suite (``tests/integration/test_interrupts.py``): there each named
point of ``crashpoints.POINTS`` of a start once, the signal sent by the point itself
(``SIDECAR_FSM_CRASH_AT=<point>@SIGINT``). Must not bind anything but loopback or leave a process
behind: every start's processes are ended in ``finally``, whatever the verdict.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import psutil
import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.harness.busy import busy_loops  # noqa: E402
from bench.harness.tables import load_average, markdown_table, text_table  # noqa: E402
from bench.readme import results_path, update_readme  # noqa: E402
from sidecar_fsm.run import crashpoints  # noqa: E402
from sidecar_fsm.state.fsm import TERMINAL  # noqa: E402
from sidecar_fsm.state.store import open_all_hosts  # noqa: E402

# The interrupt must come out this soon after its signal.
ANSWER_SECONDS = 1.0
# A start that neither ends nor gets ready in this long is a hang (a swallowed signal).
START_DEADLINE_SECONDS = 60.0

# The API's caller: prints GO right before the call, then the outcome as one JSON line. A start
# that returned waits for the signal (a late one) and stops its manager.
API_DRIVER = r"""
import copy, json, sys, time
from omegaconf import OmegaConf
from sidecar_fsm.launcher import start_h2_ping_sidecar
plain = sys.argv[2:] == ["plain"]  # a plain dict, as a Gym user may pass, else a DictConfig
config = json.loads(sys.argv[1]) if plain else OmegaConf.create(json.loads(sys.argv[1]))
before = copy.deepcopy(config) if plain else OmegaConf.to_container(config)
manager = None
try:
    print("GO", flush=True)
    manager = start_h2_ping_sidecar(config)
    print(json.dumps({"outcome": "late"}), flush=True)
    while True:
        time.sleep(3600)
except KeyboardInterrupt:
    at = time.monotonic()
    if manager is not None:
        manager.stop()
        sys.exit(0)
    unchanged = (config if plain else OmegaConf.to_container(config)) == before
    print(json.dumps({"outcome": "interrupted", "at": at, "unchanged": unchanged}), flush=True)
    sys.exit(130)
"""

_SIGNAL_LINE = re.compile(rf"{crashpoints.ENV_VAR}: (SIG[A-Z]+) at (\S+) t=([0-9.]+)")
# The first step of a start, where the random moments of the CLI's start begin.
CLI_BEGINS = "binary-resolved"


@dataclass
class Start:
    """One interrupted start: how it was interrupted, how it answered, what it left."""

    kind: str  # "api" (start_h2_ping_sidecar) or "cli" (sidecar-fsm start)
    sig: str
    where: str  # a crash point, or "random +0.123s"
    outcome: str  # "interrupted", "late", "early", or what went wrong
    code: int | None
    answer_seconds: float | None
    unchanged: bool | None
    left: list[str] = field(default_factory=list)
    stderr: str = ""

    @property
    def ok(self) -> bool:
        if self.left or self.outcome not in ("interrupted", "late", "early"):
            return False
        if self.outcome != "interrupted":
            return True
        in_time = self.answer_seconds is not None and self.answer_seconds <= ANSWER_SECONDS
        return in_time and self.unchanged is not False and (self.kind == "api" or self.code == 130)

    def describe(self) -> str:
        answer = "-" if self.answer_seconds is None else f"{self.answer_seconds:.3f}s"
        return (
            f"{self.kind} {self.sig} at {self.where}: {self.outcome} (exit {self.code}, answer {answer}, "
            f"config unchanged {self.unchanged}); left {self.left or 'nothing'}\n{self.stderr[-2000:]}"
        )


def start_config(binary: Path, origin_url: str, ca_file: Path, log_dir: Path) -> dict[str, Any]:
    """A Gym config with two sidecars in front of ``origin_url`` and a model aimed at it."""
    return {
        "policy_base_url": f"{origin_url}/v1",
        "policy_model": {"responses_api_models": {"m": {"base_url": "${policy_base_url}"}}},
        "sidecar": {
            "enabled": True,
            "binary": str(binary),
            "ca_file": str(ca_file),
            "instances": [
                {"name": "one", "upstream": origin_url, "listen": "127.0.0.1:0"},
                {"name": "two", "upstream": origin_url, "listen": "127.0.0.1:0"},
            ],
            "shutdown_grace": "2s",
            "startup_timeout_seconds": 30,
            "log_dir": str(log_dir),
        },
    }


def leftovers(log_dir: Path) -> list[str]:
    """What a start under ``log_dir`` left: live processes naming it, runs or instances not ended."""
    left = []
    for process in psutil.process_iter(["pid", "cmdline", "status"]):
        with contextlib.suppress(psutil.Error):
            if process.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            if any(str(log_dir) in arg for arg in process.info["cmdline"] or []):
                left.append(f"process {process.info['pid']}")
    for store in open_all_hosts(log_dir):
        try:
            for run in store.list_runs("all"):
                if run.ended_at is None:
                    left.append(f"run {run.run_id} live")
                for inst in store.instances_of(run.run_id):
                    if inst.state not in TERMINAL:
                        left.append(f"instance {inst.name} {inst.state}")
        finally:
            store.close()
    return left


def _end(process: subprocess.Popen[str], log_dir: Path) -> None:
    """Whatever the verdict: the driver and every process naming the log dir end now."""
    with contextlib.suppress(ProcessLookupError):
        process.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(10)
    for found in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error):
            if any(str(log_dir) in arg for arg in found.info["cmdline"] or []):
                found.kill()


def run_start(
    kind: str,
    sig: signal.Signals,
    config: dict[str, Any],
    log_dir: Path,
    point: str | None = None,
    delay: float | None = None,
    track: Callable[[subprocess.Popen[str]], None] | None = None,
    plain: bool = False,
) -> Start:
    """One start of ``kind``, interrupted by ``sig`` at crash point ``point`` (sent by the point
    itself) or ``delay`` seconds after it began (sent from here); its verdict. ``plain``: the
    API is given a plain dict rather than a DictConfig."""
    env = {k: v for k, v in os.environ.items() if k != crashpoints.ENV_VAR}
    if point is not None:  # a point, or a whole SIDECAR_FSM_CRASH_AT value ("a@SIGINT,b@SIGINT")
        env[crashpoints.ENV_VAR] = point if "@" in point else f"{point}@{sig.name}"
    elif kind == "cli":
        env[crashpoints.ENV_VAR] = f"{CLI_BEGINS}@MARK"
    if kind == "api":
        argv = [sys.executable, "-c", API_DRIVER, json.dumps(config), *(["plain"] if plain else [])]
    else:
        config_file = log_dir.parent / f"{log_dir.name}.yaml"
        config_file.write_text(yaml.safe_dump(config))
        argv = [sys.executable, "-m", "sidecar_fsm", "start", str(config_file)]
    process = subprocess.Popen(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    if track is not None:
        track(process)
    where = point or f"random +{delay:.3f}s"
    try:
        sent_at = None
        if delay is not None:
            assert process.stdout is not None and process.stderr is not None
            stream, begun = (process.stdout, "GO") if kind == "api" else (process.stderr, f"at {CLI_BEGINS}")
            if begun not in stream.readline():
                return Start(kind, sig.name, where, f"no {begun!r}", process.wait(10), None, None)
            time.sleep(delay)
            sent_at = time.monotonic()
            process.send_signal(sig)
        try:
            out, err = process.communicate(timeout=START_DEADLINE_SECONDS)
        except subprocess.TimeoutExpired:
            if point is not None:
                return Start(kind, sig.name, where, "hung", None, None, None, stderr="")
            # A late signal to the API driver after it printed: it is waiting for one.
            process.send_signal(sig)
            out, err = process.communicate(timeout=START_DEADLINE_SECONDS)
        exited_at = time.monotonic()
        return _verdict(kind, sig, where, process.returncode, out, err, sent_at, exited_at, log_dir)
    finally:
        _end(process, log_dir)


def _verdict(
    kind: str,
    sig: signal.Signals,
    where: str,
    code: int,
    out: str,
    err: str,
    sent_at: float | None,
    exited_at: float,
    log_dir: Path,
) -> Start:
    announced = _SIGNAL_LINE.search(err)
    if announced is not None:
        sent_at = float(announced.group(3))
    left = leftovers(log_dir)
    if kind == "api":
        lines = [line for line in out.splitlines() if line.startswith("{")]
        result = json.loads(lines[-1]) if lines else {}
        outcome = result.get("outcome") or f"no outcome (exit {code})"
        if outcome == "late" and code == 0:
            return Start(kind, sig.name, where, "late", code, None, None, left, err)
        answer = result["at"] - sent_at if "at" in result and sent_at is not None else None
        return Start(kind, sig.name, where, outcome, code, answer, result.get("unchanged"), left, err)
    answer = exited_at - sent_at if sent_at is not None else None
    if code == 130 and "interrupted before the sidecars were ready" in err:
        return Start(kind, sig.name, where, "interrupted", code, answer, True, left, err)
    if code == 0 and f"{sig.name}: draining" in err:
        return Start(kind, sig.name, where, "late", code, None, None, left, err)
    if code == -sig:  # died of it before any handler of ours: nothing was started
        return Start(kind, sig.name, where, "early", code, None, None, left, err)
    return Start(kind, sig.name, where, f"unexpected exit {code}", code, answer, None, left, err)


def _median_start_seconds(kind: str, config_of: Callable[[Path], dict[str, Any]], work: Path) -> float:
    """How long an uninterrupted start of ``kind`` takes here, now: the random moments' span."""
    spans = []
    for index in range(3):
        log_dir = work / f"measure-{kind}-{index}"
        config = config_of(log_dir)
        begin = time.monotonic()
        if kind == "api":
            process = subprocess.Popen(
                [sys.executable, "-c", API_DRIVER, json.dumps(config)],
                stdout=subprocess.PIPE,
                text=True,
                start_new_session=True,
            )
            assert process.stdout is not None
            process.stdout.readline()  # GO
            begin = time.monotonic()
            done = "late"
        else:
            config_file = work / f"measure-{index}.yaml"
            config_file.write_text(yaml.safe_dump(config))
            process = subprocess.Popen(
                [sys.executable, "-m", "sidecar_fsm", "start", str(config_file)],
                env={**os.environ, crashpoints.ENV_VAR: f"{CLI_BEGINS}@MARK"},
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                start_new_session=True,
            )
            assert process.stderr is not None
            process.stderr.readline()  # the mark
            begin = time.monotonic()
            done = "supervising"
        try:
            assert process.stdout is not None
            for line in process.stdout:
                if done in line:
                    break
            spans.append(time.monotonic() - begin)
            process.send_signal(signal.SIGTERM)
            process.wait(30)
        finally:
            _end(process, log_dir)
    return statistics.median(spans)


def hunt(starts: int, seed: int, work: Path, binary: Path, origin_url: str, ca_file: Path) -> list[Start]:
    """``starts`` random-moment starts, API SIGINT, CLI SIGINT and CLI SIGTERM in turn."""
    rng = random.Random(seed)

    def config_of(log_dir: Path) -> dict[str, Any]:
        return start_config(binary, origin_url, ca_file, log_dir)

    spans = {kind: _median_start_seconds(kind, config_of, work) for kind in ("api", "cli")}
    kinds = [("api", signal.SIGINT), ("cli", signal.SIGINT), ("cli", signal.SIGTERM)]
    results = []
    for index in range(starts):
        kind, sig = kinds[index % len(kinds)]
        log_dir = work / f"start-{index}"
        delay = rng.uniform(0.0, spans[kind])
        result = run_start(kind, sig, config_of(log_dir), log_dir, delay=delay)
        results.append(result)
        if not result.ok:
            print(f"FAILED: {result.describe()}", file=sys.stderr)
    return results


def summary(results: list[Start]) -> list[list[str]]:
    rows = []
    for kind, sig in sorted({(r.kind, r.sig) for r in results}):
        mine = [r for r in results if (r.kind, r.sig) == (kind, sig)]
        answers = sorted(r.answer_seconds for r in mine if r.answer_seconds is not None)
        interrupted = [r for r in mine if r.outcome == "interrupted"]

        def at(q: float, answers: list[float] = answers) -> str:
            return f"{answers[min(len(answers) - 1, int(q * len(answers)))]:.3f}" if answers else "-"

        rows.append(
            [
                "start_h2_ping_sidecar" if kind == "api" else "sidecar-fsm start",
                sig,
                str(len(mine)),
                str(len(interrupted)),
                str(sum(r.outcome == "late" for r in mine)),
                str(sum(r.outcome == "early" for r in mine)),
                at(0.5),
                at(0.95),
                f"{answers[-1]:.3f}" if answers else "-",
                str(sum(not r.ok for r in mine)),
            ]
        )
    return rows


HEADER = [
    "caller",
    "signal",
    "starts",
    "interrupted",
    "late",
    "early",
    "answer p50 (s)",
    "p95",
    "max",
    "failed",
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=300)
    parser.add_argument("--busy", type=int, default=3, help="CPU-bound loops running meanwhile")
    parser.add_argument("--seed", type=int, default=31)
    parser.add_argument("--no-readme", action="store_true", help="print only; write no results")
    args = parser.parse_args(argv)

    from bench.harness.binaries import sidecar_binary
    from sidecar_fsm.lab import TlsH2Origin, make_ca_and_cert

    binary = sidecar_binary()
    with tempfile.TemporaryDirectory(prefix="interrupt-hunt-") as tmp:
        work = Path(tmp)
        origin = TlsH2Origin(make_ca_and_cert(work / "ca")).start()
        try:
            with busy_loops(args.busy):
                load = load_average()
                began = time.monotonic()
                results = hunt(args.starts, args.seed, work, binary, origin.url, origin.ca_file)
                took = time.monotonic() - began
        finally:
            origin.stop()
    rows = summary(results)
    print(text_table(HEADER, rows))
    failed = [r for r in results if not r.ok]
    command = f"python bench/interrupt_hunt.py --starts {args.starts} --busy {args.busy} --seed {args.seed}"
    report = "\n".join(
        [
            f"`{command}` ({datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, {took:.0f} s, "
            f"{os.cpu_count()} cores, {args.busy} busy loops, load {load}):",
            "",
            markdown_table(HEADER, rows),
            "",
            f"Failures: {len(failed)}.",
            *[f"\n```\n{r.describe()}\n```" for r in failed[:5]],
        ]
    )
    if not args.no_readme:
        results_path("interrupt_hunt").write_text(f"# Interrupt hunt\n\n{report}\n")
        update_readme("interrupt_hunt", report)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
