"""One run's sidecar children on this host, as the launcher and NeMo Gym drive them: ``NodeSidecars``.

Owns the public face of a run's children; the jobs live beside it: ``start`` (record the run,
spawn, await readiness), ``watch`` (notice exits, restart), ``stop`` (drain, kill, close the
run), over the state they share in ``children``. The command line and environment are
``command``'s, the files ``runfiles``', the wording of failures ``messages``', the open database
``sharedstore``'s.
Each decision becomes an event fired on the instance's ``InstanceMachine`` with the facts it
establishes (pid, start time, exit code, error, restart count, bound address) as arguments:
the run layer never sets a state, never writes SQL (``store`` does, inside the transition) and
never signals a process except through ``procs``. It does not build the binary (``buildcache``),
parse the config (``config``) or touch the caller's global config (``launcher``/``rewrite``).
``sidecar_command``, ``sidecar_env`` and ``shared_store`` stay importable from here.
"""

from __future__ import annotations

from collections.abc import Callable

from sidecar_fsm.errors import SidecarsStopped
from sidecar_fsm.run import start as starting
from sidecar_fsm.run import stop as stopping
from sidecar_fsm.run import traffic
from sidecar_fsm.run import watch as watching
from sidecar_fsm.run.children import SidecarRun
from sidecar_fsm.run.command import sidecar_command, sidecar_env
from sidecar_fsm.state.sharedstore import shared_store

__all__ = ["NodeSidecars", "shared_store", "sidecar_command", "sidecar_env"]


class NodeSidecars(SidecarRun):
    """The sidecar processes one run owns on this host: one child per instance.

    ``start()`` records the run and its instances in the host's database, spawns every instance
    and awaits them together; ``failures()`` reports (or restarts) children that stopped;
    ``stop()`` drains and ends them all. Not thread-safe: one thread drives a run (Gym's poll
    loop). The constructor is ``SidecarRun``'s: ``store`` and ``run_id`` may be given by a
    caller that already holds them (tests, the CLI); ``flags`` trims every command to what a
    user-named binary accepts.
    """

    def start(self) -> list[str]:
        """Start every instance and wait until all are ready; one summary line per instance.

        Then, unless ``upstream_check: off``, await each proxy's first upstream check: one line
        each in ``upstream_verdicts``; with ``fail``, a failed check fails the start.

        All children are spawned first and awaited together, so N instances take one startup
        (plus a launch each), not N.
        Raises ``SidecarError`` naming every instance that exited or missed
        ``startup_timeout_seconds`` (with its log tail); before any exception leaves, including
        ``KeyboardInterrupt``, every child of this run has been stopped.
        """
        return starting.start(self)

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

        About once a minute it also brings the proxies' traffic figures into the database
        (``traffic.poll``): NeMo Gym's poll loop and the CLI's supervise loop both call this.
        """
        traffic.poll(self)
        return watching.failures(self)

    def check(self) -> None:
        """Raise ``SidecarError`` naming every instance that stopped (see ``failures()``)."""
        messages = self.failures()
        if messages:
            raise SidecarsStopped(messages)

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
        stopping.stop(self, hurry)
