"""One run's sidecar children on this host, as the launcher and NeMo Gym drive them: ``NodeSidecars``.

The public face over the jobs beside it (``start``, ``watch``, ``stop``) and the state they share
(``children``). Each decision is an event fired on the instance's ``InstanceMachine`` with the
facts it establishes (pid, exit code, bound address...); SQL is ``store``'s, signals ``procs``'.
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

    Not thread-safe: one thread drives a run (Gym's poll loop). The constructor is
    ``SidecarRun``'s.
    """

    def start(self) -> list[str]:
        """Start every instance and wait until all are ready; one summary line per instance.

        All are spawned first and awaited together, so N instances take one startup, not N.
        Then, unless ``upstream_check: off``, each proxy's first upstream check is awaited (one
        line each in ``upstream_verdicts``; with ``fail``, a failed check fails the start).
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
        instances are reported on every call. Empty after ``stop()``. A transition that cannot be
        recorded (disk full, a lock held too long, the database deleted or replaced) stops every
        sidecar and raises ``SidecarError`` saying why: a sidecar the record does not show could
        outlive a crash of this process with nothing left to reap it. Also imports the proxies'
        traffic figures about once a minute (``traffic.poll``).
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

        Instances with no process go straight to ``stopped``. The rest get ``drain`` and SIGTERM
        together and are awaited against one deadline (``shutdown_grace`` + slack); any still
        running then is SIGKILLed and ``failed`` ("killed after grace"). ``hurry``, asked during
        that wait, returns True once the caller wants it cut short (a second Ctrl-C): each proxy
        still draining then gets a second SIGTERM, which ends its drain at once. A
        ``KeyboardInterrupt`` during the wait skips to SIGKILL and propagates after the cleanup.
        A state write that fails never keeps a process alive: processes are ended first, the
        error raised after. Once the database cannot take the run's rows (``failures()`` met a
        failed write, or the file was deleted or replaced, which raises its one line), nothing
        more is recorded: ``reap`` closes the rows later.
        """
        stopping.stop(self, hurry)
