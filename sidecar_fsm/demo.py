"""``sidecar-fsm demo``: the product's main job, shown end to end on this machine in ~10 s.

Owns the demo's story and its narration: build (or find) the proxy, run the lab's TLS HTTP/2
origin behind an idle-dropping relay (Global Accelerator's 340 s scaled down to 2 s), send a
request whose first byte takes 3x the idle limit directly (it fails) and through a sidecar the
launcher starts from a Gym-shaped config (it succeeds), then print the instance's persisted
state history. Must leave nothing running, whatever fails (everything is stopped in
``finally``), and must not touch state outside its own log dir (a temporary one unless
``--log-dir`` is given).
"""

from __future__ import annotations

import contextlib
import http.client
import io
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, TextIO
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from sidecar_fsm.launcher import H2PingSidecarManager

IDLE_SECONDS = 2.0
FIRST_BYTE_SECONDS = 3 * IDLE_SECONDS
PING_INTERVAL = "500ms"
INSTANCE_NAME = "demo"
MODEL_SERVER = "demo_model"

# How often the build narration says it is still compiling (a cold build takes ~15 s).
_TICK_SECONDS = 3.0


class _Narrator:
    """Prints the demo's lines; colour (bold headings, green/red verdicts) only on a terminal."""

    def __init__(self, stream: TextIO, color: bool) -> None:
        self.stream = stream
        self.color = color

    def _paint(self, text: str, code: str) -> str:
        return f"\x1b[{code}m{text}\x1b[0m" if self.color else text

    def line(self, text: str = "") -> None:
        print(text, file=self.stream, flush=True)

    def step(self, text: str) -> None:
        self.line()
        self.line(self._paint(text, "1"))

    def ok(self, text: str) -> None:
        self.line("  " + self._paint("OK", "32") + "      " + text)

    def failed(self, text: str) -> None:
        self.line("  " + self._paint("FAILED", "31") + "  " + text)


@contextlib.contextmanager
def _build_ticker(say: _Narrator) -> Iterator[list[float]]:
    """Narrates a Go build while it runs: the build's own message, then the elapsed time.

    The yielded list is filled with the start time when ``buildcache`` reports that a build (or
    a wait for another process's build) began; nothing is printed on a warm cache.
    """
    started: list[float] = []
    done = threading.Event()

    def tick() -> None:
        while not done.wait(_TICK_SECONDS):
            if started:
                say.line(f"  ... still compiling ({time.monotonic() - started[0]:.0f}s)")

    thread = threading.Thread(target=tick, name="sidecar-fsm-demo-build", daemon=True)
    thread.start()
    try:
        yield started
    finally:
        done.set()
        thread.join()


def _ensure_binary(say: _Narrator, cache_dir: str | None) -> Path:
    from sidecar_fsm.buildcache import cache_dir_of, ensure_binary

    cache = cache_dir_of({"cache_dir": cache_dir} if cache_dir else {})
    say.step("[1/4] the proxy binary (built from go/ into the shared cache on first use)")
    with _build_ticker(say) as started:

        def progress(message: str) -> None:
            started.append(time.monotonic())
            say.line(f"  {message}")

        begin = time.monotonic()
        binary = ensure_binary(cache, progress=progress)
    if started:
        say.line(f"  built {binary} in {time.monotonic() - begin:.1f}s")
    else:
        say.line(f"  cached: {binary}")
    return binary


def _demo_config(upstream: str, ca_file: str, log_dir: str, cache_dir: Path) -> object:
    """A Gym-shaped global config: a model server whose base_url is the (slow) upstream."""
    from omegaconf import OmegaConf

    return OmegaConf.create(
        {
            "cache_dir": str(cache_dir),
            "sidecar": {
                "enabled": True,
                "instances": [{"name": INSTANCE_NAME, "upstream": upstream, "listen": "127.0.0.1:0"}],
                "ping_interval": PING_INTERVAL,
                "ping_timeout": "2s",
                "shutdown_grace": "5s",
                "ca_file": ca_file,
                "log_dir": log_dir,
            },
            "policy_model": {"responses_api_models": {MODEL_SERVER: {"base_url": upstream}}},
        }
    )


def _direct_request(say: _Narrator, relay_port: int, ca_file: str, path: str) -> bool:
    """The request as an HTTP/2 client without PINGs sends it; True if it failed as expected."""
    from sidecar_fsm.lab.h2client import H2ClientError, h2_request

    say.step("[3/4] the request sent directly: HTTP/2 through the relay, no PINGs")
    say.line(f"  GET https://localhost:{relay_port}{path}")
    begin = time.monotonic()
    try:
        status, body = h2_request(
            "127.0.0.1",
            relay_port,
            path,
            ca_file,
            server_hostname="localhost",
            timeout=FIRST_BYTE_SECONDS + 10,
        )
    except (H2ClientError, OSError) as error:
        say.failed(f"after {time.monotonic() - begin:.1f}s: {error}")
        say.line(f"          the connection was silent for {IDLE_SECONDS:g}s, so the relay dropped it")
        return True
    say.ok(f"status {status}, {len(body)} bytes after {time.monotonic() - begin:.1f}s (not dropped?)")
    return False


def _through_sidecar(
    say: _Narrator, config: object, path: str, origin_pings: int
) -> tuple[H2PingSidecarManager | None, bool]:
    """Start the sidecar with the launcher and send the request as Gym's aiohttp would."""
    from omegaconf import DictConfig

    from sidecar_fsm.launcher import start_h2_ping_sidecar

    assert isinstance(config, DictConfig)
    say.step(
        f"[4/4] the same request through a sidecar (HTTP/1.1 in; HTTP/2, PING every {PING_INTERVAL}, out)"
    )
    say.line("  start_h2_ping_sidecar(config), as `gym env start` calls it, prints:")
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            manager = start_h2_ping_sidecar(config)
    finally:
        for text in printed.getvalue().splitlines():
            say.line(f"    {text}")
    if manager is None:  # pragma: no cover - the demo config enables it
        say.failed("the launcher started nothing")
        return None, False
    base_url = str(config.policy_model.responses_api_models[MODEL_SERVER].base_url)
    target = urlsplit(base_url)
    say.line(f"  GET {base_url}{path}   (the rewritten base_url, plain HTTP/1.1)")
    begin = time.monotonic()
    connection = http.client.HTTPConnection(
        target.hostname or "127.0.0.1", target.port, timeout=FIRST_BYTE_SECONDS + 20
    )
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        body = response.read()
        status = response.status
    except (OSError, http.client.HTTPException) as error:
        say.failed(f"after {time.monotonic() - begin:.1f}s: {error}")
        return manager, False
    finally:
        connection.close()
    elapsed = time.monotonic() - begin
    if status != 200:
        say.failed(f"status {status} after {elapsed:.1f}s: {body[:200].decode(errors='replace')}")
        return manager, False
    say.ok(f"status 200, {len(body)} bytes after {elapsed:.1f}s")
    return manager, True


def _print_history(say: _Narrator, log_dir: str, run_id: str | None) -> None:
    from sidecar_fsm import render
    from sidecar_fsm.store import Store, database_path

    if run_id is None:
        return
    say.step(f"the instance's persisted state history ({database_path(log_dir)})")
    with Store.open_existing(database_path(log_dir)) as store:
        run = store.get_run(run_id)
        if run is None:
            say.line(f"  run {run_id} is not recorded")
            return
        rows = [(inst.name, t) for inst in store.instances_of(run_id) for t in store.history(inst.id)]
    rows.sort(key=lambda row: (row[1].at, row[1].id))
    for text in render.history_lines(run, rows, color=say.color):
        say.line("  " + text)


def run_demo(
    *,
    log_dir: str | None = None,
    cache_dir: str | None = None,
    color: bool = False,
    stream: TextIO | None = None,
) -> int:
    """Run the demo; 0 when the direct request failed and the sidecar's succeeded, else 1.

    ``log_dir`` None means a temporary directory, removed at the end; a given one is kept so
    ``sidecar-fsm status`` and ``history`` can be tried on it afterwards.
    """
    from sidecar_fsm.buildcache import cache_dir_of
    from sidecar_fsm.lab.origin import TlsH2Origin
    from sidecar_fsm.lab.relay import IdleRelay

    say = _Narrator(stream or sys.stdout, color)
    say.line(
        say._paint(
            "sidecar-fsm demo: a long request through a load balancer that drops idle connections", "1"
        )
    )
    say.line(
        "AWS Global Accelerator drops a TCP connection that carries no data for 340 s; HTTP/2 PINGs\n"
        "count as data, TCP keepalives do not. Here a local relay plays it, scaled down: it drops\n"
        f"connections idle for {IDLE_SECONDS:g}s, and the origin sends its first byte after "
        f"{FIRST_BYTE_SECONDS:g}s ({FIRST_BYTE_SECONDS / IDLE_SECONDS:g}x the limit)."
    )
    own_log_dir = log_dir is None
    state_dir = (
        tempfile.mkdtemp(prefix="sidecar-fsm-demo-") if log_dir is None else str(Path(log_dir).resolve())
    )
    origin = TlsH2Origin()
    relay: IdleRelay | None = None
    manager: H2PingSidecarManager | None = None
    try:
        _ensure_binary(say, cache_dir)
        origin.start()
        relay = IdleRelay("127.0.0.1", origin.port, idle=IDLE_SECONDS).start()
        say.step("[2/4] the lab: a TLS HTTP/2 origin behind an idle-dropping relay")
        say.line(f"  origin  {origin.url}  (its own throwaway CA: {origin.ca_file})")
        say.line(
            f"  relay   127.0.0.1:{relay.port} -> {origin.port}, drops connections idle {IDLE_SECONDS:g}s"
        )
        path = f"/slow?first_byte={FIRST_BYTE_SECONDS:g}"
        direct_failed = _direct_request(say, relay.port, str(origin.ca_file), path)
        drops_before = relay.drops
        pings_before = origin.pings
        upstream = f"https://localhost:{relay.port}"
        config = _demo_config(
            upstream,
            str(origin.ca_file),
            state_dir,
            cache_dir_of({"cache_dir": cache_dir} if cache_dir else {}),
        )
        manager, sidecar_ok = _through_sidecar(say, config, path, pings_before)
        if sidecar_ok:
            say.line(
                f"          the origin received {origin.pings - pings_before} PINGs while it waited; "
                f"the relay dropped {relay.drops - drops_before} connections"
            )
        if manager is not None:
            manager.check()
            manager.stop()
            _print_history(say, state_dir, manager.run_id)
        say.line()
        if direct_failed and sidecar_ok:
            say.line(
                say._paint("result:", "1")
                + f" the direct request failed at the {IDLE_SECONDS:g}s idle limit; through the sidecar"
            )
            say.line(
                f"        the same request waited {FIRST_BYTE_SECONDS:g}s and succeeded; nothing left running"
            )
            if not own_log_dir:
                say.line(f"try: sidecar-fsm --log-dir {state_dir} status --all")
            return 0
        say.line(
            say._paint("result:", "1") + " the demo did not show the expected failure and success (see above)"
        )
        return 1
    finally:
        # Whatever failed above, nothing outlives the demo: the sidecar first (it holds a
        # connection through the relay), then the relay, then the origin.
        if manager is not None:
            with contextlib.suppress(Exception):
                manager.stop()
        if relay is not None:
            relay.stop()
        origin.stop()
        if own_log_dir:
            shutil.rmtree(state_dir, ignore_errors=True)
