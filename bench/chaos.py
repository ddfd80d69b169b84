"""Chaos run: launchers and proxies SIGKILLed at random on one log dir, then one reap, then an audit.

Run from the repo root: ``.venv/bin/python bench/chaos.py`` (``--help`` for options). Default: 8
launcher processes x 50 lifecycles each (start 2 sidecars, poll ``check()`` for up to 0.2 s,
``stop()``), all on one log dir and one database, against the lab's TLS HTTP/2 origin. Meanwhile a
seeded schedule SIGKILLs a random launcher (which is then restarted for its remaining
lifecycles) or a random proxy of this log dir, every ``--kill-every`` seconds on average, for at
most ``--time-limit`` seconds. Half the launchers run with ``exit_with_owner`` and half without
(their sidecars outlive a killed launcher until ``reap``); half allow one restart. Then one
``sidecar-fsm reap``, and the audit the issue asks for: orphan processes (our binary carrying a
ready path in this log dir, still alive once every drain's grace has passed), files left (ready
files and the proxies' temp files), inconsistent rows (``PRAGMA integrity_check``, a run not
ended, an instance not terminal, a state that is not its last history row's target, a history
that is not a legal path of ``fsm.TRANSITIONS``). Prints a table and writes it to
``bench/README.md`` (unless ``--no-readme``) and, in full, to ``bench/results/chaos.md`` (or
``--out``); ``tests/integration/test_chaos.py`` runs the same code small.

The launcher half is this file too (``chaos.py launcher ...``), so what a killed process was
doing is exactly what is shown here. Everything the run starts is ended before it returns, pass
or fail; orphans found by the audit are SIGKILLed (through ``procs``) after they are counted.
About 530 lines, past one sitting's 400: the launcher half, the kill schedule and the audit are
one experiment, and reading what a kill can interrupt beside what the audit looks for is the point.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.harness.waits import BenchError, wait_until  # noqa: E402
from bench.readme import results_path, update_readme  # noqa: E402
from sidecar_fsm.base import procs  # noqa: E402
from sidecar_fsm.base.buildcache import ensure_binary, user_cache_dir  # noqa: E402
from sidecar_fsm.config import H2PingSidecarConfig  # noqa: E402
from sidecar_fsm.errors import SidecarError  # noqa: E402
from sidecar_fsm.lab import TlsH2Origin, make_ca_and_cert  # noqa: E402
from sidecar_fsm.run.supervise import NodeSidecars  # noqa: E402
from sidecar_fsm.state.fsm import TERMINAL, target_of  # noqa: E402
from sidecar_fsm.state.store import DB_DIR_NAME  # noqa: E402

SHUTDOWN_GRACE_SECONDS = 1.0
# After the reap, how long a sidecar still draining by itself (exit_with_owner) may take.
ORPHAN_WAIT_SECONDS = SHUTDOWN_GRACE_SECONDS + 10.0


@dataclass(frozen=True)
class ChaosPlan:
    launchers: int = 8
    lifecycles: int = 50  # per launcher slot, across the restarts of a killed launcher
    seed: int = 13
    kill_every: float = 0.1  # mean seconds between two kills (exponential)
    launcher_share: float = 0.8  # of the kills, the share that hits a launcher (else a proxy)
    # Of the launcher kills, the share aimed at a start: the next lifecycle a launcher begins
    # is killed 0-150 ms in, where the spawns and their records are. Uniform moments over a
    # whole lifecycle land there rarely, since a lifecycle mostly polls check().
    aim_at_start: float = 0.8
    time_limit: float = 900.0


@dataclass
class ChaosResult:
    plan: ChaosPlan
    lifecycles: int = 0  # begun: completed, or cut by a launcher kill
    completed: int = 0
    launcher_kills: int = 0
    proxy_kills: int = 0
    cut_at_time_limit: int = 0
    runs_reaped: int = 0
    # What the reap found, "<state>: <result>" -> count: which windows the kills hit.
    reaped: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    orphans: list[str] = field(default_factory=list)
    files_left: list[str] = field(default_factory=list)
    inconsistencies: list[str] = field(default_factory=list)
    launcher_errors: list[str] = field(default_factory=list)

    def table(self) -> str:
        rows = [
            ("lifecycles (begun / completed)", f"{self.lifecycles} / {self.completed}"),
            ("launcher kills (SIGKILL)", str(self.launcher_kills)),
            ("proxy kills (SIGKILL)", str(self.proxy_kills)),
            ("runs closed by the one reap", str(self.runs_reaped)),
            ("orphan processes", str(len(self.orphans))),
            ("files left (ready, temp)", str(len(self.files_left))),
            ("inconsistent rows", str(len(self.inconsistencies))),
            ("launcher errors (not our kills)", str(len(self.launcher_errors))),
            ("wall time", f"{self.seconds:.0f} s"),
        ]
        return "\n".join(["| measure | result |", "| --- | --- |", *(f"| {a} | {b} |" for a, b in rows)])


# -- the launcher half ---------------------------------------------------------------------------


def launcher_main(args: argparse.Namespace) -> int:
    """``args.count`` lifecycles, one after another; ``begin``/``end`` on stdout around each.

    A ``SidecarError`` is expected (a proxy killed under ``start()`` or ``check()``) and ends the
    lifecycle early, ``stop()`` included; anything else is a bug and exits with its traceback.
    """
    rng = random.Random(args.seed)
    config = H2PingSidecarConfig.model_validate(
        {
            "enabled": True,
            "instances": [
                {"name": name, "upstream": args.origin, "listen": "127.0.0.1:0"}
                for name in ("policy", "judge")
            ],
            "ca_file": args.ca_file,
            "shutdown_grace": f"{SHUTDOWN_GRACE_SECONDS:g}s",
            "startup_timeout_seconds": 30,
            "exit_with_owner": args.exit_with_owner,
            "restart": {"max_restarts": args.restarts, "backoff": "50ms"},
        }
    )
    for _ in range(args.count):
        print("begin", flush=True)
        sidecars = NodeSidecars(config, config.instances, args.binary, args.log_dir)
        try:
            sidecars.start()
            hold = time.monotonic() + rng.uniform(0.0, 0.2)
            while time.monotonic() < hold:
                sidecars.check()
                time.sleep(0.05)  # Gym's poll loop, compressed: the workload, not an ordering
        except SidecarError:
            pass  # stop() below (or start() itself) ended what was left and recorded why
        try:
            sidecars.stop()
        except SidecarError as exc:
            print(f"stop failed: {exc}", file=sys.stderr, flush=True)
            return 3
        print("end", flush=True)
    return 0


# -- the controller half -------------------------------------------------------------------------


@dataclass
class _Slot:
    """One launcher slot: the process doing its lifecycles now, and how many are left."""

    index: int
    remaining: int
    generation: int = 0
    process: subprocess.Popen[str] | None = None
    reader: threading.Thread | None = None
    begun: int = 0
    ended: int = 0
    began_at: float = 0.0  # monotonic time of the last "begin"

    @property
    def exit_with_owner(self) -> bool:
        return self.index % 2 == 0

    @property
    def restarts(self) -> int:
        return 1 if self.index % 4 in (2, 3) else 0


class _Chaos:
    def __init__(self, plan: ChaosPlan, binary: Path, scratch: Path) -> None:
        self.plan = plan
        self.binary = Path(binary)
        self.exe = os.path.realpath(binary)
        self.scratch = scratch
        self.log_dir = scratch / "logs"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.rng = random.Random(plan.seed)
        self.result = ChaosResult(plan)
        self.slots = [_Slot(index, plan.lifecycles) for index in range(plan.launchers)]
        self.origin: TlsH2Origin | None = None
        self.env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}

    def spawn(self, slot: _Slot) -> None:
        assert self.origin is not None
        argv = [
            sys.executable,
            str(Path(__file__).resolve()),
            "launcher",
            "--log-dir", str(self.log_dir),
            "--binary", str(self.binary),
            "--origin", self.origin.url,
            "--ca-file", str(self.origin.ca_file),
            "--count", str(slot.remaining),
            "--seed", str(self.plan.seed * 1000 + slot.index * 100 + slot.generation),
            "--restarts", str(slot.restarts),
        ]  # fmt: skip
        if slot.exit_with_owner:
            argv.append("--exit-with-owner")
        stderr = open(self.scratch / f"launcher-{slot.index}-{slot.generation}.err", "w")  # noqa: SIM115
        with stderr:
            slot.process = subprocess.Popen(
                argv, stdout=subprocess.PIPE, stderr=stderr, text=True, env=self.env
            )
        slot.begun = slot.ended = 0
        slot.reader = threading.Thread(target=self._read, args=(slot, slot.process), daemon=True)
        slot.reader.start()

    @staticmethod
    def _read(slot: _Slot, process: subprocess.Popen[str]) -> None:
        assert process.stdout is not None
        for line in process.stdout:
            if line == "begin\n":
                slot.began_at = time.monotonic()
                slot.begun += 1
            elif line == "end\n":
                slot.ended += 1

    def settle(self, slot: _Slot, killed: bool) -> None:
        """Account for ``slot``'s process, which has exited (killed by us or by itself)."""
        assert slot.process is not None and slot.reader is not None
        code = slot.process.wait()
        slot.reader.join()  # EOF: every line the process wrote has been counted
        self.result.lifecycles += slot.begun
        self.result.completed += slot.ended
        slot.remaining -= slot.begun
        if not killed and code != 0:
            err = self.scratch / f"launcher-{slot.index}-{slot.generation}.err"
            tail = err.read_text(errors="replace").strip().splitlines()[-3:]
            self.result.launcher_errors.append(
                f"launcher {slot.index}.{slot.generation}: exit {code}: {tail}"
            )
        slot.process = None
        slot.generation += 1

    def proxies(self) -> list[psutil.Process]:
        return proxies_of(self.exe, self.log_dir)

    def kill_proxy(self, process: psutil.Process) -> bool:
        try:
            identity = procs.ProcessIdentity(process.pid, process.create_time(), self.exe)
        except psutil.Error:
            return False
        return procs.signal_if_ours(identity, signal.SIGKILL)

    def run(self) -> ChaosResult:
        began = time.monotonic()
        certs = make_ca_and_cert(self.scratch / "ca")
        self.origin = TlsH2Origin(certs).start()
        try:
            for slot in self.slots:
                self.spawn(slot)
            self._schedule(began + self.plan.time_limit)
            self._reap()
            found = audit(self.log_dir, self.exe, ORPHAN_WAIT_SECONDS)
            self.result.orphans, self.result.files_left, more = found
            self.result.inconsistencies.extend(more)
        finally:
            for slot in self.slots:
                if slot.process is not None:
                    slot.process.kill()
                    slot.process.wait()
            for process in self.proxies():
                self.kill_proxy(process)
            self.origin.stop()
        self.result.seconds = time.monotonic() - began
        return self.result

    def _schedule(self, deadline: float) -> None:
        while time.monotonic() < deadline:
            for slot in self.slots:
                if slot.process is not None and slot.process.poll() is not None:
                    self.settle(slot, killed=False)
                    if slot.remaining > 0 and len(self.result.launcher_errors) < 20:
                        self.spawn(slot)
            live = [slot for slot in self.slots if slot.process is not None]
            if not live:
                return
            time.sleep(self.rng.expovariate(1.0 / self.plan.kill_every))  # the seeded schedule
            if self.rng.random() < self.plan.launcher_share:
                # Only a launcher inside a lifecycle: a kill during its Python start-up tests nothing.
                busy = [slot for slot in live if slot.begun > slot.ended]
                if not busy:
                    continue
                slot = self.rng.choice(busy)
                if self.rng.random() < self.plan.aim_at_start and not self._aim_at_start(slot):
                    continue
                if slot.process is None or slot.process.poll() is not None:
                    continue  # it finished meanwhile; settled next round
                slot.process.kill()
                self.result.launcher_kills += 1
                self.settle(slot, killed=True)
                if slot.remaining > 0:
                    self.spawn(slot)
            else:
                # Only a proxy of a live launcher: one whose launcher was killed is the audit's to
                # find, and killing it here would hide an orphan.
                parents = {slot.process.pid for slot in live if slot.process is not None}
                found = sorted(
                    (process for process in self.proxies() if _parent(process) in parents),
                    key=lambda process: process.pid,
                )
                if found and self.kill_proxy(self.rng.choice(found)):
                    self.result.proxy_kills += 1
        for slot in self.slots:
            if slot.process is not None:
                slot.process.kill()
                self.result.cut_at_time_limit += 1
                self.settle(slot, killed=True)

    def _aim_at_start(self, slot: _Slot) -> bool:
        """Wait (bounded) for ``slot``'s next lifecycle to begin, then 0-150 ms more; False if none did."""
        last = slot.began_at
        until = time.monotonic() + 5.0
        while slot.began_at == last and time.monotonic() < until:
            if slot.process is None or slot.process.poll() is not None:
                return False
            time.sleep(0.002)  # polling a counter another thread sets; bounded by `until`
        if slot.began_at == last:
            return False
        time.sleep(max(0.0, slot.began_at + self.rng.uniform(0.0, 0.15) - time.monotonic()))
        return True

    def _reap(self) -> None:
        command = [sys.executable, "-m", "sidecar_fsm", "--log-dir", str(self.log_dir), "reap", "--json"]
        done = subprocess.run(command, capture_output=True, text=True, env=self.env, timeout=600)
        if done.returncode != 0:
            self.result.inconsistencies.append(f"reap exited {done.returncode}: {done.stderr.strip()}")
            return
        runs = json.loads(done.stdout)["runs"]
        self.result.runs_reaped = len(runs)
        for run in runs:
            for instance in run["instances"]:
                key = f"{instance['state']}: {instance['result']}"
                self.result.reaped[key] = self.result.reaped.get(key, 0) + 1


# -- the audit -----------------------------------------------------------------------------------


def proxies_of(exe: str, log_dir: Path) -> list[psutil.Process]:
    """Live processes of the binary ``exe`` with an argument in ``log_dir`` (their ready file)."""
    prefix = f"{log_dir}{os.sep}"
    found = []
    for process in psutil.process_iter(["exe", "cmdline", "status"]):
        info = process.info
        if info["exe"] != exe or info["status"] == psutil.STATUS_ZOMBIE:
            continue
        if any(arg.startswith(prefix) for arg in info["cmdline"] or []):
            found.append(process)
    return found


def audit(log_dir: Path, exe: str, wait: float) -> tuple[list[str], list[str], list[str]]:
    """Orphans, files left and inconsistent rows of ``log_dir`` after its reap; read-only.

    An orphan is a process of ``exe`` carrying a path in ``log_dir`` still alive after ``wait``
    seconds (a sidecar of a killed ``exit_with_owner`` launcher drains by itself within its
    grace), described with the row that holds its ready path, if any.
    """
    # Those still alive after `wait` are the finding, not a failure of the wait. A scan of every
    # process costs tens of ms on a busy machine: 0.1 s between scans.
    with contextlib.suppress(BenchError):
        wait_until(lambda: not proxies_of(exe, log_dir), wait, "the proxies' exits", poll=0.1)
    rows = _ready_rows(log_dir)
    orphans = []
    for process in proxies_of(exe, log_dir):
        with contextlib.suppress(psutil.Error):
            ready = _flag(process.cmdline(), "-ready-file")
            row = rows.get(ready or "", "no row has this ready path")
            orphans.append(f"pid {process.pid}, ready file {ready}: {row}")
    files_left = [
        path.name
        for path in sorted(log_dir.iterdir())
        if path.name.endswith(".ready") or (path.name.startswith(".") and ".tmp" in path.name)
    ]
    inconsistencies = []
    for db in sorted((log_dir / DB_DIR_NAME).glob("*.db")):
        inconsistencies.extend(audit_database(db))
    return orphans, files_left, inconsistencies


def _ready_rows(log_dir: Path) -> dict[str, str]:
    """Each instance's ready path -> its run, name, state, recorded pid and history, in words."""
    rows: dict[str, str] = {}
    for db in sorted((log_dir / DB_DIR_NAME).glob("*.db")):
        conn = sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True)
        try:
            for instance_id, ready, run_id, name, state, pid in conn.execute(
                "SELECT id, ready_path, run_id, name, state, pid FROM instances"
            ):
                steps = conn.execute(
                    "SELECT event, dest, detail FROM transitions WHERE instance_id = ? ORDER BY id",
                    [instance_id],
                ).fetchall()
                history = " > ".join(f"{event}:{dest}" for event, dest, _ in steps)
                last = f", last detail '{steps[-1][2]}'" if steps else ""
                rows[ready] = (
                    f"run {run_id} {name}: state {state}, recorded pid {pid}, history {history}{last}"
                )
        finally:
            conn.close()
    return rows


def _parent(process: psutil.Process) -> int | None:
    try:
        return process.ppid()
    except psutil.Error:
        return None


def _flag(argv: list[str], name: str) -> str | None:
    for index, arg in enumerate(argv[:-1]):
        if arg == name:
            return argv[index + 1]
    return None


def audit_database(db: Path) -> list[str]:
    """Every inconsistency of a reaped database: integrity, open runs, live or lying instances."""
    found: list[str] = []
    conn = sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True)
    try:
        check = conn.execute("PRAGMA integrity_check").fetchone()[0]
        if check != "ok":
            found.append(f"{db.name}: integrity_check says {check}")
        for (run_id,) in conn.execute("SELECT run_id FROM runs WHERE ended_at IS NULL"):
            found.append(f"run {run_id}: not ended after reap")
        for instance_id, run_id, name, state in conn.execute("SELECT id, run_id, name, state FROM instances"):
            where = f"run {run_id} instance {name} (id {instance_id})"
            if state not in TERMINAL:
                found.append(f"{where}: state {state} after reap")
            rows = conn.execute(
                "SELECT source, event, dest FROM transitions WHERE instance_id = ? ORDER BY id", [instance_id]
            ).fetchall()
            current = "configured"
            for source, event, dest in rows:
                if source != current or target_of(source, event) != dest:
                    found.append(f"{where}: illegal step {source} -{event}-> {dest} after {current}")
                current = dest
            if current != state:
                found.append(f"{where}: state {state} but its last history row says {current}")
    finally:
        conn.close()
    return found


def run_chaos(plan: ChaosPlan, binary: Path, scratch: Path) -> ChaosResult:
    """Run ``plan`` with ``binary`` in ``scratch`` (which receives the log dir and launcher logs)."""
    return _Chaos(plan, binary, scratch).run()


# -- command line --------------------------------------------------------------------------------


def _report(result: ChaosResult, command: str, load_before: str, load_after: str) -> str:
    plan = result.plan
    lines = [
        "# Chaos run",
        "",
        f"Command: `{command}`",
        "",
        f"Machine: {os.cpu_count()} cores, shared with other work (load average {load_before} before, "
        f"{load_after} after). Plan: {plan.launchers} launchers x {plan.lifecycles} lifecycles, seed "
        f"{plan.seed}, a kill every {plan.kill_every:g} s on average ({plan.launcher_share:.0%} launchers, "
        f"{plan.aim_at_start:.0%} of those 0-150 ms into a start), "
        f"time limit {plan.time_limit:g} s; shutdown_grace {SHUTDOWN_GRACE_SECONDS:g}s; even launchers with "
        "exit_with_owner, launchers 2, 3, 6, 7 with one restart allowed. Written by bench/chaos.py.",
        "",
        result.table(),
        "",
        "Instances the reap closed, by the state the kill left them in and what the reap found:",
        "",
        "| state at reap: outcome | instances |",
        "| --- | --- |",
        *(f"| {key} | {count} |" for key, count in sorted(result.reaped.items())),
        "",
    ]
    for title, items in (
        ("Orphans", result.orphans),
        ("Files left", result.files_left),
        ("Inconsistent rows", result.inconsistencies),
        ("Launcher errors", result.launcher_errors),
    ):
        if items:
            lines += [f"## {title}", "", *(f"- {item}" for item in items[:40]), ""]
    return "\n".join(lines)


def _load() -> str:
    return " / ".join(f"{value:.1f}" for value in os.getloadavg())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    sub = parser.add_subparsers(dest="mode")
    launcher = sub.add_parser("launcher", help="(internal) one launcher slot's lifecycles")
    launcher.add_argument("--log-dir", required=True)
    launcher.add_argument("--binary", required=True)
    launcher.add_argument("--origin", required=True)
    launcher.add_argument("--ca-file", required=True)
    launcher.add_argument("--count", type=int, required=True)
    launcher.add_argument("--seed", type=int, required=True)
    launcher.add_argument("--restarts", type=int, default=0)
    launcher.add_argument("--exit-with-owner", action="store_true")
    parser.add_argument("--launchers", type=int, default=ChaosPlan.launchers)
    parser.add_argument("--lifecycles", type=int, default=ChaosPlan.lifecycles)
    parser.add_argument("--seed", type=int, default=ChaosPlan.seed)
    parser.add_argument("--kill-every", type=float, default=ChaosPlan.kill_every)
    parser.add_argument("--launcher-share", type=float, default=ChaosPlan.launcher_share)
    parser.add_argument("--aim-at-start", type=float, default=ChaosPlan.aim_at_start)
    parser.add_argument("--time-limit", type=float, default=ChaosPlan.time_limit)
    parser.add_argument("--out", type=Path, default=None, help="default: bench/results/chaos.md")
    parser.add_argument(
        "--no-readme", action="store_true", help="do not write the table into bench/README.md"
    )
    parser.add_argument("--keep", action="store_true", help="keep the scratch folder (logs, database)")
    args = parser.parse_args(argv)
    if args.mode == "launcher":
        return launcher_main(args)
    plan = ChaosPlan(
        args.launchers,
        args.lifecycles,
        args.seed,
        args.kill_every,
        args.launcher_share,
        args.aim_at_start,
        args.time_limit,
    )
    binary = ensure_binary(user_cache_dir())
    load_before = _load()
    scratch = Path(tempfile.mkdtemp(prefix="sidecar-fsm-chaos-"))
    result = run_chaos(plan, binary, scratch)
    command = "python bench/chaos.py " + " ".join(sys.argv[1:] if argv is None else argv)
    report = _report(result, command.strip(), load_before, _load())
    out = args.out or results_path("chaos")
    out.write_text(report + "\n")
    if not args.no_readme:
        details = "[results/chaos.md](results/chaos.md)"
        note = f"every orphan is explained in {details}" if result.orphans else f"details in {details}"
        summary = (
            f"{plan.launchers} launchers x {plan.lifecycles} lifecycles on one log dir, seed {plan.seed}, "
            f"load average {load_before} before; {note}"
        )
        update_readme("chaos", f"`{command.strip()}`\n\n{result.table()}\n\n{summary}")
    print(report)
    if args.keep or result.orphans or result.inconsistencies or result.launcher_errors:
        print(f"scratch kept: {scratch}")
    else:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0 if not (result.orphans or result.files_left or result.inconsistencies) else 1


if __name__ == "__main__":
    sys.exit(main())
