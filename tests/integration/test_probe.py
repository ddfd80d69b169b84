"""Does the path need the sidecar? ``sidecar-fsm probe`` and the PING in the start's check (issue 32).

Real parts only: the built proxy (its ``-probe`` mode through the CLI, as a user runs it, and the
launcher's start), the lab's TLS HTTP/2 origin told to answer PINGs, ignore them or GOAWAY them,
the idle-dropping relay, a port that refuses connections, and Debian's HAProxy as a TLS HTTP/2
load balancer with short ``timeout client``/``timeout server`` in front of a slow HTTP/1.1
origin (skipped, naming it, where HAProxy is not installed). Probes run for seconds (``--for``,
``--ping-interval``). Every process started is ended, pass or fail.
"""

from __future__ import annotations

import json
import os
import pty
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from helpers import ProcessRegistry, sidecar_cli, terminate_and_reap, wait_until
from omegaconf import DictConfig

from sidecar_fsm.errors import SidecarError
from sidecar_fsm.lab import CertPaths, IdleRelay, TlsH2Origin
from sidecar_fsm.launcher import H2PingSidecarManager
from sidecar_fsm.state.hostname import host_name

SHORT = ["--for", "3s", "--ping-interval", "0.5s"]
SECRET = "Bearer pingproof-s3cret-value"


def probe(
    log_dir: Path, env: dict[str, str], upstream: str, *args: str, ca_file: Path | None = None
) -> subprocess.CompletedProcess[str]:
    ca = ["--ca-file", str(ca_file)] if ca_file is not None else []
    return sidecar_cli(log_dir, "probe", upstream, *ca, *args, env=env, timeout=60)


# A time the probe reports, allowing for a loaded machine (the lab's timers fire late, never early).
AT_0_5, AT_1_5, AT_2 = r"0\.[5-9]", r"(1\.[5-9]|2\.[0-4])", r"2\.[0-4]"


def matches(pattern: str, line: str) -> bool:
    """Whether ``line`` is all of ``pattern``; an AssertionError showing both when not."""
    assert re.fullmatch(pattern, line), f"{line!r} does not match {pattern!r}"
    return True


def line_of(out: str, head: str) -> str:
    return next(
        (line for line in out.splitlines() if line.startswith(head)), f"(no line {head!r} in {out!r})"
    )


# --- the probe ---------------------------------------------------------------------------------


def test_an_idle_dropping_path_drops_the_silent_connection_and_keeps_the_pinged_one(
    tls_origin: TlsH2Origin, idle_relay: Callable[..., IdleRelay], log_dir: Path, probe_env: dict[str, str]
) -> None:
    relay = idle_relay(tls_origin, idle=1.5)
    done = probe(log_dir, probe_env, f"https://localhost:{relay.port}", *SHORT, ca_file=tls_origin.ca_file)
    assert done.returncode == 0, done.stdout + done.stderr
    assert line_of(done.stdout, "probing ").endswith(
        "(direct) for 3s: two idle HTTP/2 connections, one silent, one PINGed every 0.5s"
    )
    assert matches(
        rf"silent  closed after {AT_1_5}s: EOF \(closed without GOAWAY\)", line_of(done.stdout, "silent ")
    )
    pinged = line_of(done.stdout, "pinged ")
    assert matches(r"pinged  open after 3\.[0-3]s; .*", pinged)
    counts = re.search(r"; (\d+) PINGs sent, (\d+) answered", pinged)
    assert counts is not None, pinged
    assert int(counts[1]) >= 3 and int(counts[2]) == int(counts[1]), pinged
    assert matches(
        rf"verdict: idle connections are dropped after ~{AT_1_5}s; PINGs every 0\.5s keep them open: "
        r"the sidecar helps here \(idle connections only: --request PATH also tests a slow response\)",
        line_of(done.stdout, "verdict: "),
    )
    assert relay.drops >= 1


@pytest.mark.parametrize(
    ("exit_code", "pings", "idle", "args", "pinged", "verdict"),
    [
        pytest.param(
            3,
            "answer",
            # The relay drops at 1.5 s, before the first PING at 2.5 s: nothing is known about PINGs.
            1.5,
            ["--for", "4s", "--ping-interval", "2.5s"],
            rf"pinged  closed after {AT_1_5}s: EOF \(closed without GOAWAY\); 0 PINGs sent, 0 answered",
            rf"verdict: the path dropped the PINGed connection after ~{AT_1_5}s, before its first PING "
            rf"\(every 2\.5s\): inconclusive; a ping_interval under ~{AT_1_5}s should keep it open: "
            r"try --ping-interval (0\.[7-9]|1(\.[0-2])?)s",
            id="drop-before-the-first-ping-exit-3",
        ),
        pytest.param(
            1,
            "goaway",
            None,
            SHORT,
            rf"pinged  closed after {AT_0_5}s: GOAWAY ENHANCE_YOUR_CALM; 1 PING sent, 0 answered",
            rf"verdict: PINGs do not keep the connection open \(closed after {AT_0_5}s with GOAWAY "
            r"ENHANCE_YOUR_CALM\): the sidecar cannot help here; ENHANCE_YOUR_CALM means the upstream "
            r"refuses PINGs this often: try a longer --ping-interval",
            id="goaway-names-the-remedy-exit-1",
        ),
    ],
)
def test_a_ping_that_does_not_keep_the_path_open_is_named_with_what_to_try(
    exit_code: int,
    pings: str,
    idle: float | None,
    args: list[str],
    pinged: str,
    verdict: str,
    make_tls_origin: Callable[..., TlsH2Origin],
    idle_relay: Callable[..., IdleRelay],
    log_dir: Path,
    probe_env: dict[str, str],
) -> None:
    origin = make_tls_origin(pings=pings)
    upstream = origin.url if idle is None else f"https://localhost:{idle_relay(origin, idle=idle).port}"
    done = probe(log_dir, probe_env, upstream, *args, ca_file=origin.ca_file)
    assert done.returncode == exit_code, done.stdout + done.stderr
    assert matches(pinged, line_of(done.stdout, "pinged "))
    assert matches(verdict, line_of(done.stdout, "verdict: "))
    if exit_code == 3:  # inconclusive is not "cannot help"
        assert "cannot help" not in done.stdout


def test_a_short_for_pings_a_quarter_of_it_by_default(
    tls_origin: TlsH2Origin, log_dir: Path, probe_env: dict[str, str]
) -> None:
    done = probe(log_dir, probe_env, tls_origin.url, "--for", "2s", ca_file=tls_origin.ca_file)
    assert done.returncode == 0, done.stdout + done.stderr
    assert line_of(done.stdout, "probing ").endswith("one silent, one PINGed every 0.5s")
    assert re.search(r"; [2-4] PINGs sent, [2-4] answered", line_of(done.stdout, "pinged ")), done.stdout


def test_a_clean_path_keeps_both_open_and_says_the_sidecar_is_not_needed_in_json(
    tls_origin: TlsH2Origin, log_dir: Path, probe_env: dict[str, str]
) -> None:
    done = probe(log_dir, probe_env, tls_origin.url, *SHORT, "--json", ca_file=tls_origin.ca_file)
    assert done.returncode == 0, done.stdout + done.stderr
    document = json.loads(done.stdout)
    assert list(document) == ["upstream", "route", "for_s", "silent", "pinged", "request", "verdict"]
    assert document["upstream"] == tls_origin.url and document["for_s"] == 3 and document["route"] == "direct"
    assert document["silent"] == {"open": True, "closed_after_s": None, "how": None}
    pinged = document["pinged"]
    assert pinged["open"] is True and pinged["pings"] >= 3 and pinged["acks"] == pinged["pings"]
    assert document["verdict"].startswith("no idle drop within 3s: the sidecar is not needed on this path")
    assert tls_origin.pings >= pinged["pings"]


def test_an_origin_that_answers_no_ping_cannot_be_helped(
    make_tls_origin: Callable[..., TlsH2Origin], log_dir: Path, probe_env: dict[str, str]
) -> None:
    origin = make_tls_origin(pings="ignore")
    done = probe(log_dir, probe_env, origin.url, *SHORT, "--json", ca_file=origin.ca_file)
    assert done.returncode == 1, done.stdout + done.stderr
    document = json.loads(done.stdout)
    assert document["pinged"]["pings"] >= 1 and document["pinged"]["acks"] == 0
    sent = document["pinged"]["pings"]
    assert (
        document["verdict"]
        == f"PINGs are not answered ({sent} sent, none answered): the sidecar cannot help here"
    )
    assert origin.pings >= 1  # the PINGs arrived; the origin kept its answer


def test_a_dead_upstream_a_wrong_ca_and_an_http1_server_are_one_line_each(
    refusing_port: int,
    tls_origin: TlsH2Origin,
    make_tls_origin: Callable[..., TlsH2Origin],
    log_dir: Path,
    probe_env: dict[str, str],
) -> None:
    dead = f"https://127.0.0.1:{refusing_port}"
    done = probe(log_dir, probe_env, dead, *SHORT)
    assert (done.returncode, done.stdout) == (1, ""), done.stderr
    assert done.stderr.splitlines() == [
        f"sidecar-fsm probe: {dead} (direct): dial tcp 127.0.0.1:{refusing_port}: connect: connection refused"
    ]
    wrong_ca = probe(log_dir, probe_env, tls_origin.url, *SHORT)  # no --ca-file: the lab CA is unknown
    assert wrong_ca.returncode == 1 and len(wrong_ca.stderr.splitlines()) == 1, wrong_ca.stderr
    assert "x509: certificate signed by unknown authority" in wrong_ca.stderr
    h1 = make_tls_origin(h1_only=True)
    done = probe(log_dir, probe_env, h1.url, *SHORT, ca_file=h1.ca_file)
    assert done.returncode == 1 and len(done.stderr.splitlines()) == 1, done.stderr
    assert "does not speak HTTP/2" in done.stderr or "not h2" in done.stderr, done.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--for", "60"], "sidecar-fsm probe: --for '60' has no unit; write '60s'"),
        (["--ping-interval", "6m"], "sidecar-fsm probe: --ping-interval '6m' must be above 0 and below 340s"),
        (["--for", "1s", "--ping-interval", "2s"], "sidecar-fsm probe: --for '1s' must be longer than"),
        (["--request", "slow"], "sidecar-fsm probe: --request 'slow' must be a path starting with /"),
        (
            ["--request", "/x", "-H", "Authorization Bearer zzz"],
            "sidecar-fsm probe: --header '(no ':'): ...'",
        ),
        (
            ["--upstream", "http://127.0.0.1:9"],
            "sidecar-fsm probe: UPSTREAM 'http://127.0.0.1:9' must be https://",
        ),
    ],
)
def test_bad_usage_is_one_line_and_exit_2(
    args: list[str], message: str, log_dir: Path, probe_env: dict[str, str]
) -> None:
    if args[0] == "--upstream":
        done = probe(log_dir, probe_env, args[1])
    else:
        done = probe(log_dir, probe_env, "https://127.0.0.1:9", *args)
    assert done.returncode == 2, done.stdout + done.stderr
    assert len(done.stderr.splitlines()) == 1 and done.stderr.startswith(message), done.stderr
    assert "zzz" not in done.stderr


def test_a_request_is_reported_and_its_header_values_never_shown(
    tls_origin: TlsH2Origin, idle_relay: Callable[..., IdleRelay], log_dir: Path, probe_env: dict[str, str]
) -> None:
    relay = idle_relay(tls_origin, idle=1.5)
    done = probe(
        log_dir,
        probe_env,
        f"https://localhost:{relay.port}",
        *SHORT,
        "--request",
        "/slow?first_byte=2",
        "--header",
        f"Authorization: {SECRET}",
        ca_file=tls_origin.ca_file,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert matches(
        rf"request GET /slow\?first_byte=2: status 200 after {AT_2}s", line_of(done.stdout, "request ")
    )
    assert matches(
        rf"verdict: .*the sidecar helps here; the request waited {AT_2}s and got 200",
        line_of(done.stdout, "verdict: "),
    )
    assert SECRET not in done.stdout + done.stderr
    assert not list(log_dir.rglob("*"))  # nothing stored: no config, no run


# --- a real load balancer: HAProxy --------------------------------------------------------------


class _SlowHttp1(BaseHTTPRequestHandler):
    """``/slow?first_byte=S``: an HTTP/1.1 200 after S seconds (the origin behind HAProxy)."""

    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        delay = float(parse_qs(urlsplit(self.path).query).get("first_byte", ["0"])[0])
        time.sleep(min(delay, 30.0))
        body = b"slow\n"
        try:
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except OSError:
            pass  # HAProxy gave up on it (timeout server): what the test is about

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def haproxy(tmp_path: Path, lab_certs: CertPaths, process_registry: ProcessRegistry) -> Iterator[str]:
    """HAProxy as a TLS HTTP/2 front (ALPN h2) with ``timeout client 2s`` and ``timeout server
    2s`` before a slow HTTP/1.1 origin on loopback; its ``https://localhost:PORT``. The front's
    socket is bound here on port 0 and handed to HAProxy (``bind fd@N``), so no port is guessed."""
    binary = shutil.which("haproxy") or (
        "/usr/sbin/haproxy" if os.access("/usr/sbin/haproxy", os.X_OK) else None
    )
    if binary is None:
        pytest.skip("HAProxy is not installed (Debian package haproxy)")
    origin = ThreadingHTTPServer(("127.0.0.1", 0), _SlowHttp1)
    origin.daemon_threads = True
    serving = threading.Thread(target=origin.serve_forever, daemon=True)
    serving.start()
    front = socket.socket()
    front.bind(("127.0.0.1", 0))
    front.listen(64)
    site = tmp_path / "haproxy-site.pem"
    site.write_bytes(lab_certs.cert_pem.read_bytes() + lab_certs.key_pem.read_bytes())
    config = tmp_path / "haproxy.cfg"
    config.write_text(
        "global\n  maxconn 100\n"
        "defaults\n  mode http\n  timeout connect 2s\n  timeout client 2s\n  timeout server 2s\n"
        f"frontend fe\n  bind fd@{front.fileno()} ssl crt {site} alpn h2\n  default_backend be\n"
        f"backend be\n  server origin 127.0.0.1:{origin.server_address[1]}\n"
    )
    log = open(tmp_path / "haproxy.log", "wb")  # noqa: SIM115 (closed below, after the process)
    process = subprocess.Popen(
        [binary, "-db", "-f", str(config)], pass_fds=[front.fileno()], stdout=log, stderr=log
    )
    process_registry.add(process)
    try:
        # No readiness wait: the socket listens already, so the probe's connects queue in the
        # kernel until HAProxy accepts them.
        url = f"https://localhost:{front.getsockname()[1]}"
        yield url
    finally:
        terminate_and_reap(process, 10)
        log.close()
        front.close()
        origin.shutdown()
        origin.server_close()
        serving.join(5)


def test_haproxy_goaways_the_silent_connection_and_times_out_a_silent_response_pings_cannot_help(
    haproxy: str, lab_certs: CertPaths, log_dir: Path, probe_env: dict[str, str]
) -> None:
    # Idle only: HAProxy's timeout client GOAWAYs the silent connection; PINGs keep the other.
    idle = probe(
        log_dir, probe_env, haproxy, "--for", "4s", "--ping-interval", "0.5s", ca_file=lab_certs.ca_pem
    )
    assert idle.returncode == 0, idle.stdout + idle.stderr
    assert matches(rf"silent  closed after {AT_2}s: GOAWAY NO_ERROR", line_of(idle.stdout, "silent "))
    assert matches(r"pinged  open after 4\.[0-3]s; .*", line_of(idle.stdout, "pinged "))

    # With a request to the slow endpoint: HAProxy's own 504 at its timeout server, PINGs answered.
    args = ["--for", "5s", "--ping-interval", "0.5s", "--request", "/slow?first_byte=5"]
    human = probe(log_dir, probe_env, haproxy, *args, ca_file=lab_certs.ca_pem)
    assert human.returncode == 1, human.stdout + human.stderr
    assert matches(
        rf"request GET /slow\?first_byte=5: status 504 after {AT_2}s", line_of(human.stdout, "request ")
    )
    assert matches(
        rf"verdict: the load balancer times out a silent response after ~{AT_2}s; "
        r"PINGs cannot help: raise that timeout",
        line_of(human.stdout, "verdict: "),
    )
    document = json.loads(
        probe(log_dir, probe_env, haproxy, *args, "--json", ca_file=lab_certs.ca_pem).stdout
    )
    assert document["request"]["status"] == 504 and document["request"]["timed_out"] is True
    assert 1.8 <= document["request"]["after_s"] < 3.0, document["request"]
    assert document["pinged"]["open"] is True and document["pinged"]["acks"] >= 2
    assert document["silent"]["how"] == "GOAWAY NO_ERROR"
    assert "PINGs cannot help" in document["verdict"]


# --- the PING in the start's check --------------------------------------------------------------


@pytest.fixture
def start_policy(
    instances_config: Callable[..., DictConfig],
    start_manager: Callable[[DictConfig], H2PingSidecarManager],
) -> Callable[..., H2PingSidecarManager]:
    """Factory: ``start_policy(upstream, **block)`` → the started manager of one instance,
    ``policy``, on ``upstream``; a start that fails raises, as ``start_h2_ping_sidecar`` does."""

    def start(upstream: str, **block: Any) -> H2PingSidecarManager:
        return start_manager(instances_config([{"name": "policy", "upstream": upstream}], **block))

    return start


def start_lines(capsys: pytest.CaptureFixture[str]) -> list[str]:
    prefix = f"h2-ping-sidecar {host_name()}: "
    return [line[len(prefix) :] for line in capsys.readouterr().out.splitlines() if line.startswith(prefix)]


def test_the_check_says_the_ping_was_answered_and_prints_listening_first(
    tls_origin: TlsH2Origin,
    start_policy: Callable[..., H2PingSidecarManager],
    capsys: pytest.CaptureFixture[str],
) -> None:
    start_policy(tls_origin.url)
    listening, verdict = start_lines(capsys)
    assert listening.startswith("policy listening on 127.0.0.1:"), listening
    head = f"policy upstream {tls_origin.url} ok: TLS and HTTP/2 in "
    assert verdict.startswith(head) and ", PING answered in " in verdict, verdict
    rtt = float(verdict.rsplit(" ", 1)[1].removesuffix("s"))
    assert 0 <= rtt < 1
    assert tls_origin.pings >= 1


def test_fail_fails_the_start_on_an_unanswered_ping_naming_it(
    make_tls_origin: Callable[..., TlsH2Origin],
    start_policy: Callable[..., H2PingSidecarManager],
    capsys: pytest.CaptureFixture[str],
) -> None:
    origin = make_tls_origin(pings="ignore")
    with pytest.raises(SidecarError) as caught:
        start_policy(origin.url, upstream_check="fail", upstream_check_seconds=1.5)
    first = str(caught.value).splitlines()[0]
    assert first.startswith("h2-ping-sidecar 'policy' (run "), first
    assert first.endswith(
        f"upstream {origin.url} failed its check: PING not answered within 1.5s: "
        "PINGs cannot keep this path open (upstream_check: fail)"
    ), first
    # The listening line came first, before the wait, as the proxies served already.
    assert any(" listening on " in line for line in start_lines(capsys))
    assert origin.pings >= 1


def test_warn_prints_a_goaway_on_the_ping_and_status_shows_an_unanswered_one(
    make_tls_origin: Callable[..., TlsH2Origin],
    start_policy: Callable[..., H2PingSidecarManager],
    log_dir: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    calm = make_tls_origin(pings="goaway")
    manager = start_policy(calm.url)
    verdict = start_lines(capsys)[-1]
    assert verdict.startswith(f"policy upstream {calm.url} failed: TLS and HTTP/2 in "), verdict
    assert verdict.endswith(
        ", but GOAWAY ENHANCE_YOUR_CALM answered the PING: the upstream refuses PINGs this often; "
        "set a longer ping_interval"
    ), verdict
    manager.check()  # warn: no failure of the run
    manager.stop()

    silent = make_tls_origin(pings="ignore")
    start_policy(silent.url, ping_timeout="1s", upstream_check_seconds=3)
    assert "PING not answered within 1s" in start_lines(capsys)[-1]

    def live() -> dict[str, Any]:
        runs = json.loads(sidecar_cli(log_dir, "status", "--json").stdout)["runs"]
        (run,) = [run for run in runs if run["ended_at"] is None]
        return dict(run["instances"][0]["live"] or {})

    seen = wait_until(
        lambda: (figures := live()).get("upstream_up") is False and figures, 10, "upstream down"
    )
    assert str(seen["upstream_error"]).startswith("PING not answered within 1s"), seen


def test_a_wait_past_two_seconds_is_said(
    silent_upstream: str,
    start_policy: Callable[..., H2PingSidecarManager],
    capsys: pytest.CaptureFixture[str],
) -> None:
    start_policy(silent_upstream, upstream_check_seconds=3, rewrite_base_urls=False)
    listening, waiting, verdict = start_lines(capsys)
    assert " listening on " in listening
    assert waiting == "waiting up to 3s (upstream_check_seconds) for the upstream check of policy"
    assert verdict.startswith(f"policy upstream {silent_upstream}: no verdict within 3s"), verdict


def test_the_probe_binary_mode_refuses_bad_flags_before_dialling(sidecar_binary: Path) -> None:
    done = subprocess.run(
        [
            str(sidecar_binary),
            "-probe",
            "-upstream",
            "https://127.0.0.1:9",
            "-for",
            "1s",
            "-ping-interval",
            "2s",
        ],
        capture_output=True,
        text=True,
        timeout=20,
    )
    assert done.returncode == 2 and done.stdout == "", done
    assert done.stderr.strip() == '-for "1s": must be longer than -ping-interval 2s, so that a PING is sent'


def test_progress_shows_on_a_terminal_and_not_in_a_pipe(
    tls_origin: TlsH2Origin, log_dir: Path, probe_env: dict[str, str]
) -> None:
    leader, follower = pty.openpty()
    try:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "sidecar_fsm",
                "--log-dir",
                str(log_dir),
                "probe",
                tls_origin.url,
                "--ca-file",
                str(tls_origin.ca_file),
                "--for",
                "2.5s",
                "--ping-interval",
                "0.5s",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=follower,
            env=probe_env,
            text=True,
        )
        os.close(follower)
        follower = -1
        seen = b""
        while True:  # until the child closes the terminal (EOF or EIO); bounded by its --for
            try:
                chunk = os.read(leader, 4096)
            except OSError:
                break
            if not chunk:
                break
            seen += chunk
        stdout, _ = process.communicate(timeout=30)
    finally:
        os.close(leader)
        if follower >= 0:
            os.close(follower)
    assert process.returncode == 0, stdout + seen.decode(errors="replace")
    assert b"\r\x1b[Kprobe: 1.0s of 2.5s; silent open; pinged open (" in seen, seen
    assert "probe: " not in stdout  # the report on stdout has no progress in it
    assert line_of(stdout, "verdict: ").startswith("verdict: no idle drop within 2.5s")


def test_the_lab_command_told_to_ignore_pings_fails_the_probe(
    log_dir: Path, probe_env: dict[str, str], tmp_path: Path, process_registry: ProcessRegistry
) -> None:
    out = tmp_path / "lab.out"
    with open(out, "wb") as sink:
        lab = subprocess.Popen(
            [sys.executable, "-m", "sidecar_fsm", "lab", "--idle", "20", "--pings", "ignore"],
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    process_registry.add(lab)
    try:
        wait_until(lambda: "serving until Ctrl-C" in out.read_text() or lab.poll() is not None, 30, "the lab")
        printed = dict(
            line.split(": ", 1)
            for line in out.read_text().splitlines()
            if line.startswith(("upstream:", "ca_file:"))
        )
        done = probe(
            log_dir, probe_env, printed["upstream"], *SHORT, "--json", ca_file=Path(printed["ca_file"])
        )
        assert done.returncode == 1, done.stdout + done.stderr
        assert json.loads(done.stdout)["verdict"].startswith("PINGs are not answered (")
    finally:
        lab.terminate()
        lab.wait(20)
    assert "lab stopped" in out.read_text()
