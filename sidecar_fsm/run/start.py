"""Starting one run's children: record the run, spawn every instance, await them together.

Owns ``start`` (``NodeSidecars.start()``) and the steps a restart reuses: ``launch`` (one process,
remembered, not yet recorded) and ``await_ready`` (every given child at once). Any exception out
of ``start`` stops every child first. Creating the logs, and each process with its record, run
with SIGINT held (``interrupts_deferred``): an interrupt there would leak a child nothing knows.
SIGKILL cannot be held: a launcher killed there leaves a process no row names yet, which ``reap``
still finds and proves ours (``procs.find_ours``). Signals only through ``stop.kill``.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from sidecar_fsm.base import procs
from sidecar_fsm.base.ready import ReadyOutcome, ReadyWait, wait_all_ready
from sidecar_fsm.errors import SidecarError
from sidecar_fsm.run import crashpoints, targets, upcheck
from sidecar_fsm.run.binaryflags import filter_command
from sidecar_fsm.run.children import Child, SidecarRun, process_facts
from sidecar_fsm.run.command import config_summary, sidecar_command, sidecar_env
from sidecar_fsm.run.interrupts import interrupts_deferred
from sidecar_fsm.run.messages import log_failure_message, with_log_tail
from sidecar_fsm.run.runfiles import create_logs, remove_files
from sidecar_fsm.run.stop import kill, stop
from sidecar_fsm.state import storagefault
from sidecar_fsm.state.fsm import Firing, InstanceMachine, fire_together
from sidecar_fsm.state.sharedstore import owner_identity, shared_store
from sidecar_fsm.state.store import InstanceRecord, NewInstance


def start(run: SidecarRun) -> list[str]:
    """Start every instance and wait until all are ready (``NodeSidecars.start``); one line each."""
    if run.started:
        raise SidecarError(f"run {run.run_id}: already started; create a new NodeSidecars for another run")
    run.started = True
    try:
        # The database first, then the logs, then the run row: an unusable log dir fails
        # in one line with nothing recorded, started or left behind.
        if run.store is None:
            run.store = shared_store(run.log_dir)
        run.record = storagefault.RecordWatch.of(run.store.path)
        crashpoints.hit("store-opened")
        env = sidecar_env(run.config)
        if not (os.path.isfile(run.binary) and os.access(run.binary, os.X_OK)):
            _fail_all(
                run, f"sidecar.binary: '{run.binary}' is not executable; build it or set sidecar.binary"
            )
        _spawn_all(run, env)
        errors = await_ready(run, run.children)
        if errors:
            raise SidecarError("\n".join(errors))
        listening = [
            f"{run.host}: {child.name} listening on {child.listen} -> {child.instance.upstream} "
            f"(run {run.run_id})"
            for child in run.children
        ]
        # Said now, before the check's wait (up to upstream_check_seconds): the proxies serve
        # already, and a start that printed nothing for 10 s looked hung.
        for line in listening:
            run.notify(line)
        run.upstream_verdicts = [f"{run.host}: {line}" for line in _check_upstreams(run)]
        crashpoints.hit("upstreams-checked")
    except BaseException:
        # The original error is the one worth reporting; a state write failing during this
        # cleanup has already ended the processes (stop() guarantees it) and is dropped.
        with contextlib.suppress(Exception):
            _adopt_if_recorded(run)
            stop(run)
        raise
    return listening


def _check_upstreams(run: SidecarRun) -> list[str]:
    """Await every proxy's first upstream check (``upcheck``); one line each, [] when ``off``.
    With ``fail``, each instance whose check failed is ended and failed, and ``SidecarError``
    names them (the caller's cleanup then stops the rest)."""
    if run.config.upstream_check == "off":
        return []
    why = "metrics: false" if not run.config.metrics else "its binary serves no metrics"
    timeout = float(run.config.upstream_check_seconds)
    verdicts = upcheck.await_verdicts(
        [upcheck.CheckTarget(c.name, c.instance.upstream, c.metrics, why) for c in run.children],
        timeout,
        lambda names: run.notify(f"{run.host}: {upcheck.waiting_line(names, timeout)}"),
    )
    if run.config.upstream_check == "fail":
        failed = [(c, v) for c, v in zip(run.children, verdicts, strict=True) if v.failed]
        messages = [f"{run.where(c)}: {v.reason(timeout)} (upstream_check: fail)" for c, v in failed]
        for (child, _), message in zip(failed, messages, strict=True):
            run.fail(child, message, exit_code=kill(child))
        if messages:
            raise SidecarError("\n".join(messages))
    return [verdict.line(timeout) for verdict in verdicts]


def _spawn_all(run: SidecarRun, env: dict[str, str]) -> None:
    """Open every log, record the run, then launch and record each child in turn."""
    paths = [run.path(instance, ".log") for instance in run.instances]
    logs: list[int] = []
    try:
        # Made and kept in one step a Ctrl-C cannot cut (descriptors open and files nothing
        # names otherwise); the step is a few opens.
        with interrupts_deferred():
            logs = create_logs(run.log_dir, paths)
        # The run is recorded before any process exists, and each instance's `build` and
        # `spawn` (one commit) right after its own launch: a launcher killed between two
        # launches leaves every running sidecar recorded with its pid, for `reap`.
        try:
            crashpoints.hit("logs-created")
            _open_run(run)
        except BaseException:
            # Nothing names these logs unless the run row was committed (an interrupt can land
            # after the commit, before the run knows it): a start that recorded none leaves none.
            with contextlib.suppress(Exception):
                _adopt_if_recorded(run)
            if not run.run_created:
                remove_files(paths)
            raise
        for child, log in zip(run.children, logs, strict=True):
            with interrupts_deferred():
                launch(run, child, env, log=log)
                _record_spawn(run, child)
    finally:
        for log in logs:
            os.close(log)


def _fail_all(run: SidecarRun, message: str) -> None:
    """Record the run with every instance ``failed`` for ``message``, then raise it."""
    _open_run(run)
    for child in run.children:
        child.machine.fire("build", detail=run.binary, binary=run.binary)
        crashpoints.hit("launch-failed-recorded")
        run.fail(child, message)
    raise SidecarError(message)


def _open_run(run: SidecarRun) -> None:
    """Record the run and every instance (``configured``) in one transaction: an interrupted
    start never leaves a run with half its instances on record."""
    store = run.store
    assert store is not None  # start() opened it
    owner = owner_identity()
    # The start's first write waits for another process's write lock no longer than the
    # start itself may take: a stuck holder fails the start at its deadline, naming it.
    with store.transaction(wait_seconds=float(run.config.startup_timeout_seconds)):
        store.create_run(
            run.run_id,
            os.getpid(),
            owner.start_time if owner else None,
            config_summary(run.config, run.instances, run.binary),
        )
        records = store.create_instances(
            run.run_id,
            [
                NewInstance(
                    instance.name,
                    instance.listen,
                    instance.upstream,
                    run.binary,
                    run.path(instance, ".log"),
                    run.path(instance, ".ready"),
                )
                for instance in run.instances
            ],
        )
    crashpoints.hit("run-recorded")
    _adopt(run, records)


def _adopt(run: SidecarRun, records: list[InstanceRecord]) -> None:
    """Make ``records`` (this run's committed instances, in order) the run's children."""
    assert run.store is not None
    children = []
    for index, (instance, record) in enumerate(zip(run.instances, records, strict=True)):
        assert record.log_path is not None and record.ready_path is not None
        machine = InstanceMachine(run.store, record.id)
        children.append(
            Child(index, instance, machine, record.log_path, record.ready_path, listen=instance.listen)
        )
    # Children first: a run marked created always has them (stop() settles each).
    run.children = children
    run.run_created = True


def _adopt_if_recorded(run: SidecarRun) -> None:
    """After an interrupt between ``_open_run``'s COMMIT and the lines that take its result:
    adopt the recorded run, or ``stop()`` would see none and leave it live on record."""
    if run.run_created or run.store is None:
        return
    records = run.store.instances_of(run.run_id)
    if records:
        _adopt(run, sorted(records, key=lambda record: record.id))


def _build_firing(run: SidecarRun, child: Child) -> Firing:
    return Firing(child.machine, "build", run.binary, {"binary": run.binary})


def _record_spawn(run: SidecarRun, child: Child) -> None:
    """Record ``build`` and ``spawn`` (pid, start time) of ``child``'s new process in one commit."""
    assert child.process is not None
    spawn = Firing(child.machine, "spawn", f"pid {child.process.pid}", process_facts(child))
    fire_together([_build_firing(run, child), spawn])
    crashpoints.hit("spawn-recorded")


def launch(
    run: SidecarRun,
    child: Child,
    env: dict[str, str],
    restart_of: int | None = None,
    log: int | None = None,
) -> None:
    """Start ``child``'s process on ``child.listen``; remembers it, records nothing yet.

    Callers hold SIGINT around this and the event that records it, so a process never exists
    without ``child.process`` naming it. ``log``: the caller's open log (a start), else it is
    opened here (a restart). A failure to open the log or start the binary fails the instance
    and raises ``SidecarError``.
    """
    if restart_of is not None:
        # The dead process's ready file: wait_all_ready insists on the new pid anyway, this
        # just keeps the directory honest.
        Path(child.ready_path).unlink(missing_ok=True)
    instance = child.instance
    if child.listen != instance.listen:  # a restart on the port the first process bound
        instance = instance.model_copy(update={"listen": child.listen})
    argv = sidecar_command(run.binary, run.config, instance, child.ready_path)
    if run.flags is not None:
        argv = filter_command(argv, run.flags)
    try:
        process = procs.spawn(argv, env, child.log_path if log is None else log)
        crashpoints.hit("launched")
    except OSError as exc:
        if log is None and exc.filename == child.log_path:
            problem = log_failure_message(child.log_path, exc)
        else:
            problem = f"'{run.binary}' could not be started ({exc}); check sidecar.binary"
        raise _launch_failed(run, child, problem, restart_of) from exc
    child.process = process
    # Start time only, no executable: a wrapper script that execs the proxy changes its exe
    # after we look, and would then never be "ours" to signal. None if it exited already.
    found = procs.identity_of(process.pid)
    child.identity = procs.ProcessIdentity(process.pid, found.start_time, None) if found else None


def _launch_failed(run: SidecarRun, child: Child, problem: str, exit_code: int | None) -> SidecarError:
    """Fail ``child`` whose process could not be started; the error for the caller to raise."""
    message = f"{run.where(child)}: {problem}"
    if child.state == "configured":  # a start, which records `build` with the `spawn` that failed
        fire_together([_build_firing(run, child)])
        crashpoints.hit("launch-failed-recorded")
    run.fail(child, message, exit_code=exit_code)
    return SidecarError(message)


def await_ready(run: SidecarRun, children: list[Child]) -> list[str]:
    """Wait for all ``children`` at once; fire ``ready`` or ``fail``; the failure messages."""
    waits = [
        ReadyWait(child.name, child.ready_path, child.process, child.listen)
        for child in children
        if child.process
    ]
    outcomes = wait_all_ready(waits, timeout=float(run.config.startup_timeout_seconds))
    bound = {name: outcome.info for name, outcome in outcomes.items() if outcome.info is not None}
    # One commit for every instance that came up, all or none: the caller gets its addresses
    # right after it. `metrics` is written even when None: a restarted proxy's old metrics
    # port is stale, and a binary without -metrics-listen has none.
    fire_together(
        [
            Firing(
                child.machine,
                "ready",
                f"listening on {bound[child.name].listen}",
                {"listen": bound[child.name].listen, "metrics": bound[child.name].metrics},
            )
            for child in children
            if child.name in bound
        ]
    )
    crashpoints.hit("ready-recorded")
    if bound and run.store is not None:
        targets.refresh(run.store)
        crashpoints.hit("targets-written")
    errors: list[str] = []
    for child in children:
        if child.name in bound:
            child.listen = bound[child.name].listen
            child.metrics = bound[child.name].metrics
            child.route = bound[child.name].route
        else:
            errors.append(_startup_failure(run, child, outcomes.get(child.name)))
    return errors


def _startup_failure(run: SidecarRun, child: Child, outcome: ReadyOutcome | None) -> str:
    """Fail ``child`` that did not become ready (ending its process first); the message."""
    exit_code = outcome.exit_code if outcome else None
    if outcome is not None and outcome.refused:  # its ready file names a port not its own
        exit_code = kill(child)
        message = with_log_tail(f"{run.where(child)}: {outcome.refused}", child.log_path)
    elif exit_code is None:
        # Timed out (or never waited on): it is not serving anything, so no drain is owed.
        exit_code = kill(child)
        message = with_log_tail(
            f"{run.where(child)}: not ready after {run.config.startup_timeout_seconds:g}s "
            f"(startup_timeout_seconds); raise it or see {child.log_path}",
            child.log_path,
        )
    else:
        message = run.exit_message(child, exit_code, before_ready=True)
    run.fail(child, message, exit_code=exit_code)
    return message
