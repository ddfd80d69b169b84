"""What every ``sidecar-fsm`` command shares: the log dir, output, usage errors, finding a run.

Every command's parser is built on each start, ``--help`` included, so this module and the
command modules import at their top only what building the parser needs; a command imports its
layers inside its ``cmd_`` function (tests/unit/test_cli_imports.py holds ``--help`` to that).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Literal, NoReturn

from sidecar_fsm.base import trust
from sidecar_fsm.base.gosyntax import duration_seconds
from sidecar_fsm.base.resources import command_hint, default_log_dir
from sidecar_fsm.view import cells

if TYPE_CHECKING:
    from sidecar_fsm.state.store import InstanceRecord, RunRecord, Store

PROG = "sidecar-fsm"
LOG_DIR_ENV = "SIDECAR_FSM_LOG_DIR"


class UsageError(Exception):
    """A bad argument: one line on stderr, exit 2."""


class Parser(argparse.ArgumentParser):
    """argparse that reports a usage error as one line (``where: what; what to do``), exit 2."""

    # Options whose value may start with "-" (``prune --older-than -1d``): argparse would take
    # such a value for an unknown option and say "expected one argument", hiding the real
    # problem with the value, which the command then reports itself.
    dash_values: frozenset[str] = frozenset()

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message}; see {self.prog} --help")

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        if self.dash_values:
            args = _joined_dash_values(list(sys.argv[1:] if args is None else args), self.dash_values)
        return super().parse_known_args(args, namespace)


def _joined_dash_values(args: list[str], options: frozenset[str]) -> list[str]:
    """``[--older-than, -1d]`` as ``[--older-than=-1d]``; stops at ``--``, which ends options."""
    joined: list[str] = []
    index = 0
    while index < len(args):
        arg = args[index]
        if arg == "--":
            return joined + args[index:]
        value = args[index + 1] if index + 1 < len(args) else ""
        if arg in options and value.startswith("-") and not value.startswith("--"):
            joined.append(f"{arg}={value}")
            index += 2
            continue
        joined.append(arg)
        index += 1
    return joined


def log_dir_of(args: argparse.Namespace) -> tuple[str, bool]:
    """The log dir and whether the user chose it (flag or environment) rather than the default."""
    chosen = getattr(args, "log_dir", None) or os.environ.get(LOG_DIR_ENV)
    return (chosen, True) if chosen else (default_log_dir(), False)


def color() -> bool:
    return sys.stdout.isatty() and "NO_COLOR" not in os.environ and os.environ.get("TERM") != "dumb"


def out(lines: Sequence[str] | str) -> None:
    text = lines if isinstance(lines, str) else "\n".join(lines)
    print(text, flush=True)


def err(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def os_reason(error: OSError) -> str:
    """``Not a directory: '/a/b'``: the reason and the path the system named, one line."""
    reason = error.strerror or type(error).__name__
    return f"{reason}: '{error.filename}'" if error.filename else reason


def _file_in_the_way(path: str) -> str | None:
    """The file that ``path`` is or runs through (``/notes.txt`` of ``/notes.txt/logs``); None if none."""
    current = os.path.abspath(path)
    while not os.path.exists(current):
        parent = os.path.dirname(current)
        if parent == current:
            return None
        current = parent
    return None if os.path.isdir(current) else current


_warned: set[str] = set()


def warn_if_untrusted(log_dir: str, where: str) -> None:
    """Reads go on in a log dir others can write (inspecting it is the point), with one warning
    per process (``top`` reopens it every frame); writers refuse it (``trust``)."""
    from sidecar_fsm.state.store import DB_DIR_NAME

    problem = trust.log_dir_problem(log_dir, os.path.join(log_dir, DB_DIR_NAME))
    if problem is not None and log_dir not in _warned:
        _warned.add(log_dir)
        err(f"{PROG} {where}: warning: {problem}")


def require_log_dir(log_dir: str, where: str) -> None:
    """Raise unless ``log_dir`` is a directory: ``LookupError`` (exit 1) when nothing is there,
    as for a missing run (most often a forgotten ``--log-dir``, never "nothing to do"), and
    ``UsageError`` (exit 2) when it is, or runs through, a file. Creates nothing.
    """
    if os.path.isdir(log_dir):
        return
    blocker = _file_in_the_way(log_dir)
    if blocker is None:
        raise LookupError(
            f"{PROG} {where}: log dir '{log_dir}' does not exist; "
            f"give the --log-dir (or {LOG_DIR_ENV}) the run was started with"
        )
    raise UsageError(
        f"{PROG} {where}: log dir '{log_dir}': '{blocker}' is a file, not a directory; use another --log-dir"
    )


@contextlib.contextmanager
def all_stores(log_dir: str, where: str) -> Iterator[list[Store]]:
    """Every host's database under ``log_dir``, read side, past ``require_log_dir``. Creates nothing."""
    require_log_dir(log_dir, where)
    from sidecar_fsm.state.store import open_all_hosts

    warn_if_untrusted(log_dir, where)
    stores = open_all_hosts(log_dir)
    try:
        yield stores
    finally:
        for store in stores:
            store.close()


def every_run(
    stores: Sequence[Store], which: Literal["live", "all"] = "all"
) -> list[tuple[Store, RunRecord]]:
    """Each recorded run (``which``: ``all`` or ``live``) with the store it lives in."""
    return [(store, run) for store in stores for run in store.list_runs(which)]


def find_run(
    runs: list[tuple[Store, RunRecord]], prefix: str, where: str, log_dir: str
) -> tuple[Store, RunRecord]:
    """The one run whose id is ``prefix`` or starts with it; a lookup or usage error otherwise."""
    exact = [pair for pair in runs if pair[1].run_id == prefix]
    matches = exact or [pair for pair in runs if pair[1].run_id.startswith(prefix)]
    if not matches:
        raise LookupError(
            f"{PROG} {where}: run '{prefix}' is not recorded in {log_dir}; "
            f"see {command_hint('status --all', log_dir)}"
        )
    if len(matches) > 1:
        names = ", ".join(cells.short_run_id(pair[1].run_id) for pair in matches[:5])
        raise UsageError(
            f"{PROG} {where}: run prefix '{prefix}' matches {len(matches)} runs ({names}); give more of it"
        )
    return matches[0]


def global_options(json_option: bool, json_help: str = "machine-readable output") -> argparse.ArgumentParser:
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
    sub: Any,
    name: str,
    func: Callable[[argparse.Namespace], int],
    help: str,
    *,
    example: str,
    json_option: bool = False,
) -> argparse.ArgumentParser:
    """Add subcommand ``name`` run by ``func(args) -> exit code``; its parser, to add arguments to.

    Every command takes ``--json`` too, so ``top --json`` and ``--json top`` meet the same check
    in ``main`` (``--json`` does not apply) rather than two different errors.
    """
    command: argparse.ArgumentParser = sub.add_parser(
        name,
        help=help,
        description=help,
        epilog=f"example:\n  {example}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        parents=[global_options(True, "machine-readable output" if json_option else argparse.SUPPRESS)],
    )
    command.set_defaults(func=func, accepts_json=json_option)
    return command


def ray_options(command: argparse.ArgumentParser, ray_help: str) -> None:
    """``--ray`` and ``--ray-address``: ``status`` and ``reap`` reach a Ray cluster alike."""
    command.add_argument("--ray", action="store_true", help=ray_help)
    command.add_argument(
        "--ray-address",
        metavar="ADDR",
        help="the Ray cluster to join (implies --ray; default 'auto': $RAY_ADDRESS or the local cluster)",
    )


def only_instance(
    instances: Sequence[InstanceRecord], name: str | None, where: str, run_id: str
) -> list[InstanceRecord]:
    """``instances``, or only the one called ``name`` when given; a lookup error naming the
    run's instances when none is."""
    if name is None:
        return list(instances)
    chosen = [inst for inst in instances if inst.name == name]
    if not chosen:
        known = ", ".join(inst.name for inst in instances) or "none"
        raise LookupError(
            f"{PROG} {where}: instance '{name}' is not in run {cells.short_run_id(run_id)}; "
            f"its instances: {known}"
        )
    return chosen


def seconds_option(command: str, option: str, text: str, example: str, go_duration: bool = False) -> float:
    """``option``'s value in seconds: a number above 0, or with ``go_duration`` a Go duration
    (``400s``, as the proxy takes it); a usage error naming the option and the value otherwise."""
    where = f"{PROG} {command}: {option} '{text}'"
    if go_duration:
        try:
            return duration_seconds(text, example)
        except ValueError as error:
            raise UsageError(f"{where} {error}") from None
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise UsageError(f"{where}: must be a number of seconds above 0; try {example}")
    return seconds
