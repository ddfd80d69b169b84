"""``sidecar-fsm exec``: a Gym program runs unchanged on sidecar-fsm's launcher.

The command is real: the console script, a stand-in ``nemo_gym`` (tests/gym_standin) whose own
``launcher``/``config`` are traps that raise on import, and its ``env_start``, which does with
the sidecar what ``gym env start`` does: start it through the redirected launcher, send a
request through the rewritten URL whose first byte comes after the idle relay's limit, poll
``check()``, stop on Ctrl-C. Exit statuses and signals are observed from the outside.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
from helpers import SIDECAR_FSM, ProcessRegistry, wait_until

import sidecar_fsm
from sidecar_fsm.gymexec import EXIT_CANNOT_RUN, EXIT_NOT_FOUND, REDIRECTED_MODULES
from sidecar_fsm.lab import IdleRelay, TlsH2Origin

REPO = Path(sidecar_fsm.__file__).resolve().parents[1]
STANDIN = Path(__file__).resolve().parents[1] / "gym_standin"


def _env(*front: Path) -> dict[str, str]:
    """Our environment with PYTHONPATH = ``front`` then this checkout (so the child imports it)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([*map(str, front), str(REPO)])
    return env


def _exec(
    *command: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SIDECAR_FSM), "exec", *command],
        env=env if env is not None else _env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def _python(code: str, *extra: str) -> list[str]:
    return ["--", sys.executable, "-c", code, *extra]


# --- the gym env start flow -------------------------------------------------------------------


GymConfig = Callable[[float], tuple[Path, IdleRelay]]


@pytest.fixture
def gym_config(
    tmp_path: Path,
    tls_origin: TlsH2Origin,
    idle_relay: Callable[..., IdleRelay],
    sidecar_binary: Path,
    cache_dir: Path,
    log_dir: Path,
) -> GymConfig:
    """``gym_config(idle)``: a gym.yaml whose one sidecar and model reach the lab's origin through
    a relay that drops a connection idle for ``idle`` seconds, and that relay. Its ``cache_dir``
    already holds the session's proxy (``sidecar_binary``): the program under test builds nothing."""

    def write(idle: float) -> tuple[Path, IdleRelay]:
        relay = idle_relay(tls_origin, idle=idle)
        return _write_gym_config(tmp_path, tls_origin, relay, cache_dir, log_dir), relay

    return write


def _write_gym_config(
    tmp_path: Path, origin: TlsH2Origin, relay: IdleRelay, cache_dir: Path, log_dir: Path
) -> Path:
    upstream = f"https://localhost:{relay.port}"
    config = tmp_path / "gym.yaml"
    config.write_text(
        f"""
cache_dir: {cache_dir}
policy_model:
  responses_api_models:
    m:
      base_url: {upstream}
sidecar:
  enabled: true
  instances: [{{name: slow, upstream: "{upstream}", listen: "127.0.0.1:0"}}]
  ca_file: {origin.ca_file}
  ping_interval: 300ms
  shutdown_grace: 5s
  log_dir: {log_dir}
"""
    )
    return config


def _facts(text: str) -> dict[str, str]:
    return dict(line.split(": ", 1) for line in text.splitlines() if ": " in line)


def test_gym_entry_point_serves_a_slow_request_and_stops_on_sigint(
    gym_config: GymConfig, tmp_path: Path, log_dir: Path, process_registry: ProcessRegistry
) -> None:
    config, relay = gym_config(1.0)
    out_path = tmp_path / "out.txt"
    with out_path.open("w") as out:
        proc = subprocess.Popen(
            [str(SIDECAR_FSM), "exec", "--", sys.executable, "-m", "nemo_gym.env_start", str(config),
             "--path", "/slow?first_byte=2.5"],
            env=_env(STANDIN),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )  # fmt: skip
    process_registry.add(proc)

    def facts() -> dict[str, str]:
        return _facts(out_path.read_text())

    wait_until(lambda: "serving" in facts() or proc.poll() is not None, 60, "the stand-in to serve")
    seen = facts()
    assert "serving" in seen, out_path.read_text()
    # exec replaced itself with the command: the pid we started is the program's own.
    assert seen["pid"] == str(proc.pid)
    assert seen["url"].startswith("http://127.0.0.1:") and seen["url"].endswith("/slow?first_byte=2.5")
    assert seen["response"] == "200 slow: first byte after 2.5s"
    assert relay.drops == 0
    sidecars = psutil.Process(proc.pid).children(recursive=True)
    assert sidecars, "the launcher started no process"

    proc.send_signal(signal.SIGINT)
    assert proc.wait(30) == -signal.SIGINT  # the program itself received it and died of it
    assert facts()["stopped"] == "SIGINT"
    _, alive = psutil.wait_procs(sidecars, timeout=10)
    assert alive == []
    assert list(log_dir.glob("*.ready")) == []


def test_exit_status_of_the_gym_program_passes_through(gym_config: GymConfig, log_dir: Path) -> None:
    config, _ = gym_config(30)
    done = _exec(
        "--", sys.executable, "-m", "nemo_gym.env_start", str(config), "--exit", "3", env=_env(STANDIN)
    )
    assert done.returncode == 3, done.stdout + done.stderr
    facts = _facts(done.stdout)
    assert facts["response"].startswith("200 ")
    assert facts["stopped"] == "finally"
    assert list(log_dir.glob("*.ready")) == []


# --- what is redirected, and what is not ------------------------------------------------------


def test_without_exec_the_standin_trap_fires() -> None:
    """The control: the stand-in's launcher really is a trap, so the tests below prove something."""
    done = subprocess.run(
        [sys.executable, "-c", "import nemo_gym.h2_ping_sidecar.launcher"],
        env=_env(STANDIN),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert "exec did not redirect it" in done.stderr


CHECK_ALIASES = """
import importlib, json, sys
names = json.loads(sys.argv[1])
for alias, target in names.items():
    module = importlib.import_module(alias)
    assert module is importlib.import_module(target), alias
    assert module.__spec__.name == target, module.__spec__
import nemo_gym.h2_ping_sidecar.launcher as launcher
import sidecar_fsm.errors
assert launcher.SidecarError is sidecar_fsm.errors.SidecarError
print("ok")
"""


@pytest.mark.parametrize("with_gym", [True, False], ids=["gym-installed", "no-gym"])
def test_exactly_the_two_modules_are_sidecar_fsms(with_gym: bool) -> None:
    import json

    env = _env(STANDIN) if with_gym else _env()
    done = _exec(*_python(CHECK_ALIASES, json.dumps(REDIRECTED_MODULES)), env=env)
    assert (done.returncode, done.stdout, done.stderr) == (0, "ok\n", "")
    probe = "import nemo_gym, nemo_gym.global_config as g; print(g.__file__, nemo_gym.__file__)"
    other = _exec(*_python(probe), env=env)
    if with_gym:
        # Everything else of nemo_gym stays Gym's.
        assert other.returncode == 0, other.stderr
        assert other.stdout.split() == [
            str(STANDIN / "nemo_gym" / "global_config.py"),
            str(STANDIN / "nemo_gym" / "__init__.py"),
        ]
    else:
        assert other.returncode == 1
        assert "No module named 'nemo_gym.global_config'" in other.stderr


def test_python_children_of_the_command_are_redirected_too() -> None:
    """Gym starts its servers as child processes; they inherit the redirect through PYTHONPATH."""
    child = "import nemo_gym.h2_ping_sidecar.config as c; print(c.__name__)"
    parent = f"import subprocess, sys; sys.exit(subprocess.call([sys.executable, '-c', {child!r}]))"
    done = _exec(*_python(parent), env=_env(STANDIN))
    assert (done.returncode, done.stdout) == (0, "sidecar_fsm.config\n"), done.stderr


def test_an_existing_sitecustomize_still_runs(tmp_path: Path) -> None:
    user = tmp_path / "user-site"
    user.mkdir()
    (user / "sitecustomize.py").write_text("import os\nos.environ['USER_SITECUSTOMIZE_RAN'] = 'yes'\n")
    code = (
        "import os, sitecustomize, nemo_gym.h2_ping_sidecar.launcher as l;"
        "print(os.environ.get('USER_SITECUSTOMIZE_RAN'), sitecustomize.__file__, l.__name__)"
    )
    done = _exec(*_python(code), env=_env(user))
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["yes", str(user / "sitecustomize.py"), "sidecar_fsm.launcher"]


def test_the_command_gets_default_signal_dispositions() -> None:
    """Python ignores SIGPIPE for itself; the command must not inherit that (`yes | head` must end)."""
    done = _exec("--", "grep", "^SigIgn:", "/proc/self/status")
    assert done.returncode == 0, done.stderr
    ignored = int(done.stdout.split()[1], 16)
    assert not ignored & (1 << (signal.SIGPIPE - 1))


# --- a command that cannot run ----------------------------------------------------------------


def test_exit_status_passes_through_unchanged() -> None:
    assert _exec("--", "sh", "-c", "exit 3").returncode == 3
    assert _exec("sh", "-c", "kill -TERM $$").returncode == -signal.SIGTERM


def test_command_not_found_is_one_line_and_127() -> None:
    done = _exec("--", "no-such-command-here")
    assert done.returncode == EXIT_NOT_FOUND == 127
    assert (
        done.stderr
        == "sidecar-fsm exec: 'no-such-command-here': command not found; check the name and PATH\n"
    )
    assert done.stdout == ""


def test_command_that_is_not_executable_is_one_line_and_126(tmp_path: Path) -> None:
    script = tmp_path / "not-executable"
    script.write_text("#!/bin/sh\nexit 0\n")
    done = _exec("--", str(script))
    assert done.returncode == EXIT_CANNOT_RUN == 126
    assert done.stderr.count("\n") == 1 and "permission denied" in done.stderr


def test_no_command_is_bad_usage() -> None:
    for args in ((), ("--",)):
        done = _exec(*args)
        assert done.returncode == 2
        assert done.stderr == "sidecar-fsm exec: no COMMAND given; use sidecar-fsm exec -- COMMAND [ARG...]\n"


def test_a_second_bootstrap_earlier_on_the_path_chains_once(tmp_path: Path) -> None:
    """Nested exec from another install: two bootstraps on the path, each runs once, no loop."""
    from sidecar_fsm.gymexec import BOOTSTRAP_DIR

    other = tmp_path / "other-install"
    shutil.copytree(BOOTSTRAP_DIR, other)
    user = tmp_path / "user-site"
    user.mkdir()
    (user / "sitecustomize.py").write_text(
        "import builtins\nbuiltins.USER_RUNS = getattr(builtins, 'USER_RUNS', 0) + 1\n"
    )
    code = (
        "import builtins, sys, nemo_gym.h2_ping_sidecar.launcher as l;"
        "finders = [f for f in sys.meta_path if getattr(f, '_sidecar_fsm_exec', False)];"
        "print(builtins.USER_RUNS, len(finders), l.__name__)"
    )
    done = _exec(*_python(code), env=_env(other, user))
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1", "2", "sidecar_fsm.launcher"]
