"""``gymexec`` and ``binaryflags``, pure parts: exec's environment, Go usage parsing, argv filtering."""

from __future__ import annotations

import ast
import os
from pathlib import Path

from sidecar_fsm.gymexec import BOOTSTRAP_DIR, REDIRECTED_MODULES, command_environ
from sidecar_fsm.run.binaryflags import BinaryFlags, filter_command, parse_usage


def test_the_bootstrap_redirects_exactly_the_documented_modules() -> None:
    source = (Path(BOOTSTRAP_DIR) / "sitecustomize.py").read_text()
    (aliases,) = [
        node.value
        for node in ast.parse(source).body
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "_ALIASES" for t in node.targets)
    ]
    assert ast.literal_eval(aliases) == REDIRECTED_MODULES


def test_bootstrap_goes_first_and_the_rest_of_pythonpath_is_kept_verbatim() -> None:
    assert command_environ({})["PYTHONPATH"] == BOOTSTRAP_DIR
    env = command_environ({"PYTHONPATH": f"/a{os.pathsep}{os.pathsep}/b", "HOME": "/h"})
    assert env == {"PYTHONPATH": f"{BOOTSTRAP_DIR}{os.pathsep}/a{os.pathsep}{os.pathsep}/b", "HOME": "/h"}


# Go's flag.PrintDefaults output, as Gym's proxy prints it on stderr (plus a one-letter flag).
GO_USAGE = """Usage of ./h2-ping-sidecar:
  -insecure-skip-verify
    \tskip upstream TLS verification (testing only)
  -listen string
    \tlocal HTTP/1.1 listen address (default "127.0.0.1:8080")
  -ready-file string
    \twrite this file once the listener is bound, so a supervisor can tell
    \tour listener from a port already in use
  -v\tverbose
  -n int\tcount
"""


def test_go_usage_is_parsed_into_flags_and_arity() -> None:
    flags = parse_usage("/b", GO_USAGE)
    assert flags.accepted == {"insecure-skip-verify", "listen", "ready-file", "v", "n"}
    assert flags.takes_value == {"listen", "ready-file", "n"}
    assert flags.reports_listen is False
    ours = parse_usage(
        "/b", '  -ready-file path\n    \twrite {"pid","listen"} JSON to this path once bound\n'
    )
    assert ours.reports_listen is True
    assert parse_usage("/b", "flag provided but not defined: -h\n").accepted == frozenset()


def test_filter_keeps_known_flags_with_their_values_and_drops_the_rest() -> None:
    flags = BinaryFlags("/b", frozenset({"listen", "insecure-skip-verify"}), frozenset({"listen"}), False)
    command = ["/b", "-listen", "127.0.0.1:1", "-ca-file", "/ca", "-exit-with-pid=9", "-insecure-skip-verify"]
    assert filter_command(command, flags) == ["/b", "-listen", "127.0.0.1:1", "-insecure-skip-verify"]
    assert filter_command(["/b"], flags) == ["/b"]
