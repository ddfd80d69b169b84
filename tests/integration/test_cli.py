"""The ``sidecar-fsm`` command run as a subprocess against the real proxy, origin and database.

Covers ``start`` (supervise, SIGTERM drain, the rewritten config), the SIGKILL of a launcher and
what ``status`` and ``reap`` then do (with and without ``exit_with_owner``), ``history``,
``build``, and the read commands on a missing, empty or too-new state database.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers import SIDECAR_FSM, ProcessRegistry, http11_request, sidecar_cli, wait_until

from sidecar_fsm.base import procs
from sidecar_fsm.lab import TlsH2Origin
from sidecar_fsm.state.fsm import InstanceMachine
from sidecar_fsm.state.store import Store, database_path, schema_version


def cli_json(log_dir: Path, *args: str) -> Any:
    done = sidecar_cli(log_dir, *args, "--json")
    # status exits 3 when a live run needs attention (a killed launcher's run): still its JSON.
    assert done.returncode in ((0, 3) if args[0] == "status" else (0,)), done.stderr
    return json.loads(done.stdout)


def write_gym_config(path: Path, origin: TlsH2Origin, binary: Path | None, **sidecar: Any) -> Path:
    """A Gym-shaped config: two sidecar instances on free ports, a model server on the origin.

    ``binary`` None leaves ``sidecar.binary`` out: the build cache provides it.
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
    """A ``sidecar-fsm start`` subprocess, its output file, and the sidecars it reported ready."""

    def __init__(
        self,
        log_dir: Path,
        config: Path,
        registry: ProcessRegistry,
        *extra: str,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.output = log_dir.parent / "start.out"
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
        (self.run,) = cli_json(log_dir, "status")["runs"]
        self.instances = self.run["instances"]
        for inst in self.instances:
            registry.add_pid(inst["pid"])

    def text(self) -> str:
        return self.output.read_text(errors="replace")


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


@pytest.fixture
def gym_config_file(tmp_path: Path, tls_origin: TlsH2Origin, sidecar_binary: Path) -> Path:
    return write_gym_config(tmp_path / "gym.yaml", tls_origin, sidecar_binary)


def test_start_supervises_until_sigterm_then_drains_and_exits_0(
    log_dir: Path, gym_config_file: Path, process_registry: ProcessRegistry, tmp_path: Path
) -> None:
    rewritten = tmp_path / "rewritten.yaml"
    started = StartedCli(log_dir, gym_config_file, process_registry, "--write-config", str(rewritten))
    assert {inst["state"] for inst in started.instances} == {"ready"}
    assert all(echo_through(inst) == 200 for inst in started.instances)
    assert "policy_model.responses_api_models.openai_model.base_url" in started.text()
    written = yaml.safe_load(rewritten.read_text())
    base_url = written["policy_model"]["responses_api_models"]["openai_model"]["base_url"]
    assert base_url in {f"http://{inst['listen']}/v1" for inst in started.instances}
    assert written["policy_base_url"].startswith("https://localhost:")  # top-level key untouched
    # Its sidecars already run: `gym env start --config OUT.yaml` must not start a second set.
    assert written["sidecar"]["enabled"] is False
    assert "cache_dir" not in written  # the CLI's cache choice is not put into the user's config
    second = load_through_the_launcher(rewritten)
    assert second == {"manager": None, "base_url": base_url}
    assert len(cli_json(log_dir, "status", "--all")["runs"]) == 1  # no second run recorded
    assert [sidecar_identity(inst) for inst in started.instances]  # the first set still serves

    started.proc.send_signal(signal.SIGTERM)
    assert started.proc.wait(timeout=30) == 0, started.text()

    (run,) = cli_json(log_dir, "status")["runs"]
    assert run["outcome"] == "ended"
    assert {inst["state"] for inst in run["instances"]} == {"stopped"}
    history = cli_json(log_dir, "history", run["run_id"][:8], "policy")["transitions"]
    assert [(t["from"], t["to"]) for t in history] == [
        ("configured", "building"),
        ("building", "spawned"),
        ("spawned", "ready"),
        ("ready", "draining"),
        ("draining", "stopped"),
    ]
    human = sidecar_cli(log_dir, "history", run["run_id"])
    assert human.returncode == 0
    assert human.stdout.splitlines()[1].split() == [
        "TIME",
        "AFTER",
        "INSTANCE",
        "FROM",
        "TO",
        "EVENT",
        "DETAIL",
    ]
    # header lines + 5 transitions x 2 instances + what each instance carried
    assert len(human.stdout.splitlines()) == 2 + 10 + 2
    assert [line.split(":")[0] for line in human.stdout.splitlines()[-2:]] == [
        "traffic policy",
        "traffic judge",
    ]


def test_sigkilled_start_leaves_sidecars_serving_until_reap(
    log_dir: Path,
    tmp_path: Path,
    tls_origin: TlsH2Origin,
    sidecar_binary: Path,
    process_registry: ProcessRegistry,
) -> None:
    config = write_gym_config(tmp_path / "gym.yaml", tls_origin, sidecar_binary, exit_with_owner=False)
    started = StartedCli(log_dir, config, process_registry)
    identities = [sidecar_identity(inst) for inst in started.instances]
    ready_files = [Path(inst["ready_path"]) for inst in started.instances]
    assert all(path.exists() for path in ready_files)

    started.proc.send_signal(signal.SIGKILL)
    started.proc.wait(timeout=10)

    # Nobody supervises them now, and without exit_with_owner they keep serving.
    assert all(echo_through(inst) == 200 for inst in started.instances)
    (run,) = cli_json(log_dir, "status")["runs"]
    assert run["owner"]["status"] == "dead" and run["ended_at"] is None
    assert {inst["state"] for inst in run["instances"]} == {"ready"}
    assert {inst["alive"] for inst in run["instances"]} == {True}  # ours, and still running
    human = sidecar_cli(log_dir, "status")
    assert human.returncode == 3  # owner gone with sidecars still running: needs attention
    assert f"pid {started.proc.pid} (dead)" in human.stdout
    assert f"owner gone: run sidecar-fsm --log-dir {log_dir} reap" in human.stdout

    plan = sidecar_cli(log_dir, "reap", "--dry-run")
    assert plan.returncode == 0 and plan.stdout.startswith(f"would reap run {run['run_id'][:12]}")
    assert all(procs.is_ours(identity) for identity in identities)

    done = cli_json(log_dir, "reap")
    (reaped,) = done["runs"]
    assert reaped["run_id"] == run["run_id"] and reaped["owner"] == "dead"
    assert {inst["result"] for inst in reaped["instances"]} == {"drained and exited after SIGTERM"}
    assert not any(procs.is_ours(identity) for identity in identities)
    assert not any(path.exists() for path in ready_files)
    (after,) = cli_json(log_dir, "status", "--all")["runs"]
    assert after["outcome"] == "reaped"
    for inst in after["instances"]:
        assert inst["state"] == "failed"
        assert inst["error"].startswith(f"reaped: owner pid {started.proc.pid} is gone; drained and exited")

    again = sidecar_cli(log_dir, "reap")
    assert again.returncode == 0
    assert again.stdout.startswith("nothing to reap")


def test_sigkilled_start_with_exit_with_owner_sidecars_exit_by_themselves(
    log_dir: Path, gym_config_file: Path, process_registry: ProcessRegistry
) -> None:
    started = StartedCli(log_dir, gym_config_file, process_registry)
    identities = [sidecar_identity(inst) for inst in started.instances]

    started.proc.send_signal(signal.SIGKILL)
    started.proc.wait(timeout=10)

    # shutdown_grace is 2s; the sidecars notice the owner is gone, drain and exit.
    wait_until(
        lambda: not any(procs.is_ours(i) for i in identities), 2 + 10, "sidecars to exit with their owner"
    )
    before = db_rows(database_path(log_dir))
    (run,) = cli_json(log_dir, "status")["runs"]
    assert run["owner"]["status"] == "dead"
    assert {inst["state"] for inst in run["instances"]} == {"ready"}  # nobody recorded the exit yet
    # ...but status says what is true now: the processes are gone.
    assert [(inst["alive"], inst["process"]) for inst in run["instances"]] == [(False, "gone")] * 2
    human = sidecar_cli(log_dir, "status")
    for inst in run["instances"]:
        line = next(line for line in human.stdout.splitlines() if line.strip().startswith(inst["name"] + " "))
        assert f"{inst['pid']} (gone)" in line
        assert line.endswith(
            f"recorded ready but pid {inst['pid']} has exited; nothing left running: "
            f"run sidecar-fsm --log-dir {log_dir} reap to close the record"
        )
    assert "ended: owner gone, nothing left running" in human.stdout
    assert human.returncode == 0  # nothing needs attention: nothing of the run is left
    history = sidecar_cli(log_dir, "history", run["run_id"], "policy")
    assert history.returncode == 0
    head = history.stdout.splitlines()[:2]
    assert f"owner pid {started.proc.pid} (dead: run sidecar-fsm --log-dir {log_dir} reap)" in head[0]
    assert head[1].startswith("policy: recorded ready but pid ")
    as_json = cli_json(log_dir, "history", run["run_id"])
    assert {inst["alive"] for inst in as_json["instances"]} == {False}
    assert as_json["run"]["owner"]["status"] == "dead"
    assert db_rows(database_path(log_dir)) == before  # reading never changes the database

    (reaped,) = cli_json(log_dir, "reap")["runs"]
    assert {inst["result"] for inst in reaped["instances"]} == {"process had already exited"}
    (after,) = cli_json(log_dir, "status", "--all")["runs"]
    assert after["outcome"] == "reaped"
    assert {inst["state"] for inst in after["instances"]} == {"failed"}
    assert not any(Path(inst["ready_path"]).exists() for inst in after["instances"])
    assert cli_json(log_dir, "reap")["runs"] == []


@pytest.mark.parametrize("command", [["status"], ["status", "--all"], ["status", "--run", "abc"]])
def test_status_on_a_missing_log_dir_or_run_fails_alike_and_on_an_empty_one_says_so(
    command: list[str], tmp_path: Path
) -> None:
    missing = tmp_path / "never-created"
    for argv in ([*command, "--log-dir", str(missing)], ["--log-dir", str(missing), *command, "--json"]):
        done = subprocess.run(
            [sys.executable, "-m", "sidecar_fsm", *argv], capture_output=True, text=True, timeout=60
        )
        assert (done.returncode, done.stdout) == (1, "")
        assert done.stderr == (
            f"sidecar-fsm status: log dir '{missing}' does not exist; "
            "give the --log-dir (or SIDECAR_FSM_LOG_DIR) the run was started with\n"
        )
    assert not missing.exists()
    empty = tmp_path / "empty"
    Store.open(empty).close()
    done = sidecar_cli(empty, *command)
    if "--run" in command:
        assert (done.returncode, done.stdout) == (1, "")
        assert done.stderr == (
            f"sidecar-fsm status --run: run 'abc' is not recorded in {empty}; "
            f"see sidecar-fsm --log-dir {empty} status --all\n"
        )
        return
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout == f"no runs recorded in {empty}\n"
    as_json = sidecar_cli(empty, *command, "--json")
    assert as_json.returncode == 0
    assert json.loads(as_json.stdout) == {"runs": []}


def test_history_on_a_missing_log_dir_or_run_fails_alike(tmp_path: Path) -> None:
    missing = tmp_path / "never-created"
    done = sidecar_cli(missing, "history", "abc")
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr.startswith(f"sidecar-fsm history: log dir '{missing}' does not exist; ")
    assert not missing.exists()
    empty = tmp_path / "empty"
    Store.open(empty).close()
    for extra in ([], ["--json"]):
        done = sidecar_cli(empty, "history", "abc", *extra)
        assert (done.returncode, done.stdout) == (1, "")
        assert done.stderr == (
            f"sidecar-fsm history: run 'abc' is not recorded in {empty}; "
            f"see sidecar-fsm --log-dir {empty} status --all\n"
        )


def test_reap_on_a_missing_log_dir_says_so_and_creates_nothing(tmp_path: Path) -> None:
    """Not "nothing to reap": an operator who forgot --log-dir after a crash must hear it."""
    missing = tmp_path / "never-created"
    for args in (["reap"], ["reap", "--json"]):
        done = sidecar_cli(missing, *args)
        assert (done.returncode, done.stdout) == (1, "")
        assert done.stderr == (
            f"sidecar-fsm reap: log dir '{missing}' does not exist; "
            "give the --log-dir (or SIDECAR_FSM_LOG_DIR) the run was started with\n"
        )
    assert not missing.exists()


@pytest.mark.parametrize("command", [["status"], ["history", "abc"], ["reap", "--dry-run"]])
def test_a_database_newer_than_the_code_is_refused_with_exit_2(command: list[str], log_dir: Path) -> None:
    Store.open(log_dir).close()
    path = database_path(log_dir)
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {schema_version() + 1}")
    conn.commit()
    conn.close()
    before = path.read_bytes()

    done = sidecar_cli(log_dir, *command)

    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr == (
        f"{path}: schema {schema_version() + 1} is newer than this sidecar-fsm ({schema_version()}); "
        "upgrade it or use another --log-dir\n"
    )
    assert path.read_bytes() == before


def test_history_of_an_unknown_run_or_instance_fails_with_one_line(
    log_dir: Path, gym_config_file: Path, process_registry: ProcessRegistry
) -> None:
    started = StartedCli(log_dir, gym_config_file, process_registry)
    started.proc.send_signal(signal.SIGINT)
    assert started.proc.wait(timeout=30) == 0
    unknown = sidecar_cli(log_dir, "history", "zzzz")
    assert unknown.returncode == 1
    assert unknown.stderr == (
        f"sidecar-fsm history: run 'zzzz' is not recorded in {log_dir}; "
        f"see sidecar-fsm --log-dir {log_dir} status --all\n"
    )
    bad_instance = sidecar_cli(log_dir, "history", started.run["run_id"], "nope")
    assert bad_instance.returncode == 1
    assert bad_instance.stderr.startswith("sidecar-fsm history: instance 'nope' is not in run ")
    assert bad_instance.stderr.count("\n") == 1


def test_build_prints_the_cached_binary(cache_dir: Path, sidecar_binary: Path, tmp_path: Path) -> None:
    done = subprocess.run(
        [str(SIDECAR_FSM), "build", "--cache-dir", str(cache_dir)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    path = Path(done.stdout.strip())
    assert path.is_file() and os.access(path, os.X_OK)
    assert path.is_relative_to(cache_dir)
    # Which binary and why, on stderr: an editable install packages none, so the cache's.
    assert done.stderr == (
        "sidecar-fsm build: from the build cache, built before; "
        "no binary is packaged with this install (editable, or no wheel for this platform)\n"
    )


def test_start_exits_1_naming_the_sidecar_that_died(
    log_dir: Path, gym_config_file: Path, process_registry: ProcessRegistry
) -> None:
    started = StartedCli(log_dir, gym_config_file, process_registry)
    judge = next(inst for inst in started.instances if inst["name"] == "judge")
    assert procs.signal_if_ours(sidecar_identity(judge), signal.SIGKILL)

    assert started.proc.wait(timeout=30) == 1, started.text()
    assert "judge" in started.text()
    (run,) = cli_json(log_dir, "status", "--run", started.run["run_id"][:6])["runs"]
    states = {inst["name"]: inst["state"] for inst in run["instances"]}
    assert states == {"judge": "failed", "policy": "stopped"}
    human = sidecar_cli(log_dir, "status", "--run", started.run["run_id"])
    judge_line = next(line for line in human.stdout.splitlines() if line.strip().startswith("judge"))
    assert judge_line.split()[1] == "failed"


SLEEP = "/bin/sleep" if os.path.exists("/bin/sleep") else "/usr/bin/sleep"


def test_status_proves_identity_before_calling_a_process_alive(
    log_dir: Path, process_registry: ProcessRegistry
) -> None:
    """Three instances recorded ready: one whose process runs, one whose pid another process now
    holds (its start time differs), one whose process exited. Records go through the real store
    and state machine; the processes are real (``sleep``)."""
    ours = subprocess.Popen([SLEEP, "300"], stdin=subprocess.DEVNULL)
    impostor = subprocess.Popen([SLEEP, "300"], stdin=subprocess.DEVNULL)
    exited = subprocess.Popen([SLEEP, "300"], stdin=subprocess.DEVNULL)
    owner = subprocess.Popen([SLEEP, "300"], stdin=subprocess.DEVNULL)
    for proc in (ours, impostor, exited, owner):
        process_registry.add(proc)
    identities = {name: procs.identity_of(p.pid) for name, p in (("ours", ours), ("impostor", impostor))}
    exited_identity = procs.identity_of(exited.pid)
    owner_identity = procs.identity_of(owner.pid)
    for gone in (exited, owner):  # identities read while they ran; now they end
        gone.kill()
        gone.wait()
    assert owner_identity and exited_identity and identities["ours"] and identities["impostor"]
    recorded = {
        "policy": identities["ours"],
        "judge": procs.ProcessIdentity(impostor.pid, identities["impostor"].start_time - 10, SLEEP),
        "critic": exited_identity,
    }
    with Store.open(log_dir) as store:
        run_id = "f00dfeed" * 4
        store.create_run(run_id, owner.pid, owner_identity.start_time, {"shutdown_grace": "5s"})
        for index, (name, identity) in enumerate(recorded.items()):
            record = store.create_instance(
                run_id,
                name,
                f"127.0.0.1:{20000 + index}",
                "https://api.example.com",
                identity.exe,
                None,
                None,
            )
            machine = InstanceMachine(store, record.id)
            machine.fire("build")
            machine.fire("spawn", pid=identity.pid, pid_start_time=identity.start_time)
            machine.fire("ready")
    before = db_rows(database_path(log_dir))

    (run,) = cli_json(log_dir, "status")["runs"]
    observed = {inst["name"]: (inst["state"], inst["alive"], inst["process"]) for inst in run["instances"]}
    assert observed == {
        "policy": ("ready", True, "running"),
        "judge": ("ready", False, "reused"),
        "critic": ("ready", False, "gone"),
    }
    human = sidecar_cli(log_dir, "status").stdout
    assert f"{impostor.pid} (reused)" in human
    assert (
        f"recorded ready but pid {impostor.pid} now belongs to another process; "
        f"run sidecar-fsm --log-dir {log_dir} reap" in human
    )
    assert f"{exited.pid} (gone)" in human
    assert db_rows(database_path(log_dir)) == before  # reading never changes the database
    assert ours.poll() is None and impostor.poll() is None  # and never signals


def test_start_and_build_use_the_users_cache_not_the_working_directory(
    tmp_path: Path,
    tls_origin: TlsH2Origin,
    cache_dir: Path,
    sidecar_binary: Path,
    process_registry: ProcessRegistry,
) -> None:
    # $XDG_CACHE_HOME/sidecar-fsm is the session's cache (already built), so nothing compiles.
    xdg = tmp_path / "xdg"
    xdg.mkdir()
    (xdg / "sidecar-fsm").symlink_to(cache_dir)
    env = {**os.environ, "XDG_CACHE_HOME": str(xdg)}
    elsewhere = tmp_path / "some-other-folder"
    elsewhere.mkdir()
    log_dir = tmp_path / "logs"
    config = write_gym_config(tmp_path / "gym.yaml", tls_origin, None)

    built = subprocess.run(
        [str(SIDECAR_FSM), "build"], capture_output=True, text=True, timeout=600, env=env, cwd=elsewhere
    )
    assert built.returncode == 0, built.stderr
    assert Path(built.stdout.strip()) == xdg / "sidecar-fsm" / sidecar_binary.relative_to(cache_dir)

    started = StartedCli(log_dir, config, process_registry, env=env, cwd=elsewhere)
    assert {inst["binary"] for inst in started.instances} == {built.stdout.strip()}
    assert "building" not in started.text()
    started.proc.send_signal(signal.SIGINT)
    assert started.proc.wait(timeout=30) == 0, started.text()
    assert list(elsewhere.iterdir()) == []  # no ./cache


def test_an_unforeseen_filesystem_fault_is_one_line_naming_the_command_and_path(tmp_path: Path) -> None:
    """A config whose cache_dir runs through a file: the build cannot make its folder."""
    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine\n")
    config = tmp_path / "gym.yaml"
    config.write_text(
        f"cache_dir: {a_file / 'cache'}\n"
        "sidecar:\n  enabled: true\n"
        "  instances: [{name: nvcf, upstream: 'https://api.example.com', listen: '127.0.0.1:0'}]\n"
    )
    done = sidecar_cli(tmp_path / "logs", "start", str(config))
    assert done.returncode in (1, 2), done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith("sidecar-fsm start: ") and str(a_file) in done.stderr, done.stderr
    assert a_file.read_text() == "mine\n"


def test_an_upstream_path_is_dropped_with_one_warning_line(tmp_path: Path) -> None:
    """The warning names the field and the value in one line, not Python's file:line form."""
    config = tmp_path / "gym.yaml"
    missing = tmp_path / "no-such-binary"
    config.write_text(
        yaml.safe_dump(
            {
                "sidecar": {
                    "enabled": True,
                    "binary": str(missing),
                    "build_if_missing": False,
                    "instances": [
                        {"name": "policy", "upstream": "https://api.example.com/v1", "listen": "127.0.0.1:0"}
                    ],
                }
            }
        )
    )
    done = sidecar_cli(tmp_path / "logs", "start", str(config))
    assert done.returncode == 1, done.stderr
    warning, error = done.stderr.strip().splitlines()
    assert warning.startswith(
        "sidecar-fsm: warning: sidecar.instances[0].upstream: 'https://api.example.com/v1'"
    )
    assert "dropped" in warning
    assert "does not exist" in error
    assert "Traceback" not in done.stderr and not (tmp_path / "logs").exists()
