"""``sidecar-fsm demo``: the product's main job, shown end to end on this machine in ~10 s.

Owns the demo's story and its narration (the steps are its headings); a failure is told in the
same voice, naming the step and keeping the scratch folder. Must leave nothing running whatever
fails (everything is stopped in ``finally``), and must not touch state outside its own log dir.
"""

from __future__ import annotations

import contextlib
import http.client
import io
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import TextIO
from urllib.parse import urlsplit

from omegaconf import DictConfig, OmegaConf

from sidecar_fsm.base.buildcache import choose_binary, user_cache_dir
from sidecar_fsm.errors import SidecarError, SidecarsStopped
from sidecar_fsm.lab.h2client import H2ClientError, h2_request
from sidecar_fsm.lab.nvcf import NvcfLab
from sidecar_fsm.lab.origin import TlsH2Origin
from sidecar_fsm.lab.relay import IdleRelay
from sidecar_fsm.launcher import H2PingSidecarManager, start_h2_ping_sidecar
from sidecar_fsm.state.store import Store, database_path
from sidecar_fsm.view import cells, render

IDLE_SECONDS = 2.0
FIRST_BYTE_SECONDS = 3 * IDLE_SECONDS
PING_INTERVAL = "500ms"
# NVCF's 60 s poll window scaled down, and work that takes longer than it.
NVCF_WINDOW_SECONDS = 1
NVCF_WORK_SECONDS = 3.0
NVCF_PATH = "/v1/chat/completions"
INSTANCE_NAME = "demo"
MODEL_SERVER = "demo_model"

# How long a failed request through the sidecar waits for the launcher to see the sidecar's
# exit: the kernel closes a dying process's sockets a moment before its exit can be collected.
_EXIT_VISIBLE_SECONDS = 3.0


class DemoFailed(Exception):
    """A step did not show what it should; the message says why, in the demo's words."""


class _Narrator:
    """Prints the demo's lines; colour (bold headings, green/red verdicts) only on a terminal."""

    def __init__(self, stream: TextIO, color: bool) -> None:
        self.stream = stream
        self.color = color
        self.current_step = "getting ready"

    def _paint(self, text: str, code: str) -> str:
        return f"\x1b[{code}m{text}\x1b[0m" if self.color else text

    def line(self, text: str = "") -> None:
        print(text, file=self.stream, flush=True)

    def step(self, text: str) -> None:
        self.current_step = text
        self.line()
        self.line(self._paint(text, "1"))

    def ok(self, text: str) -> None:
        self.line("  " + self._paint("OK", "32") + "      " + text)

    def failed(self, text: str) -> None:
        self.line("  " + self._paint("FAILED", "31") + "  " + text)


def _ensure_binary(say: _Narrator, cache: Path) -> Path:
    say.step("[1/5] the proxy binary (packaged in the wheel, else built from go/ into the shared cache)")
    # A cold build takes about 40 s on 2 cores (32 s CPU, 97 MB of Go cache; up to 2 min on a
    # loaded machine): buildcache says so, then tells the elapsed time every 10 s.
    started: list[float] = []

    def progress(message: str) -> None:
        started.append(time.monotonic())
        say.line(f"  {message}")

    begin = time.monotonic()
    choice = choose_binary(cache, progress=progress)
    if started:
        say.line(f"  built {choice.path} in {time.monotonic() - begin:.1f}s")
    else:
        say.line(f"  {choice.path}")
    say.line(f"  ({choice.why})")
    return choice.path


def _demo_config(upstream: str, ca_file: str, log_dir: str, cache_dir: Path) -> DictConfig:
    """A Gym-shaped global config: a model server whose base_url is the (slow) upstream."""
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
                "nvcf": {"poll_window": f"{NVCF_WINDOW_SECONDS}s"},
            },
            "policy_model": {"responses_api_models": {MODEL_SERVER: {"base_url": upstream}}},
        }
    )


def _direct_request(say: _Narrator, relay_port: int, ca_file: str, path: str) -> bool:
    """The request as an HTTP/2 client without PINGs sends it; True if it failed as expected."""
    say.step("[3/5] the request sent directly: HTTP/2 through the relay, no PINGs")
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


def _first_reason(error: BaseException) -> str:
    """The first line of an error that says why (``check()``'s: its first instance's reason)."""
    text = error.reasons[0] if isinstance(error, SidecarsStopped) and error.reasons else str(error)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return (lines or [type(error).__name__])[0]


def _why_the_sidecar_failed(manager: H2PingSidecarManager) -> str:
    """What the launcher knows about a sidecar behind a failed request: how it exited, if it did."""
    deadline = time.monotonic() + _EXIT_VISIBLE_SECONDS
    while True:
        try:
            manager.check()
        except SidecarError as error:
            return _first_reason(error)
        if time.monotonic() >= deadline:
            return "the sidecar still runs; its log says why"
        threading.Event().wait(0.05)


def _through_sidecar(
    say: _Narrator, config: DictConfig, path: str, started: list[H2PingSidecarManager]
) -> str:
    """Start the sidecar with the launcher (into ``started`` at once, for the caller to stop) and
    send the request as Gym's aiohttp would; returns the rewritten base URL."""
    say.step(
        f"[4/5] the same request through a sidecar (HTTP/1.1 in; HTTP/2, PING every {PING_INTERVAL}, out)"
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
        raise DemoFailed("the launcher started nothing")
    started.append(manager)
    base_url = str(config.policy_model.responses_api_models[MODEL_SERVER].base_url)
    say.line(f"  GET {base_url}{path}   (the rewritten base_url, plain HTTP/1.1)")
    begin = time.monotonic()
    try:
        status, body = _plain_request(base_url, "GET", path)
    except (OSError, http.client.HTTPException) as error:
        elapsed = time.monotonic() - begin
        say.failed(f"after {elapsed:.1f}s: {error or type(error).__name__}")
        raise DemoFailed(
            f"the request through the sidecar failed after {elapsed:.1f}s: {_why_the_sidecar_failed(manager)}"
        ) from error
    elapsed = time.monotonic() - begin
    if status != 200:
        text = body[:200].decode(errors="replace").strip()
        say.failed(f"status {status} after {elapsed:.1f}s: {text}")
        raise DemoFailed(
            f"the sidecar answered {status} after {elapsed:.1f}s: {text.splitlines()[0] if text else '-'}"
        )
    say.ok(f"status 200, {len(body)} bytes after {elapsed:.1f}s")
    return base_url


def _plain_request(
    base_url: str, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None
) -> tuple[int, bytes]:
    """One HTTP/1.1 request to the sidecar at ``base_url``, as Gym's aiohttp sends it."""
    target = urlsplit(base_url)
    connection = http.client.HTTPConnection(
        target.hostname or "127.0.0.1", target.port, timeout=FIRST_BYTE_SECONDS + 20
    )
    try:
        connection.request(method, path, body=body, headers=headers or {})
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def _nvcf_leg(say: _Narrator, relay_port: int, ca_file: str, base_url: str) -> None:
    """A chat completion longer than NVCF's poll window: directly a 202 an OpenAI client would take
    for the completion; through the sidecar, the completion."""
    say.step(
        f"[5/5] NVCF past its poll window: work of {NVCF_WORK_SECONDS:g}s, window {NVCF_WINDOW_SECONDS}s "
        "(NVCF's 60 s scaled down)"
    )
    request = {"model": "lab", "messages": [{"role": "user", "content": "a long judgement"}]}
    body = json.dumps(request).encode()
    work = ("lab-work-seconds", f"{NVCF_WORK_SECONDS:g}")
    say.line(f"  POST https://localhost:{relay_port}{NVCF_PATH}   (directly)")
    begin = time.monotonic()
    status, answer = h2_request(
        "127.0.0.1", relay_port, NVCF_PATH, ca_file, method="POST", body=body, headers=[work]
    )
    text = answer.decode(errors="replace").strip()
    if status != 202:
        raise DemoFailed(f"the origin answered {status}, not NVCF's 202, past its window: {text[:200]}")
    say.failed(f"status 202 after {time.monotonic() - begin:.1f}s: {text}")
    say.line("          not the completion, but an OpenAI client takes it for one and raises nothing")
    say.line(f"  POST {base_url}{NVCF_PATH}   (through the sidecar)")
    begin = time.monotonic()
    # A failure in transit is worded by run_demo, as every step's is.
    status, answer = _plain_request(base_url, "POST", NVCF_PATH, body, dict([work]))
    text = answer[:90].decode(errors="replace").strip()
    if status != 200 or b'"choices"' not in answer:
        say.failed(f"status {status} after {time.monotonic() - begin:.1f}s: {text}")
        raise DemoFailed(f"through the sidecar the answer was {status}, not the completion: {text or '-'}")
    say.ok(f"status 200 after {time.monotonic() - begin:.1f}s: the completion ({text}...)")
    say.line("          the sidecar followed the 202 and polled NVCF's status URL; the client saw one answer")


def _print_history(say: _Narrator, log_dir: str, run_id: str | None, kept: bool) -> None:
    """The run's transitions; the database is named only when it is ``kept`` (a scratch folder
    removed after a success would leave the user a path to nothing)."""
    if run_id is None or not database_path(log_dir).exists():
        return
    where = database_path(log_dir) if kept else "removed with the scratch folder; --log-dir DIR keeps it"
    say.step(f"the instance's persisted state history ({where})")
    with Store.open_existing(database_path(log_dir)) as store:
        run = store.get_run(run_id)
        if run is None:
            say.line(f"  run {run_id} is not recorded")
            return
        rows = [(inst.name, t) for inst in store.instances_of(run_id) for t in store.history(inst.id)]
    rows.sort(key=lambda row: (row[1].at, row[1].id))
    for text in render.history_lines(run, rows, color=say.color):
        say.line("  " + text)


def _step_name(step: str) -> str:
    """``[4/4] the same request through a sidecar``: a step's heading without its aside."""
    return step.split(" (", 1)[0]


def _tell_failure(say: _Narrator, step: str, why: str, scratch: str, run_id: str | None) -> bool:
    """The failure's ending: which step, why, what was kept. True if the scratch folder holds a log
    or the state database; an empty one (a failure before the sidecar started) is not kept."""
    say.line()
    say.line(say._paint("result:", "1") + f" the demo failed at step {_step_name(step)}:")
    say.line(f"        {why}")
    logs = sorted(p.name for p in Path(scratch).glob("h2ping-*.log"))
    databases = sorted(str(p.relative_to(scratch)) for p in Path(scratch).glob("sidecar-fsm/*.db"))
    kept = [f"the sidecar's log {name}" for name in logs] + [f"the state database {db}" for db in databases]
    if kept:
        say.line(f"kept its scratch folder for a look: {scratch}")
        say.line(f"  it holds {'; '.join(kept)}")
        if run_id is not None:
            say.line(f"  try: sidecar-fsm --log-dir {scratch} history {cells.short_run_id(run_id)}")
    say.line("nothing left running")
    return bool(kept)


def run_demo(
    *,
    log_dir: str | None = None,
    cache_dir: str | None = None,
    color: bool = False,
    stream: TextIO | None = None,
) -> int:
    """Run the demo; 0 when the direct request failed and the sidecar's succeeded, else 1. ``log_dir``
    None means a scratch folder, removed after a success; a given one is always kept."""
    say = _Narrator(stream or sys.stdout, color)
    _introduce(say)
    own_log_dir = log_dir is None
    state_dir = (
        tempfile.mkdtemp(prefix="sidecar-fsm-demo-") if log_dir is None else str(Path(log_dir).resolve())
    )
    cache = Path(os.path.abspath(os.path.expanduser(cache_dir))) if cache_dir else user_cache_dir()
    origin = TlsH2Origin(nvcf=NvcfLab(window=NVCF_WINDOW_SECONDS))
    relay: IdleRelay | None = None
    started: list[H2PingSidecarManager] = []
    keep = not own_log_dir
    try:
        _ensure_binary(say, cache)
        say.step("[2/5] the lab: a TLS HTTP/2 origin behind an idle-dropping relay")
        origin.start()
        relay = IdleRelay("127.0.0.1", origin.port, idle=IDLE_SECONDS).start()
        say.line(f"  origin  {origin.url}  (its own throwaway CA: {origin.ca_file})")
        say.line(
            f"  relay   127.0.0.1:{relay.port} -> {origin.port}, drops connections idle {IDLE_SECONDS:g}s"
        )
        path = f"/slow?first_byte={FIRST_BYTE_SECONDS:g}"
        if not _direct_request(say, relay.port, str(origin.ca_file), path):
            raise DemoFailed(
                f"the direct request did not fail: the relay should have dropped its connection "
                f"after {IDLE_SECONDS:g}s of silence"
            )
        drops_before = relay.drops
        pings_before = origin.pings
        upstream = f"https://localhost:{relay.port}"
        config = _demo_config(upstream, str(origin.ca_file), state_dir, cache)
        base_url = _through_sidecar(say, config, path, started)
        say.line(
            f"          the origin received {origin.pings - pings_before} PINGs while it waited; "
            f"the relay dropped {relay.drops - drops_before} connections"
        )
        _nvcf_leg(say, relay.port, str(origin.ca_file), base_url)
        started[0].check()
        started[0].stop()
        _print_history(say, state_dir, started[0].run_id, kept=keep)
        _tell_success(say, None if own_log_dir else state_dir)
        return 0
    except KeyboardInterrupt:
        say.line()
        say.line(f"interrupted at step {_step_name(say.current_step)}; kept its scratch folder: {state_dir}")
        keep = True
        raise
    except Exception as error:
        # Any failure, ours or the machine's, ends in words, never a traceback: a first-time
        # user reads which step failed and why, and finds the logs where the last line says.
        why = str(error) if isinstance(error, DemoFailed) else _first_reason(error)
        failed_step = say.current_step
        _stop_all(started, relay, origin)
        if started:
            with contextlib.suppress(Exception):
                # A failure keeps the folder when it holds the database (_tell_failure).
                _print_history(say, state_dir, started[0].run_id, kept=True)
        run_id = started[0].run_id if started else None
        keep = _tell_failure(say, failed_step, why, state_dir, run_id) or keep
        return 1
    finally:
        _stop_all(started, relay, origin)
        if not keep:
            shutil.rmtree(state_dir, ignore_errors=True)


def _introduce(say: _Narrator) -> None:
    """What the demo shows and why, before anything starts."""
    say.line(
        say._paint(
            "sidecar-fsm demo: a long request through a load balancer that drops idle connections", "1"
        )
    )
    say.line(
        "AWS Global Accelerator drops a TCP connection that carries no data for 340 s; HTTP/2 PINGs\n"
        "count as data, TCP keepalives do not. Here a local relay plays it, scaled down: it drops\n"
        f"connections idle for {IDLE_SECONDS:g}s, and the origin sends its first byte after "
        f"{FIRST_BYTE_SECONDS:g}s ({FIRST_BYTE_SECONDS / IDLE_SECONDS:g}x the limit). Then NVCF's poll\n"
        "window: past it NVCF answers 202 with a request id, not the answer."
    )


def _tell_success(say: _Narrator, kept_log_dir: str | None) -> None:
    """The result in two lines, and the command to look at the run if its log dir is kept."""
    say.line()
    say.line(
        say._paint("result:", "1")
        + f" the direct request failed at the {IDLE_SECONDS:g}s idle limit; through the sidecar"
    )
    say.line(
        f"        the same request waited {FIRST_BYTE_SECONDS:g}s and succeeded; NVCF's 202 was followed"
    )
    say.line("        to the answer through the sidecar; nothing left running")
    if kept_log_dir is not None:
        say.line(f"try: sidecar-fsm --log-dir {kept_log_dir} status --all")


def _stop_all(started: list[H2PingSidecarManager], relay: IdleRelay | None, origin: TlsH2Origin) -> None:
    """Stop everything the demo started; idempotent. The sidecar first: it holds a connection to the relay."""
    for manager in started:
        with contextlib.suppress(Exception):
            manager.stop()
    if relay is not None:
        relay.stop()
    origin.stop()
