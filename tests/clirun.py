"""What the command-line tests share: ``sidecar-fsm start`` in the background (``StartedCli``), a
Gym-shaped config for it, ``--json`` read back, and what the database and the sidecars say.

The ``gym_config_file`` fixture (a config on the lab origin and the test binary) and ``start_cli``
(a ``StartedCli`` of such a config) are in conftest.
"""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml
from helpers import SIDECAR_FSM, ProcessRegistry, http11_request, sidecar_cli, wait_until

from sidecar_fsm.base import procs
from sidecar_fsm.lab import TlsH2Origin


def cli_json(log_dir: Path, *args: str) -> Any:
    """``sidecar-fsm --log-dir LOG_DIR ARGS... --json``, parsed; it must succeed (``status`` may
    exit 3: a run that needs attention, such as a killed launcher's, still prints its JSON)."""
    done = sidecar_cli(log_dir, *args, "--json")
    assert done.returncode in ((0, 3) if args[0] == "status" else (0,)), done.stderr
    return json.loads(done.stdout)


def write_gym_config(path: Path, origin: TlsH2Origin, binary: Path | None, **sidecar: Any) -> Path:
    """A Gym-shaped config: two sidecar instances on free ports, a model server on the origin.

    ``binary`` None leaves ``sidecar.binary`` out: the build cache provides it. ``sidecar`` keys
    go over the block's (``shutdown_grace`` is 2 s unless given).
    """
    config = {
        "policy_base_url": origin.url + "/v1",
        "sidecar": {
            "enabled": True,
            **({"binary": str(binary)} if binary is not None else {}),
            "ca_file": str(origin.ca_file),
            "instances": [
                {"name": "policy", "upstream": origin.url, "listen": "127.0.0.1:0"},
                {"name": "judge", "upstream": origin.url, "listen": "127.0.0.1:0"},
            ],
            "shutdown_grace": "2s",
            **sidecar,
        },
        "policy_model": {"responses_api_models": {"openai_model": {"base_url": "${policy_base_url}"}}},
    }
    path.write_text(yaml.safe_dump(config))
    return path


class StartedCli:
    """A ``sidecar-fsm start CONFIG`` subprocess, its output (``CONFIG`` with ``.out``) and its run
    as ``status --json`` shows it once it supervises (``run``, ``run_id``, ``instances``). Every
    process of it is in ``registry``, so the test's cleanup ends them whatever happens."""

    def __init__(
        self,
        log_dir: Path,
        config: Path,
        registry: ProcessRegistry,
        *extra: str,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.output = config.with_suffix(".out")
        with open(self.output, "wb") as out:
            self.proc = subprocess.Popen(
                [str(SIDECAR_FSM), "start", str(config), "--log-dir", str(log_dir), *extra],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                cwd=cwd,
            )
        registry.add(self.proc)
        wait_until(
            lambda: "supervising" in self.text() or self.proc.poll() is not None, 30, "start to be ready"
        )
        assert self.proc.poll() is None, self.text()
        runs = cli_json(log_dir, "status", "--all")["runs"]
        (self.run,) = [run for run in runs if run["owner"]["pid"] == self.proc.pid]
        self.run_id: str = self.run["run_id"]
        self.instances: list[dict[str, Any]] = self.run["instances"]
        for inst in self.instances:
            registry.add_pid(inst["pid"])

    def text(self) -> str:
        return self.output.read_text(errors="replace")

    def sigkill_and_wait_for_sidecars(self) -> None:
        """SIGKILL the launcher, then wait until its sidecars (``exit_with_owner``, the default)
        have noticed, drained and exited by themselves: what a user's ``kill -9`` leaves."""
        identities = [sidecar_identity(inst) for inst in self.instances]
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)
        # shutdown_grace is write_gym_config's 2 s; then 10 s for a loaded machine.
        wait_until(
            lambda: not any(procs.is_ours(i) for i in identities), 2 + 10, "sidecars to exit with their owner"
        )


def load_through_the_launcher(config: Path) -> dict[str, Any]:
    """What ``start_h2_ping_sidecar`` returns for ``config`` in a fresh process, as Gym would call it."""
    code = (
        "import json, sys\n"
        "from omegaconf import OmegaConf\n"
        "from sidecar_fsm.launcher import start_h2_ping_sidecar\n"
        "config = OmegaConf.load(sys.argv[1])\n"
        "manager = start_h2_ping_sidecar(config)\n"
        "url = config.policy_model.responses_api_models.openai_model.base_url\n"
        "print(json.dumps({'manager': None if manager is None else repr(manager), 'base_url': url}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(config)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return result


def db_rows(path: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table, through a read-only connection: what "the database" holds."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        tables = [row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        return {t: sorted(conn.execute(f"SELECT * FROM {t}").fetchall(), key=repr) for t in tables}
    finally:
        conn.close()


def echo_through(inst: dict[str, Any]) -> int:
    host, port = inst["listen"].rsplit(":", 1)
    return http11_request(host, int(port), "/echo?x=1", timeout=10).status


def sidecar_identity(inst: dict[str, Any]) -> procs.ProcessIdentity:
    identity = procs.identity_of(inst["pid"])
    assert identity is not None, f"sidecar {inst['name']} is not running"
    return identity
