"""``sidecar-fsm probe UPSTREAM``: does this path drop idle connections, and do PINGs keep them open?

Runs the proxy's ``-probe`` mode (``run.probe``) and prints what it reports, with progress on a
terminal so a probe of 400 s does not look hung. The verdict and the exit code are the probe's
own: 0 the sidecar helps or is not needed, 1 it cannot help or the upstream could not be probed,
3 inconclusive. ``--header`` values go to the probe on its stdin, never printed or stored.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from typing import TYPE_CHECKING, Any

from sidecar_fsm.cli.common import PROG, UsageError, add_command, err, out, seconds_option

# The layers are imported where used: every command builds this parser (cli/common says why).
if TYPE_CHECKING:
    from sidecar_fsm.run.probe import ProbeRequest

DEFAULT_FOR = "400s"  # just past Global Accelerator's 340 s
_MAX_PING_INTERVAL = 340.0
# An HTTP field name (RFC 9110 token).
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")


def _headers(values: list[str]) -> list[tuple[str, str]]:
    """``Name: value`` pairs; a malformed one is refused naming only its name part."""
    headers = []
    for raw in values:
        name, sep, value = raw.partition(":")
        if not sep or not _HEADER_NAME.fullmatch(name.strip()) or "\n" in value or "\r" in value:
            shown = name.strip()[:40] if sep else "(no ':')"
            raise UsageError(f"{PROG} probe: --header '{shown}: ...' must be 'Name: value'")
        headers.append((name.strip(), value.strip()))
    return headers


def request_of(args: argparse.Namespace) -> ProbeRequest:
    """The probe asked for, every argument checked (``UsageError``, exit 2)."""
    from sidecar_fsm.base.urls import normalize_upstream, without_userinfo
    from sidecar_fsm.run.probe import ProbeRequest

    try:
        upstream = normalize_upstream(args.upstream)
    except ValueError as error:
        raise UsageError(f"{PROG} probe: UPSTREAM '{without_userinfo(args.upstream)}' {error}") from None
    for_s = seconds_option("probe", "--for", args.for_, DEFAULT_FOR, go_duration=True)
    # Without --ping-interval the probe picks 60s or a quarter of --for, whichever is shorter.
    interval = (
        0.0
        if args.ping_interval is None
        else seconds_option("probe", "--ping-interval", args.ping_interval, "60s", go_duration=True)
    )
    if args.ping_interval is not None and not 0 < interval < _MAX_PING_INTERVAL:
        raise UsageError(
            f"{PROG} probe: --ping-interval '{args.ping_interval}' must be above 0 and below 340s; try 60s"
        )
    if for_s <= interval:
        raise UsageError(
            f"{PROG} probe: --for '{args.for_}' must be longer than --ping-interval '{args.ping_interval}', "
            "so that a PING is sent"
        )
    if args.ca_file and not (os.path.isfile(args.ca_file) and os.access(args.ca_file, os.R_OK)):
        raise UsageError(
            f"{PROG} probe: --ca-file '{args.ca_file}' is not a readable file; give the CA's PEM file"
        )
    if args.request is not None and not args.request.startswith("/"):
        raise UsageError(
            f"{PROG} probe: --request '{args.request}' must be a path starting with /, e.g. /v1/slow"
        )
    if args.header and args.request is None:
        raise UsageError(f"{PROG} probe: --header is sent with --request only; add --request PATH")
    return ProbeRequest(
        upstream,
        args.for_,
        args.ping_interval,
        os.path.abspath(args.ca_file) if args.ca_file else None,
        args.insecure_skip_verify,
        args.request,
        _headers(args.header),
    )


def cmd_probe(args: argparse.Namespace) -> int:
    from sidecar_fsm.base.buildcache import ensure_binary, user_cache_dir
    from sidecar_fsm.run.probe import ProbeEnded, probe_events
    from sidecar_fsm.view import probe_report

    request = request_of(args)
    binary = ensure_binary(user_cache_dir(), progress=err)
    progress = sys.stderr.isatty()
    result: dict[str, Any] | None = None
    drawn = False
    try:
        for event in probe_events(str(binary), request):
            kind = event.get("event")
            if kind == "start" and not args.json:
                out(probe_report.start_line(event))
            elif kind == "progress" and progress:
                sys.stderr.write("\r\033[K" + probe_report.progress_line(event))
                sys.stderr.flush()
                drawn = True
            elif kind == "error":
                route = f" ({event['route']})" if event.get("route") else ""
                err(f"{PROG} probe: {event.get('upstream')}{route}: {event.get('error')}")
                return 1
            elif kind == "result":
                result = event
    except ProbeEnded as ended:
        err(f"{PROG} probe: {ended}")
        return 2 if ended.exit_code == 2 else 1
    finally:
        if drawn:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()
    if result is None:
        err(f"{PROG} probe: the probe ended without a result")
        return 1
    if args.json:
        out(json.dumps(probe_report.json_document(result), indent=2))
    else:
        out(probe_report.report_lines(result))
    return int(result.get("exit_code", 1))


def register(sub: Any) -> None:
    probe = add_command(
        sub,
        "probe",
        cmd_probe,
        "does this path drop idle HTTP/2 connections, and do PINGs keep them open? (no config, no run)",
        example='sidecar-fsm probe https://api.example.com --request /v1/slow -H "Authorization: $AUTH"',
        json_option=True,
    )
    probe.add_argument(
        "upstream", metavar="UPSTREAM", help="https://host[:port], as in an instance's upstream"
    )
    probe.add_argument(
        "--for",
        dest="for_",
        metavar="DURATION",
        default=DEFAULT_FOR,
        help=f"watch the connections this long, or until both are closed (default {DEFAULT_FOR})",
    )
    probe.add_argument(
        "--ping-interval",
        metavar="D",
        help="PING the second connection this often (default 60s, as the sidecar, or a quarter of --for)",
    )
    probe.add_argument("--ca-file", metavar="F", help="extra PEM roots for the upstream (as sidecar.ca_file)")
    probe.add_argument(
        "--insecure-skip-verify", action="store_true", help="skip certificate verification (tests only)"
    )
    probe.add_argument(
        "--request",
        metavar="PATH",
        help="also GET PATH (an endpoint known to be slow) on the PINGed connection: a response timeout",
    )
    probe.add_argument(
        "-H",
        "--header",
        action="append",
        default=[],
        metavar="'Name: value'",
        help="a header for --request (repeatable); values are never printed or stored",
    )
