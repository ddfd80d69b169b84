"""The instance state machine: the only code that changes an instance's state.

Owns the states, the transition table (``TRANSITIONS``, data that reads like SPEC's diagram) and
``InstanceMachine``, which fires events and persists each transition through ``Store`` before
it takes effect. Must not act on a state (build, spawn, signal, remove files): callers do that
after ``fire`` returns, so whatever they do is already on record. Must not write SQL: the store
does, in one transaction per transition.

Built on ``transitions`` with ``auto_transitions=False`` (no ``to_<state>()`` bypass) and one
machine-level ``before_state_change`` callback that writes the transition. ``transitions`` runs
that callback before it moves the model, so a failed write leaves the machine and the database
where they were; an event that is illegal in the current state raises ``MachineError`` before
any callback runs, so nothing is written.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from transitions import EventData, Machine, MachineError

if TYPE_CHECKING:
    from sidecar_fsm.store import Store

__all__ = [
    "EVENTS",
    "STATES",
    "TERMINAL",
    "TRANSITIONS",
    "InstanceMachine",
    "MachineError",
    "legal_events",
    "target_of",
]

STATES = ("configured", "building", "spawned", "ready", "draining", "stopped", "failed")
TERMINAL = frozenset({"stopped", "failed"})
NON_TERMINAL = tuple(state for state in STATES if state not in TERMINAL)

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
    """What ``transitions`` moves; kept private so its generated trigger methods stay internal."""

    state: str


class InstanceMachine:
    """One instance's state machine, persisted through ``store``.

    ``state`` must be the instance's state as stored (``InstanceRecord.state``); if it is stale,
    the first ``fire`` raises ``SidecarError`` from the store and changes nothing. One machine
    per instance; ``fire`` is serialized per machine, so threads may share one, and machines of
    different instances run in parallel (the store serializes the writes).
    """

    def __init__(self, store: Store, instance_id: int, state: str = "configured") -> None:
        if state not in STATES:
            raise ValueError(f"InstanceMachine: '{state}' is not a state; states are {list(STATES)}")
        self.store = store
        self.instance_id = instance_id
        self._model = _Model()
        self._fire_lock = threading.Lock()
        self._machine = Machine(
            model=self._model,
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
            before_state_change=[self._persist],
        )

    @property
    def state(self) -> str:
        """The current state (always equal to the stored one after a successful ``fire``)."""
        return self._model.state

    def fire(self, event: str, detail: str | None = None, **facts: Any) -> None:
        """Fire ``event``: persist the transition (with ``detail`` and ``facts``), then move.

        Raises ``MachineError`` if ``event`` is illegal in the current state (terminal states
        accept nothing), ``ValueError`` for an unknown event or fact or a missing required fact,
        and whatever the store raises (``SidecarError``) when the write fails; in every case
        neither the machine nor the database changed.
        """
        if event not in EVENTS:
            raise ValueError(f"fire: '{event}' is not an event; events are {list(EVENTS)}")
        # Unknown facts are refused by the store inside the persisting callback, before the
        # machine moves: the store owns the columns, so the list lives there only.
        with self._fire_lock:
            self._machine.events[event].trigger(self._model, detail=detail, **facts)

    def _persist(self, event_data: EventData) -> None:
        transition = event_data.transition
        assert transition is not None and transition.dest is not None  # no internal transitions
        facts = dict(event_data.kwargs)
        detail = facts.pop("detail", None)
        self.store.record_transition(
            self.instance_id,
            transition.source,
            transition.dest,
            event_data.event.name,
            detail,
            facts,
        )

    def __repr__(self) -> str:
        return f"InstanceMachine(instance_id={self.instance_id}, state={self.state!r})"
