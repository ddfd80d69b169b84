"""Watching one run's children: notice the ones that exited, restart what the policy allows.

Owns ``failures`` (``NodeSidecars.failures()``): restarts through ``start.launch`` and
``start.await_ready``; each restart, and a child stopped (SIGSTOP) or running again, is said in
one line through ``run.notify``, where the operator looks.
"""

from __future__ import annotations

import contextlib
import time

from sidecar_fsm.base import procs
from sidecar_fsm.base.exitstatus import ended_words, exit_cell
from sidecar_fsm.errors import SidecarError
from sidecar_fsm.run import crashpoints, traffic
from sidecar_fsm.run.children import Child, SidecarRun, process_facts
from sidecar_fsm.run.command import sidecar_env
from sidecar_fsm.run.interrupts import interrupts_deferred
from sidecar_fsm.run.start import await_ready, launch
from sidecar_fsm.run.stop import stop
from sidecar_fsm.state import storagefault


def failures(run: SidecarRun) -> list[str]:
    """One message per instance no longer running, after restarting what may be (``NodeSidecars``)."""
    if not run.started or run.stopped:
        return []
    try:
        if run.record is not None:
            run.record.check(run.run_id)
        return _failures(run)
    except SidecarError as exc:
        assert run.store is not None
        # Recording nothing more: each write would meet the same fault, a stuck lock holder
        # costing the busy timeout per write (60 s) while the sidecars still run.
        run.unrecordable = exc
        with contextlib.suppress(Exception):
            stop(run)
        raise SidecarError(storagefault.stopped_message(run.store.path, run.run_id, exc)) from exc


def _failures(run: SidecarRun) -> list[str]:
    dead: list[tuple[Child, int]] = []
    for child in run.children:
        if child.state == "ready" and child.process is not None:
            code = child.process.poll()
            if code is not None:
                dead.append((child, code))
            else:
                _note_stopped(run, child, child.process.pid)
    policy = run.config.restart
    to_restart: list[tuple[Child, int]] = []
    for child, code in dead:
        if child.restart_count < policy.max_restarts:
            to_restart.append((child, code))
        else:
            run.fail(child, run.exit_message(child, code, before_ready=False), exit_code=code)
    if to_restart:
        _restart(run, to_restart)
    return [child.error for child in run.children if child.state == "failed" and child.error]


def _note_stopped(run: SidecarRun, child: Child, pid: int) -> None:
    """Say once that ``child``'s process is stopped, and once that it runs again: a stopped proxy
    is alive (nothing to restart) but answers nobody, which its exit code would never tell."""
    stopped = procs.is_stopped(pid)
    if stopped != child.stopped:
        child.stopped = stopped
        run.notify(
            f"{run.host}: {child.name} (pid {pid}) is stopped (SIGSTOP, a debugger): it answers nothing "
            f"until kill -CONT {pid}"
            if stopped
            else f"{run.host}: {child.name} (pid {pid}) runs again"
        )


def _restart(run: SidecarRun, dead: list[tuple[Child, int]]) -> None:
    # Said before the backoff, where the operator looks (the start's console, Gym's log): a
    # restart only recorded in the database is a crash nobody hears about.
    for child, code in dead:
        run.notify(
            f"{run.host}: {child.name} {ended_words(code)}; restarting (attempt {child.restart_count + 1} "
            f"of {run.config.restart.max_restarts}) on {child.listen}"
        )
    # The backoff is a real wait, not ordering: a proxy that dies at once (upstream refused
    # its flags, port taken) must not be respawned in a tight loop.
    time.sleep(run.config.restart.backoff_seconds)
    env = sidecar_env(run.config)
    spawned: list[Child] = []
    for child, code in dead:
        try:
            _respawn(run, child, env, code)
        except SidecarError:
            if child.state == "failed":
                continue  # could not be started: already failed with its message
            raise  # its restart (or failure) could not be recorded: failures() stops the run
        spawned.append(child)
    await_ready(run, spawned)


def _respawn(run: SidecarRun, child: Child, env: dict[str, str], exit_code: int) -> None:
    """Replace the dead process of a ``ready`` child on the same address; fire ``restart``."""
    # The dead process's last figures, before the new one writes the same file under its pid.
    traffic.import_children(run, [child])
    with interrupts_deferred():
        launch(run, child, env, restart_of=exit_code)
        assert child.process is not None
        attempt = child.restart_count + 1
        child.machine.fire(
            "restart",
            detail=(
                f"{exit_cell(exit_code)}; attempt {attempt} of {run.config.restart.max_restarts}, "
                f"pid {child.process.pid} on {child.listen}"
            ),
            restart_count=attempt,
            **process_facts(child),
        )
        crashpoints.hit("restart-recorded")
        child.restart_count = attempt
