"""A real local Ray cluster for the tests, isolated from every other Ray on the machine.

Owns starting Ray nodes on this machine (``ray start --block``, one process per node, each in
its own process group) in a private temp dir with a private HOME, and ending every process of
them, pass or fail. The HOME matters: Ray reads ``~/.ray`` (an auth token another user's
cluster left there fails ``ray start`` with ``InvalidAuthToken``), so a suite that used the
machine's HOME would pass or fail by what ran on the machine before it. Never runs
``ray stop``, which would end every Ray of this user on the machine.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import psutil
from helpers import ProcessRegistry, wait_until

RAY = Path(sys.executable).with_name("ray")
_NODE_START_SECONDS = 60.0
_NODE_STOP_SECONDS = 30.0
_JOIN = re.compile(r"ray start --address='([^']+)'")


def ray_env(home: Path, host: str | None = None) -> dict[str, str]:
    """Our environment with a private HOME and no pointer to another Ray, plus this node's
    database host name (``SIDECAR_FSM_HOST``: several nodes on one machine stand for hosts)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env["HOME"] = str(home)
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    if host is not None:
        env["SIDECAR_FSM_HOST"] = host
    return env


@dataclass
class RayNode:
    """One ``ray start --block`` process; ending it ends the node's raylet, GCS and workers."""

    host: str
    process: subprocess.Popen[bytes]
    output: Path

    def text(self) -> str:
        return self.output.read_text(errors="replace") if self.output.exists() else ""


class LocalRayCluster:
    """Ray nodes on this machine in a private temp dir; ``stop()`` leaves none of their processes."""

    def __init__(self, registry: ProcessRegistry) -> None:
        # Short and private: Ray puts unix sockets under it (107-byte path limit) and records its
        # address there, so nothing of another Ray on this machine is read or touched.
        self.temp_dir = Path(tempfile.mkdtemp(prefix="sfray", dir="/tmp"))
        self.home = self.temp_dir / "home"
        self.home.mkdir()
        self.registry = registry
        self.nodes: list[RayNode] = []
        self.address = ""

    def env(self, host: str | None = None) -> dict[str, str]:
        """The environment for a process that joins this cluster (a driver, the CLI)."""
        return ray_env(self.home, host)

    def start_node(self, host: str) -> RayNode:
        head = not self.nodes
        argv = [str(RAY), "start", "--block", "--num-cpus=1", "--object-store-memory=80000000"]
        argv += ["--disable-usage-stats", f"--temp-dir={self.temp_dir}"]
        if head:
            argv += ["--head", "--port=0", "--include-dashboard=false"]
        else:
            argv += [f"--address={self.address}"]
        output = self.temp_dir / f"{host}.out"
        with open(output, "wb") as out:
            process = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env(host),
                start_new_session=True,  # its own process group: the backstop kills exactly it
            )
        self.registry.add(process)
        node = RayNode(host, process, output)
        self.nodes.append(node)
        wait_until(
            lambda: "Ray runtime started" in node.text() or process.poll() is not None,
            _NODE_START_SECONDS,
            f"ray node {host} to start",
        )
        assert process.poll() is None, f"ray start for {host} exited {process.returncode}:\n{node.text()}"
        if head:
            # `ray start --head` prints how other nodes join: ray start --address='IP:PORT'.
            match = wait_until(
                lambda: _JOIN.search(node.text()), _NODE_START_SECONDS, f"ray head address in {output}"
            )
            self.address = match.group(1)
        return node

    def _leftovers(self) -> list[psutil.Process]:
        """Processes of this cluster: in a node's process group or naming our temp dir."""
        groups = {node.process.pid for node in self.nodes}
        found = []
        for proc in psutil.process_iter(["pid", "cmdline"]):
            with contextlib.suppress(psutil.Error):
                if proc.pid == os.getpid():
                    continue
                if os.getpgid(proc.pid) in groups or str(self.temp_dir) in " ".join(
                    proc.info["cmdline"] or []
                ):
                    found.append(proc)
        return found

    def stop(self) -> None:
        # Workers first, then the head: each `ray start --block` ends its own node on SIGTERM.
        for node in reversed(self.nodes):
            if node.process.poll() is None:
                node.process.send_signal(signal.SIGTERM)
                try:
                    node.process.wait(_NODE_STOP_SECONDS)
                except subprocess.TimeoutExpired:
                    node.process.kill()
                    node.process.wait(_NODE_STOP_SECONDS)
        for node in self.nodes:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(node.process.pid, signal.SIGKILL)
        leftovers = self._leftovers()
        for proc in leftovers:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        psutil.wait_procs(leftovers, timeout=_NODE_STOP_SECONDS)
        shutil.rmtree(self.temp_dir, ignore_errors=True)
