"""The observation layer's closed sets, read off by reap and status without child processes.

The state groups against the transition table; the reap plan for each process verdict (what it
ends, what it records), never branching on its own words; the words and ``alive`` of status for
the same verdicts. The verdicts themselves, against real processes, are in
``tests/integration/test_observe.py``.
"""

from __future__ import annotations

import pytest
from test_render import NOW, instance_record, run_record

from sidecar_fsm.base import procs
from sidecar_fsm.observe.runs import RunObservation, ended_with_owner
from sidecar_fsm.observe.verdicts import Owner, Process
from sidecar_fsm.run.reap import plan_run
from sidecar_fsm.state.fsm import (
    BEFORE_PROCESS,
    DRAINABLE,
    NON_TERMINAL,
    SERVING_METRICS,
    TERMINAL,
    TRANSITIONS,
    WITH_PROCESS,
)
from sidecar_fsm.view import status as view_status


def test_the_state_groups_are_the_transition_tables_own() -> None:
    assert set(NON_TERMINAL) == BEFORE_PROCESS | WITH_PROCESS and not BEFORE_PROCESS & WITH_PROCESS
    assert SERVING_METRICS < WITH_PROCESS and not TERMINAL & WITH_PROCESS
    # A process comes into being by a spawn or a restart, and only there.
    spawning = {dest for event, _, dest, _ in TRANSITIONS if event in ("spawn", "restart")}
    assert spawning <= WITH_PROCESS
    assert {"spawned", "ready"} == DRAINABLE
    assert {dest for event, _, dest, _ in TRANSITIONS if event == "ready"} <= SERVING_METRICS


UNRECORDED = procs.ProcessIdentity(41077, NOW - 10, "/cache/h2-ping-sidecar", "/logs/h2ping-policy.ready")

# verdict on the recorded pid (or an unrecorded process) -> (the action reap plans, pids it ends,
# status's "alive").
PLANS: dict[str, tuple[RunObservation, str, list[int], bool | None]] = {
    "running": (
        RunObservation(run_record(), Owner.DEAD, [instance_record()], {1: Process.RUNNING}),
        "SIGTERM, mark failed",
        [41030],
        True,
    ),
    "gone": (
        RunObservation(run_record(), Owner.DEAD, [instance_record()], {1: Process.GONE}),
        "mark failed",
        [],
        False,
    ),
    "reused": (
        RunObservation(run_record(), Owner.REUSED, [instance_record()], {1: Process.REUSED}),
        "mark failed (pid not ours)",
        [],
        False,
    ),
    "unproven": (
        RunObservation(
            run_record(), Owner.DEAD, [instance_record(pid_start_time=None)], {1: Process.UNPROVEN}
        ),
        "mark failed (pid unproven)",
        [],
        None,
    ),
    "unrecorded": (
        RunObservation(
            run_record(),
            Owner.DEAD,
            [instance_record(state="configured", pid=None, pid_start_time=None)],
            unrecorded={1: [UNRECORDED]},
        ),
        "SIGTERM, mark failed (unrecorded pid 41077)",
        [41077],
        True,
    ),
    "claimed": (
        RunObservation(
            run_record(),
            Owner.DEAD,
            [instance_record(pid_start_time=None)],
            {1: Process.UNPROVEN},
            claimed={1: procs.ProcessIdentity(41030, NOW - 193, "/cache/h2-ping-sidecar", "/logs/x.ready")},
        ),
        "SIGTERM, mark failed",
        [41030],
        True,
    ),
}


@pytest.mark.parametrize("case", sorted(PLANS))
def test_reap_plans_from_the_verdict_and_status_reads_the_same_one(case: str) -> None:
    observed, action, pids, alive = PLANS[case]
    (plan,) = plan_run(observed)
    (inst,) = observed.instances
    assert plan.report.action == action
    assert [identity.pid for identity in plan.ends] == pids
    assert plan.report.process == observed.process_of(inst)
    assert view_status.process_alive(observed.process_of(inst)) is alive
    # What status calls running under a gone owner is what reap ends, and nothing else.
    assert (observed.process_of(inst) == Process.RUNNING) == bool(plan.ends)
    assert ended_with_owner(observed) == (not plan.ends and case != "unproven")


def test_an_exit_with_owner_run_is_waited_for_not_signalled() -> None:
    observed = RunObservation(
        run_record(config_summary={"exit_with_owner": True}),
        Owner.DEAD,
        [instance_record()],
        {1: Process.RUNNING},
    )
    (plan,) = plan_run(observed)
    assert (plan.report.action, plan.draining) == ("wait for its drain, mark failed", True)


def test_an_unproven_pid_is_said_as_such_and_never_taken_for_gone() -> None:
    observed, _, _, _ = PLANS["unproven"]
    status = view_status.RunStatus(
        **{name: getattr(observed, name) for name in observed.__dataclass_fields__}
    )
    (inst,) = status.instances
    assert view_status.process_note(status, inst) == (
        "pid 41030 cannot be proven ours (no start time recorded); nothing signals it; run sidecar-fsm reap"
    )
    assert view_status.needs_attention(status) == "owner gone; run sidecar-fsm reap"
