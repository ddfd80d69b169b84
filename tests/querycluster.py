"""What ``tests/integration/test_query.py`` drives: the CLI, a real ``start`` run per host, the README.

Helpers only (no fixtures): running ``sidecar-fsm`` as a subprocess with ``SIDECAR_FSM_HOST``
naming the node, one ``start`` run supervised until told to stop, its config, a folder's bytes
as a snapshot, the README's ``query`` examples, and the files or JSON a process serves.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import signal
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import psutil
import yaml
from helpers import SIDECAR_FSM, ProcessRegistry, wait_until

from sidecar_fsm.base import procs
from sidecar_fsm.lab import TlsH2Origin
from sidecar_fsm.state.hostname import HOST_ENV

README = Path(__file__).resolve().parent.parent / "README.md"


def sfsm(
    log_dir: Path, *args: str, host: str | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != HOST_ENV}
    if host is not None:
        env[HOST_ENV] = host
    return subprocess.run(
        [str(SIDECAR_FSM), "--log-dir", str(log_dir), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def rows(log_dir: Path, sql: str, *args: str) -> list[dict[str, Any]]:
    done = sfsm(log_dir, "query", sql, "--json", *args)
    assert done.returncode == 0, done.stderr
    result: list[dict[str, Any]] = json.loads(done.stdout)["rows"]
    return result


class Run:
    """A ``sidecar-fsm start`` on ``host``, supervising until told to stop."""

    def __init__(self, log_dir: Path, config: Path, host: str, registry: ProcessRegistry) -> None:
        self.log_dir, self.host = log_dir, host
        self.output = config.with_suffix(".out")
        env = {**os.environ, HOST_ENV: host}
        with open(self.output, "wb") as out:
            self.proc = subprocess.Popen(
                [str(SIDECAR_FSM), "start", str(config), "--log-dir", str(log_dir)],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
            )
        registry.add(self.proc)
        wait_until(lambda: "supervising" in self.text() or self.proc.poll() is not None, 30, "start")
        assert self.proc.poll() is None, self.text()
        (run,) = rows(log_dir, f"SELECT run_id FROM run_summary WHERE host = '{host}' AND ended IS NULL")
        self.run_id: str = run["run_id"]
        for inst in self.instances().values():
            registry.add_pid(inst["pid"])

    def text(self) -> str:
        return self.output.read_text(errors="replace")

    def instances(self) -> dict[str, dict[str, Any]]:
        found = rows(self.log_dir, f"SELECT * FROM instance_summary WHERE run_id = '{self.run_id}'")
        return {inst["name"]: inst for inst in found}

    def kill_proxy(self, name: str) -> None:
        identity = procs.identity_of(self.instances()[name]["pid"])
        assert identity is not None and procs.signal_if_ours(identity, signal.SIGKILL)

    def stop(self, expect: int) -> None:
        self.proc.send_signal(signal.SIGTERM)
        assert self.proc.wait(timeout=30) == expect, self.text()


def write_config(path: Path, origin: TlsH2Origin, binary: Path, **sidecar: Any) -> Path:
    """Two instances on free ports: ``policy`` to ``localhost``, ``judge`` to ``127.0.0.1``."""
    config = {
        "sidecar": {
            "enabled": True,
            "binary": str(binary),
            "ca_file": str(origin.ca_file),
            "instances": [
                {"name": "policy", "upstream": f"https://localhost:{origin.port}", "listen": "127.0.0.1:0"},
                {"name": "judge", "upstream": f"https://127.0.0.1:{origin.port}", "listen": "127.0.0.1:0"},
            ],
            "shutdown_grace": "2s",
            **sidecar,
        }
    }
    path.write_text(yaml.safe_dump(config))
    return path


def snapshot(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` and a hash of its bytes: what "nothing changed" means."""
    return {
        str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


def open_files(pid: int) -> list[Any]:
    try:
        return list(psutil.Process(pid).open_files())
    except psutil.Error:
        return []


def readme_queries() -> list[tuple[list[str], list[str]]]:
    """Each ``$ sidecar-fsm query ...`` of the README's query section: its argv and output lines."""
    text = README.read_text()
    examples = []
    for block in re.findall(r"```console\n(.*?)```", text, flags=re.DOTALL):
        lines = block.splitlines()
        index = 0
        while index < len(lines):
            if not lines[index].startswith("$ sidecar-fsm query "):
                index += 1
                continue
            command = lines[index][2:]
            index += 1
            while not _complete(command):
                command += "\n" + lines[index]
                index += 1
            output = []
            while index < len(lines) and not lines[index].startswith("$ "):
                output.append(lines[index])
                index += 1
            examples.append((shlex.split(command), output))
    return examples


def _complete(command: str) -> bool:
    try:
        shlex.split(command)
    except ValueError:
        return False
    return True


def get_json(url: str) -> Any:
    """The JSON document at ``url``; None while the server does not answer yet."""
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return json.loads(response.read())
    except (ConnectionError, urllib.error.URLError):
        return None
