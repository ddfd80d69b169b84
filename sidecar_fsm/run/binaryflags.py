"""Which flags a proxy binary accepts, and what follows for the argv and the config.

A ``sidecar.binary`` built from NeMo Gym's sources knows only ``GYM_FLAGS``, exits 2 on any
other flag before it binds, and writes a bare PID into its ready file (so a ``:0`` listen's port
is never learned). The launcher passes only what the binary knows and refuses, before anything
starts, the settings it cannot honour. A binary with the build cache's stamp for these sources
is ours and never asked; any other is asked ``-describe`` (go/describe.go) under a timeout, the
answer remembered per file identity. One with no ``-describe`` (Gym's) is taken to accept Gym's
flags, all Gym's launcher ever passed it. Runs no process but that short-lived ``-describe``.
"""

from __future__ import annotations

import json
import mmap
import os
import subprocess
import threading
from collections.abc import Sequence
from dataclasses import dataclass

from sidecar_fsm.base.buildcache import sources_hash
from sidecar_fsm.config import H2PingSidecarConfig, SidecarInstanceConfig, parse_duration_seconds
from sidecar_fsm.errors import ConfigError, SidecarError

__all__ = [
    "GYM_FLAGS",
    "BinaryFlags",
    "binary_flags",
    "check",
    "filter_command",
    "forget",
    "from_description",
    "refusals",
    "warnings",
]

# A Go binary answers in milliseconds; a slow disk or a loaded node can take seconds. Longer than
# this and the "binary" is not a flag-parsing proxy (or it is hung): say so.
DESCRIBE_TIMEOUT_SECONDS = 10.0

# Flags of our proxy that take no value, so that dropping one never takes the next token along.
_NO_VALUE_FLAGS = frozenset({"insecure-skip-verify"})

# Without these the binary cannot be started, supervised or awaited at all.
_REQUIRED_FLAGS = ("listen", "upstream", "ready-file")

_USE_OURS = "or leave sidecar.binary unset to use sidecar-fsm's proxy"

# NeMo Gym's proxy's flags: what a binary without -describe is given.
GYM_FLAGS = frozenset(
    ("listen", "upstream", "ping-interval", "ping-timeout", "shutdown-grace", "retry-body-limit")
    + ("max-conn-age", "ready-file", "insecure-skip-verify")
)


@dataclass(frozen=True)
class BinaryFlags:
    """The flags a binary accepts (names without the dash), the subset that takes a value, and
    whether its ready file names the bound address (a ``listen`` key; Gym's holds a bare PID)."""

    path: str
    accepted: frozenset[str]
    takes_value: frozenset[str]
    reports_listen: bool
    # It answered -describe, so its exit codes are ours (a taken address: 3 or 4).
    described: bool = False


def from_description(path: str, text: str) -> BinaryFlags | None:
    """The flags ``-describe``'s JSON ``text`` lists; None when it is not such a document. Pure."""
    try:
        described = json.loads(text)
        flags = {entry["name"]: entry["type"] for entry in described["flags"]}
        ready_keys = set(described["ready_file"])
    except (ValueError, TypeError, KeyError):
        return None
    return BinaryFlags(
        path,
        frozenset(flags),
        frozenset(name for name, kind in flags.items() if kind != "bool"),
        reports_listen="listen" in ready_keys,
        described=True,
    )


_lock = threading.Lock()
# None: our own proxy (stamped), which is passed the whole command.
_cache: dict[tuple[str, int, int, int, int], BinaryFlags | None] = {}


def binary_flags(binary: str | os.PathLike[str]) -> BinaryFlags | None:
    """The flags ``binary`` accepts, None for our own proxy; remembered while the file (path,
    device, inode, size, mtime) is unchanged. Failures are not remembered: a timeout on a loaded
    node may pass. Thread-safe. Raises ``SidecarError`` when it cannot be run or does not answer.
    """
    path = os.path.abspath(os.fspath(binary))
    try:
        st = os.stat(path)
    except OSError as error:
        raise SidecarError(
            f"'{path}': cannot read it ({error.strerror}); point sidecar.binary at a built h2-ping-sidecar"
        ) from None
    key = (path, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    with _lock:
        if key in _cache:
            return _cache[key]
    flags = None if _is_ours(path) else _ask(path)
    with _lock:
        _cache[key] = flags
    return flags


def _is_ours(path: str) -> bool:
    """Whether ``path`` holds the build cache's stamp for these sources (mapped: a few ms for
    11 MB; runs nothing). A file that cannot be read is not ours: asking it then says why."""
    try:
        stamp = sources_hash().encode()
        with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
            return data.find(stamp) != -1
    except (OSError, ValueError, SidecarError):  # ValueError: an empty file cannot be mapped
        return False


def forget() -> None:
    """Drop every remembered answer (tests; a long-lived process that wants to re-ask)."""
    with _lock:
        _cache.clear()


def _ask(path: str) -> BinaryFlags:
    try:
        # Own session: a terminal's Ctrl-C during the ask goes to the launcher, which decides.
        result = subprocess.run(
            [path, "-describe"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=DESCRIBE_TIMEOUT_SECONDS,
            start_new_session=True,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise SidecarError(
            f"'{path}': no answer to -describe within {DESCRIBE_TIMEOUT_SECONDS:g}s, so its flags are "
            "unknown; point sidecar.binary at a built h2-ping-sidecar"
        ) from None
    except OSError as error:
        raise SidecarError(
            f"'{path}': cannot be run ({error.strerror}); point sidecar.binary at a built h2-ping-sidecar"
        ) from None
    described = (
        from_description(path, result.stdout.decode("utf-8", errors="replace"))
        if result.returncode == 0
        else None
    )
    return described or BinaryFlags(path, GYM_FLAGS, GYM_FLAGS - _NO_VALUE_FLAGS, reports_listen=False)


def filter_command(command: Sequence[str], flags: BinaryFlags) -> list[str]:
    """``command`` (``sidecar_command``'s argv) without the flags ``flags`` does not accept. Pure.

    A dropped flag takes its value with it, unless followed by another flag (a boolean). Which
    settings may be dropped is for :func:`refusals` and :func:`warnings`, checked first.
    """
    kept = [command[0]]
    index = 1
    while index < len(command):
        token = command[index]
        index += 1
        if not token.startswith("-"):
            kept.append(token)  # not ours to judge: positional arguments pass through
            continue
        name, has_inline_value = token.lstrip("-").split("=", 1)[0], "=" in token
        value: list[str] = []
        known = name in flags.accepted
        if known:
            takes_value = name in flags.takes_value
        else:  # arity unknown: a value, unless a boolean of ours or followed by another flag
            follows = command[index] if index < len(command) else ""
            takes_value = name not in _NO_VALUE_FLAGS and not follows.startswith("-")
        if takes_value and not has_inline_value and index < len(command):
            value = [command[index]]
            index += 1
        if known:
            kept += [token, *value]
    return kept


def refusals(
    config: H2PingSidecarConfig, instances: Sequence[SidecarInstanceConfig], flags: BinaryFlags
) -> list[str]:
    """One line per setting ``flags``' binary cannot honour (bad config: exit 2); pure.

    Dropping ``-ca-file`` would fail every request's certificate check hours later, dropping
    ``-access-log`` would silently lose the log asked for. The traffic file and log rotation
    flags are dropped without a word: no figures, and the log grows as NeMo Gym's always did.
    """
    lines = [
        f"sidecar.binary: '{flags.path}' has no -{name} flag, so it is not an h2-ping-sidecar; "
        f"point it at a built h2-ping-sidecar {_USE_OURS}"
        for name in _REQUIRED_FLAGS
        if name not in flags.accepted
    ]
    if not flags.reports_listen:
        for index, instance in enumerate(instances):
            if instance.listen_port == 0:
                lines.append(
                    f"sidecar.instances[{index}].listen: '{instance.listen}' picks a free port, but "
                    f"'{flags.path}' writes only its pid to the ready file, so the port it bound "
                    f"cannot be learned; give a fixed port {_USE_OURS}"
                )
    if config.ca_file and "ca-file" not in flags.accepted:
        lines.append(
            f"sidecar.ca_file: '{config.ca_file}' cannot be passed to '{flags.path}', which has no "
            f"-ca-file flag; add the CA to the system roots and drop ca_file, {_USE_OURS}"
        )
    if config.access_log and "access-log" not in flags.accepted:
        lines.append(
            f"sidecar.access_log: 'true' cannot be passed to '{flags.path}', which has no -access-log "
            f"flag; drop access_log, {_USE_OURS}"
        )
    if "metrics-listen" not in flags.accepted:
        # Without -metrics-listen there is no /metrics to fix and no verdict to wait for.
        for index, instance in enumerate(instances):
            if config.metrics and instance.metrics_listen:
                lines.append(
                    f"sidecar.instances[{index}].metrics_listen: '{instance.metrics_listen}' cannot be "
                    f"passed to '{flags.path}', which has no -metrics-listen flag; drop it {_USE_OURS}"
                )
        if config.upstream_check == "fail":
            lines.append(
                f"sidecar.upstream_check: 'fail' needs the upstream check's verdict, which '{flags.path}' "
                f"cannot give (no -metrics-listen flag); set upstream_check: warn {_USE_OURS}"
            )
    return lines


def warnings(config: H2PingSidecarConfig, flags: BinaryFlags) -> list[str]:
    """One line per setting that will be dropped with a visible cost; pure, print them and go on."""
    lines = []
    if "nvcf-follow" not in flags.accepted:
        lines.append(
            f"WARNING: sidecar.binary '{flags.path}' has no -nvcf-follow (a NeMo Gym build): "
            "NVCF 202s pass through to the client"
        )
    if config.exit_with_owner and "exit-with-pid" not in flags.accepted:
        lines.append(
            f"WARNING: sidecar.binary '{flags.path}' has no -exit-with-pid, so a sidecar whose "
            "launcher is killed keeps running: only `sidecar-fsm reap` ends an orphan"
        )
    if "max-conn-age" not in flags.accepted and parse_duration_seconds(config.max_conn_age) > 0:
        lines.append(
            f"WARNING: sidecar.max_conn_age '{config.max_conn_age}' is ignored: sidecar.binary "
            f"'{flags.path}' has no -max-conn-age, so upstream connections are never rotated"
        )
    return lines


def check(
    binary: str | os.PathLike[str], config: H2PingSidecarConfig, instances: Sequence[SidecarInstanceConfig]
) -> tuple[BinaryFlags | None, list[str]]:
    """Learn ``binary``'s flags and judge ``config`` against them: (flags, warnings to print).

    The launcher's one call, before any process starts; flags None is our own proxy, which has
    nothing to refuse or warn about. Raises ``ConfigError`` with every refusal, one per line;
    ``SidecarError`` when the binary cannot be asked.
    """
    flags = binary_flags(binary)
    if flags is None:
        return None, []
    refused = refusals(config, instances, flags)
    if refused:
        raise ConfigError("\n".join(refused))
    return flags, warnings(config, flags)
