"""The ``sidecar-fsm`` command: arguments, subcommands and exit codes.

Owns parsing the command line, choosing the log dir, opening the right databases, calling the
module that does the work (launcher, store, reap, buildcache, demo) and mapping the outcome to
an exit code: 0 success, 1 a failure, 2 bad usage or config (``ConfigError``,
``SchemaTooNewError``, a bad argument), always with a one-line message on stderr. Must not
format output (``render`` does), speak SQL (``store``), change state (``fsm``) or signal a
process (``procs``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import select
import signal
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, NoReturn

from sidecar_fsm import render
from sidecar_fsm.errors import ConfigError, SchemaTooNewError, SidecarError
from sidecar_fsm.hostname import host_name
from sidecar_fsm.resources import default_log_dir

if TYPE_CHECKING:
    from sidecar_fsm.launcher import H2PingSidecarManager

PROG = "sidecar-fsm"
LOG_DIR_ENV = "SIDECAR_FSM_LOG_DIR"

# How often ``start`` asks the supervisor whether a sidecar stopped. A signal wakes the loop at
# once (self-pipe), so this bounds only how late a crashed sidecar is noticed.
CHECK_INTERVAL_SECONDS = 0.5


class UsageError(Exception):
    """A bad argument: one line on stderr, exit 2."""


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage error as one line (``where: what; what to do``), exit 2."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message}; see {self.prog} --help")


def _log_dir(args: argparse.Namespace) -> tuple[str, bool]:
    """The log dir and whether the user chose it (flag or environment) rather than the default."""
    chosen = args.log_dir or os.environ.get(LOG_DIR_ENV)
    return (chosen, True) if chosen else (default_log_dir(), False)


def _color() -> bool:
    return sys.stdout.isatty() and "NO_COLOR" not in os.environ and os.environ.get("TERM") != "dumb"


def _out(lines: Sequence[str] | str) -> None:
    text = lines if isinstance(lines, str) else "\n".join(lines)
    print(text, flush=True)


def _err(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------ read commands


@contextlib.contextmanager
def _all_stores(log_dir: str) -> Iterator[list[Any]]:
    from sidecar_fsm.store import open_all_hosts

    stores = open_all_hosts(log_dir)
    try:
        yield stores
    finally:
        for store in stores:
            store.close()


def _no_state(log_dir: str, as_json: bool, kind: str) -> int:
    if as_json:
        _out(render.empty_json(kind))
    else:
        _out(f"no runs recorded in {log_dir}")
    return 0


def _owner(run: Any) -> str:
    from sidecar_fsm.reap import owner_status

    # Another host's pids mean nothing here: its owner can only be judged on that host.
    if run.host != host_name():
        return "other host"
    return owner_status(run)


def cmd_status(args: argparse.Namespace) -> int:
    log_dir, _ = _log_dir(args)
    with _all_stores(log_dir) as stores:
        runs = [(store, run) for store in stores for run in store.list_runs("all")]
        if not runs:
            return _no_state(log_dir, args.json, "runs")
        runs.sort(key=lambda pair: pair[1].started_at, reverse=True)
        if args.run:
            runs = [_find_run(runs, args.run, "status --run")]
        elif not args.all:
            live = [pair for pair in runs if pair[1].ended_at is None]
            finished = [pair for pair in runs if pair[1].ended_at is not None]
            runs = live + finished[:1]
        statuses = [
            render.RunStatus(run=run, owner=_owner(run), instances=store.instances_of(run.run_id))
            for store, run in runs
        ]
    if args.json:
        _out(render.status_json(statuses))
    else:
        _out(render.status_lines(statuses, color=_color()))
    return 0


def _find_run(runs: list[tuple[Any, Any]], prefix: str, where: str) -> tuple[Any, Any]:
    exact = [pair for pair in runs if pair[1].run_id == prefix]
    matches = exact or [pair for pair in runs if pair[1].run_id.startswith(prefix)]
    if not matches:
        raise LookupError(f"{PROG} {where}: run '{prefix}' is not recorded; see {PROG} status --all")
    if len(matches) > 1:
        names = ", ".join(render.short_run_id(pair[1].run_id) for pair in matches[:5])
        raise UsageError(
            f"{PROG} {where}: run prefix '{prefix}' matches {len(matches)} runs ({names}); give more of it"
        )
    return matches[0]


def cmd_history(args: argparse.Namespace) -> int:
    log_dir, _ = _log_dir(args)
    with _all_stores(log_dir) as stores:
        runs = [(store, run) for store in stores for run in store.list_runs("all")]
        if not runs:
            return _no_state(log_dir, args.json, "transitions")
        store, run = _find_run(runs, args.run, "history")
        instances = store.instances_of(run.run_id)
        if args.instance is not None:
            chosen = [inst for inst in instances if inst.name == args.instance]
            if not chosen:
                names = ", ".join(inst.name for inst in instances) or "none"
                raise LookupError(
                    f"{PROG} history: instance '{args.instance}' is not in run "
                    f"{render.short_run_id(run.run_id)}; its instances: {names}"
                )
            instances = chosen
        rows = [(inst.name, t) for inst in instances for t in store.history(inst.id)]
    rows.sort(key=lambda row: (row[1].at, row[1].id))
    if args.json:
        _out(render.history_json(run, rows))
    else:
        _out(render.history_lines(run, rows, color=_color()))
    return 0


def cmd_reap(args: argparse.Namespace) -> int:
    from sidecar_fsm.reap import ReapReport, reap
    from sidecar_fsm.store import Store, database_path

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
    from sidecar_fsm.cluster import DEFAULT_ADDRESS, ClusterUnavailableError, reap_cluster

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


def cmd_build(args: argparse.Namespace) -> int:
    from sidecar_fsm.buildcache import cache_dir_of, ensure_binary

    cache_dir = cache_dir_of({"cache_dir": args.cache_dir} if args.cache_dir else {})
    binary = ensure_binary(Path(cache_dir), progress=_err)
    _out(str(binary))
    return 0


# -------------------------------------------------------------------------------------- demo


def cmd_demo(args: argparse.Namespace) -> int:
    from sidecar_fsm.demo import run_demo

    chosen, explicit = _log_dir(args)
    return run_demo(log_dir=chosen if explicit else None, cache_dir=args.cache_dir, color=_color())


# ------------------------------------------------------------------------------------- start


def _load_config(items: Sequence[str]) -> Any:
    """Merge the YAML files and ``key=value`` overrides in order, as ``gym env start`` does."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException
    from yaml import YAMLError

    files = [item for item in items if "=" not in item]
    overrides = [item for item in items if "=" in item]
    if not files:
        raise UsageError(f"{PROG} start: no CONFIG.yaml given; pass at least one YAML file")
    configs = []
    for name in files:
        if not os.path.isfile(name):
            raise UsageError(f"{PROG} start: '{name}' is not a file; give a YAML config file")
        try:
            configs.append(OmegaConf.load(name))
        except (YAMLError, OmegaConfBaseException) as error:
            first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise UsageError(f"{PROG} start: '{name}' is not valid YAML ({first}); fix the file") from error
    try:
        configs.append(OmegaConf.from_dotlist(overrides))
        return OmegaConf.merge(*configs)
    except OmegaConfBaseException as error:
        first = str(error).strip().splitlines()[0]
        raise UsageError(
            f"{PROG} start: overrides {overrides} cannot be merged ({first}); use key=value"
        ) from error


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


def cmd_start(args: argparse.Namespace) -> int:
    from omegaconf import OmegaConf, open_dict

    from sidecar_fsm.launcher import start_h2_ping_sidecar

    config = _load_config(args.configs)
    chosen, explicit = _log_dir(args)
    sidecar_block = config.get("sidecar") if hasattr(config, "get") else None
    if sidecar_block is None or not sidecar_block.get("enabled", False):
        raise UsageError(f"{PROG} start: sidecar.enabled is not true in the config; set sidecar.enabled=true")
    if explicit and sidecar_block.get("log_dir") is None:
        with open_dict(config):
            config.sidecar.log_dir = chosen
    if args.write_config and not Path(args.write_config).resolve().parent.is_dir():
        raise UsageError(f"{PROG} start: --write-config '{args.write_config}': its directory does not exist")

    # Until the supervision loop owns the signals, SIGTERM interrupts startup like Ctrl-C, so
    # start_h2_ping_sidecar stops whatever it already spawned before the error propagates.
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        manager = start_h2_ping_sidecar(config)
    except KeyboardInterrupt:
        _err(f"{PROG} start: interrupted before the sidecars were ready; everything started was stopped")
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    if manager is None:  # pragma: no cover - enabled was checked above
        raise UsageError(f"{PROG} start: sidecar.enabled is not true in the config; set sidecar.enabled=true")
    return _supervise(manager, config, args.write_config, OmegaConf.to_yaml)


def _started_summary(manager: H2PingSidecarManager) -> tuple[str | None, str, list[tuple[str, str, str]]]:
    """Run id, log dir and (name, bound listen, upstream) per instance of a started manager."""
    instances = manager.instances_actual
    return manager.run_id, manager.log_dir, [(inst.name, inst.listen, inst.upstream) for inst in instances]


def _supervise(manager: H2PingSidecarManager, config: Any, write_config: str | None, to_yaml: Any) -> int:
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
            _write_atomically(write_config, to_yaml(config))
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
    from sidecar_fsm.gymexec import ExecFailed, exec_command

    command = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    if not command:
        raise UsageError(f"{PROG} exec: no COMMAND given; use {PROG} exec -- COMMAND [ARG...]")
    try:
        exec_command(command, where=f"{PROG} exec")
    except ExecFailed as error:
        _err(str(error))
        return error.exit_code


# -------------------------------------------------------------------------------------- main


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=PROG,
        description="Launch, inspect and reap h2-ping-sidecar proxies, each a persisted state machine.",
    )
    parser.add_argument(
        "--log-dir",
        metavar="DIR",
        help=f"where state lives (env {LOG_DIR_ENV}; default {default_log_dir()})",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    start = sub.add_parser(
        "start", help="start the sidecars of a Gym config and supervise them until a signal"
    )
    start.add_argument(
        "configs", nargs="+", metavar="CONFIG.yaml|key=value", help="YAML files, then overrides"
    )
    start.add_argument(
        "--write-config", metavar="OUT.yaml", help="write the rewritten config here (atomically)"
    )
    start.set_defaults(func=cmd_start)

    status = sub.add_parser(
        "status", help="runs and their instances (default: live runs and the latest finished)"
    )
    status.add_argument("--run", metavar="ID", help="only this run (a unique prefix is enough)")
    status.add_argument("--all", action="store_true", help="every recorded run")
    status.add_argument("--json", action="store_true", help="machine-readable output")
    status.set_defaults(func=cmd_status)

    history = sub.add_parser("history", help="a run's state transitions, oldest first")
    history.add_argument("run", metavar="RUN", help="run id or a unique prefix of it")
    history.add_argument("instance", metavar="INSTANCE", nargs="?", help="only this instance")
    history.add_argument("--json", action="store_true", help="machine-readable output")
    history.set_defaults(func=cmd_history)

    reap = sub.add_parser(
        "reap", help="end the sidecars of runs whose launcher is gone, and close those runs"
    )
    reap.add_argument("--dry-run", action="store_true", help="print the plan, change nothing")
    reap.add_argument("--json", action="store_true", help="machine-readable output")
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
    reap.set_defaults(func=cmd_reap)

    build = sub.add_parser("build", help="build (or find) the h2-ping-sidecar binary and print its path")
    build.add_argument("--cache-dir", metavar="DIR", help="build cache root (default: ./cache)")
    build.set_defaults(func=cmd_build)

    demo = sub.add_parser(
        "demo", help="show a long request failing directly and succeeding through a sidecar"
    )
    demo.add_argument("--cache-dir", metavar="DIR", help="build cache root (default: ./cache)")
    demo.set_defaults(func=cmd_demo)

    exec_ = sub.add_parser(
        "exec",
        help="run COMMAND with NeMo Gym's sidecar launcher resolved to sidecar-fsm's (becomes COMMAND)",
    )
    exec_.add_argument(
        "argv", nargs=argparse.REMAINDER, metavar="[--] COMMAND [ARG...]", help="the command to become"
    )
    exec_.set_defaults(func=cmd_exec)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; the exit code (0 ok, 1 failure, 2 bad usage or config)."""
    try:
        args = build_parser().parse_args(argv)
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
    except KeyboardInterrupt:
        _err(f"{PROG}: interrupted")
        return 130


def _one_line(error: BaseException) -> str:
    text = str(error.args[0]) if isinstance(error, LookupError) and error.args else str(error)
    return text.strip().splitlines()[0] if text.strip() else type(error).__name__


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
