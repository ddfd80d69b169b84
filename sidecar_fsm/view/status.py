"""What runs now: the one model of a run that ``status``, ``top``, ``history`` and ``stop`` share.

Owns the judgement of a recorded run against the machine as it is: whether its owner (the
launcher) is alive, what runs at each instance's recorded pid (ours, gone, or the pid reused
by another process), sidecars that run but were never recorded (a launcher killed between a
spawn and its commit), each proxy's live figures, and which runs to show. Every word for a
process (``PROCESS_*``) and every note on a row that is no longer true is decided here, so the
table, the JSON and the exit code can never disagree.

Read-only: never writes a row, changes a state or signals a process. Process identity is
``procs``' question (pid, start time and executable), never the pid alone. Must not format a
table (``render`` does) nor know about argv or exit codes (the CLI does).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sidecar_fsm.base import procs
from sidecar_fsm.base.resources import command_hint
from sidecar_fsm.state.fsm import TERMINAL
from sidecar_fsm.state.hostname import host_name
from sidecar_fsm.view.live import Scrape, scrape_all

if TYPE_CHECKING:
    from sidecar_fsm.state.store import InstanceRecord, RunRecord, Store

# What runs at an instance's recorded pid now (``RunStatus.processes``), decided with ``procs``
# (pid, start time and executable), never from the pid alone.
PROCESS_RUNNING = "running"
PROCESS_GONE = "gone"
PROCESS_REUSED = "reused"
PROCESS_OTHER_HOST = "other host"
OWNER_GONE = frozenset({"dead", "reused"})
REAP_HINT = "run sidecar-fsm reap"

# Recorded states in which an instance may have a process (configured/building never spawned
# one, stopped/failed recorded its end).
LIVE_STATES = frozenset({"spawned", "ready", "draining"})
# States in which a proxy serves /metrics: ready, and draining, when an operator watches the
# requests in flight go down.
SCRAPED_STATES = frozenset({"ready", "draining"})


@dataclass(frozen=True)
class RunStatus:
    """One run as it is now: the record, what became of its owner, its instances.

    ``owner`` is ``"alive"``, ``"dead"`` (no such process), ``"reused"`` (the pid now belongs
    to another process) or ``"other host"`` (not judged here). ``processes`` maps the id of each
    instance recorded live (spawned, ready, draining) with a pid to what runs there now
    (``PROCESS_*``); an instance absent from it has no process. ``live`` maps the id of each
    instance whose ``/metrics`` was scraped to the outcome (``live.Scrape``); absent: not
    scraped (no metrics address, not running, another host).
    """

    run: RunRecord
    owner: str
    instances: Sequence[InstanceRecord]
    processes: Mapping[int, str] = field(default_factory=dict)
    live: Mapping[int, Scrape] = field(default_factory=dict)
    # Instance id -> pids of live processes proven ours (``procs.find_ours``) that its row does
    # not name: a launcher killed between a spawn and its commit. Such an instance is running.
    unrecorded: Mapping[int, Sequence[int]] = field(default_factory=dict)
    # The log dir the run was read from, so every hint names it (``command_hint``).
    log_dir: str | None = None

    def process_of(self, inst: InstanceRecord) -> str | None:
        return self.processes.get(inst.id)

    def live_of(self, inst: InstanceRecord) -> Scrape | None:
        return self.live.get(inst.id)


def process_alive(process: str | None) -> bool | None:
    """The ``"alive"`` of ``--json``: True when our process runs, False when it is gone or its
    pid reused, None when there is no process or it cannot be judged here (another host)."""
    if process == PROCESS_RUNNING:
        return True
    if process in (PROCESS_GONE, PROCESS_REUSED):
        return False
    return None


def process_note(status: RunStatus, inst: InstanceRecord) -> str | None:
    """Why a recorded-live instance is not what its row says, and what to do; None if it is.

    The database keeps the state its launcher last recorded; a launcher killed with -9 records
    nothing more, and with ``exit_with_owner`` its sidecars drain and exit by themselves. Only
    ``reap`` (or the launcher, while it lives) records that, so the hint depends on the owner.
    """
    process = status.process_of(inst)
    unrecorded = status.unrecorded.get(inst.id)
    if unrecorded:
        pids = ", ".join(str(pid) for pid in unrecorded)
        what = f"pid {pids} runs but was never recorded (its launcher died first)"
    elif process == PROCESS_GONE:
        what = f"recorded {inst.state} but pid {inst.pid} has exited"
    elif process == PROCESS_REUSED:
        what = f"recorded {inst.state} but pid {inst.pid} now belongs to another process"
    else:
        return None
    if ended_with_owner(status):
        return f"{what}; nothing left running: {reap_hint(status)} to close the record"
    if status.owner in OWNER_GONE:
        return f"{what}; {reap_hint(status)}"
    if status.owner == "alive":
        return f"{what}; its launcher (pid {status.run.owner_pid}) has not recorded it yet"
    return what


def reap_hint(status: RunStatus) -> str:
    """``run sidecar-fsm reap``, naming the run's log dir when it is not the default."""
    return f"run {command_hint('reap', status.log_dir)}"


def ended_with_owner(status: RunStatus) -> bool:
    """A run whose owner is gone and nothing of which runs any more: it ended by itself.

    A launcher killed with -9 (or an actor ``ray.kill``ed) records nothing more, while its
    sidecars, with ``exit_with_owner``, drain and exit by themselves. Nothing is left to end,
    so the run reads as ended and needs no attention; its rows still say what the launcher last
    recorded until ``reap`` closes them.
    """
    if status.run.ended_at is not None or status.owner not in OWNER_GONE:
        return False
    return not status.unrecorded and all(
        status.process_of(inst) in (None, PROCESS_GONE, PROCESS_REUSED) for inst in status.instances
    )


def needs_attention(status: RunStatus) -> str | None:
    """Why a live run needs an operator, in a few words; None when it is healthy or has ended.

    What makes ``status`` exit 3, as ``systemctl status`` does for a unit that is not running
    as it should: an owner gone (its sidecars, still running or not, are nobody's until
    ``reap``), an instance that is not running (failed, stopped, or recorded live with its
    process gone or reused), an upstream a proxy reports down. An instance still starting
    (configured, building, spawned) is not a problem yet.
    """
    if status.run.ended_at is not None or ended_with_owner(status):
        return None
    if status.owner in OWNER_GONE:
        running = [inst.name for inst in status.instances if status.process_of(inst) == PROCESS_RUNNING]
        if running:
            return f"owner gone with sidecars still running ({', '.join(running)}); {reap_hint(status)}"
        return f"owner gone; {reap_hint(status)}"
    for inst in status.instances:
        process = status.process_of(inst)
        if inst.state in TERMINAL:
            return f"{inst.name} is {inst.state}"
        if process in (PROCESS_GONE, PROCESS_REUSED):
            return f"{inst.name} is not running (pid {inst.pid} {process})"
        scrape = status.live_of(inst)
        if scrape is not None and scrape.figures is not None and not scrape.figures.upstream_up:
            return f"{inst.name}: upstream {inst.upstream} is down"
    return None


def owner_of(run: RunRecord) -> str:
    """``alive``, ``dead`` or ``reused`` (``procs.pid_status``), or ``other host``: another
    host's pids mean nothing here, so its owner can only be judged on that host."""
    if run.host != host_name():
        return "other host"
    return procs.pid_status(run.owner_pid, run.owner_start_time)


def process_at(run: RunRecord, inst: InstanceRecord) -> str | None:
    """What runs at an instance's recorded pid now (``PROCESS_*``); None: no process recorded.

    ``running`` only when ``procs`` proves pid, start time and executable; ``reused`` when
    another process holds the pid; ``gone`` when nothing does. A record with no start time
    cannot prove a reuse, so a live process there counts as ours, as reap judges it.
    """
    if inst.state not in LIVE_STATES or inst.pid is None:
        return None
    if run.host != host_name():
        return PROCESS_OTHER_HOST
    status = procs.pid_status(inst.pid, inst.pid_start_time, inst.binary or None)
    return {"alive": PROCESS_RUNNING, "dead": PROCESS_GONE, "reused": PROCESS_REUSED}[status]


def unrecorded_sidecars(run: RunRecord, instances: Sequence[InstanceRecord]) -> dict[int, list[int]]:
    """Per instance, the pids of its live processes that no record names (``procs.find_ours``).

    A launcher killed between a spawn and the commit of its pid leaves a sidecar behind a
    ``configured`` row (or, mid-restart, behind the pid it replaced). Only asked for a run
    whose owner is gone: a live launcher records its pids itself, and the search reads the
    whole process table.
    """
    claims = {
        inst.id: procs.Claim(inst.binary, inst.ready_path, run.started_at)
        for inst in instances
        if inst.state not in TERMINAL and inst.binary and inst.ready_path
    }
    found = procs.find_ours(list(claims.values()))
    recorded = {inst.id: inst.pid for inst in instances}
    out: dict[int, list[int]] = {}
    for inst_id, claim in claims.items():
        pids = [identity.pid for identity in found[claim.ready_path] if identity.pid != recorded[inst_id]]
        if pids:
            out[inst_id] = pids
    return out


def observe(store: Store, run: RunRecord) -> RunStatus:
    """``run`` judged against the machine now (owner, processes, unrecorded sidecars)."""
    instances = store.instances_of(run.run_id)
    processes = {inst.id: p for inst in instances if (p := process_at(run, inst)) is not None}
    owner = owner_of(run)
    unrecorded = {}
    if owner in OWNER_GONE and run.ended_at is None:
        unrecorded = unrecorded_sidecars(run, instances)
    for inst_id in unrecorded:
        processes[inst_id] = PROCESS_RUNNING
    return RunStatus(
        run=run,
        owner=owner,
        instances=instances,
        processes=processes,
        unrecorded=unrecorded,
        log_dir=str(store.path.parent.parent),
    )


def with_live(statuses: Sequence[RunStatus]) -> list[RunStatus]:
    """``statuses`` with the ``/metrics`` of every running proxy scraped, all at once.

    Only an instance whose process ``procs`` proved ours (``PROCESS_RUNNING``, this host) is
    asked, and only when that process itself listens on the recorded address
    (``procs.listens_on``; otherwise its ``Scrape`` says so): a dead sidecar's metrics port may
    belong to another process by now, and the address came from a file. One deadline for all
    (``live.SCRAPE_TIMEOUT_SECONDS``); one that does not answer reads ``no answer`` and fails
    nothing.
    """
    wanted = {
        (index, inst.id): (inst.pid, inst.metrics)
        for index, status in enumerate(statuses)
        for inst in status.instances
        if inst.metrics and inst.state in SCRAPED_STATES and status.process_of(inst) == PROCESS_RUNNING
    }
    # The recorded address is words a ready file gave: only a port the proxy itself listens on
    # is asked, never one another process took over (it would be shown as the proxy's figures).
    targets = {
        key: address for key, (pid, address) in wanted.items() if pid and procs.listens_on(pid, address)
    }
    scrapes = scrape_all(targets)
    for key, (pid, address) in wanted.items():
        if key not in targets:
            scrapes[key] = Scrape(address, None, f"not scraped: pid {pid} does not listen on {address}")
    return [
        dataclasses.replace(
            status, live={inst_id: scrape for (at, inst_id), scrape in scrapes.items() if at == index}
        )
        for index, status in enumerate(statuses)
    ]


def runs_to_show(
    runs: Sequence[tuple[Store, RunRecord]], *, everything: bool
) -> list[tuple[Store, RunRecord]]:
    """Newest first: every run with ``everything``, else the live ones and the latest ended one
    (what an operator asks first: what runs, and how did the last one end)."""
    ordered = sorted(runs, key=lambda pair: pair[1].started_at, reverse=True)
    if everything:
        return ordered
    live = [pair for pair in ordered if pair[1].ended_at is None]
    ended = [pair for pair in ordered if pair[1].ended_at is not None]
    return live + ended[:1]
