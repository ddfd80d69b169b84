"""One judgement of what runs now: ``status``, ``reap`` and the Prometheus target file agree on it.

Named situations side by side in one log dir, each a run whose rows are written through the
real store and state machine and point at real processes: real proxies (the built binary, with
``-metrics-listen``) that run or have exited, a real owner process killed with SIGKILL, unrelated
processes holding a recorded pid, a row with no start time, another host's database, and a run
started by the launcher itself (its owner, this test, alive). The commands run as a user runs
them (subprocesses). What ``status --json`` says runs is what ``reap --dry-run --json`` plans to
act on, and what ``status`` scrapes is what the target file lists, before the reap and after it.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from helpers import ProcessRegistry, sidecar_cli, wait_until
from test_status_live import sidecars

from sidecar_fsm.base import procs
from sidecar_fsm.lab import TlsH2Origin
from sidecar_fsm.run import targets
from sidecar_fsm.state.fsm import InstanceMachine
from sidecar_fsm.state.hostname import host_name
from sidecar_fsm.state.store import Store

SLEEP = "/bin/sleep" if os.path.exists("/bin/sleep") else "/usr/bin/sleep"
OTHER_HOST = "node-x"

# situation -> (owner verdict, {instance: (what its recorded pid is, process verdict)}), the
# verdicts as status --json and reap --json say them.
SITUATIONS: dict[str, tuple[str, dict[str, tuple[str, str]]]] = {
    "owner alive": ("alive", {"policy": ("proxy", "running")}),
    "owner dead with sidecars running": ("dead", {"policy": ("proxy", "running")}),
    "owner dead and nothing left": ("dead", {"policy": ("exited proxy", "gone")}),
    "pid reused": ("reused", {"policy": ("proxy", "running"), "judge": ("impostor", "reused")}),
    # The record alone cannot prove the pid; the run's claim (executable, its ready path in
    # argv, started after the run) proves our proxy, and proves nothing of another process.
    "no start time recorded": (
        "dead",
        {"policy": ("proxy, no start time", "running"), "judge": ("impostor, no start time", "unproven")},
    ),
    "owner with no start time recorded": ("unproven", {"policy": ("proxy", "running")}),
    "another host's run": ("other host", {"policy": ("other host", "other host")}),
}
# A reap acts on exactly the open runs whose owner is dead or reused.
REAPED = {
    "owner dead with sidecars running",
    "owner dead and nothing left",
    "pid reused",
    "no start time recorded",
}
# The runs whose proxies serve /metrics: status scrapes them, the target file lists them.
SERVING = {
    "owner alive",
    "owner dead with sidecars running",
    "pid reused",
    "owner with no start time recorded",
}


def verdicts(situation: str) -> dict[str, str]:
    return {name: verdict for name, (_, verdict) in SITUATIONS[situation][1].items()}


class Lab:
    """Writes the situations' rows and starts their processes; every process is registered."""

    def __init__(self, log_dir: Path, binary: Path, origin: TlsH2Origin, registry: ProcessRegistry) -> None:
        self.log_dir, self.binary, self.origin, self.registry = log_dir, binary, origin, registry
        self.proxies: dict[tuple[str, str], subprocess.Popen[bytes]] = {}
        self.impostors: list[subprocess.Popen[Any]] = []

    def sleeper(self) -> procs.ProcessIdentity:
        proc = self.registry.add(subprocess.Popen([SLEEP, "300"], stdin=subprocess.DEVNULL))
        self.impostors.append(proc)
        identity = procs.identity_of(proc.pid)
        assert identity is not None
        return identity

    def killed_owner(self) -> tuple[int, float]:
        """A real owner process, then ``kill -9``ed, as a launcher is: its pid and start time."""
        owner = subprocess.Popen([SLEEP, "300"], stdin=subprocess.DEVNULL)
        identity = procs.identity_of(owner.pid)
        owner.send_signal(signal.SIGKILL)
        owner.wait()
        assert identity is not None
        return owner.pid, identity.start_time

    def proxy(self, situation: str, name: str, ready: Path) -> tuple[int, float, dict[str, Any]]:
        """A real proxy writing ``ready``: its pid, start time and ready file."""
        argv = [str(self.binary), "-listen", "127.0.0.1:0", "-upstream", self.origin.url]
        argv += ["-ca-file", str(self.origin.ca_file), "-shutdown-grace", "5s"]
        argv += ["-ready-file", str(ready), "-metrics-listen", "127.0.0.1:0"]
        proc = procs.spawn(argv, dict(os.environ), str(ready.with_suffix(".log")))
        self.registry.add(proc)
        self.proxies[(situation, name)] = proc
        info: dict[str, Any] = wait_until(
            lambda: ready.exists() and json.loads(ready.read_text()), 20, "ready"
        )
        identity = procs.identity_of(proc.pid)
        assert identity is not None
        return proc.pid, identity.start_time, info

    def run(
        self, store: Store, situation: str, owner: tuple[int, float | None], metrics: str | None = None
    ) -> str:
        """One run of ``situation``; each instance recorded ready, its pid as ``SITUATIONS`` says:
        a live proxy, a proxy that exited, an unrelated process (an impostor), either recorded
        with no start time, or another host's pid. ``metrics`` replaces the recorded address."""
        run_id = uuid.uuid4().hex
        store.create_run(run_id, owner[0], owner[1], {"shutdown_grace": "5s"})
        for name, (kind, _) in SITUATIONS[situation][1].items():
            ready = self.log_dir / f"h2ping-{name}-{store.host}-{run_id}.ready"
            record = store.create_instance(
                run_id, name, "127.0.0.1:0", self.origin.url, str(self.binary), str(ready), str(ready)
            )
            machine = InstanceMachine(store, record.id)
            machine.fire("build")
            if kind.startswith("impostor"):
                impostor = self.sleeper()
                pid, start, info = impostor.pid, impostor.start_time - 100, {"listen": "127.0.0.1:9"}
            elif kind == "other host":
                pid, start, info = 4242, 1.0, {"listen": "127.0.0.1:9", "metrics": "127.0.0.1:10"}
            else:
                pid, start, info = self.proxy(situation, name, ready)
            if kind == "exited proxy":
                proc = self.proxies[(situation, name)]
                proc.terminate()
                assert procs.wait_exit(proc, 10) is not None
            machine.fire("spawn", pid=pid, pid_start_time=None if kind.endswith("no start time") else start)
            machine.fire("ready", listen=info["listen"], metrics=metrics or info.get("metrics"))
        return run_id


@pytest.fixture
def lab(
    log_dir: Path, sidecar_binary: Path, tls_origin: TlsH2Origin, process_registry: ProcessRegistry
) -> Lab:
    return Lab(log_dir, sidecar_binary, tls_origin, process_registry)


@pytest.fixture
def situations(lab: Lab, log_dir: Path, cache_dir: Path) -> Iterator[dict[str, str]]:
    """Every situation in ``log_dir``: situation -> run id. The launcher's run starts last, so
    its start rewrites the target file with every situation on record, as a real start does."""
    runs: dict[str, str] = {}
    with Store.open(log_dir) as store:
        for situation, (owner, _) in SITUATIONS.items():
            if owner in ("alive", "other host"):
                continue
            if owner == "dead":
                recorded: tuple[int, float | None] = lab.killed_owner()
            else:  # a live process at the owner's pid: another one (reused), or unprovable
                impostor = lab.sleeper()
                recorded = (impostor.pid, None if owner == "unproven" else impostor.start_time - 100)
            runs[situation] = lab.run(store, situation, recorded)
    with Store.open(log_dir, host=OTHER_HOST) as other:
        runs["another host's run"] = lab.run(other, "another host's run", (4242, 1.0))
    with ExitStack() as stack:
        manager = stack.enter_context(sidecars(log_dir, cache_dir, lab.origin, lab.origin.url, ["policy"]))
        runs["owner alive"] = str(manager.run_id)
        assert set(runs) == set(SITUATIONS)
        yield runs


def status_document(log_dir: Path) -> dict[str, Any]:
    done = sidecar_cli(log_dir, "status", "--json")
    assert done.returncode in (0, 3), done.stderr
    document: dict[str, Any] = json.loads(done.stdout)
    return document


def reap_document(log_dir: Path, *flags: str) -> dict[str, Any]:
    done = sidecar_cli(log_dir, "reap", *flags, "--json")
    assert done.returncode == 0, done.stderr
    document: dict[str, Any] = json.loads(done.stdout)
    return document


def target_file(log_dir: Path) -> set[str]:
    path = log_dir / "sidecar-fsm" / "prometheus" / f"{host_name()}.json"
    return {target for entry in json.loads(path.read_text()) for target in entry["targets"]}


def scraped(status: dict[str, Any]) -> set[str]:
    """The metrics addresses status asked: its claim (serving, ours, running) and its proof."""
    return {
        inst["live"]["metrics"]
        for run in status["runs"]
        for inst in run["instances"]
        if inst["live"] is not None and not (inst["live"]["problem"] or "").startswith("not scraped")
    }


def settled_status(log_dir: Path) -> dict[str, Any]:
    """``status --json`` once every scraped proxy answered and saw its upstream up: the start-up
    dial takes a moment, and a scrape on a loaded machine may miss its 0.2 s deadline."""

    def settled() -> dict[str, Any] | None:
        document = status_document(log_dir)
        lives = [i["live"] for run in document["runs"] for i in run["instances"] if i["live"] is not None]
        lives = [live for live in lives if not (live["problem"] or "").startswith("not scraped")]
        return document if all(live["answered"] and live["upstream_up"] for live in lives) else None

    return wait_until(settled, 20, "every scraped proxy to answer with its upstream up")


def metrics_of(shown: dict[str, Any], situations: set[str]) -> set[str]:
    return {
        inst["metrics"]
        for situation in situations
        for inst in shown[situation]["instances"]
        if inst["metrics"] and inst["process"] == "running"
    }


def test_status_reap_and_the_target_file_agree_on_what_runs_in_every_named_situation(
    log_dir: Path, lab: Lab, situations: dict[str, str]
) -> None:
    situation_of = {run_id: situation for situation, run_id in situations.items()}
    status = settled_status(log_dir)
    plan = reap_document(log_dir, "--dry-run")

    shown = {situation_of[run["run_id"]]: run for run in status["runs"]}
    planned = {situation_of[run["run_id"]]: run for run in plan["runs"]}
    # Each situation reads as named.
    for situation, (owner, _) in SITUATIONS.items():
        run = shown[situation]
        assert run["owner"]["status"] == owner, situation
        assert {i["name"]: i["process"] for i in run["instances"]} == verdicts(situation), situation
    # Reap plans exactly the open runs whose owner status calls dead or reused, and for each
    # instance it names the process as status does; it ends exactly the ones status calls alive.
    assert set(planned) == REAPED
    for situation, run in planned.items():
        assert run["owner"] == shown[situation]["owner"]["status"]
        alive = {i["name"]: i["alive"] for i in shown[situation]["instances"]}
        for inst in run["instances"]:
            assert inst["process"] == verdicts(situation)[inst["name"]], (situation, inst)
            ends = inst["action"] in ("SIGTERM, mark failed", "wait for its drain, mark failed")
            assert ends == (alive[inst["name"]] is True), (situation, inst)
    # A run needs attention exactly when reap plans it and something of it may still run; one
    # whose processes are all gone ended with its owner, and reap only closes its record.
    for situation, run in shown.items():
        plan_of = planned.get(situation, {"instances": []})["instances"]
        left = [inst for inst in plan_of if inst["process"] in ("running", "unproven")]
        assert (run["attention"] is not None) == bool(left), (situation, run["attention"])
        assert run["ended_with_owner"] == (situation in planned and not left), situation
    # The target file lists exactly the proxies status scrapes (serving, ours, listening).
    assert scraped(status) == target_file(log_dir) == metrics_of(shown, SERVING)

    # The reap does what it planned: the proxies it ends are gone, nothing else was signalled.
    reaped = reap_document(log_dir)
    assert {situation_of[run["run_id"]] for run in reaped["runs"]} == REAPED
    for (situation, name), proc in lab.proxies.items():
        verdict = verdicts(situation)[name]
        if situation in planned and verdict == "running":
            assert procs.wait_exit(proc, 10) is not None, (situation, name)
        elif verdict != "gone":
            assert proc.poll() is None, (situation, name)
    assert all(impostor.poll() is None for impostor in lab.impostors), "an unrelated process was signalled"
    # Afterwards the agreement still holds: nothing left to reap, the file lists what runs.
    after = settled_status(log_dir)
    assert reap_document(log_dir, "--dry-run")["runs"] == []
    assert scraped(after) == target_file(log_dir) == metrics_of(shown, SERVING - REAPED)


def test_a_start_drops_the_targets_a_killed_launcher_left(log_dir: Path, cache_dir: Path, lab: Lab) -> None:
    """A launcher killed with -9 leaves its sidecars' entries in the target file; once those
    sidecars are gone, the next start on the host lists only what runs (no reap needed)."""
    situation = "owner dead with sidecars running"
    with Store.open(log_dir) as store:
        run_id = lab.run(store, situation, lab.killed_owner())
        (left,) = store.instances_of(run_id)
        # What the killed launcher's start wrote: its proxy listed.
        assert targets.refresh(store) is None
    assert target_file(log_dir) == {left.metrics}
    # The orphan exits (as with exit_with_owner); the file still names it until a rewrite.
    proc = lab.proxies[(situation, "policy")]
    proc.terminate()
    assert procs.wait_exit(proc, 10) is not None
    assert target_file(log_dir) == {left.metrics}
    with sidecars(log_dir, cache_dir, lab.origin, lab.origin.url, ["policy"]) as manager:
        with Store.open(log_dir) as store:
            (mine,) = store.instances_of(str(manager.run_id))
        assert mine.metrics and target_file(log_dir) == {mine.metrics}
    assert target_file(log_dir) == set()
    # The dead run still awaits its reap; the file did not wait for it.
    assert [run["run_id"] for run in reap_document(log_dir, "--dry-run")["runs"]] == [run_id]


def test_a_metrics_address_the_proxy_does_not_listen_on_is_neither_scraped_nor_listed(
    log_dir: Path, lab: Lab
) -> None:
    """The recorded address is words a ready file gave: a port another process holds is not the
    proxy's figures, for ``status`` nor for Prometheus (the file listed it without that proof)."""
    me = procs.identity_of(os.getpid())
    assert me is not None
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        foreign = f"127.0.0.1:{held.getsockname()[1]}"
        with Store.open(log_dir) as store:
            lab.run(store, "owner alive", (me.pid, me.start_time), metrics=foreign)
            assert targets.refresh(store) is None
        status = status_document(log_dir)
        (run,) = status["runs"]
        (inst,) = run["instances"]
        assert (run["owner"]["status"], inst["process"], inst["metrics"]) == ("alive", "running", foreign)
        assert inst["live"]["problem"] == f"not scraped: pid {inst['pid']} does not listen on {foreign}"
        assert scraped(status) == target_file(log_dir) == set()


def test_stop_does_not_signal_an_owner_it_cannot_prove_and_says_so(log_dir: Path, lab: Lab) -> None:
    """status shows the owner ``unproven`` (not gone: reap leaves the run alone), and stop
    agrees: it signals nothing and says why, instead of calling a live owner gone."""
    situation = "owner with no start time recorded"
    owner = lab.sleeper()
    with Store.open(log_dir) as store:
        run_id = lab.run(store, situation, (owner.pid, None))
    # Settled: a proxy just started may not have dialled its upstream yet, or, on a loaded
    # machine, may miss the scrape's deadline; either is attention, and neither is this test's.
    (run,) = settled_status(log_dir)["runs"]
    assert (run["owner"]["status"], run["attention"]) == ("unproven", None)
    done = sidecar_cli(log_dir, "stop", run_id)
    assert done.returncode == 1
    why = "cannot be proven to be the run's (no start time recorded); not signalled"
    assert done.stderr.strip().endswith(f"its owner (pid {owner.pid}) {why}")
    assert lab.impostors[0].poll() is None and lab.proxies[(situation, "policy")].poll() is None
    assert reap_document(log_dir, "--dry-run")["runs"] == []
