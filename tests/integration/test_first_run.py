"""The first hour of a new user (issue 30), with the real proxy, the lab origin and real signals.

The launcher given what Gym users pass (a plain ``dict``), the warning for an instance nothing
is routed through, a listen off loopback in the rewritten URL, the restart said on ``start``'s
console, and the README's "First run" walkthrough run exactly as the README prints it.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers import SIDECAR_FSM, ProcessRegistry, http11_request, sidecar_cli, wait_until

from sidecar_fsm.lab import TlsH2Origin
from sidecar_fsm.launcher import H2PingSidecarManager, start_h2_ping_sidecar
from sidecar_fsm.state.hostname import host_name


def gym_dict(origin: TlsH2Origin, log_dir: Path, binary: Path, *instances: dict[str, str]) -> dict[str, Any]:
    """A Gym global config as a plain dict (as ``yaml.safe_load`` gives it), a model URL through
    an interpolation and one through a list PyYAML shares with a top-level key (an anchor)."""
    shared_urls = [f"{origin.url}/v1"]
    return {
        "nemo_gym_log_dir": str(log_dir),
        "policy_base_url": origin.url,
        "judge_urls": shared_urls,
        "sidecar": {
            "enabled": True,
            "binary": str(binary),
            "ca_file": str(origin.ca_file),
            "shutdown_grace": "5s",
            "upstream_check": "off",
            "instances": list(instances)
            or [{"name": "policy", "upstream": origin.url, "listen": "127.0.0.1:0"}],
        },
        "policy_model": {
            "responses_api_models": {
                "openai_model": {"base_url": "${policy_base_url}", "api_key": "sk-x"},
                "judge_model": {"base_url": shared_urls},
            }
        },
    }


@dataclass(frozen=True)
class GymStart:
    config: dict[str, Any]
    manager: H2PingSidecarManager


StartGym = Callable[..., GymStart]


@pytest.fixture
def start_gym(
    tls_origin: TlsH2Origin, log_dir: Path, sidecar_binary: Path, managers: list[H2PingSidecarManager]
) -> StartGym:
    """``start_gym(*instances, **sidecar)``: ``gym_dict`` of this test's origin, binary and log dir
    (``sidecar`` added to its ``sidecar:`` block) given to the launcher as the plain dict it is;
    the dict (rewritten in place) and the manager, stopped at teardown."""

    def start(*instances: dict[str, str], **sidecar: Any) -> GymStart:
        config = gym_dict(tls_origin, log_dir, sidecar_binary, *instances)
        config["sidecar"].update(sidecar)
        manager = start_h2_ping_sidecar(config)
        assert manager is not None
        managers.append(manager)
        return GymStart(config, manager)

    return start


def test_a_plain_dict_is_started_and_rewritten_in_place_like_a_dictconfig(
    tls_origin: TlsH2Origin, start_gym: StartGym, capsys: pytest.CaptureFixture[str]
) -> None:
    started = start_gym()
    config = started.config
    (listen,) = [instance.listen for instance in started.manager.instances_actual]
    servers = config["policy_model"]["responses_api_models"]
    assert servers["openai_model"]["base_url"] == f"http://{listen}"
    assert servers["judge_model"]["base_url"] == [f"http://{listen}/v1"]
    # What the values came from keeps its meaning: the alias and the shared list are untouched.
    assert config["policy_base_url"] == tls_origin.url
    assert config["judge_urls"] == [f"{tls_origin.url}/v1"]
    host, _, port = listen.rpartition(":")
    assert http11_request(host, int(port), "/echo").status == 200
    out = capsys.readouterr().out
    assert (
        f"policy_model.responses_api_models.openai_model.base_url: {tls_origin.url} -> http://{listen}" in out
    )
    assert "WARNING" not in out


@pytest.mark.parametrize("given", [42, None, "sidecar: {enabled: true}", [("sidecar", {})]])
def test_anything_but_a_mapping_is_a_one_line_type_error_naming_its_type(given: object) -> None:
    with pytest.raises(TypeError) as raised:
        start_h2_ping_sidecar(given)  # type: ignore[arg-type]
    assert str(raised.value) == (
        "start_h2_ping_sidecar: global_config_dict must be a DictConfig or a dict, "
        f"not {type(given).__name__}"
    )


def test_an_instance_nothing_is_routed_through_is_warned_by_name_beside_a_routed_one(
    tls_origin: TlsH2Origin, start_gym: StartGym, capsys: pytest.CaptureFixture[str]
) -> None:
    other = f"https://127.0.0.1:{tls_origin.port}"  # the same origin by another name: no URL names it
    start_gym(
        {"name": "policy", "upstream": tls_origin.url, "listen": "127.0.0.1:0"},
        {"name": "judge", "upstream": other, "listen": "127.0.0.1:0"},
    )
    warnings = [line for line in capsys.readouterr().out.splitlines() if line.startswith("WARNING")]
    assert warnings == [
        f"WARNING: h2-ping-sidecar 'judge' is running but no model base_url points at its upstream "
        f"({other}), so nothing is routed through it; only *base_url keys of servers under "
        "<top-level>.responses_api_models are rewritten"
    ]


def test_a_listen_off_loopback_keeps_the_host_written_in_the_rewritten_url(
    tls_origin: TlsH2Origin, start_gym: StartGym
) -> None:
    started = start_gym(
        {"name": "policy", "upstream": tls_origin.url, "listen": "0.0.0.0:0"}, allow_non_loopback=True
    )
    (bound,) = [instance.listen_port for instance in started.manager.instances_actual]
    servers = started.config["policy_model"]["responses_api_models"]
    assert servers["openai_model"]["base_url"] == f"http://0.0.0.0:{bound}"
    assert http11_request("127.0.0.1", bound, "/echo").status == 200


# -- the README's "First run", exactly as it prints it ---------------------------------------------

README = Path(__file__).resolve().parents[2] / "README.md"
# What changes from one lab to the next: its folders (temp names) and its ports.
_VARYING = [
    (re.compile(r"/tmp/sidecar-fsm-(lab|origin)-[\w]+"), r"<\1 dir>"),
    (re.compile(r":\d{4,5}\b"), ":<port>"),
]


def first_run_section() -> tuple[list[str], list[str]]:
    """The README's "First run": the console block (``$ command`` then its output) and the
    commands of its ``sh`` blocks, in order."""
    text = README.read_text()
    section = text.split("\n## First run\n", 1)[1].split("\n## ", 1)[0]
    (console,) = re.findall(r"```console\n(.*?)```", section, flags=re.DOTALL)
    commands = [
        line
        for block in re.findall(r"```sh\n(.*?)```", section, flags=re.DOTALL)
        for line in block.splitlines()
        if line.strip()
    ]
    return console.splitlines(), commands


def varying_parts_out(line: str) -> str:
    for pattern, placeholder in _VARYING:
        line = pattern.sub(placeholder, line)
    return line


class Background:
    """A command of the walkthrough that runs until it is told to stop; output in a file."""

    def __init__(self, argv: list[str], env: dict[str, str], path: Path, registry: ProcessRegistry) -> None:
        self.path = path
        with open(path, "wb") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
        registry.add(self.proc)

    def text(self) -> str:
        return self.path.read_text(errors="replace")

    def wait_for(self, words: str, timeout: float) -> str:
        wait_until(lambda: words in self.text() or self.proc.poll() is not None, timeout, repr(words))
        assert words in self.text(), self.text()
        return self.text()


def test_the_readme_first_run_works_exactly_as_printed(
    tmp_path: Path, log_dir: Path, cache_dir: Path, sidecar_binary: Path, process_registry: ProcessRegistry
) -> None:
    console, commands = first_run_section()
    assert [varying_parts_out(command).split()[:2] for command in commands] == [
        ["sidecar-fsm", "start"],
        ["curl", "-sS"],
        ["sidecar-fsm", "status"],
        ["sidecar-fsm", "top"],
        ["sidecar-fsm", "stop"],
        ["sidecar-fsm", "history"],
    ]
    with socket.socket() as probe:  # the example config's fixed listen, which curl is sent to
        if probe.connect_ex(("127.0.0.1", 1250)) == 0:
            pytest.fail("127.0.0.1:1250 is taken on this machine; the README's walkthrough needs it")
    # The user's commands as typed; only where state and the build cache live are the test's own
    # (the cache holds the session's binary: the walkthrough does not build it again).
    xdg = tmp_path / "xdg"
    shutil.copytree(cache_dir, xdg / "sidecar-fsm", copy_function=os.link)
    env = {
        **os.environ,
        "PATH": f"{SIDECAR_FSM.parent}:{os.environ['PATH']}",
        "SIDECAR_FSM_LOG_DIR": str(log_dir),
    }
    env["XDG_CACHE_HOME"] = str(xdg)

    assert console[0] == "$ sidecar-fsm lab --idle 5"
    lab = Background(shlex.split(console[0][2:]), env, tmp_path / "lab.out", process_registry)
    printed = lab.wait_for("serving until Ctrl-C", 30).splitlines()
    assert [varying_parts_out(line) for line in printed] == [varying_parts_out(line) for line in console[1:]]
    start_line, curl_line = (line.strip() for line in printed if line.startswith("  "))
    assert varying_parts_out(start_line) == varying_parts_out(commands[0])
    assert curl_line == commands[1]

    start = Background(shlex.split(start_line), env, tmp_path / "start.out", process_registry)
    said = start.wait_for("supervising;", 60)
    assert "base_url: https://localhost:" in said and "-> http://127.0.0.1:1250/v1" in said
    assert "WARNING" not in said
    run_id = re.search(r"^run (\w+): 1 sidecar\(s\) ready", said, re.M)
    assert run_id is not None, said

    began = time.monotonic()
    answer = subprocess.run(shlex.split(curl_line), capture_output=True, text=True, timeout=60, env=env)
    assert answer.returncode == 0, answer.stderr
    assert answer.stdout.startswith("slow: first byte after 10s") and time.monotonic() - began >= 10

    status = subprocess.run(shlex.split(commands[2]), capture_output=True, text=True, timeout=30, env=env)
    assert status.returncode == 0, status.stdout + status.stderr
    assert re.search(
        r"^  nvcf\s+ready\s+\d+\s+127\.0\.0\.1:1250 → https://localhost:\d+ ", status.stdout, re.M
    )

    top = Background(shlex.split(commands[3]), env, tmp_path / "top.out", process_registry)
    top.wait_for("nvcf", 30)
    top.proc.send_signal(signal.SIGINT)
    assert top.proc.wait(timeout=10) == 0, top.text()

    stop = subprocess.run(shlex.split(commands[4]), capture_output=True, text=True, timeout=90, env=env)
    assert stop.returncode == 0, stop.stdout + stop.stderr
    assert start.proc.wait(timeout=30) == 0, start.text()

    history_argv = [run_id.group(1) if word == "RUN" else word for word in shlex.split(commands[5])]
    history = subprocess.run(history_argv, capture_output=True, text=True, timeout=30, env=env)
    assert history.returncode == 0, history.stderr
    assert [line.split()[4:6] for line in history.stdout.splitlines() if " nvcf " in line][-2:] == [
        ["ready", "draining"],
        ["draining", "stopped"],
    ], history.stdout

    lab.proc.send_signal(signal.SIGINT)
    assert lab.proc.wait(timeout=10) == 0
    assert not any(Path(word).exists() for word in shlex.split(start_line) if word.endswith("gym.yaml"))


# -- SIGTERM and `sidecar-fsm stop` always work, however start was launched ------------------------


def sigint_ignored(argv: list[str]) -> list[str]:
    """``argv`` as a script's background job (or ``nohup`` under a non-interactive shell) runs
    it: with SIGINT ignored, which the exec'd program inherits."""
    return ["sh", "-c", 'trap "" INT; exec "$@"', "sh", *argv]


StartFile = Callable[..., Path]


@pytest.fixture
def start_file(tmp_path: Path, tls_origin: TlsH2Origin, sidecar_binary: Path) -> StartFile:
    """``start_file(upstream=the origin, **sidecar)``: a ``gym.yaml`` of one instance for
    ``sidecar-fsm start``; ``sidecar`` adds to (or replaces) keys of its ``sidecar:`` block."""

    def write(upstream: str = tls_origin.url, **sidecar: Any) -> Path:
        block = {
            "enabled": True,
            "binary": str(sidecar_binary),
            "ca_file": str(tls_origin.ca_file),
            "shutdown_grace": "5s",
            "instances": [{"name": "policy", "upstream": upstream, "listen": "127.0.0.1:0"}],
            **sidecar,
        }
        path = tmp_path / "gym.yaml"
        path.write_text(yaml.safe_dump({"sidecar": block}))
        return path

    return write


LaunchStart = Callable[..., Background]


@pytest.fixture
def launch_start(tmp_path: Path, log_dir: Path, process_registry: ProcessRegistry) -> LaunchStart:
    """``launch_start(config, ignoring_sigint=False)``: ``sidecar-fsm start CONFIG`` in the
    background, as a user's shell runs it (``ignoring_sigint``: as ``sigint_ignored`` runs it)."""

    def launch(config: Path, *, ignoring_sigint: bool = False) -> Background:
        argv = [str(SIDECAR_FSM), "--log-dir", str(log_dir), "start", str(config)]
        if ignoring_sigint:
            argv = sigint_ignored(argv)
        return Background(argv, dict(os.environ), tmp_path / "start.out", process_registry)

    return launch


def test_stop_ends_a_start_launched_with_sigint_ignored(
    log_dir: Path, start_file: StartFile, launch_start: LaunchStart
) -> None:
    start = launch_start(start_file(), ignoring_sigint=True)
    start.wait_for("supervising;", 60)
    stopped = sidecar_cli(log_dir, "stop", "--timeout", "30")
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert start.proc.wait(timeout=30) == 0, start.text()
    assert "SIGTERM: draining the sidecars" in start.text()


def test_sigterm_while_starting_stops_what_was_started_with_sigint_ignored(
    log_dir: Path, start_file: StartFile, launch_start: LaunchStart
) -> None:
    """The start waits on its upstream check (an upstream that takes the connection and never
    answers): SIGTERM then ends it at once, 130, nothing left running."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        upstream = f"https://localhost:{silent.getsockname()[1]}"
        config = start_file(upstream, upstream_check_seconds=60)
        start = launch_start(config, ignoring_sigint=True)
        silent.settimeout(60)
        checking, _ = silent.accept()  # the proxy is ready and its upstream check has dialled
        with checking:
            start.proc.send_signal(signal.SIGTERM)
            assert start.proc.wait(timeout=30) == 130, start.text()
    assert "interrupted before the sidecars were ready; everything started was stopped" in start.text()
    runs = json.loads(sidecar_cli(log_dir, "status", "--all", "--json").stdout)["runs"]
    ((run,),) = [runs]
    assert run["ended_at"] is not None, run
    assert [(inst["state"], inst["alive"]) for inst in run["instances"]] == [("stopped", None)], run


def test_a_stopped_sidecar_is_said_on_starts_console_and_again_when_it_runs(
    log_dir: Path, start_file: StartFile, launch_start: LaunchStart
) -> None:
    start = launch_start(start_file())
    start.wait_for("supervising;", 60)
    (run,) = json.loads(sidecar_cli(log_dir, "status", "--json").stdout)["runs"]
    pid = run["instances"][0]["pid"]
    os.kill(pid, signal.SIGSTOP)
    try:
        said = start.wait_for("is stopped", 30)
    finally:
        os.kill(pid, signal.SIGCONT)
    line = (
        f"h2-ping-sidecar {host_name()}: policy (pid {pid}) is stopped (SIGSTOP, a debugger): "
        f"it answers nothing until kill -CONT {pid}"
    )
    assert line in said.splitlines(), said
    assert f"policy (pid {pid}) runs again" in start.wait_for("runs again", 30)


# -- a restart is said on start's console; a signal reads by its name everywhere --------------------


def test_restarts_are_said_on_the_console_and_a_signal_reads_by_its_name_everywhere(
    log_dir: Path, start_file: StartFile, launch_start: LaunchStart
) -> None:
    start = launch_start(start_file(restart={"max_restarts": 1, "backoff": "100ms"}))
    start.wait_for("supervising;", 60)

    def instance() -> dict[str, Any]:
        (run,) = json.loads(sidecar_cli(log_dir, "status", "--json").stdout)["runs"]
        (inst,) = run["instances"]
        return {**inst, "run_id": run["run_id"]}

    first = instance()
    listen = first["listen"]
    os.kill(first["pid"], signal.SIGKILL)
    said = start.wait_for("restarting", 30)
    line = f"h2-ping-sidecar {host_name()}: policy killed by SIGKILL; restarting (attempt 1 of 1) on {listen}"
    assert line in said.splitlines(), said
    again = wait_until(lambda: (i := instance())["pid"] != first["pid"] and i["state"] == "ready" and i, 30)

    os.kill(again["pid"], signal.SIGKILL)  # the policy is spent: this one fails the run
    assert start.proc.wait(timeout=30) == 1, start.text()
    never = re.compile(r"(code|exit) -\d")  # Python's returncode for a signal, never shown
    assert not never.search(start.text()), start.text()
    shown = sidecar_cli(log_dir, "status", "--run", first["run_id"])
    (row,) = [line for line in shown.stdout.splitlines() if line.lstrip().startswith("policy")]
    assert "killed by SIGKILL: h2-ping-sidecar 'policy'" in row and not never.search(row), shown.stdout
    history = sidecar_cli(log_dir, "history", first["run_id"]).stdout
    assert re.search(r"\srestart\s+killed by SIGKILL; attempt 1 of 1, pid \d+ on ", history), history
    assert "exited with code 137 (killed by SIGKILL) unexpectedly" in history
    assert not never.search(history), history
