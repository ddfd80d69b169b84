"""Reaping: closes the runs whose launcher is gone and ends only the sidecars proven to be theirs.

Observe, then act: ``observe``'s judgement (the one ``status`` shows) becomes a pure plan
(``plan_run``), carried out through ``procs.terminate`` (SIGTERM, SIGKILL after the recorded
grace), the ``fail`` event and ``store.end_run(run, "reaped")``. Never touches a run whose owner
is alive or not proven gone, nor another host's database (a reap can signal only its own host).
An instance's processes include each one ``procs.find_ours`` proves ours without a pid
(``RunObservation.to_end``): a launcher killed between a spawn and its commit leaves one, which
no order of commits can prevent, since a pid exists only after the spawn.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from filelock import FileLock

from sidecar_fsm.base import procs
from sidecar_fsm.base.ready import temp_files
from sidecar_fsm.config import parse_duration_seconds
from sidecar_fsm.errors import ConfigError
from sidecar_fsm.observe.runs import RunObservation, observe
from sidecar_fsm.observe.verdicts import Owner, Process
from sidecar_fsm.run import crashpoints, targets, traffic
from sidecar_fsm.run.prune import take_temp_files
from sidecar_fsm.state.fsm import DRAINABLE, TERMINAL, InstanceMachine
from sidecar_fsm.state.hostname import host_name
from sidecar_fsm.state.store import InstanceRecord, RunRecord, Store, database_path

DEFAULT_GRACE_SECONDS = 60.0


@dataclass(frozen=True)
class InstanceReap:
    """One instance of a reaped run: what was (or would be) done and how it ended."""

    instance_id: int
    name: str
    state: str
    pid: int | None
    action: str
    result: str | None = None
    # The observed verdict on its recorded pid (``status --json``'s ``process``); None: no process.
    process: Process | None = None


@dataclass(frozen=True)
class RunReap:
    """One run whose owner is gone: why, its non-terminal instances, the ready files removed."""

    run_id: str
    host: str
    owner_pid: int
    owner: Owner
    reason: str
    instances: list[InstanceReap] = field(default_factory=list)
    ready_files: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class ReapReport:
    dry_run: bool
    runs: list[RunReap]
    # Database temp files a launcher SIGKILLed while creating the database left (``tempfiles``).
    temp_files: list[str] = field(default_factory=list)
    # False when this host has no run on record at all (no database, or an empty one).
    any_recorded: bool = True


def _reason(run: RunRecord, owner: Owner) -> str:
    if owner == Owner.REUSED:
        return f"owner pid {run.owner_pid} now belongs to another process"
    return f"owner pid {run.owner_pid} is gone"


def recorded_grace_seconds(run: RunRecord) -> float:
    """The run's recorded ``shutdown_grace`` (default when absent): what its sidecars were told
    they may spend draining, so reap waits that long before SIGKILL, as ``stop()`` would have."""
    summary: dict[str, Any] = dict(run.config_summary or {})
    for key in ("shutdown_grace_seconds", "shutdown_grace"):
        value = summary.get(key)
        if value is None:
            continue
        try:
            return float(parse_duration_seconds(value, f"run {run.run_id} shutdown_grace"))
        except ConfigError:
            break
    return DEFAULT_GRACE_SECONDS


_RESULTS = {
    "exited": "drained and exited after SIGTERM",
    "exited-by-itself": "drained and exited by itself (exit_with_owner)",
    "exited-drained": "finished the drain its launcher had begun, and exited",
    "killed": "killed with SIGKILL after the {grace:g}s grace",
    "gone": "process had already exited",
    "not-ours": "pid {pid} belongs to another process; not signalled",
    "unproven": "pid {pid} cannot be proven ours (no start time recorded); not signalled",
}
# What is recorded for an instance with nothing to end, by the verdict on its recorded pid.
_NOTHING_TO_END = {
    Process.REUSED: ("(pid not ours)", "not-ours"),
    Process.UNPROVEN: ("(pid unproven)", "unproven"),
}


@dataclass(frozen=True)
class InstancePlan:
    """What reap does with one instance: the processes to end (``RunObservation.to_end``),
    whether they drain already (wait, do not SIGTERM), and the report line."""

    inst: InstanceRecord
    ends: list[procs.ProcessIdentity]
    draining: bool
    report: InstanceReap


def plan_instance(observed: RunObservation, inst: InstanceRecord, self_draining: bool) -> InstancePlan:
    """What to do with ``inst`` (in any state: see the module), from the observation alone. Pure."""
    process = observed.process_of(inst)
    ends = observed.to_end(inst)
    draining = self_draining or inst.state == "draining"
    if ends:
        action = "wait for its drain, mark failed" if draining else "SIGTERM, mark failed"
        unrecorded = [str(identity.pid) for identity in ends if identity.pid != inst.pid]
        if unrecorded:
            action += f" (unrecorded pid {', '.join(unrecorded)})"
    else:
        # Something may live at the pid, but the record does not prove it our sidecar.
        why = _NOTHING_TO_END.get(process) if process is not None else None
        action = f"mark failed {why[0]}" if why else "mark failed"
    report = InstanceReap(inst.id, inst.name, inst.state, inst.pid, action, process=process)
    return InstancePlan(inst, ends, draining, report)


def plan_run(observed: RunObservation) -> list[InstancePlan]:
    """The plan for every instance of ``observed`` not yet terminal. Pure."""
    self_draining = _drains_by_itself(observed.run)
    live = [inst for inst in observed.instances if inst.state not in TERMINAL]
    return [plan_instance(observed, inst, self_draining) for inst in live]


def _stale_ready_files(instances: list[InstanceRecord]) -> list[str]:
    """Ready files left behind, and the temp files of proxies that died while writing one."""
    candidates = [
        path
        for inst in instances
        if inst.ready_path
        for path in (inst.ready_path, *temp_files(inst.ready_path))
    ]
    return [path for path in candidates if os.path.lexists(path)]


def _traffic_temp_files(instances: Sequence[InstanceRecord]) -> list[str]:
    """Temp files of proxies SIGKILLed while replacing their traffic file: half a write holds
    no figure, so they go without a word, as ``prune`` would remove them with the run."""
    return [
        path
        for inst in instances
        if inst.log_path
        for path in temp_files(traffic.traffic_path(inst.log_path))
    ]


def reap_lock_path(store: Store) -> Path:
    """The lock two reapers share: next to the database, so it is per host like the database."""
    return Path(f"{store.path}.reap.lock")


def reap(store: Store, *, dry_run: bool = False) -> ReapReport:
    """Reap every open run of ``store`` whose owner is gone; with ``dry_run``, only say what.

    Idempotent: the open runs are read only once the file lock is held, so a second reaper
    finds them ended. A pid not provably ours is never signalled; each transition is committed
    before the signal it announces, so the next reap finishes what a killed one began.
    """
    # 0o644, not 0o666 minus the umask: nothing in the log dir is writable by others.
    with FileLock(str(reap_lock_path(store)), mode=0o644):
        report = ReapReport(dry_run=dry_run, runs=[], any_recorded=bool(store.list_runs()))
        for run in store.list_runs("live"):
            observed = observe(store, run)
            if observed.owner_gone:
                report.runs.append(_reap_run(store, observed, dry_run))
        if report.runs and not dry_run:
            # The reaped runs' sidecars leave Prometheus' targets (SPEC: rewritten at reap).
            targets.refresh(store)
        return report


def reap_here(log_dir: str, *, dry_run: bool = False) -> ReapReport:
    """``reap`` of this host's database under ``log_dir``, plus the database temp files a
    launcher killed while creating it left behind. A missing database is not created."""
    host = host_name()
    temps = take_temp_files(log_dir, host, dry_run)
    if not database_path(log_dir, host).exists():
        return ReapReport(dry_run=dry_run, runs=[], temp_files=temps, any_recorded=False)
    with Store.open(log_dir) as store:
        report = reap(store, dry_run=dry_run)
    return dataclasses.replace(report, temp_files=temps)


def _drains_by_itself(run: RunRecord) -> bool:
    """True when the run's sidecars got ``-exit-with-pid``: each began draining when its owner
    died, and a SIGTERM from us would end that drain at once, cutting its requests."""
    return bool(dict(run.config_summary or {}).get("exit_with_owner", False))


def _reap_run(store: Store, observed: RunObservation, dry_run: bool) -> RunReap:
    run = observed.run
    reason = _reason(run, observed.owner)
    grace = recorded_grace_seconds(run)
    result = RunReap(run.run_id, run.host, run.owner_pid, observed.owner, reason)
    for plan in plan_run(observed):
        result.instances.append(plan.report if dry_run else _reap_instance(store, plan, reason, grace))
    stale = _stale_ready_files(list(observed.instances))
    if not dry_run:
        # After the sidecars ended: each wrote its final figures when its drain did.
        traffic.import_instances(store, observed.instances)
        for path in stale + _traffic_temp_files(observed.instances):
            # The run's files are per run id, so no other run can be using them; a sidecar
            # that was killed (not drained) never removed its own.
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        store.end_run(run.run_id, "reaped")
        crashpoints.hit("reap-run-ended")
    result.ready_files.extend(stale)
    return result


# When an instance had more than one process (its recorded one and one a restart had started),
# the result reported is the most forceful that was needed.
_SEVERITY = ("gone", "exited", "exited-by-itself", "exited-drained", "killed")


def _reap_instance(store: Store, plan: InstancePlan, reason: str, grace: float) -> InstanceReap:
    inst, planned = plan.inst, plan.report
    machine = InstanceMachine(store, inst.id, inst.state)
    if not plan.ends:
        outcome = _NOTHING_TO_END[planned.process][1] if planned.process in _NOTHING_TO_END else "gone"
    else:
        # Only a spawned or ready row can say "draining"; a configured or building row whose
        # process was found unrecorded goes straight to failed once the process is ended.
        if machine.state in DRAINABLE:
            machine.fire("drain", detail=f"reap: {reason}")
            crashpoints.hit("reap-drain-recorded")
        # A row left `draining` had its SIGTERM sent (committed just before it), and a sidecar
        # whose -exit-with-pid owner died drains by itself: a second SIGTERM would cut the drain,
        # so reap waits out the grace, then SIGKILLs (a launcher killed between that commit and
        # its signal leaves a process that got none: it serves until the same deadline).
        launcher_drain = inst.state == "draining"
        outcomes: list[str] = []
        for identity in plan.ends:
            ended: str = procs.terminate(identity, grace, send_sigterm=not plan.draining)
            crashpoints.hit("reap-ended")
            if ended == "exited" and launcher_drain:
                ended = "exited-drained"
            elif ended == "exited" and plan.draining:
                ended = "exited-by-itself"
            outcomes.append(ended)
        outcome = max(outcomes, key=lambda each: _SEVERITY.index(each) if each in _SEVERITY else -1)
    text = _RESULTS[outcome].format(grace=grace, pid=inst.pid)
    error = f"reaped: {reason}; {text}"
    machine.fire("fail", detail=error, error=error)
    crashpoints.hit("reap-failed-recorded")
    return dataclasses.replace(planned, result=text)
