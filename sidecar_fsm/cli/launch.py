"""The commands that start things: ``start``, ``exec``, ``build``, ``demo`` and ``lab``.

``start`` is ``gym env start``'s sidecar step standalone: it supervises the sidecars in the
foreground until a signal or a failure, then drains them.
"""

from __future__ import annotations

import argparse
import os
import shlex
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sidecar_fsm.cli.common import (
    PROG,
    UsageError,
    add_command,
    all_stores,
    color,
    err,
    every_run,
    log_dir_of,
    os_reason,
    out,
)
from sidecar_fsm.errors import ConfigError, SidecarError

# The layers are imported inside each cmd_ function: ``--help`` never loads them (cli/common).

# ``lab``'s default idle limit: long enough to type a request, short enough to watch it bite.
LAB_IDLE_SECONDS = 20.0
# ``start``'s example override (``configfile.OVERRIDE_EXAMPLE``, held equal by a test), here so
# that building the parser does not load OmegaConf.
OVERRIDE_EXAMPLE = "sidecar.instances.0.upstream=https://api.example.com"

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from sidecar_fsm.launcher import H2PingSidecarManager
    from sidecar_fsm.run.foreground import Signals


def _cli_cache_dir(configured: Any) -> Path:
    """The build cache of ``start``, ``build`` and ``demo``: the one named, else the user's cache.

    Not ``./cache`` (the Python API's default, NeMo Gym's): a command run from another folder
    would otherwise build the proxy again there.
    """
    from sidecar_fsm.base.buildcache import user_cache_dir

    if configured:
        return Path(os.path.abspath(os.path.expanduser(str(configured))))
    return user_cache_dir()


def cmd_build(args: argparse.Namespace) -> int:
    from sidecar_fsm.base.buildcache import choose_binary

    cache_dir = _cli_cache_dir(args.cache_dir)
    try:
        choice = choose_binary(cache_dir, progress=err)
    except OSError as error:
        raise UsageError(
            f"{PROG} build: cache dir '{cache_dir}' cannot be used ({os_reason(error)}); "
            "give a --cache-dir you can write"
        ) from error
    # Which binary and why on stderr; stdout stays the bare path, for $(sidecar-fsm build).
    err(f"{PROG} build: {choice.why}")
    out(str(choice.path))
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from sidecar_fsm.demo import run_demo

    chosen, explicit = log_dir_of(args)
    return run_demo(log_dir=chosen if explicit else None, cache_dir=args.cache_dir, color=color())


def cmd_start(args: argparse.Namespace) -> int:
    from omegaconf import DictConfig, open_dict
    from pydantic import ValidationError

    from sidecar_fsm.base.buildcache import CACHE_DIR_KEY
    from sidecar_fsm.config import describe_error, h2_ping_sidecar_config_from_global_config, misspelled_block
    from sidecar_fsm.configfile import load_config
    from sidecar_fsm.launcher import start_h2_ping_sidecar
    from sidecar_fsm.run.foreground import catching_stop_signals

    config = load_config(args.configs, f"{PROG} start")
    chosen, explicit = log_dir_of(args)
    sidecar_block = config.get("sidecar")
    misspelled = misspelled_block(config)
    if misspelled is not None:
        raise UsageError(f"{PROG} start: '{misspelled}': top-level key not read; did you mean 'sidecar'?")
    if isinstance(sidecar_block, DictConfig) and not sidecar_block.get("enabled", False):
        try:  # a misspelled key inside the block ("enabeld") is the likelier mistake: name it
            h2_ping_sidecar_config_from_global_config(config)
        except ValidationError as error:
            raise ConfigError(describe_error(error)) from None
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

    # One handler from here to the last drain: while start_h2_ping_sidecar runs, SIGINT and
    # SIGTERM raise there (it stops whatever it spawned before the error propagates); once it
    # has returned they are recorded, and the foreground wait drains at once.
    with catching_stop_signals(raise_in=start_h2_ping_sidecar.__code__) as signals:
        try:
            manager = start_h2_ping_sidecar(config)
        except ValidationError as error:
            # The schema raises pydantic's error, as NeMo Gym's does; here it is bad config: exit 2.
            raise ConfigError(describe_error(error)) from None
        except KeyboardInterrupt:
            err(f"{PROG} start: interrupted before the sidecars were ready; everything started was stopped")
            return 130
        signals.raise_in = None
        assert manager is not None  # enabled was checked above
        return _run_in_foreground(manager, signals, args.write_config, inject_cache_dir, config)


def _run_in_foreground(
    manager: H2PingSidecarManager,
    signals: Signals,
    write_config: str | None,
    inject_cache_dir: bool,
    config: DictConfig,
) -> int:
    """Print what started, watch the sidecars until a signal or a failure, drain; the exit code."""
    from sidecar_fsm.base.buildcache import CACHE_DIR_KEY
    from sidecar_fsm.configfile import config_to_write, write_atomically
    from sidecar_fsm.run.foreground import watch_until_signal
    from sidecar_fsm.view import render

    failed = False
    hurried: list[str] = []

    def hurry() -> bool:
        # Asked by stop() while it awaits the drains, in the main thread: never in a handler.
        if len(signals.received) > 1 and not hurried:
            hurried.append(signals.received[1].name)
            err(f"{hurried[0]} again: stopping now; the proxies end their drain, closing what is in flight")
        return bool(hurried)

    try:
        if write_config:
            kept = [CACHE_DIR_KEY] if inject_cache_dir else []
            write_atomically(write_config, config_to_write(config, kept))
        # The route ("direct" or "via egress proxy URL", never with credentials) is the
        # proxy's own word, from its ready file; a binary that gives none (Gym's) gets none.
        routes = manager.routes
        instances = [
            (
                inst.name,
                inst.listen,
                inst.upstream if (route := routes.get(inst.name)) is None else f"{inst.upstream} ({route})",
            )
            for inst in manager.instances_actual
        ]
        out(render.started_lines(manager.run_id, manager.log_dir, instances))
        if write_config:
            out(f"wrote the rewritten config to {write_config}")
        error = watch_until_signal(manager.check, signals)
        if error is not None:
            err(str(error))
            failed = True
        else:
            err("\n".join(_draining_lines(manager, signals.received[0].name)))
    except BaseException:
        failed = True
        raise
    finally:
        # Drain even when writing the config or printing failed: the sidecars must not
        # outlive this command unsupervised.
        manager.stop(hurry)
    err("stopped after a failure" if failed else "stopped now (drain cut short)" if hurried else "stopped")
    return 1 if failed else 0


def cmd_lab(args: argparse.Namespace) -> int:
    """The lab origin behind the idle relay, in the foreground until Ctrl-C or SIGTERM."""
    from sidecar_fsm.configfile import EXAMPLE_CONFIG, write_atomically
    from sidecar_fsm.lab import IdleRelay, TlsH2Origin
    from sidecar_fsm.run.foreground import catching_stop_signals
    from sidecar_fsm.view import render

    try:
        idle = float(args.idle)
    except ValueError:
        idle = -1.0
    if not (0 < idle < float("inf")):
        raise UsageError(f"{PROG} lab: --idle '{args.idle}' must be a number of seconds above 0; try 20")
    with (
        catching_stop_signals() as signals,
        tempfile.TemporaryDirectory(prefix="sidecar-fsm-lab-") as scratch,
    ):
        origin = TlsH2Origin(pings=args.pings).start()
        try:
            relay = IdleRelay("127.0.0.1", origin.port, idle=idle).start()
            try:
                upstream = f"https://localhost:{relay.port}"
                config = Path(scratch) / "gym.yaml"
                write_atomically(str(config), EXAMPLE_CONFIG)
                out(
                    render.lab_lines(
                        upstream,
                        str(origin.ca_file),
                        idle,
                        origin.url,
                        _lab_start_line(config, upstream, str(origin.ca_file), idle),
                        f"curl -sS 'http://{_EXAMPLE_LISTEN}/slow?first_byte={2 * idle:g}'",
                    )
                )
                while not signals.received:
                    signals.wait(3600)
            finally:
                relay.stop()
        finally:
            origin.stop()
    err(f"{signals.received[0].name}: lab stopped")
    return 0


# The example config's listen, where the lab's printed request goes.
_EXAMPLE_LISTEN = "127.0.0.1:1250"


def _lab_start_line(config: Path, upstream: str, ca_file: str, idle: float) -> str:
    """A ``start`` of the example config that works against the lab as printed: a ping interval
    below the relay's idle limit (the example's 60s would get the request a 502), and the model's
    base_url pointed at the upstream, so it is rewritten to the sidecar rather than warned about."""
    from sidecar_fsm.configfile import EXAMPLE_MODEL_BASE_URL

    ping = min(idle / 4, 60.0)
    overrides = [
        f"sidecar.ca_file={ca_file}",
        f"sidecar.instances.0.upstream={upstream}",
        f"sidecar.ping_interval={ping:g}s",
        f"{EXAMPLE_MODEL_BASE_URL}={upstream}/v1",
    ]
    return shlex.join([PROG, "start", str(config), *overrides])


def _draining_lines(manager: H2PingSidecarManager, signal_name: str) -> list[str]:
    """What the drain waits for, per instance (its requests in flight, scraped now), and how
    long at most; just the first line when the figures cannot be read (the drain goes on)."""
    from sidecar_fsm.view import status, upkeep_report

    grace = float(manager.config.shutdown_grace_seconds)
    try:
        with all_stores(manager.log_dir, "start") as stores:
            found = [(s, r) for s, r in every_run(stores) if r.run_id == manager.run_id]
            observed = [status.observe(store, run) for store, run in found]
        (run_status,) = status.with_live(observed)
    except (SidecarError, OSError, LookupError, ValueError):
        return [f"{signal_name}: draining the sidecars, up to {grace:g}s"]
    live = [(inst.name, run_status.live_of(inst)) for inst in run_status.instances if inst.state == "ready"]
    return upkeep_report.draining_lines(live, grace, signal_name)


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
        err(str(error))
        return error.exit_code
    return 0  # pragma: no cover - exec_command replaces this process or raises


def register(sub: Any) -> None:
    start = add_command(
        sub,
        "start",
        cmd_start,
        "start the sidecars of a Gym config and supervise them until a signal",
        example=f"sidecar-fsm start gym.yaml {OVERRIDE_EXAMPLE} 'policy_model.tags=[a,b]'",
    )
    start.add_argument(
        "configs",
        nargs="+",
        metavar="CONFIG.yaml|key=value",
        help="YAML files, then OmegaConf dotlist overrides (a.b=x; list items a.0.b=x or a[0].b=x; "
        "YAML values such as [1,2])",
    )
    start.add_argument(
        "--write-config",
        metavar="OUT.yaml",
        help="write the rewritten config here (atomically), with sidecar.enabled: false",
    )

    for name, func, summary, example in (
        (
            "build",
            cmd_build,
            "build (or find) the h2-ping-sidecar binary and print its path",
            " --cache-dir ~/.cache/sidecar-fsm",
        ),
        ("demo", cmd_demo, "show a long request failing directly and succeeding through a sidecar", ""),
    ):
        # Both build the proxy, so both take the cache to build it in.
        add_command(sub, name, func, summary, example=f"sidecar-fsm {name}{example}").add_argument(
            "--cache-dir",
            metavar="DIR",
            help="build cache root (default: $XDG_CACHE_HOME/sidecar-fsm, else ~/.cache/sidecar-fsm)",
        )

    exec_ = add_command(
        sub,
        "exec",
        cmd_exec,
        "run COMMAND with NeMo Gym's sidecar launcher resolved to sidecar-fsm's (becomes COMMAND)",
        example="sidecar-fsm exec -- gym env start --config gym.yaml",
    )
    exec_.add_argument(
        "argv", nargs=argparse.REMAINDER, metavar="[--] COMMAND [ARG...]", help="the command to become"
    )

    lab = add_command(
        sub,
        "lab",
        cmd_lab,
        "run a local TLS HTTP/2 origin behind an idle-dropping relay, to try start with no endpoint",
        example="sidecar-fsm lab --idle 20",
    )
    lab.add_argument(
        "--idle",
        metavar="SECONDS",
        default=str(LAB_IDLE_SECONDS),
        help=f"the relay drops connections silent this long (default {LAB_IDLE_SECONDS:g}; "
        "Global Accelerator: 340)",
    )
    lab.add_argument(
        "--pings",
        # lab.origin.PINGS_POLICIES, spelled out: importing the lab here would load h2 and
        # cryptography for every command (TlsH2Origin refuses any other value anyway).
        choices=("answer", "ignore", "goaway"),
        default="answer",
        help="how the origin meets PINGs: answer them (default), ignore them (as a path that does not "
        "carry them) or goaway (ENHANCE_YOUR_CALM, as a server refusing frequent PINGs)",
    )
