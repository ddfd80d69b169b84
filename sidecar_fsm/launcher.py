"""NeMo Gym's launcher API (``nemo_gym.h2_ping_sidecar.launcher``), wired to sidecar-fsm's parts.

Owns the order of a start (``start_h2_ping_sidecar`` says it), the guarantee callers rely on, and
re-exports Gym's other names from their owners. Must not change instance state itself
(``supervise`` fires events) nor parse config values (``config`` does).
"""

from __future__ import annotations

import contextlib
import copy
import os

# Not used here: NeMo Gym's own tests choose the Go toolchain by patching launcher.shutil.which,
# which find_go reads, so the name stays where Gym's callers look for it.
import shutil  # noqa: F401
from collections.abc import Callable, MutableMapping
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from sidecar_fsm.base import trust
from sidecar_fsm.base.buildcache import (
    SIDECAR_BINARY_NAME,
    build_sidecar,
    cache_dir_of,
    choose_binary,
    default_binary_path,
)
from sidecar_fsm.base.resources import SIDECAR_SOURCE_DIR, default_log_dir
from sidecar_fsm.base.urls import redact_url, split_url
from sidecar_fsm.config import (
    H2PingSidecarConfig,
    SidecarInstanceConfig,
    h2_ping_sidecar_config_from_global_config,
    is_loopback_host,
)
from sidecar_fsm.errors import ConfigError, SidecarError
from sidecar_fsm.rewrite import RewrittenUrl, Undo, recording_undo, rewrite_base_urls, undo_writes
from sidecar_fsm.run import binaryflags, crashpoints
from sidecar_fsm.run.command import sidecar_command, sidecar_env
from sidecar_fsm.run.interrupts import interrupts_deferred
from sidecar_fsm.run.supervise import NodeSidecars

__all__ = [
    "SIDECAR_BINARY_NAME",
    "SIDECAR_SOURCE_DIR",
    "H2PingSidecarConfig",
    "H2PingSidecarManager",
    "NodeSidecars",
    "RewrittenUrl",
    "SidecarError",
    "SidecarInstanceConfig",
    "build_sidecar",
    "default_binary_path",
    "h2_ping_sidecar_config_from_global_config",
    "resolve_binary",
    "resolve_log_dir",
    "rewrite_base_urls",
    "sidecar_command",
    "sidecar_env",
    "start_h2_ping_sidecar",
]

NEMO_GYM_LOG_DIR_KEY = "nemo_gym_log_dir"


def _global_get(global_config_dict: Any, key: str) -> Any:
    if global_config_dict is None:
        return None
    try:
        return global_config_dict.get(key)
    except (AttributeError, TypeError):
        return None


def _say(line: str) -> None:
    print(f"h2-ping-sidecar {line}", flush=True)


def _progress(message: str) -> None:
    print(f"h2-ping-sidecar: {message}", flush=True)


def resolve_binary(config: H2PingSidecarConfig, global_config_dict: Any) -> Path:
    """The proxy executable: ``sidecar.binary`` (built if missing and allowed), else what
    ``buildcache.choose_binary`` picks. Raises ``SidecarError`` when there is none and none can
    be built, ``ConfigError`` when another user could replace it (checked before any build too).
    """
    if not config.binary:
        return choose_binary(
            cache_dir_of(global_config_dict), build_if_missing=config.build_if_missing, progress=_progress
        ).path
    path = Path(os.path.abspath(os.path.expanduser(config.binary)))
    if not path.exists() and config.build_if_missing:
        trust.check_binary("sidecar.binary", path)
        build_sidecar(path, progress=_progress)
    # NeMo Gym's words ("does not exist", "not executable"), one line each.
    if not path.exists():
        raise SidecarError(
            f"sidecar.binary: '{path}' does not exist; "
            "point it at a built h2-ping-sidecar or set build_if_missing: true"
        )
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise SidecarError(
            f"sidecar.binary: '{path}' is not executable; "
            "make it executable (chmod +x) or point it at a built h2-ping-sidecar"
        )
    trust.check_binary("sidecar.binary", path)
    return path


def resolve_log_dir(config: H2PingSidecarConfig, global_config_dict: Any) -> str:
    """``sidecar.log_dir``, else the global ``nemo_gym_log_dir``, else ``<tmp>/nemo_gym_h2ping-<uid>``;
    absolute, so a later ``chdir`` of the caller does not move the logs."""
    configured = config.log_dir or _global_get(global_config_dict, NEMO_GYM_LOG_DIR_KEY)
    if configured:
        return os.path.abspath(os.path.expanduser(str(configured)))
    return default_log_dir()


class H2PingSidecarManager:
    """Owns the sidecar processes of its runs: Gym starts it, polls ``check()``, calls ``stop()``.

    ``start()`` after ``stop()`` or a failed ``start()`` starts a new run (a new ``run_id``), as
    NeMo Gym's manager can; ``instances_actual`` gives the bound addresses once started.
    """

    def __init__(
        self,
        config: H2PingSidecarConfig,
        instances: list[SidecarInstanceConfig],
        binary: Path,
        log_dir: str,
    ) -> None:
        self.config = config
        self.instances = list(instances)
        self._binary = str(binary)
        self._log_dir = log_dir
        self._sidecars: NodeSidecars | None = None
        self.run_id: str | None = None

    @property
    def log_dir(self) -> str:
        return self._log_dir

    @property
    def instances_actual(self) -> list[SidecarInstanceConfig]:
        if self._sidecars is None:
            return list(self.instances)
        return self._sidecars.instances_actual

    @property
    def routes(self) -> dict[str, str | None]:
        """Each instance's upstream route as its proxy said it ("direct", "via egress proxy URL");
        None for a binary that does not say (NeMo Gym's); empty before ``start()``."""
        return {} if self._sidecars is None else self._sidecars.routes

    def start(self) -> None:
        """Start every instance as a new run and await them together; on a failure nothing is left running."""
        if self._sidecars is not None and self._sidecars.running:
            raise SidecarError(f"run {self.run_id}: already running; call stop() first")
        sidecars = NodeSidecars(
            self.config, self.instances, self._binary, self._log_dir, flags=self._binary_flags()
        )
        self._sidecars = sidecars
        self.run_id = sidecars.run_id
        # notify also says the "listening on" lines, as soon as the proxies are ready (before
        # the upstream check's wait). NodeSidecars.start() stops its children before any
        # exception leaves it.
        sidecars.notify = _say
        sidecars.start()
        for line in sidecars.upstream_verdicts:
            _say(line)

    def _binary_flags(self) -> binaryflags.BinaryFlags | None:
        """What a user-named binary accepts (asked once per file); None for ours. A manager built
        directly by a caller is judged here too, so Gym's binary never gets a flag it would exit on."""
        if not self.config.binary:
            return None
        flags, _ = binaryflags.check(self._binary, self.config, self.instances)
        return flags

    def check(self) -> None:
        """Raise ``SidecarError`` if any sidecar stopped. Called from Gym's poll loop."""
        if self._sidecars is not None:
            self._sidecars.check()

    def stop(self, hurry: Callable[[], bool] | None = None) -> None:
        """SIGTERM every sidecar (it drains), SIGKILL after grace + slack; idempotent. ``hurry`` (the
        CLI's second Ctrl-C) returning True sends a second SIGTERM, which ends a drain at once."""
        if self._sidecars is not None:
            self._sidecars.stop(hurry)


def _check_readable_file(field: str, value: str | None) -> None:
    if not value:
        return
    path = os.path.expanduser(value)
    if not (os.path.isfile(path) and os.access(path, os.R_OK)):
        raise ConfigError(
            f"{field}: '{value}' is not a readable file; give the PEM file of the upstream's CA"
        )


def _url_listens(
    configured: list[SidecarInstanceConfig], bound: list[SidecarInstanceConfig]
) -> list[SidecarInstanceConfig]:
    """The instances as the rewritten URLs name them: the bound port, and for a listen off
    loopback the host the user wrote (``0.0.0.0:21350`` stays ``0.0.0.0``, as NeMo Gym writes
    it, not the ``[::]`` the kernel reports for a wildcard bind). A loopback listen keeps the
    bound address: ``localhost`` may resolve to an address the proxy did not bind."""
    written = {instance.name: instance for instance in configured}
    urls = []
    for instance in bound:
        mine = written.get(instance.name)
        if mine is not None and not is_loopback_host(mine.listen_host):
            host = mine.listen.rpartition(":")[0]
            instance = instance.model_copy(update={"listen": f"{host}:{instance.listen_port}"})
        urls.append(instance)
    return urls


def _not_routed_warnings(instances: list[SidecarInstanceConfig], changes: list[RewrittenUrl]) -> list[str]:
    """One warning per instance no model base_url was pointed at, by name, even when another
    instance is routed: a sidecar nothing calls protects nothing."""
    # The address each new URL names, without the userinfo a client authenticates with.
    routed = {split_url(change.new).netloc.rpartition("@")[2] for change in changes}
    lines = []
    for instance in instances:
        if instance.listen in routed:
            continue
        lines.append(
            f"WARNING: h2-ping-sidecar '{instance.name}' is running but no model base_url points at its "
            f"upstream ({instance.upstream}), so nothing is routed through it; only *base_url keys of "
            "servers under <top-level>.responses_api_models are rewritten"
        )
    return lines


def start_h2_ping_sidecar(global_config_dict: DictConfig | dict[str, Any]) -> H2PingSidecarManager | None:
    """Start the sidecars when ``sidecar.enabled`` and point model base URLs at them, in place.

    Returns the manager to poll and stop, or None when disabled. Order, which is the guarantee:
    1. every check with no side effect (the block, a dry-run rewrite, ``ca_file``, the binary and
       its flags): a failure here starts nothing and leaves ``global_config_dict`` as it was;
    2. start every instance and await them together;
    3. rewrite ``global_config_dict`` with the bound addresses, print each change, and warn by
       name for each instance no base_url points at.
    Once a process exists, any exception or ``KeyboardInterrupt`` stops every sidecar of this run
    before it propagates; SIGINT cannot cut step 3 in half, and one after it puts back its writes.
    """
    if not isinstance(global_config_dict, MutableMapping):
        raise TypeError(
            "start_h2_ping_sidecar: global_config_dict must be a DictConfig or a dict, "
            f"not {type(global_config_dict).__name__}"
        )
    config = h2_ping_sidecar_config_from_global_config(global_config_dict)
    if not config.enabled:
        return None
    instances = list(config.instances)
    if config.rewrite_base_urls:
        # The same rewrite on a throwaway copy, before a process exists: an unparseable model
        # base_url fails here, with the caller's config untouched (NeMo Gym's order, and its
        # tests count the calls).
        rewrite_base_urls(copy.deepcopy(global_config_dict), instances)
    _check_readable_file("sidecar.ca_file", config.ca_file)
    for instance in instances:
        # Accepted with NeMo Gym's warning, as Gym accepts it, so one config runs on both;
        # allow_non_loopback (ours) says it is meant and silences it.
        if not config.allow_non_loopback and not is_loopback_host(instance.listen_host):
            print(
                f"WARNING: h2-ping-sidecar instance '{instance.name}' listens on {instance.listen}, which is "
                "not a loopback address: the proxy has no authentication, so anything that can reach it "
                f"can send requests, with its own credentials, to {instance.upstream}; use 127.0.0.1, or "
                "set sidecar.allow_non_loopback: true if this is meant",
                flush=True,
            )
    binary = resolve_binary(config, global_config_dict)
    if config.binary:
        # A user-named binary may be NeMo Gym's, which lacks some of our flags: refuse what it
        # cannot honour now, with nothing started. Ours (the build cache's, or a copy of it:
        # binaryflags knows it by its stamp) has every flag and is not asked.
        _, notes = binaryflags.check(binary, config, instances)
        for note in notes:
            print(note, flush=True)
    log_dir = resolve_log_dir(config, global_config_dict)
    crashpoints.hit("binary-resolved")

    manager = H2PingSidecarManager(config, instances, binary, log_dir)
    undo: list[Undo] = []
    try:
        manager.start()
        if config.rewrite_base_urls:
            # In memory and short, but a KeyboardInterrupt in the middle would leave the
            # caller's config half rewritten: SIGINT waits until it is done, and is then
            # handled by the except below like any other interrupt, which puts it back.
            targets = _url_listens(instances, manager.instances_actual)
            with interrupts_deferred(), recording_undo(undo):
                changes = rewrite_base_urls(global_config_dict, targets)
            crashpoints.hit("rewritten")
            for change in changes:
                # Base URLs may carry credentials (userinfo, ?api-key=): never print them.
                old, new = redact_url(change.old), redact_url(change.new)
                print(f"h2-ping-sidecar: {change.location}: {old} -> {new}", flush=True)
            for warning in _not_routed_warnings(targets, changes):
                print(warning, flush=True)
        crashpoints.hit("started")
        # Returned from inside the try: an interrupt up to here is handled below; Python checks
        # for signals after the call returns, in the caller, which owns the manager by then.
        return manager
    except BaseException:
        # The original error is the one to report; stop() has ended the processes even if it
        # then complains that a state write failed.
        try:
            with contextlib.suppress(Exception):
                manager.stop()
        finally:
            # Its sidecars are gone: the caller's config must not point at them.
            with interrupts_deferred():
                undo_writes(undo)
        raise
