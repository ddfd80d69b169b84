"""What runs now, as ``status``, ``top``, ``history`` and ``stop`` show it: ``observe``'s
verdicts plus each proxy's live figures, and the words for what needs attention.

What runs is not decided here but in ``sidecar_fsm.observe``, which ``reap``, ``stop`` and the
target file read too, so the table, the JSON, the exit code and every other command agree.
Must not format a table (``render`` does) nor know about argv or exit codes (the CLI does).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sidecar_fsm.base.resources import command_hint
from sidecar_fsm.observe import runs
from sidecar_fsm.observe.runs import RunObservation, ended_with_owner
from sidecar_fsm.observe.verdicts import OURS, OWNER_GONE, Owner, Process, metrics_claimed, metrics_proven
from sidecar_fsm.state.fsm import TERMINAL
from sidecar_fsm.view.live import Scrape, scrape_all

if TYPE_CHECKING:
    from sidecar_fsm.state.store import InstanceRecord, RunRecord, Store

# What a record lacks when its process cannot be proven ours.
_UNPROVEN_WHY = "no start time recorded"


@dataclass(frozen=True)
class RunStatus(RunObservation):
    """A run observed now (``RunObservation``) plus ``live``: the id of each instance whose
    ``/metrics`` was scraped, to the outcome (``live.Scrape``); absent: not scraped (no metrics
    address, not running, another host)."""

    live: Mapping[int, Scrape] = field(default_factory=dict)

    def live_of(self, inst: InstanceRecord) -> Scrape | None:
        return self.live.get(inst.id)


def process_alive(process: str | None) -> bool | None:
    """The ``"alive"`` of ``--json``: True when our process runs, False when it is gone or its
    pid reused, None when there is no process or it cannot be judged here (unproven, another
    host)."""
    if process in OURS:
        return True
    if process in (Process.GONE, Process.REUSED):
        return False
    return None


def process_note(status: RunStatus, inst: InstanceRecord) -> str | None:
    """Why a recorded-live instance is not what its row says, and what to do; None if it is.

    The database keeps the state its launcher last recorded; a launcher killed with -9 records
    nothing more, and with ``exit_with_owner`` its sidecars drain and exit by themselves. Only
    ``reap`` (or the launcher, while it lives) records that, so the hint depends on the owner.
    """
    process = status.process_of(inst)
    unrecorded = status.unrecorded_pids(inst)
    if unrecorded:
        pids = ", ".join(str(pid) for pid in unrecorded)
        what = f"pid {pids} runs but was never recorded (its launcher died first)"
    elif process == Process.GONE:
        what = f"recorded {inst.state} but pid {inst.pid} has exited"
    elif process == Process.REUSED:
        what = f"recorded {inst.state} but pid {inst.pid} now belongs to another process"
    elif process == Process.UNPROVEN:
        what = f"pid {inst.pid} cannot be proven ours ({_UNPROVEN_WHY}); nothing signals it"
    elif process == Process.STOPPED:
        return f"pid {inst.pid} stopped (SIGSTOP, a debugger): it answers nothing; kill -CONT {inst.pid}"
    else:
        return None
    if ended_with_owner(status):
        return f"{what}; nothing left running: {reap_hint(status)} to close the record"
    if status.owner in OWNER_GONE:
        return f"{what}; {reap_hint(status)}"
    if status.owner == Owner.ALIVE and process != Process.UNPROVEN:
        return f"{what}; its launcher (pid {status.run.owner_pid}) has not recorded it yet"
    return what


def reap_hint(status: RunObservation) -> str:
    """``run sidecar-fsm reap``, naming the run's log dir when it is not the default."""
    return f"run {command_hint('reap', status.log_dir)}"


def owner_refusal(status: RunObservation) -> str:
    """Why ``stop`` cannot ask this run's owner to stop: gone (reap closes the run), or not
    proven to be the process that started it (nothing signals it)."""
    pid = status.run.owner_pid
    if status.owner == Owner.UNPROVEN:
        return f"its owner (pid {pid}) cannot be proven to be the run's ({_UNPROVEN_WHY}); not signalled"
    return f"its owner (pid {pid}) is gone; {reap_hint(status)}"


def needs_attention(status: RunStatus) -> str | None:
    """Why a live run needs an operator, in a few words (``status`` exits 3); None when it is
    healthy or has ended. An instance still starting is not a problem yet. An owner that cannot
    be proven may still own the run: it is judged as a live one, as ``reap`` does.
    """
    if status.run.ended_at is not None or ended_with_owner(status):
        return None
    if status.owner in OWNER_GONE:
        running = [inst.name for inst in status.instances if status.process_of(inst) in OURS]
        if running:
            return f"owner gone with sidecars still running ({', '.join(running)}); {reap_hint(status)}"
        return f"owner gone; {reap_hint(status)}"
    for inst in status.instances:
        process = status.process_of(inst)
        if inst.state in TERMINAL:
            return f"{inst.name} is {inst.state}"
        if process in (Process.GONE, Process.REUSED):
            return f"{inst.name} is not running (pid {inst.pid} {process})"
        if process == Process.UNPROVEN:
            return f"{inst.name}: pid {inst.pid} cannot be proven ours ({_UNPROVEN_WHY})"
        if process == Process.STOPPED:
            return f"{inst.name} is stopped (pid {inst.pid}: SIGSTOP, a debugger); it answers nothing"
        scrape = status.live_of(inst)
        if scrape is None:
            continue
        if scrape.figures is None and inst.state == "ready":
            return f"{inst.name}: /metrics at {scrape.address}: {scrape.problem}"
        if scrape.figures is not None and scrape.figures.upstream_down:
            return f"{inst.name}: upstream {inst.upstream} is down"
    return None


def observe(store: Store, run: RunRecord) -> RunStatus:
    """``run`` as ``sidecar_fsm.observe`` judges it now, not yet scraped (``with_live``)."""
    observed = runs.observe(store, run)
    return RunStatus(**{f.name: getattr(observed, f.name) for f in dataclasses.fields(observed)})


def with_live(statuses: Sequence[RunStatus]) -> list[RunStatus]:
    """``statuses`` with the ``/metrics`` of every serving proxy scraped, all at once.

    Only an address ``observe`` claims is asked, and only once proven (the process itself
    listens there; otherwise its ``Scrape`` says so): exactly the Prometheus target file's.
    """
    wanted = {
        (index, inst.id): inst
        for index, status in enumerate(statuses)
        for inst in status.instances
        # The record's own verdict, not one a claim search proved: the target file has no
        # search, and both must name the same proxies.
        if metrics_claimed(inst, status.processes.get(inst.id))
    }
    proven = {key: str(inst.metrics) for key, inst in wanted.items() if metrics_proven(inst)}
    scrapes = scrape_all(proven)
    for key, inst in wanted.items():
        if key not in proven:
            scrapes[key] = Scrape(
                str(inst.metrics), None, f"not scraped: pid {inst.pid} does not listen on {inst.metrics}"
            )
    return [
        dataclasses.replace(
            status, live={inst_id: scrape for (at, inst_id), scrape in scrapes.items() if at == index}
        )
        for index, status in enumerate(statuses)
    ]


def runs_to_show(
    runs: Sequence[tuple[Store, RunRecord]], *, everything: bool
) -> list[tuple[Store, RunRecord]]:
    """Newest first: every run with ``everything``, else the live ones and the one that ended
    last (what an operator asks first: what runs, and how did the last one end). Last to end,
    not last to start: a start refused on a busy port ends at once, and must not hide the run
    that held the port and failed after it."""
    ordered = sorted(runs, key=lambda pair: pair[1].started_at, reverse=True)
    if everything:
        return ordered
    live = [pair for pair in ordered if pair[1].ended_at is None]
    ended = sorted(
        (pair for pair in ordered if pair[1].ended_at is not None), key=lambda pair: pair[1].ended_at or 0.0
    )
    return live + ended[-1:]
