"""A Ray driver that runs NeMo Gym's sidecar call sites inside a Ray actor, as NeMo-RL does.

NeMo-RL runs Gym's ``RunHelper`` inside a Ray actor, so ``start_h2_ping_sidecar`` is called
from an actor method, ``check()`` from later calls (Gym's poll loop), ``stop()`` at shutdown.
This script joins the cluster at ``argv[1]`` and takes one command per stdin line, answering
each with one JSON line on stdout: ``start CONFIG_JSON``, ``check``, ``stop``, ``kill``
(``ray.kill`` of the actor) and ``quit``. The actor class lives in ``__main__``, so Ray ships
it to the worker by value: the worker needs only sidecar_fsm installed, not the tests.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import ray


@ray.remote(num_cpus=0, max_restarts=0)
class GymRunner:
    """Stands for RunHelper: owns the sidecar manager across method calls."""

    def __init__(self) -> None:
        self.manager: Any = None

    def start(self, config: dict[str, Any]) -> dict[str, Any]:
        from omegaconf import OmegaConf

        from sidecar_fsm.launcher import start_h2_ping_sidecar

        global_config = OmegaConf.create(config)
        self.manager = start_h2_ping_sidecar(global_config)
        model = global_config.policy_model.responses_api_models.openai_model
        return {"worker_pid": os.getpid(), "base_url": model.base_url, "run_id": self.manager.run_id}

    def check(self) -> str | None:
        from sidecar_fsm.launcher import SidecarError

        try:
            self.manager.check()
        except SidecarError as error:
            return str(error)
        return None

    def stop(self) -> bool:
        self.manager.stop()
        return True


def main() -> None:
    ray.init(address=sys.argv[1], log_to_driver=False, logging_level="ERROR")
    runner = GymRunner.remote()  # type: ignore[attr-defined]
    for line in sys.stdin:
        command, _, argument = line.strip().partition(" ")
        answer: Any
        try:
            if command == "start":
                answer = ray.get(runner.start.remote(json.loads(argument)))
            elif command == "check":
                answer = {"error": ray.get(runner.check.remote())}
            elif command == "stop":
                answer = {"stopped": ray.get(runner.stop.remote())}
            elif command == "kill":
                ray.kill(runner, no_restart=True)
                answer = {"killed": True}
            elif command == "quit":
                break
            else:
                answer = {"failed": f"unknown command {command!r}"}
        except Exception as error:  # reported to the test, which fails naming it
            answer = {"failed": f"{type(error).__name__}: {error}"}
        print(json.dumps(answer), flush=True)
    ray.shutdown()


if __name__ == "__main__":
    main()
