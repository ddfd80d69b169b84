"""The ``sidecar-fsm`` command: arguments, subcommands and exit codes.

Owns parsing the command line (global options before or after the command), choosing the log
dir and the build cache, opening the right databases, judging what runs now at a recorded pid
(through ``procs``, read-only), calling the module that does the work (launcher, store, reap,
buildcache, demo; ``live`` scrapes the proxies' figures, ``top`` redraws them) and mapping the
outcome to an exit code: 0 success, 1 a failure (a missing log dir or run included), 2 bad
usage or config (``ConfigError``, ``SchemaTooNewError``, a bad argument), always with a
one-line message on stderr, never a traceback. Must not format output (``render`` does), speak
SQL (``store``), change state (``fsm``) or signal a process (``procs``).

A new subcommand is a ``cmd_<name>(args) -> exit code`` function and one ``add_command`` line
in ``build_parser``. Longer than the usual module: every command's path from argv to exit code
reads here in one place, while the work itself lives in the modules it calls.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import os
import select
import signal
import sys
import tempfile
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, NoReturn, TextIO

from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException
from yaml import MarkedYAMLError, YAMLError

from sidecar_fsm.base import procs
from sidecar_fsm.base.buildcache import CACHE_DIR_KEY, ensure_binary, user_cache_dir
from sidecar_fsm.base.egress import egress_route
from sidecar_fsm.base.resources import default_log_dir
from sidecar_fsm.errors import ConfigError, ConfigWarning, SchemaTooNewError, SidecarError
from sidecar_fsm.gymexec import ExecFailed, exec_command
from sidecar_fsm.run.cluster import DEFAULT_ADDRESS, ClusterUnavailableError, reap_cluster
from sidecar_fsm.run.reap import ReapReport, owner_status, reap
from sidecar_fsm.state.fsm import TERMINAL
from sidecar_fsm.state.hostname import host_name
from sidecar_fsm.state.store import InstanceRecord, RunRecord, Store, database_path, open_all_hosts
from sidecar_fsm.view import render, top
from sidecar_fsm.view.live import scrape_all

if TYPE_CHECKING:
    from sidecar_fsm.launcher import H2PingSidecarManager

PROG = "sidecar-fsm"
LOG_DIR_ENV = "SIDECAR_FSM_LOG_DIR"

# How often ``start`` asks the supervisor whether a sidecar stopped. A signal wakes the loop at
# once (self-pipe), so this bounds only how late a crashed sidecar is noticed.
CHECK_INTERVAL_SECONDS = 0.5

# Recorded states in which an instance may have a process (configured/building never spawned
# one, stopped/failed recorded its end).
_LIVE_STATES = frozenset({"spawned", "ready", "draining"})
# States in which a proxy serves /metrics: ready, and draining, when an operator watches the
# requests in flight go down.
_SCRAPED_STATES = frozenset({"ready", "draining"})
TOP_INTERVAL_SECONDS = 2.0


class UsageError(Exception):
    """A bad argument: one line on stderr, exit 2."""


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage error as one line (``where: what; what to do``), exit 2."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message}; see {self.prog} --help")


def _log_dir(args: argparse.Namespace) -> tuple[str, bool]:
    """The log dir and whether the user chose it (flag or environment) rather than the default."""
    chosen = getattr(args, "log_dir", None) or os.environ.get(LOG_DIR_ENV)
    return (chosen, True) if chosen else (default_log_dir(), False)


def _color() -> bool:
    return sys.stdout.isatty() and "NO_COLOR" not in os.environ and os.environ.get("TERM") != "dumb"


def _out(lines: Sequence[str] | str) -> None:
    text = lines if isinstance(lines, str) else "\n".join(lines)
    print(text, flush=True)


def _err(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------ read commands


def _file_in_the_way(path: str) -> str | None:
    """The file that ``path`` is or runs through (``/notes.txt`` of ``/notes.txt/logs``); None if none."""
    current = os.path.abspath(path)
    while not os.path.exists(current):
        parent = os.path.dirname(current)
        if parent == current:
            return None
        current = parent
    return None if os.path.isdir(current) else current


@contextlib.contextmanager
def _all_stores(log_dir: str, where: str) -> Iterator[list[Store]]:
    """Every host's database under ``log_dir``, read side; a missing log dir is a lookup failure.

    A missing log dir and a missing run answer alike (exit 1, one line): both mean "nothing was
    recorded where you looked", most often a mistyped ``--log-dir``. A log dir that is, or runs
    through, a file cannot be used at all: exit 2, as for an unusable database. Opening creates
    nothing.
    """
    if not os.path.isdir(log_dir):
        blocker = _file_in_the_way(log_dir)
        if blocker is None:
            raise LookupError(
                f"{PROG} {where}: log dir '{log_dir}' does not exist; "
                f"give the --log-dir (or {LOG_DIR_ENV}) the run was started with"
            )
        # The store may name it first (UnusableStateError, exit 2); if it finds nothing, we do.
        for store in open_all_hosts(log_dir):
            store.close()
        raise UsageError(
            f"{PROG} {where}: log dir '{log_dir}': '{blocker}' is a file, not a directory; "
            "use another --log-dir"
        )
    stores = open_all_hosts(log_dir)
    try:
        yield stores
    finally:
        for store in stores:
            store.close()


def _owner(run: RunRecord) -> str:
    # Another host's pids mean nothing here: its owner can only be judged on that host.
    if run.host != host_name():
        return "other host"
    return owner_status(run)


def _process(run: RunRecord, inst: InstanceRecord) -> str | None:
    """What runs at an instance's recorded pid now, for ``render.PROCESS_*``; None: no process.

    Read-only. ``running`` only when ``procs.is_ours`` proves pid, start time and executable;
    ``reused`` when another process holds the pid; ``gone`` when nothing does. A record with no
    start time cannot prove a reuse, so a live process there counts as ours, as reap judges it.
    """
    if inst.state not in _LIVE_STATES or inst.pid is None:
        return None
    if run.host != host_name():
        return render.PROCESS_OTHER_HOST
    if inst.pid_start_time is not None:
        identity = procs.ProcessIdentity(inst.pid, inst.pid_start_time, inst.binary or None)
        if procs.is_ours(identity):
            return render.PROCESS_RUNNING
        return render.PROCESS_REUSED if procs.identity_of(inst.pid) is not None else render.PROCESS_GONE
    return render.PROCESS_RUNNING if procs.identity_of(inst.pid) is not None else render.PROCESS_GONE


def _unrecorded(run: RunRecord, instances: list[InstanceRecord]) -> dict[int, list[int]]:
    """Per instance, the pids of its live processes that no record names (``procs.find_ours``).

    Read-only. A launcher killed between a spawn and the commit of its pid leaves a sidecar
    behind a ``configured`` row (or, mid-restart, behind the pid it replaced). Only asked for a
    run whose owner is gone: a live launcher records its pids itself, and the search reads the
    whole process table.
    """
    claims = {
        inst.id: procs.Claim(inst.binary, inst.ready_path, run.started_at)
        for inst in instances
        if inst.state not in TERMINAL and inst.binary and inst.ready_path
    }
    found = procs.find_ours(list(claims.values()))
    out: dict[int, list[int]] = {}
    for inst_id, claim in claims.items():
        pids = [identity.pid for identity in found[claim.ready_path]]
        recorded = next(inst.pid for inst in instances if inst.id == inst_id)
        if [pid for pid in pids if pid != recorded]:
            out[inst_id] = [pid for pid in pids if pid != recorded]
    return out


def _observed(store: Store, run: RunRecord) -> render.RunStatus:
    instances = store.instances_of(run.run_id)
    processes = {inst.id: p for inst in instances if (p := _process(run, inst)) is not None}
    owner = _owner(run)
    unrecorded = _unrecorded(run, instances) if owner in ("dead", "reused") and run.ended_at is None else {}
    for inst_id in unrecorded:
        processes[inst_id] = render.PROCESS_RUNNING
    return render.RunStatus(
        run=run, owner=owner, instances=instances, processes=processes, unrecorded=unrecorded
    )


def _with_live(statuses: list[render.RunStatus]) -> list[render.RunStatus]:
    """``statuses`` with the ``/metrics`` of every running proxy scraped, all at once.

    Only an instance whose process ``procs`` proved ours (``PROCESS_RUNNING``, this host) is
    asked: a dead sidecar's metrics port may belong to another process by now. One deadline for
    all (``live.SCRAPE_TIMEOUT_SECONDS``); one that does not answer reads ``no answer`` and
    fails nothing. Read-only: the database is closed by then and is never written.
    """
    targets = {
        (index, inst.id): inst.metrics
        for index, status in enumerate(statuses)
        for inst in status.instances
        if inst.metrics
        and inst.state in _SCRAPED_STATES
        and status.process_of(inst) == render.PROCESS_RUNNING
    }
    scrapes = scrape_all(targets)
    return [
        dataclasses.replace(
            status, live={inst_id: scrape for (at, inst_id), scrape in scrapes.items() if at == index}
        )
        for index, status in enumerate(statuses)
    ]


def cmd_status(args: argparse.Namespace) -> int:
    log_dir, _ = _log_dir(args)
    with _all_stores(log_dir, "status") as stores:
        runs = [(store, run) for store in stores for run in store.list_runs("all")]
        runs.sort(key=lambda pair: pair[1].started_at, reverse=True)
        if args.run:
            runs = [_find_run(runs, args.run, "status --run", log_dir)]
        elif not runs:
            _out(render.empty_json("runs") if args.json else f"no runs recorded in {log_dir}")
            return 0
        elif not args.all:
            live = [pair for pair in runs if pair[1].ended_at is None]
            finished = [pair for pair in runs if pair[1].ended_at is not None]
            runs = live + finished[:1]
        statuses = [_observed(store, run) for store, run in runs]
    statuses = _with_live(statuses)
    if args.json:
        _out(render.status_json(statuses))
    else:
        _out(render.status_lines(statuses, color=_color()))
    return 0


def _top_interval(text: str) -> float:
    """``--interval``: seconds between frames, a finite number above 0."""
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise UsageError(f"{PROG} top: --interval '{text}': must be a number of seconds above 0; try 2")
    return seconds


def cmd_top(args: argparse.Namespace) -> int:
    """Live runs (or ``--run``) with their proxies' figures, redrawn every interval until Ctrl-C."""
    log_dir, _ = _log_dir(args)
    interval = _top_interval(args.interval)
    color = _color()

    def frame() -> str:
        # Reopened for every frame: a run started meanwhile may be on a host database that did
        # not exist at the previous frame. Reading creates and changes nothing.
        with _all_stores(log_dir, "top") as stores:
            if args.run:
                runs = [(store, run) for store in stores for run in store.list_runs("all")]
                runs = [_find_run(runs, args.run, "top --run", log_dir)]
            else:
                runs = [(store, run) for store in stores for run in store.list_runs("live")]
                runs.sort(key=lambda pair: pair[1].started_at, reverse=True)
            statuses = [_observed(store, run) for store, run in runs]
        lines = render.top_lines(_with_live(statuses), where=log_dir, interval=interval, color=color)
        return "\n".join(lines)

    return top.show(frame, interval)


def _find_run(
    runs: list[tuple[Store, RunRecord]], prefix: str, where: str, log_dir: str
) -> tuple[Store, RunRecord]:
    exact = [pair for pair in runs if pair[1].run_id == prefix]
    matches = exact or [pair for pair in runs if pair[1].run_id.startswith(prefix)]
    if not matches:
        raise LookupError(
            f"{PROG} {where}: run '{prefix}' is not recorded in {log_dir}; see {PROG} status --all"
        )
    if len(matches) > 1:
        names = ", ".join(render.short_run_id(pair[1].run_id) for pair in matches[:5])
        raise UsageError(
            f"{PROG} {where}: run prefix '{prefix}' matches {len(matches)} runs ({names}); give more of it"
        )
    return matches[0]


def cmd_history(args: argparse.Namespace) -> int:
    log_dir, _ = _log_dir(args)
    with _all_stores(log_dir, "history") as stores:
        runs = [(store, run) for store in stores for run in store.list_runs("all")]
        store, run = _find_run(runs, args.run, "history", log_dir)
        status = _observed(store, run)
        instances = list(status.instances)
        if args.instance is not None:
            chosen = [inst for inst in instances if inst.name == args.instance]
            if not chosen:
                names = ", ".join(inst.name for inst in instances) or "none"
                raise LookupError(
                    f"{PROG} history: instance '{args.instance}' is not in run "
                    f"{render.short_run_id(run.run_id)}; its instances: {names}"
                )
            instances = chosen
            status = render.RunStatus(run, status.owner, chosen, status.processes)
        rows = [(inst.name, t) for inst in instances for t in store.history(inst.id)]
    rows.sort(key=lambda row: (row[1].at, row[1].id))
    if args.json:
        _out(render.history_json(run, rows, status=status))
    else:
        _out(render.history_lines(run, rows, color=_color(), status=status))
    return 0


def cmd_reap(args: argparse.Namespace) -> int:
    log_dir, _ = _log_dir(args)
    if args.ray or args.ray_address:
        return _reap_ray(args, log_dir)
    # Only this host's database: a reap can signal only processes on its own host. A missing
    # database is not created: there is nothing to reap and nothing to write.
    if not database_path(log_dir).exists():
        report = ReapReport(dry_run=args.dry_run, runs=[])
    else:
        store = Store.open(log_dir)
        try:
            report = reap(store, dry_run=args.dry_run)
        finally:
            store.close()
    if args.json:
        _out(render.reap_json(report))
    else:
        _out(render.reap_lines(report, color=_color()))
    return 0


def _reap_ray(args: argparse.Namespace, log_dir: str) -> int:
    """``reap --ray``: the reap on every alive node of the Ray cluster; 1 if any node failed."""
    try:
        result = reap_cluster(log_dir, address=args.ray_address or DEFAULT_ADDRESS, dry_run=args.dry_run)
    except ClusterUnavailableError as error:
        raise UsageError(f"{PROG} {error}") from error
    if args.json:
        _out(render.cluster_reap_json(result))
    else:
        _out(render.cluster_reap_lines(result, color=_color()))
    for node in result.nodes:
        if node.error is not None:
            _err(f"{PROG} reap --ray: node {node.node_id} ({node.address}): {node.error}")
    return 1 if result.failed else 0


# ------------------------------------------------------------------------------------- build


def _cli_cache_dir(configured: Any) -> Path:
    """The build cache of ``start``, ``build`` and ``demo``: the one named, else the user's cache.

    Not ``./cache`` (the Python API's default, NeMo Gym's): a command run from another folder
    would otherwise build the proxy again there.
    """
    if configured:
        return Path(os.path.abspath(os.path.expanduser(str(configured))))
    return user_cache_dir()


def cmd_build(args: argparse.Namespace) -> int:
    cache_dir = _cli_cache_dir(args.cache_dir)
    try:
        binary = ensure_binary(cache_dir, progress=_err)
    except OSError as error:
        raise UsageError(
            f"{PROG} build: cache dir '{cache_dir}' cannot be used ({_os_reason(error)}); "
            "give a --cache-dir you can write"
        ) from error
    _out(str(binary))
    return 0


# -------------------------------------------------------------------------------------- demo


def cmd_demo(args: argparse.Namespace) -> int:
    # Imported here: the demo's lab (a TLS HTTP/2 origin) pulls cryptography and h2.
    from sidecar_fsm.demo import run_demo

    chosen, explicit = _log_dir(args)
    return run_demo(log_dir=chosen if explicit else None, cache_dir=args.cache_dir, color=_color())


# ------------------------------------------------------------------------------------- start


def _yaml_error_line(name: str, error: YAMLError) -> str:
    """``FILE:LINE:COLUMN: not valid YAML: problem (context at line L column C)``, one line.

    PyYAML's marks are 0-based; editors and compilers count from 1, so do we.
    """
    if isinstance(error, MarkedYAMLError):
        mark = error.problem_mark or error.context_mark
        where = f"{name}:{mark.line + 1}:{mark.column + 1}" if mark is not None else name
        problem = error.problem or error.context or type(error).__name__
        context = ""
        at = error.context_mark
        if error.context and error.problem and at is not None:
            context = f" ({error.context} at line {at.line + 1} column {at.column + 1})"
        return f"{where}: not valid YAML: {problem}{context}"
    first = str(error).strip().splitlines()
    return f"{name}: not valid YAML: {first[0] if first else type(error).__name__}"


def _load_config(items: Sequence[str]) -> DictConfig:
    """Merge the YAML files and ``key=value`` overrides in order, as ``gym env start`` does."""
    files = [item for item in items if "=" not in item]
    overrides = [item for item in items if "=" in item]
    if not files:
        raise UsageError(f"{PROG} start: no CONFIG.yaml given; pass at least one YAML file")
    configs = []
    for name in files:
        if not os.path.isfile(name):
            raise UsageError(f"{PROG} start: '{name}' is not a file; give a YAML config file")
        try:
            loaded = OmegaConf.load(name)
        except YAMLError as error:
            raise UsageError(f"{PROG} start: {_yaml_error_line(name, error)}; fix the file") from error
        except OmegaConfBaseException as error:
            first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise UsageError(f"{PROG} start: {name}: {first}; fix the file") from error
        except UnicodeDecodeError as error:
            raise UsageError(
                f"{PROG} start: {name}: not UTF-8 text (byte {error.start}); save it as UTF-8"
            ) from error
        except OSError as error:
            raise UsageError(
                f"{PROG} start: '{name}' cannot be read ({error.strerror or error}); check its permissions"
            ) from error
        if not isinstance(loaded, DictConfig):
            raise UsageError(f"{PROG} start: {name}: the top level is a list, not a mapping; fix the file")
        configs.append(loaded)
    try:
        configs.append(OmegaConf.from_dotlist(overrides))
        merged = OmegaConf.merge(*configs)
    except OmegaConfBaseException as error:
        first = str(error).strip().splitlines()[0]
        raise UsageError(
            f"{PROG} start: overrides {overrides} cannot be merged ({first}); use key=value"
        ) from error
    assert isinstance(merged, DictConfig)  # a merge of mappings is a mapping
    return merged


def _write_atomically(path: str, text: str) -> None:
    """Write ``text`` to ``path`` via a temp file in the same directory and a rename.

    A reader (the model servers being started next) sees either the old file or the whole new
    one, never a half-written config; the fsync makes the rename durable before we report it.
    """
    target = Path(path)
    fd, temp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)
        raise


class _Interrupted(KeyboardInterrupt):
    """SIGTERM during startup, raised as KeyboardInterrupt so the launcher cleans up first."""


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise _Interrupted(signal.Signals(signum).name)


def _config_to_write(config: DictConfig, injected_cache_dir: bool) -> str:
    """The rewritten config as YAML for ``--write-config``, with ``sidecar.enabled: false``.

    Its sidecars already run (this command supervises them), so ``gym env start --config
    OUT.yaml`` must use them through the rewritten base URLs, not start a second set. A
    ``cache_dir`` this command chose is left out: the user did not write it, and Gym reads
    that key for its own caches.
    """
    written = OmegaConf.create(OmegaConf.to_container(config, resolve=False))
    assert isinstance(written, DictConfig)
    with open_dict(written):
        written.sidecar.enabled = False
        if injected_cache_dir:
            del written[CACHE_DIR_KEY]
    return OmegaConf.to_yaml(written)


def cmd_start(args: argparse.Namespace) -> int:
    # Imported here: the launcher pulls pydantic and the supervisor, which read commands never need.
    from pydantic import ValidationError

    from sidecar_fsm.config import describe_error
    from sidecar_fsm.launcher import start_h2_ping_sidecar

    config = _load_config(args.configs)
    chosen, explicit = _log_dir(args)
    sidecar_block = config.get("sidecar")
    if not isinstance(sidecar_block, DictConfig) or not sidecar_block.get("enabled", False):
        raise UsageError(f"{PROG} start: sidecar.enabled is not true in the config; set sidecar.enabled=true")
    if args.write_config and not Path(args.write_config).resolve().parent.is_dir():
        raise UsageError(f"{PROG} start: --write-config '{args.write_config}': its directory does not exist")
    with open_dict(config):
        if explicit and sidecar_block.get("log_dir") is None:
            config.sidecar.log_dir = chosen
        inject_cache_dir = config.get(CACHE_DIR_KEY) is None
        if inject_cache_dir:
            config[CACHE_DIR_KEY] = str(_cli_cache_dir(None))

    # Until the supervision loop owns the signals, SIGTERM interrupts startup like Ctrl-C, so
    # start_h2_ping_sidecar stops whatever it already spawned before the error propagates.
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        manager = start_h2_ping_sidecar(config)
    except ValidationError as error:
        # The schema raises pydantic's error, as NeMo Gym's does; here it is bad config: exit 2.
        raise ConfigError(describe_error(error)) from None
    except KeyboardInterrupt:
        _err(f"{PROG} start: interrupted before the sidecars were ready; everything started was stopped")
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    if manager is None:  # pragma: no cover - enabled was checked above
        raise UsageError(f"{PROG} start: sidecar.enabled is not true in the config; set sidecar.enabled=true")
    return _supervise(manager, args.write_config, lambda: _config_to_write(config, inject_cache_dir))


def _started_summary(manager: H2PingSidecarManager) -> tuple[str | None, str, list[tuple[str, str, str]]]:
    """Run id, log dir and (name, bound listen, upstream and its route) per instance of a started manager.

    The route ("direct" or "via egress proxy URL", never with credentials) is what the proxy
    decides from the same environment, which the launcher passes through unchanged.
    """
    rows = [
        (i.name, i.listen, f"{i.upstream} ({egress_route(i.upstream, os.environ)})")
        for i in manager.instances_actual
    ]
    return manager.run_id, manager.log_dir, rows


def _supervise(
    manager: H2PingSidecarManager, write_config: str | None, config_text: Callable[[], str]
) -> int:
    """Watch the sidecars until SIGINT/SIGTERM or a failure, then drain them; the exit code.

    A self-pipe wakes the wait the moment a signal arrives (the handler only writes a byte), so
    a Ctrl-C is answered at once rather than after the check interval, and nothing runs inside
    the handler that could interleave badly with ``check()``.
    """
    read_fd, write_fd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    received: list[int] = []

    def on_signal(signum: int, frame: FrameType | None) -> None:
        received.append(signum)
        with contextlib.suppress(BlockingIOError):
            os.write(write_fd, b"!")

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    failed = False
    try:
        if write_config:
            _write_atomically(write_config, config_text())
        _out(render.started_lines(*_started_summary(manager)))
        if write_config:
            _out(f"wrote the rewritten config to {write_config}")
        while not received:
            try:
                manager.check()
            except SidecarError as error:
                _err(str(error))
                failed = True
                break
            with contextlib.suppress(InterruptedError):
                select.select([read_fd], [], [], CHECK_INTERVAL_SECONDS)
        if received:
            _err(f"{signal.Signals(received[0]).name}: draining the sidecars")
    except BaseException:
        failed = True
        raise
    finally:
        # Drain even when writing the config or printing failed: the sidecars must not outlive
        # this command unsupervised.
        manager.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        os.close(read_fd)
        os.close(write_fd)
    _err("stopped" if not failed else "stopped after a failure")
    return 1 if failed else 0


# -------------------------------------------------------------------------------------- exec


def cmd_exec(args: argparse.Namespace) -> int:
    """Become COMMAND with Gym's sidecar launcher redirected; returns only if it cannot be run.

    127 when COMMAND is not found, 126 when it is found but cannot be run, as a shell reports.
    """
    command = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    if not command:
        raise UsageError(f"{PROG} exec: no COMMAND given; use {PROG} exec -- COMMAND [ARG...]")
    try:
        exec_command(command, where=f"{PROG} exec")
    except ExecFailed as error:
        _err(str(error))
        return error.exit_code


# -------------------------------------------------------------------------------------- main


def _global_options(json_option: bool, json_help: str = "machine-readable output") -> argparse.ArgumentParser:
    """The options every command takes before or after its name (``status --log-dir X`` works).

    ``default=SUPPRESS``: a subcommand that does not see the option must not overwrite the value
    the main parser took before the command name with its own default.
    """
    options = argparse.ArgumentParser(add_help=False)
    options.add_argument(
        "--log-dir",
        metavar="DIR",
        default=argparse.SUPPRESS,
        help=f"where state lives (env {LOG_DIR_ENV}; default {default_log_dir()})",
    )
    if json_option:
        options.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help=json_help)
    return options


def add_command(
    sub: Any, name: str, func: Callable[[argparse.Namespace], int], help: str, *, json_option: bool = False
) -> argparse.ArgumentParser:
    """Add subcommand ``name`` run by ``func(args) -> exit code``; its parser, to add arguments to.

    Every command takes the global options (``--log-dir``, and ``--json`` when ``json_option``)
    before or after its name; ``args.json`` is then always set. One line per new command in
    ``build_parser``, and a ``cmd_<name>`` function, is all a subcommand needs.
    """
    command: argparse.ArgumentParser = sub.add_parser(name, help=help, parents=[_global_options(json_option)])
    command.set_defaults(func=func, accepts_json=json_option)
    return command


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=PROG,
        description="Launch, inspect and reap h2-ping-sidecar proxies, each a persisted state machine.",
        parents=[_global_options(True, "machine-readable output (status, history, reap)")],
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True, parser_class=_Parser)

    start = add_command(
        sub, "start", cmd_start, "start the sidecars of a Gym config and supervise them until a signal"
    )
    start.add_argument(
        "configs", nargs="+", metavar="CONFIG.yaml|key=value", help="YAML files, then overrides"
    )
    start.add_argument(
        "--write-config",
        metavar="OUT.yaml",
        help="write the rewritten config here (atomically), with sidecar.enabled: false",
    )

    status = add_command(
        sub,
        "status",
        cmd_status,
        "runs and their instances (default: live runs and the latest finished)",
        json_option=True,
    )
    status.add_argument("--run", metavar="ID", help="only this run (a unique prefix is enough)")
    status.add_argument("--all", action="store_true", help="every recorded run")

    top_ = add_command(
        sub, "top", cmd_top, "the live figures of status (in flight, PINGs, upstream), redrawn until Ctrl-C"
    )
    top_.add_argument("--run", metavar="ID", help="only this run (default: every live run)")
    top_.add_argument(
        "--interval",
        metavar="SECONDS",
        default=str(TOP_INTERVAL_SECONDS),
        help=f"seconds between frames (default {TOP_INTERVAL_SECONDS:g})",
    )

    history = add_command(
        sub, "history", cmd_history, "a run's state transitions, oldest first", json_option=True
    )
    history.add_argument("run", metavar="RUN", help="run id or a unique prefix of it")
    history.add_argument("instance", metavar="INSTANCE", nargs="?", help="only this instance")

    reap = add_command(
        sub,
        "reap",
        cmd_reap,
        "end the sidecars of runs whose launcher is gone, and close those runs",
        json_option=True,
    )
    reap.add_argument("--dry-run", action="store_true", help="print the plan, change nothing")
    reap.add_argument(
        "--ray",
        action="store_true",
        help="reap on every alive node of the Ray cluster this joins (each node its own host's database)",
    )
    reap.add_argument(
        "--ray-address",
        metavar="ADDR",
        help="the Ray cluster to join (implies --ray; default 'auto': $RAY_ADDRESS or the local cluster)",
    )

    cache_help = "build cache root (default: $XDG_CACHE_HOME/sidecar-fsm, else ~/.cache/sidecar-fsm)"
    build = add_command(
        sub, "build", cmd_build, "build (or find) the h2-ping-sidecar binary and print its path"
    )
    build.add_argument("--cache-dir", metavar="DIR", help=cache_help)

    demo = add_command(
        sub, "demo", cmd_demo, "show a long request failing directly and succeeding through a sidecar"
    )
    demo.add_argument("--cache-dir", metavar="DIR", help=cache_help)

    exec_ = add_command(
        sub,
        "exec",
        cmd_exec,
        "run COMMAND with NeMo Gym's sidecar launcher resolved to sidecar-fsm's (becomes COMMAND)",
    )
    exec_.add_argument(
        "argv", nargs=argparse.REMAINDER, metavar="[--] COMMAND [ARG...]", help="the command to become"
    )
    return parser


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    args = build_parser().parse_args(argv)
    if getattr(args, "json", False) and not args.accepts_json:
        raise UsageError(f"{PROG} {args.command}: --json does not apply to {args.command}; drop it")
    args.json = getattr(args, "json", False)
    return args


def _config_warning_line(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: TextIO | None = None,
    line: str | None = None,
) -> None:
    """Print a ``ConfigWarning`` as the one line it is; any other warning as Python would."""
    if issubclass(category, ConfigWarning):
        _err(f"{PROG}: warning: {message}")
    else:
        _show_python_warning(message, category, filename, lineno, file, line)


_show_python_warning = warnings.showwarning


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; the exit code (0 ok, 1 failure, 2 bad usage or config)."""
    # Python's default form adds the file, line and source of the warn() call: noise for a user
    # who only needs to know that an upstream's path is dropped. Restored on the way out, for a
    # caller (a test) that runs main() in its own process.
    with warnings.catch_warnings():
        warnings.showwarning = _config_warning_line
        return _run(argv)


def _run(argv: Sequence[str] | None) -> int:
    where = PROG
    try:
        args = _parse(argv)
        where = f"{PROG} {args.command}"
        return int(args.func(args))
    except UsageError as error:
        _err(_one_line(error))
        return 2
    except (ConfigError, SchemaTooNewError) as error:
        # The first line is the one-line message; a config error may add an example after it
        # (the instances YAML), which STYLE allows on later lines.
        _err(str(error).strip())
        return 2
    except LookupError as error:
        _err(_one_line(error))
        return 1
    except SidecarError as error:
        _err(str(error))
        return 1
    except OSError as error:
        # A filesystem fault no command foresaw (full disk, permissions): one line, not a trace.
        _err(f"{where}: {_os_reason(error)}")
        return 1
    except KeyboardInterrupt:
        _err(f"{PROG}: interrupted")
        return 130


def _os_reason(error: OSError) -> str:
    """``Not a directory: '/a/b'``: the reason and the path the system named, one line."""
    reason = error.strerror or type(error).__name__
    return f"{reason}: '{error.filename}'" if error.filename else reason


def _one_line(error: BaseException) -> str:
    text = str(error.args[0]) if isinstance(error, LookupError) and error.args else str(error)
    return text.strip().splitlines()[0] if text.strip() else type(error).__name__


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
