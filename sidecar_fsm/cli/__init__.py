"""The ``sidecar-fsm`` command: the parser and every outcome's exit code.

0 success, 1 a failure (a missing log dir or run included), 2 bad usage or config, always with
a one-line message on stderr, never a traceback. The commands live in one module per group,
each of which parses, calls and prints, and decides nothing itself. A new subcommand is a
``cmd_<name>(args) -> exit code`` function and an ``add_command`` call in its group's ``register``.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import signal
import sys
import warnings
from collections.abc import Sequence
from typing import NoReturn, TextIO

from sidecar_fsm.cli import launch, probe, query, show, upkeep
from sidecar_fsm.cli.common import PROG, Parser, UsageError, err, global_options, os_reason
from sidecar_fsm.errors import ConfigError, ConfigWarning, SchemaTooNewError, SidecarError

__all__ = ["build_parser", "main", "run"]


def build_parser() -> Parser:
    parser = Parser(
        prog=PROG,
        description="Launch, inspect and reap h2-ping-sidecar proxies, each a persisted state machine.",
        parents=[global_options(False)],
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True, parser_class=Parser)
    for group in (launch, show, upkeep, query, probe):
        group.register(sub)
    # Named from the commands as registered, so the help never lags behind one that gains --json.
    takes_json = [name for name, command in sub.choices.items() if command.get_default("accepts_json")]
    parser.add_argument(
        "--json",
        action="store_true",
        default=argparse.SUPPRESS,
        help=f"machine-readable output ({', '.join(takes_json)})",
    )
    return parser


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
        err(f"{PROG}: warning: {message}")
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
        try:
            return _run(argv)
        except BrokenPipeError:
            return _closed_pipe()


def run() -> NoReturn:
    """The ``sidecar-fsm`` script and ``python -m sidecar_fsm``: ``main()``, then exit at once."""
    code = main()
    # Python's last garbage collection walks every object of the ~600 modules a command
    # imports: 0.3-0.7 s on a loaded 2-core machine, which a Ctrl-C or SIGTERM would wait for
    # after everything was stopped. Frozen objects are not walked (exit in about 0.03 s).
    gc.freeze()
    sys.exit(code)


def _closed_pipe() -> int:
    """The reader of stdout went away (``status | head``): quiet, as ``cat`` is, exit 141.

    stdout goes to /dev/null, or the final flush would print "Exception ignored ... BrokenPipeError".
    """
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    return 128 + signal.SIGPIPE


def _run(argv: Sequence[str] | None) -> int:
    where = PROG
    try:
        args = build_parser().parse_args(argv)
        if getattr(args, "json", False) and not args.accepts_json:
            raise UsageError(f"{PROG} {args.command}: --json does not apply to {args.command}; drop it")
        args.json = getattr(args, "json", False)
        where = f"{PROG} {args.command}"
        return int(args.func(args))
    except UsageError as error:
        err(_one_line(error))
        return 2
    except (ConfigError, SchemaTooNewError) as error:
        # The first line is the one-line message; a config error may add an example after it
        # (the instances YAML), which STYLE allows on later lines.
        err(str(error).strip())
        return 2
    except LookupError as error:
        err(_one_line(error))
        return 1
    except SidecarError as error:
        err(str(error))
        return 1
    except BrokenPipeError:
        raise  # the reader of stdout left: main() ends quietly
    except OSError as error:
        # A filesystem fault no command foresaw (full disk, permissions): one line, not a trace.
        err(f"{where}: {os_reason(error)}")
        return 1
    except KeyboardInterrupt:
        err(f"{PROG}: interrupted")
        return 130


def _one_line(error: BaseException) -> str:
    text = str(error.args[0]) if isinstance(error, LookupError) and error.args else str(error)
    return text.strip().splitlines()[0] if text.strip() else type(error).__name__


if __name__ == "__main__":  # pragma: no cover
    run()
