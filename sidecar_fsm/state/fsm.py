"""The instance state machine: the only code that changes an instance's state.

Owns the transition table (``TRANSITIONS``; the states and their groups are ``states``',
re-exported) and ``InstanceMachine``, which persists each transition through ``Store`` before it
takes effect. Must not act on a state (build, spawn, signal, remove files): callers do that after
``fire`` returns, so it is already on record. Must not write SQL.

Built on ``transitions`` with ``auto_transitions=False`` (no ``to_<state>()`` bypass) and a
``before_state_change`` callback that writes the transition: a failed write leaves machine and
database where they were, and an illegal event raises ``MachineError`` before anything is written.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from transitions import EventData, Machine, MachineError

from sidecar_fsm.state.states import (
    BEFORE_PROCESS,
    NON_TERMINAL,
    SERVING_METRICS,
    STATES,
    TERMINAL,
    WITH_PROCESS,
)

# ``transitions`` logs every event at INFO: under a host that logs INFO (NeMo Gym does), 15 lines
# per start and stop of one instance, which our own history already records. Its logger is
# raised to WARNING only when nobody chose a level for it, so a user who asks for its lines
# (``logging.getLogger("transitions").setLevel(logging.INFO)``, before or after) gets them.
_transitions_logger = logging.getLogger("transitions")
if _transitions_logger.level == logging.NOTSET:
    _transitions_logger.setLevel(logging.WARNING)

if TYPE_CHECKING:
    from sidecar_fsm.state.store import Store

__all__ = [
    "BEFORE_PROCESS",
    "DRAINABLE",
    "EVENTS",
    "NON_TERMINAL",
    "SERVING_METRICS",
    "Firing",
    "STATES",
    "TERMINAL",
    "TRANSITIONS",
    "WITH_PROCESS",
    "InstanceMachine",
    "fire_together",
    "MachineError",
    "legal_events",
    "target_of",
]


# (event, from, to, facts the event must carry). Read top to bottom it is SPEC's diagram:
# configured -> building -> spawned -> ready -> draining -> stopped, failed from anywhere live.
TRANSITIONS: tuple[tuple[str, tuple[str, ...], str, tuple[str, ...]], ...] = (
    ("build", ("configured",), "building", ()),
    ("spawn", ("building",), "spawned", ()),
    ("ready", ("spawned",), "ready", ()),
    # A stop requested before ready drains a process that exists...
    ("drain", ("spawned", "ready"), "draining", ()),
    ("stop", ("draining",), "stopped", ()),
    # ...and stops at once when no process exists yet.
    ("stop", ("configured", "building"), "stopped", ()),
    # The process of a ready instance died and the restart policy allows another attempt: the
    # attempt number is a fact of this event, stored with it, never bumped elsewhere.
    ("restart", ("ready",), "spawned", ("restart_count",)),
    ("fail", NON_TERMINAL, "failed", ()),
)

EVENTS = tuple(dict.fromkeys(event for event, _, _, _ in TRANSITIONS))
# The states a ``drain`` leaves from (spawned, ready): a process that serves, or is about to.
DRAINABLE = frozenset(state for event, sources, _, _ in TRANSITIONS if event == "drain" for state in sources)


def target_of(state: str, event: str) -> str | None:
    """Where ``event`` takes an instance in ``state``, or None if it is illegal there. Pure."""
    for name, sources, dest, _ in TRANSITIONS:
        if name == event and state in sources:
            return dest
    return None


def legal_events(state: str) -> tuple[str, ...]:
    """The events ``state`` accepts, in table order; empty for a terminal state. Pure."""
    return tuple(event for event in EVENTS if target_of(state, event) is not None)


class _RequiresFacts:
    """A transition guard: the event must carry these facts.

    Raises ``ValueError`` rather than returning False: ``transitions`` turns a False guard into a
    silent no-op, and a restart whose attempt number was forgotten must not pass silently.
    """

    def __init__(self, event: str, facts: tuple[str, ...]) -> None:
        self.event = event
        self.facts = facts

    def __call__(self, event_data: EventData) -> bool:
        missing = [fact for fact in self.facts if fact not in event_data.kwargs]
        if missing:
            raise ValueError(
                f"fire: '{self.event}' needs the facts {missing}; pass them as keyword arguments"
            )
        return True


class _Model:
    """What ``transitions`` moves (private, so its generated triggers stay internal), carrying
    what the persisting callback needs."""

    state: str

    def __init__(self, store: Store, instance_id: int) -> None:
        self.store = store
        self.instance_id = instance_id


def _new_machine(model: _Model, state: str) -> Machine:
    """A ``transitions`` machine with the table, moving ``model`` only, starting in ``state``; one
    per instance (a group is made all-or-nothing by the store's transaction, not a shared machine)."""
    return Machine(
        model=model,
        states=list(STATES),
        initial=state,
        transitions=[
            {
                "trigger": event,
                "source": list(sources),
                "dest": dest,
                "conditions": [_RequiresFacts(event, facts)] if facts else [],
            }
            for event, sources, dest, facts in TRANSITIONS
        ],
        auto_transitions=False,
        send_event=True,
        before_state_change=[_persist],
    )


def _persist(event_data: EventData) -> None:
    """Store the transition ``transitions`` is about to make; it moves the model only if this returns."""
    transition = event_data.transition
    model = event_data.model
    assert transition is not None and transition.dest is not None  # no internal transitions
    assert isinstance(model, _Model)
    facts = dict(event_data.kwargs)
    detail = facts.pop("detail", None)
    model.store.record_transition(
        model.instance_id,
        transition.source,
        transition.dest,
        event_data.event.name,
        detail,
        facts,
    )


class InstanceMachine:
    """One instance's state machine, persisted through ``store``; ``fire`` is serialized per machine.

    ``state`` must be the instance's state as stored (``InstanceRecord.state``); if it is stale,
    the first ``fire`` raises ``SidecarError`` from the store and changes nothing.
    """

    def __init__(self, store: Store, instance_id: int, state: str = "configured") -> None:
        if state not in STATES:
            raise ValueError(f"InstanceMachine: '{state}' is not a state; states are {list(STATES)}")
        self.store = store
        self.instance_id = instance_id
        self._model = _Model(store, instance_id)
        self._fire_lock = threading.Lock()
        self._machine = _new_machine(self._model, state)

    @property
    def state(self) -> str:
        """The current state (always equal to the stored one after a successful ``fire``)."""
        return self._model.state

    def fire(self, event: str, detail: str | None = None, **facts: Any) -> None:
        """Fire ``event``: persist the transition (with ``detail`` and ``facts``), then move.

        Raises ``MachineError`` for an illegal event, ``ValueError`` for an unknown event or fact or
        a missing one, ``SidecarError`` for a failed write; then neither machine nor database moved.
        """
        _check_event(event)
        with self._fire_lock:
            self._trigger(event, detail, facts)

    def _trigger(self, event: str, detail: str | None, facts: Mapping[str, Any]) -> None:
        # Unknown facts are refused by the store inside the persisting callback, before the
        # machine moves: the store owns the columns, so the list lives there only.
        self._machine.events[event].trigger(self._model, detail=detail, **facts)

    def _rewind(self, state: str) -> None:
        """Put the machine back in ``state`` after the transaction that stored its move rolled back."""
        self._machine.set_state(state, model=self._model)

    def __repr__(self) -> str:
        return f"InstanceMachine(instance_id={self.instance_id}, state={self.state!r})"


class Firing(NamedTuple):
    """One event for one machine, as ``InstanceMachine.fire`` takes it; see ``fire_together``."""

    machine: InstanceMachine
    event: str
    detail: str | None = None
    facts: Mapping[str, Any] = {}


def fire_together(firings: Sequence[Firing]) -> None:
    """Fire each event on its machine, in order, all in one store transaction: all happen, or none.

    For events that must be on record together (an instance's ``build`` and ``spawn``, a run's
    ``ready``); a machine may appear more than once. Raises what ``fire`` raises for the first
    firing that fails; then the database holds none of the group and every machine is back where
    it was. The machines must share one store; each one's lock is held for the whole group.
    """
    if not firings:
        return
    machines = list({id(firing.machine): firing.machine for firing in firings}.values())
    store = machines[0].store
    if any(machine.store is not store for machine in machines):
        raise ValueError("fire_together: the machines must share one store")
    for firing in firings:
        _check_event(firing.event)
    # One lock order for every caller (instance ids are unique per store), so two groups
    # that share machines cannot deadlock.
    ordered = sorted(machines, key=lambda machine: machine.instance_id)
    with contextlib.ExitStack() as held:
        for machine in ordered:
            held.enter_context(machine._fire_lock)
        before = [machine.state for machine in machines]
        try:
            with store.transaction():
                for firing in firings:
                    firing.machine._trigger(firing.event, firing.detail, firing.facts)
        except BaseException:
            for machine, state in zip(machines, before, strict=True):
                machine._rewind(state)
            raise


def _check_event(event: str) -> None:
    if event not in EVENTS:
        raise ValueError(f"fire: '{event}' is not an event; events are {list(EVENTS)}")
