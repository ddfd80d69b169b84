"""``gymexec`` and ``binaryflags``, pure parts: exec's environment, reading -describe, argv filtering."""

from __future__ import annotations

import ast
import json
import os
from pathlib import Path

from sidecar_fsm.gymexec import BOOTSTRAP_DIR, REDIRECTED_MODULES, command_environ
from sidecar_fsm.run.binaryflags import BinaryFlags, filter_command, from_description


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


def test_a_description_gives_the_flags_their_arity_and_the_ready_files_keys() -> None:
    text = json.dumps(
        {
            "flags": [
                {"name": "listen", "type": "host:port"},
                {"name": "insecure-skip-verify", "type": "bool"},
            ],
            "ready_file": ["pid", "listen"],
        }
    )
    flags = from_description("/b", text)
    assert flags == BinaryFlags(
        "/b", frozenset({"listen", "insecure-skip-verify"}), frozenset({"listen"}), True, described=True
    )
    assert from_description("/b", json.dumps({"flags": [], "ready_file": ["pid"]})).reports_listen is False  # type: ignore[union-attr]
    for not_one in ("", "flag provided but not defined: -describe", "[]", '{"flags": 1}'):
        assert from_description("/b", not_one) is None


def test_filter_keeps_known_flags_with_their_values_and_drops_the_rest() -> None:
    flags = BinaryFlags("/b", frozenset({"listen", "insecure-skip-verify"}), frozenset({"listen"}), False)
    command = ["/b", "-listen", "127.0.0.1:1", "-ca-file", "/ca", "-exit-with-pid=9", "-insecure-skip-verify"]
    assert filter_command(command, flags) == ["/b", "-listen", "127.0.0.1:1", "-insecure-skip-verify"]
    assert filter_command(["/b"], flags) == ["/b"]
    # An unknown flag followed by another flag is a boolean: it takes nothing along.
    command = ["/b", "-nvcf-follow", "-listen", "x", "-nvcf-budget", "60m"]
    assert filter_command(command, flags) == ["/b", "-listen", "x"]
