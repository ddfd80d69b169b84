"""What a sidecar is started with: its command line and environment, and the run row's summary of them.

Owns ``sidecar_command`` and ``sidecar_env`` (importable from ``sidecar_fsm.launcher`` too, as
NeMo Gym's launcher exports them) and ``config_summary`` (credential-free, for the database).
Must not start anything, open files or read the config's source: it turns a validated
``H2PingSidecarConfig`` into argv, environment and a summary, nothing more.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from sidecar_fsm.base.urls import redact_url
from sidecar_fsm.config import H2PingSidecarConfig, NvcfConfig, SidecarInstanceConfig
from sidecar_fsm.run.runfiles import ACCESS_LOG, LOG, TRAFFIC, sibling

# Loopback only: /metrics has no authentication. Port 0: the proxy picks one and writes it into
# its ready file, which the ``ready`` event records for ``status`` and ``top``.
METRICS_LISTEN = "127.0.0.1:0"


def sidecar_command(
    binary: str, config: H2PingSidecarConfig, instance: SidecarInstanceConfig, ready_path: str
) -> list[str]:
    """The proxy's argv for ``instance``: every tuning flag from ``config``, explicit, nothing implied.

    Pure apart from reading our own pid: ``-exit-with-pid`` makes a sidecar whose launcher was
    SIGKILLed drain and exit by itself instead of holding the port forever. Its files sit beside
    ``ready_path`` (``runfiles.sibling``); the log it rotates (``-log-file``) also takes its
    stdout and stderr. A binary that lacks a flag gets this through ``binaryflags.filter_command``.
    """
    command = [
        str(binary),
        "-listen",
        instance.listen,
        "-upstream",
        instance.upstream,
        "-ping-interval",
        config.ping_interval,
        "-ping-timeout",
        config.ping_timeout,
        "-shutdown-grace",
        config.shutdown_grace,
        "-retry-body-limit",
        str(config.retry_body_limit),
        "-max-conn-age",
        config.max_conn_age,
        "-ready-file",
        ready_path,
    ]
    if config.ca_file:
        command += ["-ca-file", str(Path(config.ca_file).expanduser())]
    if config.exit_with_owner:
        command += ["-exit-with-pid", str(os.getpid())]
    if config.metrics:
        command += ["-metrics-listen", instance.metrics_listen or METRICS_LISTEN]
    command += ["-traffic-file", sibling(ready_path, TRAFFIC)]
    if config.access_log:
        command += ["-access-log", sibling(ready_path, ACCESS_LOG)]
    command += [
        "-log-file",
        sibling(ready_path, LOG),
        "-log-max-bytes",
        str(config.log_max_bytes),
        "-log-backups",
        str(config.log_backups),
    ]
    command += _nvcf_flags(config.nvcf_of(instance))
    if config.insecure_skip_verify:
        command.append("-insecure-skip-verify")
    return command


def _nvcf_flags(nvcf: NvcfConfig) -> list[str]:
    """The ``-nvcf-*`` flags for ``nvcf``: only those that differ from the proxy's defaults
    (follow on, budget 60m, no window, the default status URL), which the proxy's own ``-h``
    states and tests/integration/test_config_agrees_with_proxy.py holds to these."""
    flags = [] if nvcf.follow else ["-nvcf-follow=false"]  # a Go bool takes its value after '='
    if nvcf.budget_seconds != NvcfConfig().budget_seconds:
        flags += ["-nvcf-budget", nvcf.budget]
    if nvcf.poll_window is not None:
        flags += ["-nvcf-poll-window", nvcf.poll_window]
    if nvcf.status_url is not None:
        flags += ["-nvcf-status-url", nvcf.status_url]
    return flags


def sidecar_env(config: H2PingSidecarConfig) -> dict[str, str]:
    """The child's environment: ours, plus the Go runtime limits, minus any ``http2debug`` in GODEBUG.

    ``http2debug`` logs every HTTP/2 frame, Authorization headers included, so the proxy refuses
    to start with it: removing it here spares a startup failure over a variable the user set for
    something else. ``HTTPS_PROXY``/``NO_PROXY`` pass through: the proxy dials through them.
    """
    env = dict(os.environ)
    godebug = env.pop("GODEBUG", None)
    if godebug is not None:
        kept = [
            setting
            for setting in godebug.split(",")
            if setting.strip() and setting.split("=", 1)[0].strip() != "http2debug"
        ]
        if kept:
            env["GODEBUG"] = ",".join(kept)
    if config.gomemlimit is not None:
        env["GOMEMLIMIT"] = str(config.gomemlimit)
    if config.gomaxprocs is not None:
        env["GOMAXPROCS"] = str(config.gomaxprocs)
    return env


def config_summary(
    config: H2PingSidecarConfig, instances: list[SidecarInstanceConfig], binary: str
) -> dict[str, Any]:
    """What the run row keeps about what its sidecars were started with: shape and tuning, never credentials.

    Upstreams are redacted once more, so no userinfo or query reaches the database whatever
    the config module accepts.
    """
    c = config
    return {
        "instances": [
            {
                "name": i.name,
                "upstream": redact_url(i.upstream),
                "listen": i.listen,
                "metrics_listen": i.metrics_listen,
                "nvcf": _nvcf_summary(c.nvcf_of(i)),
            }
            for i in instances
        ],
        "binary": binary,
        "ping_interval": c.ping_interval,
        "ping_timeout": c.ping_timeout,
        "shutdown_grace": c.shutdown_grace,
        "max_conn_age": c.max_conn_age,
        "retry_body_limit": c.retry_body_limit,
        "startup_timeout_seconds": c.startup_timeout_seconds,
        "exit_with_owner": c.exit_with_owner,
        "metrics": c.metrics,
        "upstream_check": c.upstream_check,
        "upstream_check_seconds": c.upstream_check_seconds,
        "restart": {"max_restarts": c.restart.max_restarts, "backoff": c.restart.backoff},
        "ca_file": c.ca_file,
        "insecure_skip_verify": c.insecure_skip_verify,
        "gomemlimit": c.gomemlimit,
        "gomaxprocs": c.gomaxprocs,
        "access_log": c.access_log,
        "log_max_bytes": c.log_max_bytes,
        "log_backups": c.log_backups,
    }


def _nvcf_summary(nvcf: NvcfConfig) -> dict[str, Any]:
    """``nvcf``'s keys as the run row keeps them: the status URL redacted like the upstream."""
    status_url = None if nvcf.status_url is None else redact_url(nvcf.status_url)
    return {**nvcf.model_dump(), "status_url": status_url}
