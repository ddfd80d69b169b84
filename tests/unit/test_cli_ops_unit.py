"""The judgements and words behind ``stop``, ``prune``, ``status``'s exit code, overrides and hints.

No child processes: ``needs_attention`` over named situations, ``status --all``'s one line per
ended run, the override dotlist (list indices, a list replacing a mapping, malformed ones), the
age parser, the log-dir hints, the drain lines, the log tail and follower, the build ticker and
the ``transitions`` logger's level.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf
from test_render import NOW, instance_record, run_record, two_instance_status

from sidecar_fsm.base.resources import command_hint, default_log_dir
from sidecar_fsm.cli import build_parser, main
from sidecar_fsm.configfile import load_config
from sidecar_fsm.errors import ConfigError
from sidecar_fsm.observe.verdicts import Process
from sidecar_fsm.run.prune import parse_age
from sidecar_fsm.view import logs, render, upkeep_report
from sidecar_fsm.view import status as view_status
from sidecar_fsm.view.live import Figures, Scrape

# --- status: needs attention (exit 3) ----------------------------------------------------------


def _figures(in_flight: int = 0, up: bool = True) -> Figures:
    return Figures(in_flight, 0.0, 0, 0, 0, 0.0, up, 1)


def _healthy() -> view_status.RunStatus:
    return view_status.RunStatus(
        run=run_record(),
        owner="alive",
        instances=[instance_record()],
        processes={1: Process.RUNNING},
        live={1: Scrape("127.0.0.1:9101", _figures())},
        log_dir="/logs",
    )


ATTENTION = {
    "healthy": (_healthy(), None),
    "ended": (dataclasses.replace(_healthy(), run=run_record(ended_at=NOW, outcome="ended")), None),
    "owner gone, sidecar running": (
        dataclasses.replace(_healthy(), owner="dead"),
        "owner gone with sidecars still running (policy); run sidecar-fsm --log-dir /logs reap",
    ),
    # Its sidecars exited with their owner (exit_with_owner): the run ended by itself.
    "owner gone, nothing left running": (
        dataclasses.replace(_healthy(), owner="reused", processes={1: Process.GONE}),
        None,
    ),
    "instance failed": (
        dataclasses.replace(two_instance_status(), processes={1: Process.RUNNING}),
        "judge is failed",
    ),
    "process gone": (
        dataclasses.replace(_healthy(), processes={1: Process.GONE}),
        "policy is not running (pid 41030 gone)",
    ),
    "upstream down": (
        dataclasses.replace(_healthy(), live={1: Scrape("127.0.0.1:9101", _figures(up=False))}),
        "policy: upstream https://api.example.com is down",
    ),
    # A frozen or wedged proxy (SIGSTOP, a full accept queue) serves nobody either.
    "metrics do not answer": (
        dataclasses.replace(_healthy(), live={1: Scrape("127.0.0.1:9101", None, "no answer")}),
        "policy: /metrics at 127.0.0.1:9101: no answer",
    ),
}


@pytest.mark.parametrize("case", sorted(ATTENTION))
def test_needs_attention(case: str) -> None:
    observed, expected = ATTENTION[case]
    assert view_status.needs_attention(observed) == expected


def test_status_all_lists_ended_runs_one_line_each_under_one_header() -> None:
    ended = [
        dataclasses.replace(_healthy(), run=run_record(run_id=f"{n}" * 12, ended_at=NOW - n, outcome="ended"))
        for n in range(1, 4)
    ]
    lines = render.status_lines([_healthy(), *ended], now=NOW, ended_in_one_table=True)
    assert sum(line.startswith("RUN ") for line in lines) == 2  # the live run's, the ended runs'
    assert lines[-4].startswith("RUN ")
    assert [line.split()[0] for line in lines[-3:]] == ["111111111111", "222222222222", "333333333333"]


# --- overrides ---------------------------------------------------------------------------------


@pytest.fixture
def gym_yaml(tmp_path: Path) -> str:
    path = tmp_path / "gym.yaml"
    path.write_text(
        "sidecar:\n  enabled: true\n  instances:\n    - name: p\n      upstream: https://a\n"
        "policy_model:\n  x: 1\n"
    )
    return str(path)


@pytest.mark.parametrize(
    ("override", "key", "value"),
    [
        ("sidecar.instances.0.upstream=https://x", "sidecar.instances.0.upstream", "https://x"),
        ("sidecar.instances[0].upstream=https://y", "sidecar.instances.0.upstream", "https://y"),
        ("policy_model=[1,2]", "policy_model", [1, 2]),
        ("sidecar={ping_interval: 30s}", "sidecar.ping_interval", "30s"),
        ("new.key=3", "new.key", 3),
    ],
)
def test_overrides_are_the_dotlist_in_full(gym_yaml: str, override: str, key: str, value: object) -> None:
    config = load_config([gym_yaml, override], "sidecar-fsm start")
    got = OmegaConf.select(config, key)
    assert (OmegaConf.to_container(got) if OmegaConf.is_config(got) else got) == value
    assert config.sidecar.enabled is True  # a mapping merges into a mapping


@pytest.mark.parametrize(
    ("override", "reason"),
    [
        ("=x", "no key before '='"),
        ("a..b=1", "'a..b' is not a dotted key"),
        ("a[0]b=1", "'a[0]b' is not a dotted key"),
        ("sidecar.instances.5.upstream=z", "list index out of range"),
    ],
)
def test_a_malformed_override_is_one_line(gym_yaml: str, override: str, reason: str) -> None:
    with pytest.raises(ConfigError) as refused:
        load_config([gym_yaml, override], "sidecar-fsm start")
    message = str(refused.value)
    assert message.startswith(f"sidecar-fsm start: override '{override}': {reason}; use key=value, e.g. ")
    assert "\n" not in message


def test_a_malformed_override_exits_2_in_one_line(gym_yaml: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["start", gym_yaml, "=x"]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


# --- help, hints, words ------------------------------------------------------------------------


def test_every_subcommand_help_has_a_description_and_an_example(capsys: pytest.CaptureFixture[str]) -> None:
    for name in ("start", "stop", "logs", "prune", "lab", "status", "reap"):
        with pytest.raises(SystemExit):
            build_parser().parse_args([name, "--help"])
        text = capsys.readouterr().out
        assert "\nexample:\n  sidecar-fsm " in text, name
    with pytest.raises(SystemExit):
        build_parser().parse_args(["start", "--help"])
    assert "sidecar.instances.0.upstream=" in capsys.readouterr().out


def test_hints_name_the_log_dir_unless_it_is_the_default() -> None:
    assert command_hint("status", default_log_dir()) == "sidecar-fsm status"
    assert command_hint("status") == "sidecar-fsm status"
    assert command_hint("reap", "/my logs") == "sidecar-fsm --log-dir '/my logs' reap"


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("7d", 604800),
        ("36h", 129600),
        ("1d12h", 129600),
        ("90m", 5400),
        ("0s", 0),
        ("30", 30),
        ("2w", 1209600),
    ],
)
def test_prune_ages(text: str, seconds: float) -> None:
    assert parse_age(text) == seconds


@pytest.mark.parametrize("text", ["soon", "7x", "-1", "d7", "1d 2h", ""])
def test_prune_ages_refused(text: str) -> None:
    assert parse_age(text) is None


def test_drain_lines_say_what_each_instance_waits_for() -> None:
    lines = upkeep_report.draining_lines(
        [("nvcf", Scrape("a", _figures(in_flight=1))), ("judge", Scrape("b", _figures())), ("x", None)],
        60.0,
        "SIGINT",
    )
    assert lines == [
        "SIGINT: draining the sidecars",
        "draining nvcf: 1 request in flight, up to 60s; Ctrl-C again to stop now",
        "draining judge: no request in flight",
        "draining x: requests in flight unknown, up to 60s; Ctrl-C again to stop now",
    ]


# --- logs --------------------------------------------------------------------------------------


def test_tail_and_follow_read_whole_lines_only(tmp_path: Path) -> None:
    log = tmp_path / "a.log"
    log.write_bytes(b"one\ntwo\nthree\npart")
    lines, offset = logs.tail(str(log), 2)
    assert lines == ["two", "three"]
    follower = logs.Follower([str(log), str(tmp_path / "missing.log")], [offset, 0])
    assert follower.read() == []  # "part" has no newline yet
    with open(log, "ab") as handle:
        handle.write(b"ial\nfour\n")
    assert follower.read() == [(0, "partial"), (0, "four")]
    assert logs.tail(str(tmp_path / "missing.log"), None) == ([], 0)
    assert logs.prefixed("judge", "x", 6) == "judge  | x"


# --- transitions' log lines --------------------------------------------------------------------


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


# --- the build's ticker ------------------------------------------------------------------------


def test_a_build_says_it_is_alive_while_go_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from sidecar_fsm.base import buildcache

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    go = bin_dir / "go"
    go.write_text(
        '#!/bin/sh\ncase "$1" in env) echo go1.99.0 ;; build) sleep 0.5;'
        ' while [ $# -gt 0 ]; do [ "$1" = "-o" ] && out="$2"; shift; done;'
        " printf '#!/bin/sh\\n' > \"$out\" ;; esac\n"
    )
    go.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.setattr(buildcache, "BUILD_TICK_SECONDS", 0.1)
    source = tmp_path / "src"
    source.mkdir()
    (source / "main.go").write_text("package main\n")
    messages: list[str] = []
    buildcache.ensure_binary(tmp_path / "cache", progress=messages.append, source_dir=source)
    assert messages[0] == buildcache.BUILD_PROGRESS_MESSAGE
    ticks = messages[1:]
    assert ticks and all(tick.startswith("still building h2-ping-sidecar: ") for tick in ticks)


def test_start_names_the_log_dir_it_was_given_however_it_was_given() -> None:
    """``--log-dir``, ``sidecar.log_dir`` or Gym's ``nemo_gym_log_dir``: the manager's log dir
    is what ``start`` hands over, and its hint names it unless it is the default."""
    lines = render.started_lines("4c1e9a3f2b10", "/gym/logs", [("policy", "127.0.0.1:1", "https://x")])
    assert lines[-1].endswith("(see: sidecar-fsm --log-dir /gym/logs status)")
    lines = render.started_lines("4c1e9a3f2b10", default_log_dir(), [])
    assert lines[-1].endswith("(see: sidecar-fsm status)")
