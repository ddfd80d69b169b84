"""The instance state machine against a real SQLite file: every (state, event) pair, named histories.

The expected table below is written out from SPEC's diagram on purpose, not derived from
``fsm.TRANSITIONS``: the test checks the table, it does not restate it.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from typing import Any

import pytest

from sidecar_fsm.errors import SidecarError
from sidecar_fsm.state.fsm import (
    EVENTS,
    STATES,
    TERMINAL,
    Firing,
    InstanceMachine,
    MachineError,
    fire_together,
    legal_events,
    target_of,
)
from sidecar_fsm.state.store import InstanceRecord, Store

# SPEC "The instance state machine", pair by pair. Anything not listed must be refused.
LEGAL: dict[tuple[str, str], str] = {
    ("configured", "build"): "building",
    ("building", "spawn"): "spawned",
    ("spawned", "ready"): "ready",
    ("spawned", "drain"): "draining",
    ("ready", "drain"): "draining",
    ("draining", "stop"): "stopped",
    ("configured", "stop"): "stopped",
    ("building", "stop"): "stopped",
    ("ready", "restart"): "spawned",
    **{(state, "fail"): "failed" for state in ("configured", "building", "spawned", "ready", "draining")},
}

# The shortest way to bring a fresh instance into each state.
PATH_TO: dict[str, list[str]] = {
    "configured": [],
    "building": ["build"],
    "spawned": ["build", "spawn"],
    "ready": ["build", "spawn", "ready"],
    "draining": ["build", "spawn", "ready", "drain"],
    "stopped": ["stop"],
    "failed": ["fail"],
}

# Facts each event carries in these tests (restart must carry its attempt number).
FACTS: dict[str, dict[str, Any]] = {
    "spawn": {"pid": 4242, "pid_start_time": 1700000000.25, "binary": "/cache/h2-ping-sidecar"},
    "ready": {"listen": "127.0.0.1:41000"},
    "restart": {"restart_count": 1, "pid": 4343},
    "fail": {"exit_code": 1, "error": "bind: address already in use"},
}

ALL_PAIRS = [(state, event) for state in STATES for event in EVENTS]


_names = iter(range(1_000_000))


def new_instance(store: Store) -> InstanceRecord:
    """A new ``configured`` instance of run ``run1`` (recorded first if it is not yet)."""
    if store.get_run("run1") is None:
        store.create_run("run1", owner_pid=1, owner_start_time=1.0, config_summary={})
    return store.create_instance(
        "run1", f"i{next(_names)}", "127.0.0.1:0", "https://api.example.com", None, "/tmp/l", "/tmp/r"
    )


def machine_in(store: Store, state: str) -> InstanceMachine:
    machine = InstanceMachine(store, new_instance(store).id)
    for event in PATH_TO[state]:
        machine.fire(event, **FACTS.get(event, {}))
    assert machine.state == state
    return machine


def test_the_table_matches_the_spec() -> None:
    assert {(s, e): target_of(s, e) for s, e in ALL_PAIRS if target_of(s, e)} == LEGAL
    assert set(STATES) == {"configured", "building", "spawned", "ready", "draining", "stopped", "failed"}
    assert {"stopped", "failed"} == TERMINAL
    for state in TERMINAL:
        assert legal_events(state) == ()


@pytest.mark.parametrize(("state", "event"), [pair for pair in ALL_PAIRS if pair in LEGAL])
def test_legal_transition_persists_row_and_history_together(store: Store, state: str, event: str) -> None:
    machine = machine_in(store, state)
    before = store.history(machine.instance_id)

    machine.fire(event, detail=f"{event} for the test", **FACTS.get(event, {}))

    dest = LEGAL[(state, event)]
    row = store.get_instance(machine.instance_id)
    history = store.history(machine.instance_id)
    assert row is not None
    assert machine.state == row.state == history[-1].dest == dest
    assert len(history) == len(before) + 1
    last = history[-1]
    assert (last.source, last.event, last.detail) == (state, event, f"{event} for the test")
    assert row.state_since == last.at
    for fact, value in FACTS.get(event, {}).items():
        assert getattr(row, fact) == value


@pytest.mark.parametrize(("state", "event"), [pair for pair in ALL_PAIRS if pair not in LEGAL])
def test_illegal_transition_raises_and_writes_nothing(store: Store, state: str, event: str) -> None:
    machine = machine_in(store, state)
    row_before = store.get_instance(machine.instance_id)
    history_before = store.history(machine.instance_id)

    with pytest.raises(MachineError):
        machine.fire(event, **FACTS.get(event, {}))

    assert machine.state == state
    assert store.get_instance(machine.instance_id) == row_before
    assert store.history(machine.instance_id) == history_before


# Named event sequences, honcho HISTORIES style: (event, facts) steps and the final row's facts.
HISTORIES: dict[str, tuple[list[tuple[str, dict[str, Any]]], dict[str, Any]]] = {
    "clean run": (
        [
            ("build", {}),
            ("spawn", {"pid": 10, "pid_start_time": 5.0}),
            ("ready", {}),
            ("drain", {}),
            ("stop", {"exit_code": 0}),
        ],
        {"state": "stopped", "pid": 10, "exit_code": 0, "restart_count": 0},
    ),
    "stop before anything ran": ([("stop", {})], {"state": "stopped", "pid": None}),
    "stop while building": ([("build", {}), ("stop", {})], {"state": "stopped"}),
    "stop requested before ready drains": (
        [("build", {}), ("spawn", {"pid": 11}), ("drain", {}), ("stop", {"exit_code": 0})],
        {"state": "stopped", "exit_code": 0},
    ),
    "build fails": (
        [("build", {}), ("fail", {"error": "go build: exit status 1"})],
        {"state": "failed", "error": "go build: exit status 1", "pid": None},
    ),
    "bind fails before ready": (
        [("build", {}), ("spawn", {"pid": 12}), ("fail", {"exit_code": 1, "error": "bind: address in use"})],
        {"state": "failed", "exit_code": 1, "error": "bind: address in use"},
    ),
    "restarted twice then stopped": (
        [
            ("build", {}),
            ("spawn", {"pid": 13}),
            ("ready", {}),
            ("restart", {"restart_count": 1, "pid": 14, "exit_code": 2}),
            ("ready", {}),
            ("restart", {"restart_count": 2, "pid": 15, "exit_code": 2}),
            ("ready", {}),
            ("drain", {}),
            ("stop", {"exit_code": 0}),
        ],
        {"state": "stopped", "restart_count": 2, "pid": 15, "exit_code": 0},
    ),
    "killed while draining": (
        [
            ("build", {}),
            ("spawn", {"pid": 16}),
            ("ready", {}),
            ("drain", {}),
            ("fail", {"exit_code": -9, "error": "killed after shutdown grace"}),
        ],
        {"state": "failed", "exit_code": -9},
    ),
    "reaped after the owner died": (
        [("build", {}), ("spawn", {"pid": 17}), ("ready", {}), ("fail", {"error": "owner gone; reaped"})],
        {"state": "failed", "error": "owner gone; reaped", "pid": 17},
    ),
}


@pytest.mark.parametrize("name", HISTORIES)
def test_histories(store: Store, name: str) -> None:
    steps, final = HISTORIES[name]
    machine = InstanceMachine(store, new_instance(store).id)
    for event, facts in steps:
        machine.fire(event, **facts)

    history = store.history(machine.instance_id)
    assert [h.event for h in history] == [event for event, _ in steps]
    # The history is one unbroken chain from configured to the row's state.
    assert [h.source for h in history] == ["configured"] + [h.dest for h in history[:-1]]
    row = store.get_instance(machine.instance_id)
    assert row is not None
    assert row.state == history[-1].dest == machine.state
    assert {key: getattr(row, key) for key in final} == final


def test_a_failed_write_leaves_machine_and_database_unchanged(store: Store) -> None:
    record = new_instance(store)
    first = InstanceMachine(store, record.id)
    stale = InstanceMachine(store, record.id)  # e.g. a second process that loaded the row earlier
    first.fire("build")

    with pytest.raises(SidecarError, match="state is 'building', not 'configured'"):
        stale.fire("build")

    assert stale.state == "configured"
    assert [h.event for h in store.history(record.id)] == ["build"]


def test_a_machine_resumes_from_the_stored_state(store: Store) -> None:
    machine = machine_in(store, "ready")
    row = store.get_instance(machine.instance_id)
    assert row is not None

    resumed = InstanceMachine(store, row.id, state=row.state)
    resumed.fire("drain")

    assert store.history(row.id)[-1].source == "ready"


def test_restart_must_carry_its_attempt_number(store: Store) -> None:
    machine = machine_in(store, "ready")
    before = store.history(machine.instance_id)

    with pytest.raises(ValueError, match="'restart' needs the facts \\['restart_count'\\]"):
        machine.fire("restart")

    assert machine.state == "ready"
    assert store.history(machine.instance_id) == before


def test_unknown_event_fact_or_state_is_refused(store: Store) -> None:
    machine = machine_in(store, "configured")
    with pytest.raises(ValueError, match="'to_ready' is not an event"):
        machine.fire("to_ready")
    with pytest.raises(ValueError, match="unknown facts \\['state'\\]"):
        machine.fire("build", state="ready")
    with pytest.raises(ValueError, match="'running' is not a state"):
        InstanceMachine(store, machine.instance_id, state="running")
    assert store.history(machine.instance_id) == []


def test_no_auto_transition_bypass_exists(store: Store) -> None:
    machine = machine_in(store, "configured")
    assert not any(name.startswith("to_") for name in dir(machine))
    assert not any(name.startswith("to_") for name in machine._machine.events)


def test_threads_drive_different_instances_at_once(store: Store) -> None:
    machines = [InstanceMachine(store, new_instance(store).id) for _ in range(40)]
    errors: list[BaseException] = []

    def drive(chunk: list[InstanceMachine]) -> None:
        try:
            for machine in chunk:
                for event in ("build", "spawn", "ready", "drain", "stop"):
                    machine.fire(event)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=drive, args=(machines[k::4],)) for k in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)

    assert errors == []
    for machine in machines:
        row = store.get_instance(machine.instance_id)
        assert row is not None and row.state == "stopped" == store.history(row.id)[-1].dest


def test_fire_together_moves_every_machine_in_one_commit(store: Store) -> None:
    machines = [machine_in(store, "building") for _ in range(4)]
    fire_together([Firing(m, "spawn", f"pid {4000 + i}", {"pid": 4000 + i}) for i, m in enumerate(machines)])
    for index, machine in enumerate(machines):
        row = store.get_instance(machine.instance_id)
        assert row is not None
        assert machine.state == row.state == store.history(machine.instance_id)[-1].dest == "spawned"
        assert row.pid == 4000 + index


@pytest.mark.parametrize("failing", ["illegal event", "unknown fact", "stale state"])
def test_fire_together_is_all_or_nothing(store: Store, failing: str) -> None:
    machines = [machine_in(store, "building") for _ in range(3)]
    last = machines[-1]
    if failing == "illegal event":
        last.fire("spawn", pid=1)  # now 'spawned': a second spawn is illegal
    elif failing == "stale state":
        # Another process moved it: this machine still believes 'building'.
        InstanceMachine(store, last.instance_id, "building").fire("stop")
    facts: dict[str, Any] = {"pid": 7}
    firings = [Firing(m, "spawn", None, facts) for m in machines[:-1]]
    firings.append(Firing(last, "spawn", None, {"port": 1} if failing == "unknown fact" else facts))
    states_before = [m.state for m in machines]
    rows_before = [store.get_instance(m.instance_id) for m in machines]
    histories_before = [store.history(m.instance_id) for m in machines]

    with pytest.raises((MachineError, ValueError, SidecarError)):
        fire_together(firings)

    assert [m.state for m in machines] == states_before
    assert [store.get_instance(m.instance_id) for m in machines] == rows_before
    assert [store.history(m.instance_id) for m in machines] == histories_before
    # The machines still work: the first two can take the event now on their own.
    machines[0].fire("spawn", pid=8)
    assert store.get_instance(machines[0].instance_id).state == "spawned"  # type: ignore[union-attr]


def test_fire_together_fires_a_machine_twice_in_order_and_rewinds_it_whole(store: Store) -> None:
    """A start records build and spawn in one commit; a failure puts the machine back before both."""
    first, second = machine_in(store, "configured"), machine_in(store, "configured")
    fire_together(
        [
            Firing(first, "build"),
            Firing(second, "build"),
            Firing(first, "spawn", "pid 5", {"pid": 5}),
            Firing(second, "spawn", "pid 6", {"pid": 6}),
        ]
    )
    for machine in (first, second):
        assert [t.event for t in store.history(machine.instance_id)] == ["build", "spawn"]
        assert machine.state == "spawned"

    third = machine_in(store, "configured")
    with pytest.raises(MachineError):
        fire_together([Firing(third, "build"), Firing(third, "ready")])  # ready is illegal in building
    assert third.state == "configured"
    assert store.history(third.instance_id) == []
    assert store.get_instance(third.instance_id).state == "configured"  # type: ignore[union-attr]


def test_transitions_info_lines_stay_quiet_unless_asked_for() -> None:
    code = (
        "import logging, sys\n"
        "logging.basicConfig(level=logging.INFO, stream=sys.stdout, format='%(name)s %(message)s')\n"
        "{preset}"
        "import sidecar_fsm.state.fsm\n"
        "from transitions import Machine\n"
        "m = Machine(states=['a', 'b'], initial='a', transitions=[['go', 'a', 'b']])\n"
        "m.go()\n"
    )
    quiet = subprocess.run([sys.executable, "-c", code.format(preset="")], capture_output=True, text=True)
    assert quiet.returncode == 0, quiet.stderr
    assert "transitions" not in quiet.stdout
    chosen = "logging.getLogger('transitions').setLevel(logging.INFO)\n"
    asked = subprocess.run([sys.executable, "-c", code.format(preset=chosen)], capture_output=True, text=True)
    assert "transitions.core" in asked.stdout
