"""The upstream through a real egress proxy (Debian's tinyproxy) on loopback.

Which route each rule of Go's gives is the proxy's own test (go/egress_test.go,
TestRouteFollowsNetHTTPsRules); here, the tunnel itself and the route ``start`` prints.

Topology: client → h2-ping-sidecar → tinyproxy (CONNECT) → [idle relay →] lab TLS h2 origin.

Why the upstream is ``https://0.0.0.0:PORT``: net/http never proxies ``localhost`` or a loopback
address, so a proxied test upstream needs a name that is neither yet reaches the local origin.
``0.0.0.0`` is an address Go does not count as loopback, and Linux connects it to the local host
(loopback), both for tinyproxy's CONNECT and for the sidecar's own direct dial when NO_PROXY names
it; the lab certificate names it as an IP, so TLS is verified for real. The alternatives fail on a
stock machine without editing /etc/hosts: ``localhost.`` and ``*.localhost`` do not resolve through
glibc (tinyproxy's resolver), ``127.1`` does in glibc but not in Go's resolver (the direct path).

tinyproxy has no port 0: the fixture picks a free port, starts it, and tries another port if its
bind lost the race; it is ready once its log says it accepts connections. No ``ConnectPort`` line:
tinyproxy then allows CONNECT to any port, which the random origin ports need.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers import ProcessRegistry, http11_request, sidecar_cli, wait_until

from sidecar_fsm.lab import CertPaths, IdleRelay, TlsH2Origin, make_ca_and_cert

TINYPROXY = shutil.which("tinyproxy")
pytestmark = pytest.mark.skipif(
    TINYPROXY is None,
    reason="tinyproxy not installed (apt-get install tinyproxy): egress tests need a real proxy",
)

USER, PASSWORD = "egress-user-7f3", "pw-9c1e-secret"
_SECRETS = (PASSWORD, USER, base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode())
_START_ATTEMPTS = 5


@dataclass(frozen=True)
class Tinyproxy:
    process: subprocess.Popen[bytes]
    port: int
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def url_with(self, user: str, password: str) -> str:
        return f"http://{user}:{password}@127.0.0.1:{self.port}"

    def tunnels(self) -> int:
        """CONNECT tunnels tinyproxy opened (its log names each one)."""
        return self.log_path.read_text(errors="replace").count("Established connection to host")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@pytest.fixture
def tinyproxy(tmp_path: Path, process_registry: ProcessRegistry) -> Callable[..., Tinyproxy]:
    """Factory: ``tinyproxy(auth=None)`` → a started tinyproxy on 127.0.0.1 (BasicAuth with ``auth``)."""
    assert TINYPROXY is not None
    count = 0

    def start(auth: tuple[str, str] | None = None) -> Tinyproxy:
        nonlocal count
        for _ in range(_START_ATTEMPTS):
            count += 1
            folder = tmp_path / f"tinyproxy-{count}"
            folder.mkdir()
            port, log_path = _free_port(), folder / "tinyproxy.log"
            lines = [
                f"Port {port}",
                "Listen 127.0.0.1",
                "Timeout 600",
                f'LogFile "{log_path}"',
                "LogLevel Info",
                "MaxClients 100",
                "Allow 127.0.0.1",
            ]
            if auth is not None:
                lines.append(f"BasicAuth {auth[0]} {auth[1]}")
            conf = folder / "tinyproxy.conf"
            conf.write_text("\n".join(lines) + "\n")
            with open(folder / "stderr", "wb") as err:
                process = subprocess.Popen([TINYPROXY, "-d", "-c", str(conf)], stdout=err, stderr=err)
            process_registry.add(process)

            def settled(process: subprocess.Popen[bytes] = process, log_path: Path = log_path) -> bool:
                accepting = log_path.exists() and "Accepting connections" in log_path.read_text(
                    errors="replace"
                )
                return process.poll() is not None or accepting

            wait_until(settled, 10, "tinyproxy to accept connections or exit")
            if process.poll() is None:
                return Tinyproxy(process, port, log_path)
            # Exited: the port was taken between our probe and its bind; try another.
        raise AssertionError(f"tinyproxy did not start in {_START_ATTEMPTS} attempts; see {tmp_path}")

    return start


@pytest.fixture
def egress_certs(tmp_path: Path) -> CertPaths:
    return make_ca_and_cert(tmp_path / "egress-ca", hosts=("0.0.0.0", "localhost", "127.0.0.1"))


@pytest.fixture
def egress_origin(egress_certs: CertPaths) -> Iterator[TlsH2Origin]:
    origin = TlsH2Origin(egress_certs).start()
    yield origin
    origin.stop()


def proxy_env(https_proxy: str, no_proxy: str = "") -> dict[str, str]:
    """Our environment with the proxy variables set, lower-case ones cleared (Go reads upper first)."""
    env = dict(os.environ)
    env.update({"HTTPS_PROXY": https_proxy, "https_proxy": "", "NO_PROXY": no_proxy, "no_proxy": ""})
    return env


EgressSidecar = Callable[..., Any]


@pytest.fixture
def egress_sidecar(run_sidecar: Callable[..., Any], egress_origin: TlsH2Origin) -> EgressSidecar:
    """``egress_sidecar(proxy_url, upstream, *flags, no_proxy="")``: ``run_sidecar`` trusting the
    egress origin's CA, with ``HTTPS_PROXY=proxy_url`` (and ``NO_PROXY``) as a cluster sets them."""

    def start(proxy_url: str, upstream: str, *flags: str, no_proxy: str = "") -> Any:
        return run_sidecar(
            upstream, *flags, ca_file=egress_origin.ca_file, env=proxy_env(proxy_url, no_proxy)
        )

    return start


def get(sidecar: Any, path: str, **kwargs: Any) -> tuple[int, bytes]:
    response = http11_request(sidecar.host, sidecar.port, path, **kwargs)
    return response.status, response.body


def metric(sidecar: Any, name: str) -> float:
    address = json.loads(sidecar.ready_path.read_text())["metrics"]
    host, port = address.rsplit(":", 1)
    text = http11_request(host, int(port), "/metrics").body.decode()
    (line,) = [line for line in text.splitlines() if line.startswith(name + " ")]
    return float(line.split()[1])


# --- through tinyproxy ---------------------------------------------------------------------------


def test_a_long_wait_through_the_tunnel_outlives_the_idle_relay(
    tinyproxy: Callable[..., Tinyproxy],
    egress_origin: TlsH2Origin,
    idle_relay: Callable[..., IdleRelay],
    egress_sidecar: EgressSidecar,
) -> None:
    idle = 1.0
    relay = idle_relay(egress_origin, idle=idle)
    proxy = tinyproxy()
    sidecar = egress_sidecar(proxy.url, f"https://0.0.0.0:{relay.port}", "-ping-interval", "250ms")
    status, body = get(sidecar, f"/slow?first_byte={3 * idle:g}", timeout=30)
    assert status == 200, body[:300]
    assert body.startswith(b"slow: first byte after 3s")
    assert egress_origin.pings >= 3
    assert relay.drops == 0
    assert proxy.tunnels() == 1
    assert f"upstream https://0.0.0.0:{relay.port} via egress proxy {proxy.url} (" in sidecar.log()


def test_a_goaway_refusal_is_resent_through_a_new_tunnel(
    tinyproxy: Callable[..., Tinyproxy],
    egress_origin: TlsH2Origin,
    egress_sidecar: EgressSidecar,
) -> None:
    proxy = tinyproxy()
    sidecar = egress_sidecar(
        proxy.url, f"https://0.0.0.0:{egress_origin.port}", "-metrics-listen", "127.0.0.1:0"
    )
    assert get(sidecar, "/echo")[0] == 200
    egress_origin.refuse_next(1)
    status, body = get(sidecar, "/echo", method="POST", body=b"x" * 1000)
    assert status == 200, body[:300]
    assert json.loads(body)["body_length"] == 1000
    assert egress_origin.refused == 1
    assert metric(sidecar, "h2ping_retries_total") == 1
    assert proxy.tunnels() == 2


def test_no_proxy_naming_the_upstream_goes_direct(
    tinyproxy: Callable[..., Tinyproxy],
    egress_origin: TlsH2Origin,
    egress_sidecar: EgressSidecar,
) -> None:
    proxy = tinyproxy()
    upstream = f"https://0.0.0.0:{egress_origin.port}"
    sidecar = egress_sidecar(proxy.url, upstream, no_proxy="0.0.0.0")
    assert get(sidecar, "/echo")[0] == 200
    assert proxy.tunnels() == 0
    assert "egress proxy" not in sidecar.log()


def test_a_proxy_demanding_credentials_answers_502_naming_its_407_without_them(
    tinyproxy: Callable[..., Tinyproxy],
    egress_origin: TlsH2Origin,
    egress_sidecar: EgressSidecar,
) -> None:
    proxy = tinyproxy(auth=(USER, PASSWORD))
    upstream = f"https://0.0.0.0:{egress_origin.port}"
    refused = f"egress proxy {proxy.url} answered 407 Proxy Authentication Required"

    without = egress_sidecar(proxy.url, upstream)
    wait_until(
        lambda: f"upstream check: {upstream}: {refused}" in without.log(), 10, "the upstream check's verdict"
    )
    status, body = get(without, "/echo")
    assert (status, body) == (502, f"h2-ping-sidecar: upstream {upstream}: {refused}\n".encode())

    # Wrong credentials: tinyproxy answers 401, and the 502 names that answer as given.
    wrong = egress_sidecar(proxy.url_with(USER, "wrong"), upstream)
    answer = f"egress proxy {proxy.url} answered 401 Unauthorized"
    assert get(wrong, "/echo") == (502, f"h2-ping-sidecar: upstream {upstream}: {answer}\n".encode())

    right = egress_sidecar(proxy.url_with(USER, PASSWORD), upstream)
    assert get(right, "/echo")[0] == 200
    for sidecar in (without, wrong, right):
        log = sidecar.log()
        assert not any(secret in log for secret in _SECRETS), log


def test_start_prints_each_instances_route_as_its_proxy_says_and_no_credentials(
    tinyproxy: Callable[..., Tinyproxy],
    egress_origin: TlsH2Origin,
    sidecar_binary: Path,
    tmp_path: Path,
    process_registry: ProcessRegistry,
) -> None:
    """Two instances, one proxied (0.0.0.0) and one direct (loopback is never proxied): ``start``
    prints the route each proxy's ready file says; the credentials are in no output, log or row."""
    proxy = tinyproxy(auth=(USER, PASSWORD))
    upstream = f"https://0.0.0.0:{egress_origin.port}"
    loopback = f"https://127.0.0.1:{egress_origin.port}"
    config = tmp_path / "gym.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "policy_base_url": upstream + "/v1",
                "sidecar": {
                    "enabled": True,
                    "binary": str(sidecar_binary),
                    "ca_file": str(egress_origin.ca_file),
                    "instances": [
                        {"name": "policy", "upstream": upstream, "listen": "127.0.0.1:0"},
                        {"name": "judge", "upstream": loopback, "listen": "127.0.0.1:0"},
                    ],
                    "shutdown_grace": "2s",
                },
                "policy_model": {
                    "responses_api_models": {"openai_model": {"base_url": "${policy_base_url}"}}
                },
            }
        )
    )
    log_dir = tmp_path / "logs"
    output = tmp_path / "start.out"
    command = [sys.executable, "-m", "sidecar_fsm", "--log-dir", str(log_dir)]
    with open(output, "wb") as out:
        start = subprocess.Popen(
            [*command, "start", str(config)],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=proxy_env(proxy.url_with(USER, PASSWORD)),
        )
    process_registry.add(start)
    wait_until(
        lambda: "supervising" in output.read_text() or start.poll() is not None, 30, "start to be ready"
    )
    assert start.poll() is None, output.read_text()
    printed = output.read_text()
    assert f"{upstream} (via egress proxy {proxy.url})" in printed
    assert f"{loopback} (direct)" in printed

    status = subprocess.run([*command, "status", "--json"], capture_output=True, text=True, timeout=60)
    instance = next(i for i in json.loads(status.stdout)["runs"][0]["instances"] if i["name"] == "policy")
    host, port = instance["listen"].rsplit(":", 1)
    assert http11_request(host, int(port), "/echo").status == 200
    assert proxy.tunnels() >= 1
    start.send_signal(signal.SIGTERM)
    assert start.wait(30) == 0, output.read_text()
    history = subprocess.run(
        [*command, "history", json.loads(status.stdout)["runs"][0]["run_id"], "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )

    texts = {
        "start output": output.read_bytes(),
        "status": status.stdout.encode(),
        "history": history.stdout.encode(),
    }
    for path in log_dir.rglob("*"):
        if path.is_file():
            texts[str(path)] = path.read_bytes()
    assert any(path.endswith(".db") for path in texts), sorted(texts)
    leaks = [
        f"{where}: {secret}"
        for where, data in texts.items()
        for secret in _SECRETS
        if secret.encode() in data
    ]
    assert leaks == []


def test_probe_goes_through_the_egress_proxy_as_the_proxy_does_and_prints_the_route(
    tinyproxy: Callable[..., Tinyproxy],
    egress_origin: TlsH2Origin,
    cache_dir: Path,
    sidecar_binary: Path,
    tmp_path: Path,
) -> None:
    proxy = tinyproxy(auth=(USER, PASSWORD))
    xdg = tmp_path / "xdg"  # the user cache is the session's: probe finds the built binary there
    xdg.mkdir()
    (xdg / "sidecar-fsm").symlink_to(cache_dir)
    upstream = f"https://0.0.0.0:{egress_origin.port}"
    argv = ["probe", upstream, "--ca-file", str(egress_origin.ca_file), "--for", "1.5s"]
    argv += ["--ping-interval", "0.5s", "--json"]
    env = {**proxy_env(proxy.url_with(USER, PASSWORD)), "XDG_CACHE_HOME": str(xdg)}
    done = sidecar_cli(tmp_path / "logs", *argv, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    document = json.loads(done.stdout)
    assert document["route"] == f"egress proxy {proxy.url}"
    assert document["pinged"]["acks"] >= 1
    assert proxy.tunnels() == 2  # both connections, through the tunnel
    for secret in _SECRETS:
        assert secret not in done.stdout + done.stderr

    direct = {**env, "NO_PROXY": "0.0.0.0"}
    done = sidecar_cli(tmp_path / "logs", *argv, env=direct)
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout)["route"] == "direct"
    assert proxy.tunnels() == 2
