"""One run observed whole: its owner's verdict, each instance's process, the sidecars no row names.

Owns ``observe``, the search for sidecars a killed launcher never recorded, and the judgements
more than one command reads off an observation (``to_end``, ``ended_with_owner``). Read-only;
must not signal, change a state or word anything for people.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from sidecar_fsm.base import procs
from sidecar_fsm.base.addresses import listens_clash, split_listen
from sidecar_fsm.observe.verdicts import (
    OURS,
    OWNER_GONE,
    Owner,
    Process,
    instance_identity,
    owner_of,
    process_of,
)
from sidecar_fsm.state.fsm import NON_TERMINAL, TERMINAL
from sidecar_fsm.state.records import InstanceRecord, RunRecord
from sidecar_fsm.state.store import Store

__all__ = ["RunObservation", "ended_with_owner", "found_ours", "listen_holder", "observe"]


@dataclass(frozen=True)
class RunObservation:
    """One run as it is now: the record, the verdict on its owner, its instances.

    ``processes``: instance id -> the verdict on its recorded pid from the record alone. For a
    run whose owner is gone, the run's claim proves more ours: ``claimed``, one at the recorded
    pid the record could not prove; ``unrecorded``, ones at pids no row names. Either makes the
    instance running. ``log_dir`` is where the run was read from, so every hint can name it.
    """

    run: RunRecord
    owner: Owner
    instances: Sequence[InstanceRecord]
    processes: Mapping[int, Process] = field(default_factory=dict)
    unrecorded: Mapping[int, Sequence[procs.ProcessIdentity]] = field(default_factory=dict)
    claimed: Mapping[int, procs.ProcessIdentity] = field(default_factory=dict)
    log_dir: str | None = None

    def process_of(self, inst: InstanceRecord) -> Process | None:
        """``RUNNING`` when a process of ``inst`` is proven ours by the run's claim, else the
        recorded pid's verdict (None: no process recorded)."""
        if self.unrecorded.get(inst.id) or inst.id in self.claimed:
            return Process.RUNNING
        return self.processes.get(inst.id)

    def unrecorded_pids(self, inst: InstanceRecord) -> list[int]:
        return [identity.pid for identity in self.unrecorded.get(inst.id, ())]

    def to_end(self, inst: InstanceRecord) -> list[procs.ProcessIdentity]:
        """The processes of ``inst`` proven ours that still run: its recorded one when it runs,
        then the unrecorded ones. What ``reap`` ends, and nothing else."""
        ends = list(self.unrecorded.get(inst.id, ()))
        recorded = self.claimed.get(inst.id)
        if recorded is None and self.processes.get(inst.id) in OURS:
            recorded = instance_identity(inst)
        if recorded is not None:
            ends.insert(0, recorded)
        return ends

    @property
    def owner_gone(self) -> bool:
        """An open run whose owner is dead or reused: nobody's until ``reap`` closes it."""
        return self.run.ended_at is None and self.owner in OWNER_GONE


def ended_with_owner(observed: RunObservation) -> bool:
    """A run whose owner is gone and nothing of which runs any more (an unproven process counts
    as left): its sidecars drained and exited with their owner, and ``reap`` only closes it."""
    if not observed.owner_gone:
        return False
    return all(
        observed.process_of(inst) in (None, Process.GONE, Process.REUSED) for inst in observed.instances
    )


def found_ours(run: RunRecord, instances: Sequence[InstanceRecord]) -> dict[int, list[procs.ProcessIdentity]]:
    """Per instance not yet terminal, the live processes its run's claim proves ours. One scan of
    the process table, so asked only when the owner is gone: a live launcher records its pids."""
    claims = {
        inst.id: procs.Claim(inst.binary, inst.ready_path, run.started_at)
        for inst in instances
        if inst.state not in TERMINAL and inst.binary and inst.ready_path
    }
    found = procs.find_ours(list(claims.values()))
    return {inst_id: found[claim.ready_path] for inst_id, claim in claims.items() if found[claim.ready_path]}


def observe(store: Store, run: RunRecord) -> RunObservation:
    """``run`` judged against the machine now: its owner, each recorded process and, for a
    run whose owner is gone, the processes its claim proves ours. Read-only."""
    instances = store.instances_of(run.run_id)
    processes = {inst.id: p for inst in instances if (p := process_of(run.host, inst)) is not None}
    owner = owner_of(run)
    unrecorded: dict[int, list[procs.ProcessIdentity]] = {}
    claimed: dict[int, procs.ProcessIdentity] = {}
    if owner in OWNER_GONE and run.ended_at is None:
        by_id = {inst.id: inst for inst in instances}
        for inst_id, identities in found_ours(run, instances).items():
            pid = by_id[inst_id].pid
            others = [identity for identity in identities if identity.pid != pid]
            if others:
                unrecorded[inst_id] = others
            at_pid = [identity for identity in identities if identity.pid == pid]
            if at_pid and processes.get(inst_id) not in OURS:
                claimed[inst_id] = at_pid[0]
    return RunObservation(
        run, owner, instances, processes, unrecorded, claimed, str(store.path.parent.parent)
    )


def listen_holder(store: Store, listen: str, run_id: str) -> InstanceRecord | None:
    """The instance of another open run that holds ``listen`` on record, newest first: one whose
    process is proven running, else one that may be (no process recorded yet, or one that lives
    but cannot be proven ours). Read-only."""
    maybe = None
    for inst in reversed(store.instances_in_states(NON_TERMINAL)):
        if inst.run_id == run_id or not listens_clash(split_listen(inst.listen), split_listen(listen)):
            continue
        run = store.get_run(inst.run_id)
        verdict = None if run is None else process_of(run.host, inst)
        if verdict == Process.RUNNING:
            return inst
        if maybe is None and verdict in (None, Process.UNPROVEN):
            maybe = inst
    return maybe
