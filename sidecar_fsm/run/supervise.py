"""One run's sidecar children on this host: spawn, await readiness, supervise, restart, drain, stop.

Owns the processes a launcher run starts and every decision about them: when an instance counts
as ready, failed or restartable, and how it is ended. Their command line and environment are
``command``'s, their files ``runfiles``', the wording of failures ``messages``', the open
database ``sharedstore``'s. About 540 lines, past one sitting's 400: start, restart and stop
share the per-child steps (launch, record, kill, fail) and the run's state, which a further
split would pass back and forth.
Each decision becomes an event fired on the instance's ``InstanceMachine`` with the facts it
establishes (pid, start time, exit code, error, restart count, bound address) as arguments:
this module never sets a state, never writes SQL (``store`` does, inside the transition) and
never signals a process except through ``procs``. It does not build the binary (``buildcache``),
parse the config (``config``) or touch the caller's global config (``launcher``/``rewrite``).
``sidecar_command``, ``sidecar_env`` and ``shared_store`` stay importable from here.

Interrupts: once a process exists, any exception or ``KeyboardInterrupt`` out of ``start()``
stops every child first. The few lines between creating a process and recording it run with
SIGINT held (``interrupts_deferred``), since an interrupt there would leak a child nothing knows.
SIGKILL cannot be held: a launcher killed there leaves a process no row names yet, which
``reap`` still finds and proves ours (``procs.find_ours``: the binary and this run's ready path
in its argv). Every commit, spawn and signal here is followed by ``crashpoints.hit`` (inert
outside tests), so each of those instants is tested as a crash.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sidecar_fsm.base import procs
from sidecar_fsm.base.ready import ReadyInfo, ReadyOutcome, ReadyWait, wait_all_ready
from sidecar_fsm.config import H2PingSidecarConfig, SidecarInstanceConfig
from sidecar_fsm.errors import SidecarError
from sidecar_fsm.run import crashpoints
from sidecar_fsm.run.binaryflags import BinaryFlags, filter_command
from sidecar_fsm.run.command import config_summary, sidecar_command, sidecar_env
from sidecar_fsm.run.interrupts import interrupts_deferred
from sidecar_fsm.run.messages import (
    exit_message,
    log_failure_message,
    log_tail,
    port_clash_message,
    where,
    with_log_tail,
)
from sidecar_fsm.run.runfiles import create_logs, remove_files, remove_ready_files, run_file
from sidecar_fsm.state import storagefault
from sidecar_fsm.state.fsm import TERMINAL, Firing, InstanceMachine, fire_together
from sidecar_fsm.state.hostname import host_name
from sidecar_fsm.state.sharedstore import owner_identity, shared_store
from sidecar_fsm.state.store import NewInstance, Store

__all__ = ["NodeSidecars", "shared_store", "sidecar_command", "sidecar_env"]

# Time past `shutdown_grace` that `stop()` allows before SIGKILL: the proxy's own drain ends at
# the grace, so this only covers exiting (flushing logs, removing its ready file) on a busy host.
STOP_SLACK_SECONDS = 5.0
# How often a stop asks its caller whether to cut the drains short (``stop(hurry=...)``).
HURRY_POLL_SECONDS = 0.1
# Waiting for a SIGKILLed child to be reaped; the kernel needs no cooperation, so this is generous.
KILL_REAP_SECONDS = 5.0
# Exit statuses of a proxy that was asked to stop: 0 from its drain, -SIGTERM if the signal
# arrived before Go installed its handler (the first milliseconds of the process).
_CLEAN_STOP_CODES = (0, -signal.SIGTERM)


@dataclass
class _Child:
    """One instance of this run: its machine, its paths and its current process, if any."""

    index: int
    instance: SidecarInstanceConfig
    machine: InstanceMachine
    log_path: str
    ready_path: str
    # The address the proxy actually bound (from its ready file) once it was ready; until then the
    # configured one. A restart reuses it, so a `:0` instance keeps the port URLs were rewritten to.
    listen: str
    process: subprocess.Popen[bytes] | None = None
    identity: procs.ProcessIdentity | None = None
    restart_count: int = 0
    error: str | None = None

    @property
    def name(self) -> str:
        return self.instance.name

    @property
    def state(self) -> str:
        return self.machine.state


class NodeSidecars:
    """The sidecar processes one run owns on this host: one child per instance.

    ``start()`` records the run and its instances in the host's database, spawns every instance
    and awaits them together; ``failures()`` reports (or restarts) children that stopped;
    ``stop()`` drains and ends them all. Not thread-safe: one thread drives a run (Gym's poll
    loop). ``store`` and ``run_id`` may be given by a caller that already holds them (tests,
    the CLI); otherwise ``start()`` uses this process's ``shared_store(log_dir)``. ``flags``,
    what a user-named binary accepts (``binaryflags.check``), trims every command to them;
    None passes the whole command (the build cache's binary knows every flag).
    """

    def __init__(
        self,
        config: H2PingSidecarConfig,
        instances: list[SidecarInstanceConfig],
        binary: str,
        log_dir: str,
        store: Store | None = None,
        run_id: str | None = None,
        flags: BinaryFlags | None = None,
    ) -> None:
        self.config = config
        self.flags = flags
        self.instances = list(instances)
        self.binary = str(binary)
        self.log_dir = str(log_dir)
        self.host = host_name()  # the name the store files this run under
        self.run_id = run_id or uuid.uuid4().hex[:12]
        self.store = store
        # Past shutdown_grace before SIGKILL; an attribute so a test need not wait the default.
        self.stop_slack_seconds = STOP_SLACK_SECONDS
        self._children: list[_Child] = []
        self._started = False
        self._run_created = False
        self._stopped = False
        self._record: storagefault.RecordWatch | None = None
        # Set when a transition could not be recorded: the rest of the stop records nothing.
        self._unrecordable: SidecarError | None = None

    @property
    def running(self) -> bool:
        """True from ``start()`` until ``stop()`` (which a failed ``start()`` calls itself)."""
        return self._started and not self._stopped

    # -- naming -------------------------------------------------------------------------------

    def _path(self, instance: SidecarInstanceConfig, suffix: str) -> str:
        return run_file(self.log_dir, instance.name, self.host, self.run_id, suffix)

    def _where(self, child: _Child) -> str:
        return where(child.name, self.run_id, self.host)

    @property
    def instances_actual(self) -> list[SidecarInstanceConfig]:
        """The instances with ``listen`` as bound: a ``:0`` port replaced by the real one once ready."""
        if not self._children:
            return list(self.instances)
        return [child.instance.model_copy(update={"listen": child.listen}) for child in self._children]

    # -- start --------------------------------------------------------------------------------

    def start(self) -> list[str]:
        """Start every instance and wait until all are ready; one summary line per instance.

        All children are spawned first and awaited together, so N instances take one startup
        (plus a launch each), not N.
        Raises ``SidecarError`` naming every instance that exited or missed
        ``startup_timeout_seconds`` (with its log tail); before any exception leaves, including
        ``KeyboardInterrupt``, every child of this run has been stopped.
        """
        if self._started:
            raise SidecarError(
                f"run {self.run_id}: already started; create a new NodeSidecars for another run"
            )
        self._started = True
        try:
            # The database first, then the logs, then the run row: an unusable log dir fails
            # in one line with nothing recorded, started or left behind.
            if self.store is None:
                self.store = shared_store(self.log_dir)
            self._record = storagefault.RecordWatch.of(self.store.path)
            env = sidecar_env(self.config)
            if not (os.path.isfile(self.binary) and os.access(self.binary, os.X_OK)):
                self._fail_all(
                    f"sidecar.binary: '{self.binary}' is not executable; build it or set sidecar.binary"
                )
            logs = create_logs(self.log_dir, [self._path(instance, ".log") for instance in self.instances])
            try:
                # The run with its instances is recorded before any process exists, so a crash
                # leaves the run on record; each instance's `build` and `spawn` (one commit)
                # right after its own launch, so a launcher killed between two launches leaves
                # every running sidecar recorded with its pid, for `reap`. `build` is recorded
                # with `spawn` because the binary was resolved (or built) before the run.
                try:
                    self._open_run()
                except BaseException:
                    # Nothing names these logs yet (the run row is what would), so nothing
                    # would ever remove them: a start that cannot record its run leaves no file.
                    remove_files([self._path(instance, ".log") for instance in self.instances])
                    raise
                for child, log in zip(self._children, logs, strict=True):
                    with interrupts_deferred():
                        self._launch(child, env, log=log)
                        self._record_spawn(child)
            finally:
                for log in logs:
                    os.close(log)
            errors = self._await_ready(self._children)
            if errors:
                raise SidecarError("\n".join(errors))
        except BaseException:
            # The original error is the one worth reporting; a state write failing during this
            # cleanup has already ended the processes (stop() guarantees it) and is dropped.
            with contextlib.suppress(Exception):
                self.stop()
            raise
        return [
            f"{self.host}: {child.name} listening on {child.listen} -> {child.instance.upstream} "
            f"(run {self.run_id})"
            for child in self._children
        ]

    def _fail_all(self, message: str) -> None:
        """Record the run with every instance ``failed`` for ``message``, then raise it."""
        self._open_run()
        for child in self._children:
            child.machine.fire("build", detail=self.binary, binary=self.binary)
            crashpoints.hit("launch-failed-recorded")
            self._fail(child, message)
        raise SidecarError(message)

    def _open_run(self) -> None:
        """Record the run and every instance (state ``configured``) in one transaction.

        All or nothing: an interrupted start never leaves a run with half its instances on record.
        """
        if self.store is None:
            self.store = shared_store(self.log_dir)
        store = self.store
        owner = owner_identity()
        # The start's first write waits for another process's write lock no longer than the
        # start itself may take: a stuck holder fails the start at its deadline, naming it.
        with store.transaction(wait_seconds=float(self.config.startup_timeout_seconds)):
            store.create_run(
                self.run_id,
                os.getpid(),
                owner.start_time if owner else None,
                config_summary(self.config, self.instances, self.binary),
            )
            records = store.create_instances(
                self.run_id,
                [
                    NewInstance(
                        instance.name,
                        instance.listen,
                        instance.upstream,
                        self.binary,
                        self._path(instance, ".log"),
                        self._path(instance, ".ready"),
                    )
                    for instance in self.instances
                ],
            )
        crashpoints.hit("run-recorded")
        self._run_created = True
        for index, (instance, record) in enumerate(zip(self.instances, records, strict=True)):
            assert record.log_path is not None and record.ready_path is not None
            machine = InstanceMachine(store, record.id)
            self._children.append(
                _Child(index, instance, machine, record.log_path, record.ready_path, listen=instance.listen)
            )

    def _build_firing(self, child: _Child) -> Firing:
        return Firing(child.machine, "build", self.binary, {"binary": self.binary})

    def _record_spawn(self, child: _Child) -> None:
        """Record ``build`` and ``spawn`` (pid, start time) of ``child``'s new process in one commit."""
        assert child.process is not None
        spawn = Firing(child.machine, "spawn", f"pid {child.process.pid}", self._facts(child))
        fire_together([self._build_firing(child), spawn])
        crashpoints.hit("spawn-recorded")

    def _launch(
        self,
        child: _Child,
        env: dict[str, str],
        restart_of: int | None = None,
        log: int | None = None,
    ) -> None:
        """Start ``child``'s process on ``child.listen``; remembers it, records nothing yet.

        Callers hold SIGINT (``interrupts_deferred``) around this and the event that records it,
        so a process never exists without ``child.process`` naming it; ``stop()`` ends a
        launched child whose spawn was not recorded (that write failed). ``log`` is the log
        ``create_logs`` opened (a start; it stays the caller's to close), else it is opened
        here (a restart). A log that cannot be opened or an executable that cannot be started
        fails the instance and raises ``SidecarError``.
        """
        if restart_of is not None:
            # The dead process's ready file; wait_all_ready insists on the new pid anyway, this
            # just keeps the directory honest. A start's ready files are named after its run
            # id: any file there is not ours, is ignored by that pid check and goes at stop().
            Path(child.ready_path).unlink(missing_ok=True)
        instance = child.instance
        if child.listen != instance.listen:  # a restart on the port the first process bound
            instance = instance.model_copy(update={"listen": child.listen})
        argv = sidecar_command(self.binary, self.config, instance, child.ready_path)
        if self.flags is not None:
            argv = filter_command(argv, self.flags)
        try:
            process = procs.spawn(argv, env, child.log_path if log is None else log)
            crashpoints.hit("launched")
        except OSError as exc:
            if log is None and exc.filename == child.log_path:
                problem = log_failure_message(child.log_path, exc)
            else:
                problem = f"'{self.binary}' could not be started ({exc}); check sidecar.binary"
            raise self._launch_failed(child, problem, restart_of) from exc
        child.process = process
        # Start time only, no executable: a wrapper script that execs the proxy changes its exe
        # after we look, and would then never be "ours" to signal. None if it exited already.
        found = procs.identity_of(process.pid)
        child.identity = procs.ProcessIdentity(process.pid, found.start_time, None) if found else None

    def _launch_failed(self, child: _Child, problem: str, exit_code: int | None) -> SidecarError:
        """Fail ``child`` whose process could not be started; the error for the caller to raise."""
        message = f"{self._where(child)}: {problem}"
        if child.state == "configured":  # a start, which records `build` with the `spawn` that failed
            fire_together([self._build_firing(child)])
            crashpoints.hit("launch-failed-recorded")
        self._fail(child, message, exit_code=exit_code)
        return SidecarError(message)

    def _facts(self, child: _Child) -> dict[str, Any]:
        assert child.process is not None
        return {
            "pid": child.process.pid,
            "pid_start_time": child.identity.start_time if child.identity else None,
        }

    def _respawn(self, child: _Child, env: dict[str, str], exit_code: int) -> None:
        """Replace the dead process of a ``ready`` child on the same address; fire ``restart``."""
        with interrupts_deferred():
            self._launch(child, env, restart_of=exit_code)
            assert child.process is not None
            attempt = child.restart_count + 1
            child.machine.fire(
                "restart",
                detail=(
                    f"exit {exit_code}; attempt {attempt} of {self.config.restart.max_restarts}, "
                    f"pid {child.process.pid} on {child.listen}"
                ),
                restart_count=attempt,
                **self._facts(child),
            )
            crashpoints.hit("restart-recorded")
            child.restart_count = attempt

    def _await_ready(self, children: list[_Child]) -> list[str]:
        """Wait for all ``children`` at once; fire ``ready`` or ``fail``; the failure messages."""
        waits = [
            ReadyWait(child.name, child.ready_path, child.process, child.listen)
            for child in children
            if child.process
        ]
        outcomes = wait_all_ready(waits, timeout=float(self.config.startup_timeout_seconds))
        bound: dict[str, ReadyInfo] = {}
        for child in children:
            outcome = outcomes.get(child.name)
            if outcome is not None and outcome.info is not None:
                bound[child.name] = outcome.info
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
        errors: list[str] = []
        for child in children:
            if child.name in bound:
                child.listen = bound[child.name].listen
            else:
                errors.append(self._startup_failure(child, outcomes.get(child.name)))
        return errors

    def _startup_failure(self, child: _Child, outcome: ReadyOutcome | None) -> str:
        """Fail ``child`` that did not become ready (ending its process first); the message."""
        exit_code = outcome.exit_code if outcome else None
        if exit_code is None:
            # Timed out (or never waited on): it is not serving anything, so no drain is owed.
            exit_code = self._kill(child)
            message = (
                f"{self._where(child)}: not ready after {self.config.startup_timeout_seconds:g}s "
                f"(startup_timeout_seconds); raise it or see {child.log_path}"
            )
        else:
            message = self._exit_message(child, exit_code, before_ready=True)
        message = with_log_tail(message, child.log_path)
        self._fail(child, message, exit_code=exit_code)
        return message

    def _exit_message(self, child: _Child, exit_code: int, before_ready: bool) -> str:
        clash = port_clash_message(child.index, child.listen, self.store, self.run_id)
        return exit_message(self._where(child), exit_code, before_ready, child.log_path, clash)

    # -- supervision --------------------------------------------------------------------------

    def failures(self) -> list[str]:
        """One message per instance that is no longer running, after restarting what may be.

        A ``ready`` child whose process exited is restarted when ``restart.max_restarts`` allows
        (after ``restart.backoff``, on the address it had bound, awaited like a start); otherwise,
        or when the restart fails, it is ``failed`` with its exit code and log tail. Failed
        instances are reported on every call. Empty after ``stop()``.

        A transition that cannot be recorded (the filesystem is full, the write lock is held past
        the busy timeout, the database file was deleted or replaced) stops every sidecar of the
        run and raises ``SidecarError`` with one line saying why: a sidecar the record does not
        show could outlive a crash of this process with nothing left to reap it.
        """
        if not self._started or self._stopped:
            return []
        try:
            if self._record is not None:
                self._record.check(self.run_id)
            return self._failures()
        except SidecarError as exc:
            assert self.store is not None
            # Recording nothing more: each write would meet the same fault, a stuck lock holder
            # costing the busy timeout per write (60 s) while the sidecars still run.
            self._unrecordable = exc
            with contextlib.suppress(Exception):
                self.stop()
            raise SidecarError(storagefault.stopped_message(self.store.path, self.run_id, exc)) from exc

    def _failures(self) -> list[str]:
        dead: list[tuple[_Child, int]] = []
        for child in self._children:
            if child.state == "ready" and child.process is not None:
                code = child.process.poll()
                if code is not None:
                    dead.append((child, code))
        policy = self.config.restart
        to_restart: list[tuple[_Child, int]] = []
        for child, code in dead:
            if child.restart_count < policy.max_restarts:
                to_restart.append((child, code))
            else:
                message = f"{self._exit_message(child, code, before_ready=False)}\n{log_tail(child.log_path)}"
                self._fail(child, message, exit_code=code)
        if to_restart:
            self._restart(to_restart)
        return [child.error for child in self._children if child.state == "failed" and child.error]

    def check(self) -> None:
        """Raise ``SidecarError`` naming every instance that stopped (see ``failures()``)."""
        messages = self.failures()
        if messages:
            raise SidecarError("h2-ping-sidecar stopped unexpectedly:\n" + "\n".join(messages))

    def _restart(self, dead: list[tuple[_Child, int]]) -> None:
        # The backoff is a real wait, not ordering: a proxy that dies at once (upstream refused
        # its flags, port taken) must not be respawned in a tight loop.
        time.sleep(self.config.restart.backoff_seconds)
        env = sidecar_env(self.config)
        spawned: list[_Child] = []
        for child, code in dead:
            try:
                self._respawn(child, env, code)
            except SidecarError:
                if child.state == "failed":
                    continue  # could not be started: already failed with its message
                raise  # its restart (or failure) could not be recorded: failures() stops the run
            spawned.append(child)
        self._await_ready(spawned)

    # -- stop ---------------------------------------------------------------------------------

    def stop(self, hurry: Callable[[], bool] | None = None) -> None:
        """Drain and end every child, remove ready files and end the run row. Idempotent.

        ``hurry``, asked while the drains are awaited, returns True once the caller wants them
        cut short (a second Ctrl-C): every proxy still draining then gets its second SIGTERM,
        which ends its drain at once (closing the requests still in flight).

        Instances with no process go straight to ``stopped``. The rest get ``drain`` and SIGTERM
        together and are awaited against one deadline (``shutdown_grace`` + slack); any still
        running then is SIGKILLed and ``failed`` ("killed after grace"). A ``KeyboardInterrupt``
        during the wait skips to SIGKILL for the rest and propagates after the cleanup. A state
        write that fails never keeps a process alive: processes are ended first, the error is
        raised after. After ``failures()`` met a transition it could not record, or when the
        database file was deleted or replaced since, nothing more is recorded (the run's rows
        stay as they were until ``reap`` closes them) and the latter raises its one line.
        """
        if self._stopped:
            return
        self._stopped = True
        problems: list[BaseException] = []
        interrupted: BaseException | None = None
        lost: SidecarError | None = None
        if self._record is not None and self._unrecordable is None:
            try:
                self._record.check(self.run_id)
            except SidecarError as exc:
                # Deleted or replaced since the last check(): this stop's rows would go to a
                # file nobody reads (or into someone else's). End the processes, record nothing.
                lost = self._unrecordable = exc
        try:
            draining: list[_Child] = []
            for child in self._children:
                state = child.state
                if state in ("configured", "building") and child.process is not None:
                    # Launched but its spawn never recorded (that write failed): not serving
                    # yet, so no drain is owed; the record says what happened.
                    code = self._kill(child)
                    message = (
                        f"{self._where(child)}: stopped before its spawn was recorded; see {child.log_path}"
                    )
                    self._fail(child, message, exit_code=code, problems=problems)
                elif state in ("configured", "building"):
                    self._fire_collecting(
                        problems, child, "stop", "stop-recorded", detail="stopped before a process existed"
                    )
                elif state in ("spawned", "ready"):
                    code = child.process.poll() if child.process else None
                    if code is not None:
                        message = (
                            f"{self._exit_message(child, code, before_ready=state == 'spawned')}\n"
                            f"{log_tail(child.log_path)}"
                        )
                        self._fail(child, message, exit_code=code, problems=problems)
                        continue
                    self._fire_collecting(problems, child, "drain", "drain-recorded", detail="SIGTERM")
                    draining.append(child)
            # Every drain is on record before the first signal, then the signals go out back to
            # back: a woken sidecar may take our CPU, and interleaving would make N sidecars
            # drain one after another instead of together.
            for child in draining:
                if child.identity is not None:
                    procs.signal_if_ours(child.identity, signal.SIGTERM)
                    crashpoints.hit("sigterm-sent")
            deadline = time.monotonic() + self.config.shutdown_grace_seconds + self.stop_slack_seconds
            try:
                self._await_drained(draining, deadline, hurry)
            except BaseException as exc:  # KeyboardInterrupt: no more waiting, kill what is left
                interrupted = exc
            for child in draining:
                assert child.process is not None
                code = child.process.poll()
                if code is None:
                    code = self._kill(child)
                    reason = "interrupted during drain" if interrupted else "killed after grace"
                    grace = self.config.shutdown_grace
                    message = f"{self._where(child)}: {reason} (shutdown_grace {grace}); see {child.log_path}"
                    self._fail(child, message, exit_code=code, problems=problems)
                elif code in _CLEAN_STOP_CODES:
                    self._fire_collecting(
                        problems, child, "stop", "stopped-recorded", detail=f"exit {code}", exit_code=code
                    )
                else:
                    message = (
                        f"{self._where(child)}: exited with code {code} while draining; "
                        f"see {child.log_path}\n{log_tail(child.log_path)}"
                    )
                    self._fail(child, message, exit_code=code, problems=problems)
        finally:
            remove_ready_files([child.ready_path for child in self._children])
            self._end_run(problems)
        if interrupted is not None:
            raise interrupted
        if lost is not None:
            raise SidecarError(str(lost))
        if problems:
            raise SidecarError(
                f"run {self.run_id}: stopped, but its state was not fully recorded: {problems[0]}"
            )

    def _await_drained(
        self, draining: list[_Child], deadline: float, hurry: Callable[[], bool] | None
    ) -> None:
        """Wait for every draining child to exit, up to ``deadline``; asks ``hurry`` as it waits."""
        hurried = hurry is None
        for child in draining:
            assert child.process is not None
            while True:
                remaining = max(0.0, deadline - time.monotonic())
                step = remaining if hurried else min(remaining, HURRY_POLL_SECONDS)
                if procs.wait_exit(child.process, step) is not None or time.monotonic() >= deadline:
                    break
                if not hurried and hurry is not None and hurry():
                    hurried = True
                    for other in draining:
                        if other.identity is not None and other.process and other.process.poll() is None:
                            procs.signal_if_ours(other.identity, signal.SIGTERM)
                            crashpoints.hit("sigterm-sent")

    def _end_run(self, problems: list[BaseException]) -> None:
        if self.store is None or self._unrecordable is not None:
            return
        try:
            if self._run_created:
                failed = any(child.state == "failed" for child in self._children)
                self.store.end_run(self.run_id, "failed" if failed else "ended")
                crashpoints.hit("run-ended")
        except Exception as exc:
            problems.append(exc)

    def _kill(self, child: _Child) -> int | None:
        """SIGKILL ``child``'s process (through procs) and reap it; its exit code."""
        if child.process is None:
            return None
        if child.identity is not None and child.process.poll() is None:
            procs.signal_if_ours(child.identity, signal.SIGKILL)
            crashpoints.hit("sigkill-sent")
        return procs.wait_exit(child.process, KILL_REAP_SECONDS)

    def _fail(
        self,
        child: _Child,
        message: str,
        exit_code: int | None = None,
        problems: list[BaseException] | None = None,
    ) -> None:
        child.error = message
        if child.state in TERMINAL:
            return
        facts: dict[str, Any] = {"error": message}
        if exit_code is not None:
            facts["exit_code"] = exit_code
        detail = message.split("\n", 1)[0]
        if problems is None:
            child.machine.fire("fail", detail=detail, **facts)
            crashpoints.hit("fail-recorded")
        else:
            self._fire_collecting(problems, child, "fail", "fail-recorded", detail=detail, **facts)

    def _fire_collecting(
        self,
        problems: list[BaseException],
        child: _Child,
        event: str,
        point: str,
        detail: str | None = None,
        **facts: Any,
    ) -> None:
        """Fire ``event`` on ``child``, then pass crash ``point``; a failed write joins ``problems``."""
        if self._unrecordable is not None:
            return  # failures() gave up recording this run; reap closes its rows later
        try:
            child.machine.fire(event, detail=detail, **facts)
            crashpoints.hit(point)
        except Exception as exc:
            problems.append(exc)
