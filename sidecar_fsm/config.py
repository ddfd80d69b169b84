"""The ``sidecar:`` block of a NeMo Gym config: the schema, its defaults, and reading it.

Every key of Gym's block keeps its name, default and meaning (durations stay Go duration strings,
passed to the proxy's flags as written); the README's table describes each key. A bad block raises
pydantic's ``ValidationError`` however a model is built, as Gym's does, worded by ``configerrors``.
Also the public home of the names Gym's ``config`` module has, re-exported from their owners.
No I/O: whether files exist or ports are free is the launcher's business; the one side effect is
a ``ConfigWarning`` for an upstream whose path is dropped.
"""

from __future__ import annotations

import difflib
import re
import warnings
from collections.abc import Mapping
from typing import Any, ClassVar

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException
from pydantic import Field, ModelWrapValidatorHandler, ValidationInfo, field_validator, model_validator
from typing_extensions import Self

from sidecar_fsm.base.addresses import is_loopback_host, listens_clash, split_listen
from sidecar_fsm.base.configerrors import (
    OMIT,
    Problem,
    config_error,
    describe_error,
    resolution_error,
    show_value,
)
from sidecar_fsm.base.gosyntax import (
    duration_seconds,
    format_go_duration,
    normalize_duration,
    normalize_memory_limit,
    size_bytes,
)
from sidecar_fsm.base.urls import normalize_upstream, redact_url, split_url, upstream_origin
from sidecar_fsm.configblocks import (
    SIDECAR_KEY,
    NvcfConfig,
    RestartPolicy,
    SchemaModel,
    number_range,
    number_type,
    parse_duration_seconds,
)
from sidecar_fsm.errors import ConfigWarning

__all__ = [
    "DEFAULT_LISTEN",
    "GLOBAL_ACCELERATOR_IDLE_TIMEOUT_SECONDS",
    "H2_PING_SIDECAR_KEY_NAME",
    "LOAD_BALANCER_KEEP_ALIVE_SECONDS",
    "SIDECAR_KEY",
    "H2PingSidecarConfig",
    "NvcfConfig",
    "RestartPolicy",
    "SidecarInstanceConfig",
    "describe_error",
    "format_go_duration",
    "h2_ping_sidecar_config_from_global_config",
    "is_loopback_host",
    "parse_duration_seconds",
    "split_listen",
    "upstream_origin",
]

H2_PING_SIDECAR_KEY_NAME = SIDECAR_KEY  # NeMo Gym's name for the same key

# AWS Global Accelerator drops a connection that carried no application data for this long; a
# PING interval at or above it lets the very drop through that the sidecar exists to prevent.
# go/config.go (maxPingInterval, parseConfig) holds the same limit and duration rules: the
# proxy checks its flags, this checks a config before any process exists.
# tests/integration/test_config_agrees_with_proxy.py fails when the defaults or limits differ.
GLOBAL_ACCELERATOR_IDLE_TIMEOUT_SECONDS = 340.0
# AWS ALB sends GOAWAY to connections this old; rotating earlier keeps unbuffered bodies away from it.
LOAD_BALANCER_KEEP_ALIVE_SECONDS = 3600.0

DEFAULT_LISTEN = "127.0.0.1:1250"
# sidecar.upstream_check: what the start does with each proxy's first upstream check.
UPSTREAM_CHECK_MODES = ("warn", "fail", "off")

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")
# One line of YAML (flow style), so the refusal stays one line through the CLI and the API.
_INSTANCES_EXAMPLE = (
    "instances: [{name: nvcf, upstream: 'https://api.example.com', listen: '127.0.0.1:1250'}]"
)


class SidecarInstanceConfig(SchemaModel):
    """One proxy process: a loopback listener that forwards to a single HTTPS upstream."""

    _where: ClassVar[str] = f"{SIDECAR_KEY}.instance"

    name: str = "nvcf"
    """Used in log and ready file names, the state database and messages; unique in the block."""

    upstream: str
    """The https:// origin to forward to, as ``https://host[:port]`` (a path is dropped, with a warning)."""

    listen: str = DEFAULT_LISTEN
    """``host:port`` the proxy binds (port 0: a free one); loopback unless ``allow_non_loopback``."""

    metrics_listen: str | None = None
    """New: a fixed loopback ``host:port`` for ``/metrics`` (for Prometheus); null: a free port."""

    nvcf: NvcfConfig | None = None
    """New: this instance's NVCF keys over ``sidecar.nvcf``; only the keys it sets count."""

    @field_validator("name")
    @classmethod
    def _check_name(cls, value: str) -> str:
        if not _NAME.fullmatch(value):
            raise ValueError(
                "is not a valid name; use letters, digits, '_' and '-', starting with a letter or digit"
            )
        return value

    @field_validator("upstream")
    @classmethod
    def _check_upstream(cls, value: str) -> str:
        return normalize_upstream(value)

    @field_validator("listen")
    @classmethod
    def _check_listen(cls, value: str) -> str:
        split_listen(value)
        return value.strip()

    @field_validator("metrics_listen")
    @classmethod
    def _check_metrics_listen(cls, value: str | None) -> str | None:
        if value is None:
            return None
        host, _ = split_listen(value)
        if not is_loopback_host(host):
            # Unlike listen, no allow_non_loopback: /metrics has no authentication either,
            # and a Prometheus server on the node reaches loopback.
            raise ValueError("is not loopback; use 127.0.0.1:PORT (port 0 for any free one)")
        return value.strip()

    @property
    def listen_host(self) -> str:
        """The host part of ``listen``, without IPv6 brackets."""
        return split_listen(self.listen)[0]

    @property
    def listen_port(self) -> int:
        """The port part of ``listen``; 0 means the kernel picks one when the proxy binds."""
        return split_listen(self.listen)[1]


# field: (example, exclusive lower bound (-1: any non-negative), exclusive upper bound, message)
_DURATIONS: dict[str, tuple[str, float, float | None, str]] = {
    "ping_interval": (
        "60s",
        0.0,
        GLOBAL_ACCELERATOR_IDLE_TIMEOUT_SECONDS,
        "must be above 0 and below 340s (the idle limit it exists to beat); try '60s'",
    ),
    "ping_timeout": ("15s", 0.0, None, "must be above 0; try '15s'"),
    "shutdown_grace": ("60s", -1.0, None, ""),
    "max_conn_age": (
        "50m",
        -1.0,
        LOAD_BALANCER_KEEP_ALIVE_SECONDS,
        "must be below 3600s (the load balancer's connection age limit); try '50m', or '0s' to disable",
    ),
}


class H2PingSidecarConfig(SchemaModel):
    """The validated ``sidecar:`` block. Absent block: this with every default (disabled)."""

    enabled: bool = False
    """Master switch. When false nothing is started and every URL is left untouched."""

    binary: str | None = None
    """A prebuilt ``h2-ping-sidecar``; default: the build cache (see ``build_if_missing``)."""

    build_if_missing: bool = True
    """Build the proxy from ``go/`` into the cache when no binary for these sources exists."""

    instances: list[SidecarInstanceConfig] = Field(default_factory=list)
    """One per upstream; required when ``enabled``. Names and listen addresses are unique."""

    ping_interval: str = "60s"
    """PING the upstream after this much read-idle time; above 0 and below 340s."""

    ping_timeout: str = "15s"
    """Close the upstream connection when a PING is not acknowledged within this; above 0."""

    shutdown_grace: str = "60s"
    """On stop, let in-flight requests finish for up to this long; then SIGKILL (plus slack)."""

    retry_body_limit: int = 16 * 1024 * 1024
    """Bodies up to this many bytes are buffered to re-send a request refused by GOAWAY; 0 disables."""

    max_conn_age: str = "50m"
    """Move new requests to a fresh connection after 90-100 % of this; below 3600s, ``0s`` disables."""

    insecure_skip_verify: bool = False
    """Skip upstream TLS verification. Tests only; prefer ``ca_file``."""

    gomemlimit: str | None = None
    """Go runtime soft memory limit, passed as ``GOMEMLIMIT`` (``1GiB``, ``512MiB``, bytes, ``off``)."""

    gomaxprocs: int | None = None
    """Go runtime threads, passed as ``GOMAXPROCS``; positive. Null leaves it to the runtime."""

    startup_timeout_seconds: float = 30.0
    """How long all instances together may take to become ready; above 0."""

    log_dir: str | None = None
    """Logs, ready files and the state database; default (also for "") ``nemo_gym_log_dir``, else tmp."""

    rewrite_base_urls: bool = True
    """Point every model ``*base_url`` aimed at an instance's upstream at that instance instead."""

    ca_file: str | None = None
    """New: a PEM file of extra roots for the upstream's certificate (``-ca-file``)."""

    allow_non_loopback: bool = False
    """New: a listen off loopback is meant (the proxy authenticates nobody); silences Gym's warning."""

    exit_with_owner: bool = True
    """New: pass ``-exit-with-pid`` so a sidecar never outlives a killed launcher by more than its grace."""

    restart: RestartPolicy = Field(default_factory=RestartPolicy)
    """New: restart policy for a sidecar that dies while ready; default fails fast, as Gym does."""

    metrics: bool = True
    """New: each proxy serves ``/metrics`` on loopback (no request data), read by ``status`` and ``top``."""

    upstream_check: str = "warn"
    """New: wait for each proxy's first upstream check (read from ``/metrics``): ``warn`` prints a
    failure and goes on (an endpoint may come up later), ``fail`` fails the start, ``off`` skips."""

    upstream_check_seconds: float = 10.0
    """New: how long the start waits for all the upstream checks together; above 0."""

    access_log: bool = False
    """New: one JSON line per request (never a header value) beside the proxy's log; needs our proxy."""

    log_max_bytes: int = 100 * 1024 * 1024
    """New: rotate the proxy's log and access log past this many bytes (or ``100MiB``); 0 never rotates."""

    log_backups: int = 5
    """New: rotated files kept per log; 0 cuts the log in place when it is full."""

    nvcf: NvcfConfig = Field(default_factory=NvcfConfig)
    """New: following NVCF's ``202`` past its poll window; per instance too (``nvcf_of``)."""

    @field_validator("ping_interval", "ping_timeout", "shutdown_grace", "max_conn_age", mode="before")
    @classmethod
    def _check_duration(cls, value: object, info: ValidationInfo) -> str:
        example, low, high, message = _DURATIONS[str(info.field_name)]
        text, seconds = normalize_duration(value, example)
        if seconds <= low or (high is not None and seconds >= high):
            raise ValueError(message)
        return text

    _check_number_type = field_validator(
        "upstream_check_seconds",
        "retry_body_limit",
        "gomaxprocs",
        "startup_timeout_seconds",
        "log_backups",
        mode="before",
    )(number_type)
    _check_number_range = field_validator(
        "retry_body_limit", "gomaxprocs", "startup_timeout_seconds", "upstream_check_seconds", "log_backups"
    )(number_range)

    @field_validator("log_max_bytes", mode="before")
    @classmethod
    def _check_log_max_bytes(cls, value: object) -> int:
        return size_bytes(value)

    @field_validator("upstream_check", mode="before")
    @classmethod
    def _check_upstream_check(cls, value: object) -> object:
        if value not in UPSTREAM_CHECK_MODES:
            raise ValueError("must be warn, fail or off; try warn")
        return value

    @field_validator("gomemlimit", mode="before")
    @classmethod
    def _check_gomemlimit(cls, value: object) -> str | None:
        return None if value is None else normalize_memory_limit(value)

    @field_validator("binary", "log_dir", "ca_file", mode="before")
    @classmethod
    def _empty_path_is_unset(cls, value: object) -> object:
        # Gym treats an empty binary or log_dir as "use the default"; keep that meaning visible.
        if isinstance(value, str) and not value.strip():
            return None
        return value

    @field_validator("restart", "nvcf", mode="before")
    @classmethod
    def _null_block_is_default(cls, value: object) -> object:
        return {} if value is None else value

    def nvcf_of(self, instance: SidecarInstanceConfig) -> NvcfConfig:
        """``instance``'s NVCF settings: ``sidecar.nvcf`` with the keys its own block sets over it."""
        if instance.nvcf is None:
            return self.nvcf
        own = {key: getattr(instance.nvcf, key) for key in instance.nvcf.model_fields_set}
        return self.nvcf.model_copy(update=own)

    @model_validator(mode="after")
    def _check_instances(self) -> Self:
        if self.enabled and not self.instances:
            raise Problem(
                "is required when sidecar.enabled is true; add one instance per upstream, for example "
                + _INSTANCES_EXAMPLE,
                path=("instances",),
                value=OMIT,
            )
        seen_names: dict[str, int] = {}
        seen_listens: list[tuple[int, tuple[str, int]]] = []
        for index, instance in enumerate(self.instances):
            if instance.name in seen_names:
                raise Problem(
                    f"is also the name of instances[{seen_names[instance.name]}]; names must be unique, "
                    "so give each instance its own",
                    path=("instances", index, "name"),
                    value=instance.name,
                )
            seen_names[instance.name] = index
            address = split_listen(instance.listen)
            for other_index, other in seen_listens:
                if listens_clash(address, other):
                    raise Problem(
                        f"clashes with instances[{other_index}].listen "
                        f"'{self.instances[other_index].listen}'; instances must listen on different "
                        "addresses: a unique port each, or 0 for any free port",
                        path=("instances", index, "listen"),
                        value=instance.listen,
                    )
            seen_listens.append((index, address))
        self._check_metrics_listens(seen_listens)
        if self.upstream_check == "fail" and not self.metrics:
            raise Problem(
                "needs metrics: true (the verdict is read from each proxy's metrics listener); "
                "set metrics: true or upstream_check: warn",
                path=("upstream_check",),
                value=self.upstream_check,
            )
        return self

    def _check_metrics_listens(self, listens: list[tuple[int, tuple[str, int]]]) -> None:
        """Each fixed ``metrics_listen`` needs ``metrics`` and an address no other listen has."""
        seen: list[tuple[str, tuple[str, int]]] = [(f"instances[{i}].listen", a) for i, a in listens]
        for index, instance in enumerate(self.instances):
            if instance.metrics_listen is None:
                continue
            path = ("instances", index, "metrics_listen")
            if not self.metrics:
                raise Problem(
                    "needs metrics: true (with metrics off no proxy serves /metrics); "
                    "set metrics: true or drop metrics_listen",
                    path=path,
                    value=instance.metrics_listen,
                )
            address = split_listen(instance.metrics_listen)
            for where, other in seen:
                if listens_clash(address, other):
                    raise Problem(
                        f"clashes with {where}; every listen and metrics_listen needs its own "
                        "address: a unique port each, or 0 for any free port",
                        path=path,
                        value=instance.metrics_listen,
                    )
            seen.append((f"instances[{index}].metrics_listen", address))

    @model_validator(mode="wrap")
    @classmethod
    def _warn_dropped_paths(cls, data: Any, handler: ModelWrapValidatorHandler[Self]) -> Self:
        # After every check passed: a block that is refused warns about nothing. The raw value is
        # needed (the field keeps only the origin) and the index (the field cannot know it).
        config = handler(data)
        raw_instances = data.get("instances") if isinstance(data, Mapping) else None
        if isinstance(raw_instances, list):
            for index, raw in enumerate(raw_instances):
                upstream = raw.get("upstream") if isinstance(raw, Mapping) else None
                if isinstance(upstream, str):
                    _warn_if_path_dropped(f"{cls._where}.instances[{index}].upstream", upstream)
        return config

    @property
    def ping_interval_seconds(self) -> float:
        return duration_seconds(self.ping_interval)

    @property
    def ping_timeout_seconds(self) -> float:
        return duration_seconds(self.ping_timeout)

    @property
    def shutdown_grace_seconds(self) -> float:
        return duration_seconds(self.shutdown_grace)

    @property
    def max_conn_age_seconds(self) -> float:
        """0 when rotation is disabled."""
        return duration_seconds(self.max_conn_age)


def _warn_if_path_dropped(where: str, upstream: str) -> None:
    """A ``ConfigWarning`` when ``upstream`` carries a path or query: the proxy forwards each client's
    own path, so ``https://host/v1`` plus a base URL ending in ``/v1`` would look like ``/v1/v1``."""
    parts = split_url(upstream.strip())
    dropped = [f"a path ('{parts.path}')"] if parts.path not in {"", "/"} else []
    if parts.query or parts.fragment:
        dropped.append("a query")
    if not dropped:
        return
    verb = "are" if len(dropped) > 1 else "is"
    warnings.warn(
        f"{where}: '{show_value(redact_url(upstream.strip()))}' has {' and '.join(dropped)}, which {verb} "
        f"dropped: each client's own path is forwarded; write '{normalize_upstream(upstream)}'",
        ConfigWarning,
        stacklevel=2,
    )


def h2_ping_sidecar_config_from_global_config(global_config_dict: Any) -> H2PingSidecarConfig:
    """The validated ``sidecar:`` block of a NeMo Gym global config; absent or null means disabled.

    ``${...}`` is resolved first against the whole config, which is not changed. Raises
    ``pydantic.ValidationError`` for an unresolvable interpolation, a block that is not a mapping,
    and every rule of the schema.
    """
    block = _resolved_block(global_config_dict)
    if block is None:
        misspelled = misspelled_block(global_config_dict)
        if misspelled is not None:
            warnings.warn(
                f"'{misspelled}': top-level key not read; did you mean '{SIDECAR_KEY}'? "
                "without a sidecar block no sidecar starts",
                ConfigWarning,
                stacklevel=2,
            )
        return H2PingSidecarConfig()
    if not isinstance(block, Mapping):
        raise config_error(
            H2PingSidecarConfig.__name__,
            (),
            f"{SIDECAR_KEY}: '{show_value(block)}' is not a mapping of settings; write it as a block of "
            "keys like enabled: true, or remove it",
        ) from None
    return H2PingSidecarConfig.model_validate(dict(block))


def misspelled_block(global_config_dict: Any) -> str | None:
    """The top-level key that looks like a misspelled ``sidecar`` (``sidcar``, ``side_car``) when
    there is none; an absent block means disabled, so a typo would silently start nothing."""
    if not isinstance(global_config_dict, Mapping):
        return None
    keys = [str(key) for key in global_config_dict]
    if SIDECAR_KEY in keys:
        return None
    folded = {key.lower().replace("_", "").replace("-", ""): key for key in keys}
    close = difflib.get_close_matches(SIDECAR_KEY, list(folded), n=1, cutoff=0.8)
    return folded[close[0]] if close else None


def _resolved_block(global_config_dict: Any) -> Any:
    if isinstance(global_config_dict, Mapping) and not isinstance(global_config_dict, DictConfig):
        block = global_config_dict.get(SIDECAR_KEY)
        if not _has_interpolation(block):
            return block
        # A plain dict holding "${...}" means what OmegaConf would make of it: resolve the same way.
        try:
            global_config_dict = OmegaConf.create(dict(global_config_dict))
        except (OmegaConfBaseException, ValueError):
            return block
    if not isinstance(global_config_dict, DictConfig):
        try:
            return global_config_dict.get(SIDECAR_KEY)
        except (AttributeError, TypeError):
            return None
    try:
        node = global_config_dict.get(SIDECAR_KEY)
        if isinstance(node, (DictConfig, ListConfig)):
            return OmegaConf.to_container(node, resolve=True, throw_on_missing=True)
        return node
    except OmegaConfBaseException as exc:
        raise resolution_error(H2PingSidecarConfig.__name__, global_config_dict, exc) from None


def _has_interpolation(value: Any) -> bool:
    if isinstance(value, str):
        return "${" in value
    if isinstance(value, Mapping):
        return any(_has_interpolation(item) for item in value.values())
    if isinstance(value, (list, tuple)):
        return any(_has_interpolation(item) for item in value)
    return False
