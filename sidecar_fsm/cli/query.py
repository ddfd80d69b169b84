"""The ``query`` command: one read-only SELECT over every host's database, as a table, JSON or CSV.

All the SQL, and the refusal of writes, live in ``state.query``: a refused statement is bad
usage (exit 2), a statement past its deadline a failure (exit 1).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import signal
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from sidecar_fsm.cli.common import (
    PROG,
    UsageError,
    add_command,
    log_dir_of,
    out,
    require_log_dir,
    seconds_option,
    warn_if_untrusted,
)
from sidecar_fsm.view import cells

if TYPE_CHECKING:
    from sidecar_fsm.state import query

# ``--timeout``'s default, as ``state.query`` has it (a test holds the two equal): the parser is
# built for ``--help`` too, which must not load the query layer (cli/common says why).
DEFAULT_TIMEOUT_SECONDS = 10.0
# The views, as ``state.query.VIEWS`` names them (the same test holds the two equal).
VIEWS = ("run_summary", "instance_summary", "transition_log", "spawn_attempts", "traffic_summary")


def cmd_query(args: argparse.Namespace) -> int:
    from sidecar_fsm.state import query

    log_dir, _ = log_dir_of(args)
    timeout = seconds_option("query", "--timeout", args.timeout, "10")
    if args.json and args.csv:
        raise UsageError(f"{PROG} query: --json and --csv both given; choose one")
    require_log_dir(log_dir, "query")
    warn_if_untrusted(log_dir, "query")
    try:
        with _ctrl_c_cancels() as cancel:
            result = query.run_query(log_dir, args.sql, hosts=args.host or (), timeout=timeout, cancel=cancel)
    except LookupError as missing:
        raise LookupError(f"{PROG} query: {missing.args[0]}") from None
    except query.QueryRefused as refused:
        raise UsageError(f"{PROG} query: {refused}") from None
    except query.QueryTimeout as late:
        raise query.QueryTimeout(f"{PROG} query: {late}") from None
    if args.json:
        out(_json(result))
    elif args.csv:
        out(_csv(result).rstrip("\r\n"))
    else:
        out(cells.table(result.columns, ([_cell(value) for value in row] for row in result.rows)))
    return 0


@contextlib.contextmanager
def _ctrl_c_cancels() -> Iterator[threading.Event]:
    """An event SIGINT sets, instead of raising KeyboardInterrupt wherever Python happens to be.

    The statement spends its time inside SQLite, whose callbacks (the authorizer, the progress
    handler) are Python: a KeyboardInterrupt raised in one is swallowed by sqlite3 and comes
    back as a SQL error ("access to ... is prohibited"). The query checks the event instead and
    raises KeyboardInterrupt itself (exit 130). Outside the main thread nothing is installed.
    """
    cancel = threading.Event()
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:  # nohup, a script's `&`: it stays so
        yield cancel
        return
    try:
        previous = signal.signal(signal.SIGINT, lambda _signum, _frame: cancel.set())
    except ValueError:  # not the main thread: signals are not ours to handle
        yield cancel
        return
    try:
        yield cancel
    finally:
        signal.signal(signal.SIGINT, previous)


def _cell(value: Any) -> str:
    """A value as a table cell: NULL as ``-``, a float to 3 decimals, a multi-line text's first
    line and ``...``."""
    if value is None:
        return cells.UNKNOWN
    if isinstance(value, float):
        # Under a millisecond, three significant digits: 0.00049 s must not read as 0.0.
        return f"{value:.3g}" if 0 < abs(value) < 0.001 else str(round(value, 3))
    if isinstance(value, bytes):
        return f"<{len(value)} bytes>"
    text = str(value)
    first = cells.first_line(text) or ""
    return first + " ..." if first != text.strip() else first


def _json(result: query.QueryResult) -> str:
    """``{"columns": [...], "rows": [{column: value}], "hosts": [...]}``; a blob as hex."""
    rows = [
        {
            column: value.hex() if isinstance(value, bytes) else value
            for column, value in zip(result.columns, row, strict=True)
        }
        for row in result.rows
    ]
    return cells.dumps({"columns": result.columns, "rows": rows, "hosts": result.hosts})


def _csv(result: query.QueryResult) -> str:
    import csv  # only --csv needs it

    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(result.columns)
    writer.writerows(result.rows)
    return buffer.getvalue()


def register(sub: Any) -> None:
    command = add_command(
        sub,
        "query",
        cmd_query,
        f"one read-only SELECT over every host's database (views: {', '.join(VIEWS)}; "
        "their columns: SELECT * FROM pragma_table_info('run_summary'))",
        example=(
            'sidecar-fsm query "SELECT upstream, reason, count(*) AS failures FROM instance_summary '
            "WHERE state = 'failed' GROUP BY upstream, reason\""
        ),
        json_option=True,
    )
    command.add_argument("sql", metavar="SQL", help="one SELECT (or WITH ... SELECT); writes are refused")
    command.add_argument("--csv", action="store_true", help="comma-separated values, a header row first")
    command.add_argument(
        "--host",
        metavar="H",
        action="append",
        help="only this host's database (repeatable; default: every host in the log dir)",
    )
    command.add_argument(
        "--timeout",
        metavar="SECONDS",
        default=str(DEFAULT_TIMEOUT_SECONDS),
        help=f"interrupt the statement after this long (default {DEFAULT_TIMEOUT_SECONDS:g})",
    )
