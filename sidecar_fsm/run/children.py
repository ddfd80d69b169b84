"""One run's children and what the start, watch and stop jobs share about them.

Owns ``Child`` (an instance's machine, paths and current process) and ``SidecarRun`` (the run's
config, id, store and children, and whether it started, stopped or can still record), with the
per-child steps all three jobs take: naming a child, the facts of its process, failing it.
"""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sidecar_fsm.base import procs
from sidecar_fsm.config import H2PingSidecarConfig, SidecarInstanceConfig
from sidecar_fsm.errors import SidecarError
from sidecar_fsm.run import crashpoints
from sidecar_fsm.run.binaryflags import BinaryFlags
from sidecar_fsm.run.messages import (
    address_taken,
    exit_message,
    metrics_clash_message,
    port_clash_message,
    where,
    with_log_tail,
)
from sidecar_fsm.run.runfiles import run_file
from sidecar_fsm.state import storagefault
from sidecar_fsm.state.fsm import TERMINAL, InstanceMachine
from sidecar_fsm.state.hostname import host_name
from sidecar_fsm.state.store import Store

# Time past `shutdown_grace` that `stop()` allows before SIGKILL: the proxy's own drain ends at
# the grace, so this only covers exiting (flushing logs, removing its ready file) on a busy host.
STOP_SLACK_SECONDS = 5.0


@dataclass
class Child:
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
    # The proxy's /metrics address from its ready file; None without metrics or before ready.
    metrics: str | None = None
    # The upstream's route as the proxy's ready file says ("direct", "via egress proxy URL");
    # None before ready and for a binary whose ready file does not say (NeMo Gym's).
    route: str | None = None
    # Whether the process was stopped (SIGSTOP, a debugger) when last watched: said once each way.
    stopped: bool = False

    @property
    def name(self) -> str:
        return self.instance.name

    @property
    def state(self) -> str:
        return self.machine.state


class SidecarRun:
    """The state of one run's children that starting, watching and stopping them share.

    ``store`` and ``run_id`` may be given by a caller that holds them (tests, the CLI); else the
    start opens ``shared_store(log_dir)``. ``flags`` (``binaryflags.check``) trims every command
    to what a user-named binary accepts; None passes it whole.
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
        self.children: list[Child] = []
        self.started = False
        self.run_created = False
        # One line per instance on its upstream's first check, once start() awaited them
        # (``upstream_check``): kept apart from start()'s summary, which NeMo Gym's callers
        # read as exactly one line per instance.
        self.upstream_verdicts: list[str] = []
        self.stopped = False
        self.record: storagefault.RecordWatch | None = None
        # Set when a transition could not be recorded: the rest of the stop records nothing.
        self.unrecordable: SidecarError | None = None
        # When ``traffic.poll`` next imports the proxies' figures (time.monotonic()).
        self.traffic_due = 0.0
        # Where a line the operator must see while the run goes on is said (a restart, the
        # "listening on" lines, a slow upstream check); the launcher prints it. Called in the
        # driving thread (or the check's timer thread while it waits), never in a handler.
        self.notify: Callable[[str], None] = _say_nothing

    @property
    def running(self) -> bool:
        """True from ``start()`` until ``stop()`` (which a failed ``start()`` calls itself)."""
        return self.started and not self.stopped

    @property
    def instances_actual(self) -> list[SidecarInstanceConfig]:
        """The instances with ``listen`` as bound: a ``:0`` port replaced by the real one once ready."""
        if not self.children:
            return list(self.instances)
        return [child.instance.model_copy(update={"listen": child.listen}) for child in self.children]

    @property
    def routes(self) -> dict[str, str | None]:
        """Each instance's upstream route as its proxy said it once ready (``Child.route``)."""
        return {child.name: child.route for child in self.children}

    def path(self, instance: SidecarInstanceConfig, suffix: str) -> str:
        return run_file(self.log_dir, instance.name, self.host, self.run_id, suffix)

    def where(self, child: Child) -> str:
        return where(child.name, self.run_id, self.host)

    def exit_message(self, child: Child, exit_code: int, before_ready: bool) -> str:
        """Why ``child``'s process exited, then its log's tail; a taken address is one line, as
        the proxy's log would only say it again."""
        codes_known = self.flags is None or self.flags.described
        taken = address_taken(exit_code, before_ready, child.listen, codes_known)
        if taken == "listen":
            return port_clash_message(child.index, child.listen, self.store, self.run_id)
        if taken == "metrics":
            return metrics_clash_message(child.index, child.instance.metrics_listen or "")
        first = exit_message(self.where(child), exit_code, before_ready, child.log_path)
        return with_log_tail(first, child.log_path)

    def fail(
        self,
        child: Child,
        message: str,
        exit_code: int | None = None,
        problems: list[BaseException] | None = None,
    ) -> None:
        """Fire ``fail`` with ``message`` (its first line as the detail) unless ``child`` already ended.

        With ``problems`` (a stop), a write that fails joins them instead of raising.
        """
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
            self.fire_collecting(problems, child, "fail", "fail-recorded", detail=detail, **facts)

    def fire_collecting(
        self,
        problems: list[BaseException],
        child: Child,
        event: str,
        point: str,
        detail: str | None = None,
        **facts: Any,
    ) -> None:
        """Fire ``event`` on ``child``, then pass crash ``point``; a failed write joins ``problems``."""
        if self.unrecordable is not None:
            return  # failures() gave up recording this run; reap closes its rows later
        try:
            child.machine.fire(event, detail=detail, **facts)
            crashpoints.hit(point)
        except Exception as exc:
            problems.append(exc)


def _say_nothing(line: str) -> None:
    """``SidecarRun.notify`` of a run nobody listens to (a test driving ``NodeSidecars``)."""


def process_facts(child: Child) -> dict[str, Any]:
    """The pid and start time of ``child``'s current process, as the events that record it take them."""
    assert child.process is not None
    return {
        "pid": child.process.pid,
        "pid_start_time": child.identity.start_time if child.identity else None,
    }
