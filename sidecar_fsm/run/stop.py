"""Ending one run's children: drain them together, kill what outlives the grace, close the run.

Owns ``stop`` (``NodeSidecars.stop()``) and ``kill``, the one SIGKILL of a child, which a start
that timed out uses too. A state write that fails never keeps a process alive: every process is
ended first and the error raised after.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable

from sidecar_fsm.base import procs
from sidecar_fsm.errors import SidecarError
from sidecar_fsm.run import crashpoints, targets, traffic
from sidecar_fsm.run.children import Child, SidecarRun
from sidecar_fsm.run.interrupts import interrupts_deferred
from sidecar_fsm.run.messages import exit_words, log_tail
from sidecar_fsm.run.runfiles import remove_ready_files
from sidecar_fsm.state.fsm import BEFORE_PROCESS, DRAINABLE

# How often a stop asks its caller whether to cut the drains short (``stop(hurry=...)``).
HURRY_POLL_SECONDS = 0.1
# Waiting for a SIGKILLed child to be reaped; the kernel needs no cooperation, so this is generous.
KILL_REAP_SECONDS = 5.0
# Exit statuses of a proxy that was asked to stop: 0 from its drain, -SIGTERM if the signal
# arrived before Go installed its handler (the first milliseconds of the process).
_CLEAN_STOP_CODES = (0, -signal.SIGTERM)


def stop(run: SidecarRun, hurry: Callable[[], bool] | None = None) -> None:
    """Drain and end every child, remove ready files and end the run row (``NodeSidecars.stop``)."""
    if run.stopped:
        return
    run.stopped = True
    problems: list[BaseException] = []
    interrupted: BaseException | None = None
    lost = _record_lost(run)
    draining: list[Child] = []
    # Only the wait for the drains may be cut by a Ctrl-C (a second one, often: the first
    # began this stop); held anywhere else, it would leave drains begun but not signalled,
    # or processes ended but not recorded, in a run already closed. Each held step is short.
    try:
        try:
            with interrupts_deferred():
                draining = _begin_drains(run, problems)
                # Every drain is on record before the first signal, then the signals go out
                # back to back: a woken sidecar may take our CPU, and interleaving would make
                # N sidecars drain one after another instead of together.
                for child in draining:
                    if child.identity is not None:
                        procs.signal_if_ours(child.identity, signal.SIGTERM)
                        crashpoints.hit("sigterm-sent")
        except KeyboardInterrupt as exc:  # held until the signals were out: no waiting
            interrupted = exc
        if interrupted is None:
            interrupted = _await_drains(run, draining, hurry)
        with interrupts_deferred():
            _record_drained(run, draining, interrupted, problems)
    finally:
        try:
            # After the drains: each proxy wrote its final figures as its drain ended. Not
            # held (it reads files): a Ctrl-C here still leaves the run closed below.
            traffic.import_children(run)
        finally:
            with interrupts_deferred():
                remove_ready_files([child.ready_path for child in run.children])
                _end_run(run, problems)
                if run.store is not None and run.run_created:
                    targets.refresh(run.store)
    if interrupted is not None:
        raise interrupted
    if lost is not None:
        raise SidecarError(str(lost))
    if problems:
        raise SidecarError(f"run {run.run_id}: stopped, but its state was not fully recorded: {problems[0]}")


def _record_lost(run: SidecarRun) -> SidecarError | None:
    """Why the database can no longer take this run's rows (and stop records nothing), if so."""
    if run.record is None or run.unrecordable is not None:
        return None
    try:
        run.record.check(run.run_id)
    except SidecarError as exc:
        # Deleted or replaced since the last check(): this stop's rows would go to a
        # file nobody reads (or into someone else's). End the processes, record nothing.
        run.unrecordable = exc
        return exc
    return None


def _begin_drains(run: SidecarRun, problems: list[BaseException]) -> list[Child]:
    """Record ``drain`` for every serving child (returned); settle every other child now."""
    draining: list[Child] = []
    for child in run.children:
        state = child.state
        if state in BEFORE_PROCESS and child.process is not None:
            # Launched but its spawn never recorded (that write failed): not serving
            # yet, so no drain is owed; the record says what happened.
            code = kill(child)
            message = f"{run.where(child)}: stopped before its spawn was recorded; see {child.log_path}"
            run.fail(child, message, exit_code=code, problems=problems)
        elif state in BEFORE_PROCESS:
            run.fire_collecting(
                problems, child, "stop", "stop-recorded", detail="stopped before a process existed"
            )
        elif state in DRAINABLE:
            code = child.process.poll() if child.process else None
            if code is not None:
                message = run.exit_message(child, code, before_ready=state == "spawned")
                run.fail(child, message, exit_code=code, problems=problems)
                continue
            run.fire_collecting(problems, child, "drain", "drain-recorded", detail="SIGTERM")
            draining.append(child)
    return draining


def _await_drains(
    run: SidecarRun, draining: list[Child], hurry: Callable[[], bool] | None
) -> BaseException | None:
    """Wait for ``draining`` against one deadline, asking ``hurry`` every ``HURRY_POLL_SECONDS``
    (``NodeSidecars.stop``); the ``KeyboardInterrupt`` that cut the wait short."""
    deadline = time.monotonic() + run.config.shutdown_grace_seconds + run.stop_slack_seconds
    hurried = hurry is None
    try:
        for child in draining:
            assert child.process is not None
            while True:
                remaining = max(0.0, deadline - time.monotonic())
                step = remaining if hurried else min(remaining, HURRY_POLL_SECONDS)
                if procs.wait_exit(child.process, step) is not None or time.monotonic() >= deadline:
                    break
                if not hurried and hurry is not None and hurry():
                    hurried = True
                    _signal_again(draining)
    except BaseException as exc:  # KeyboardInterrupt: no more waiting, kill what is left
        return exc
    return None


def _signal_again(draining: list[Child]) -> None:
    """The second SIGTERM to every proxy still draining: it ends its drain now."""
    for other in draining:
        if other.identity is not None and other.process is not None and other.process.poll() is None:
            procs.signal_if_ours(other.identity, signal.SIGTERM)
            crashpoints.hit("sigterm-sent")


def _record_drained(
    run: SidecarRun, draining: list[Child], interrupted: BaseException | None, problems: list[BaseException]
) -> None:
    """Kill what still runs (``failed``), record a clean exit as ``stopped``, any other as ``failed``."""
    for child in draining:
        assert child.process is not None
        code = child.process.poll()
        if code is None:
            code = kill(child)
            reason = "interrupted during drain" if interrupted else "killed after grace"
            grace = run.config.shutdown_grace
            message = f"{run.where(child)}: {reason} (shutdown_grace {grace}); see {child.log_path}"
            run.fail(child, message, exit_code=code, problems=problems)
        elif code in _CLEAN_STOP_CODES:
            run.fire_collecting(
                problems, child, "stop", "stopped-recorded", detail=f"exit {code}", exit_code=code
            )
        else:
            message = (
                f"{run.where(child)}: {exit_words(code)} while draining; "
                f"see {child.log_path}\n{log_tail(child.log_path)}"
            )
            run.fail(child, message, exit_code=code, problems=problems)


def _end_run(run: SidecarRun, problems: list[BaseException]) -> None:
    if run.store is None or run.unrecordable is not None:
        return
    try:
        if run.run_created:
            failed = any(child.state == "failed" for child in run.children)
            run.store.end_run(run.run_id, "failed" if failed else "ended")
            crashpoints.hit("run-ended")
    except Exception as exc:
        problems.append(exc)


def kill(child: Child) -> int | None:
    """SIGKILL ``child``'s process (through procs) and reap it; its exit code."""
    if child.process is None:
        return None
    if child.identity is not None and child.process.poll() is None:
        procs.signal_if_ours(child.identity, signal.SIGKILL)
        crashpoints.hit("sigkill-sent")
    return procs.wait_exit(child.process, KILL_REAP_SECONDS)
