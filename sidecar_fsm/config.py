"""The ``sidecar:`` block of a NeMo Gym config: schema, defaults, durations and validation.

Owns turning the block (an OmegaConf ``DictConfig`` or a plain mapping, ``${...}`` resolved first)
into a validated ``H2PingSidecarConfig``, and every message a bad block produces: one line,
``sidecar.<path>: '<value>' <what is wrong>; <what to do>``, raised as ``ConfigError``. A raw
pydantic ``ValidationError`` never escapes, whichever way a model is built.

Every key of NeMo Gym's block is accepted with its name, default and meaning (durations stay Go
duration strings, as Gym passed them straight to the proxy's flags); ``ca_file``,
``allow_non_loopback``, ``exit_with_owner`` and ``restart`` are ours.

Must not do I/O: whether ``binary``, ``ca_file`` or ``log_dir`` exist, and whether a port is free,
is the launcher's business. Imports only ``errors`` and ``urls`` from this package.
"""

from __future__ import annotations

import difflib
import ipaddress
import json
import math
import re
from collections.abc import Mapping
from typing import Any, ClassVar

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import ErrorDetails
from typing_extensions import Self

from sidecar_fsm.errors import ConfigError
from sidecar_fsm.urls import is_valid_host_name, normalize_upstream, without_userinfo

SIDECAR_KEY = "sidecar"
H2_PING_SIDECAR_KEY_NAME = SIDECAR_KEY  # NeMo Gym's name for the same key

# AWS Global Accelerator drops a connection that carried no application data for this long; a
# PING interval at or above it lets the very drop through that the sidecar exists to prevent.
GLOBAL_ACCELERATOR_IDLE_TIMEOUT_SECONDS = 340.0
# AWS ALB sends GOAWAY to connections this old; rotating earlier keeps unbuffered bodies away from it.
LOAD_BALANCER_KEEP_ALIVE_SECONDS = 3600.0

DEFAULT_LISTEN = "127.0.0.1:1250"

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")
_UNIT_SECONDS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
# Go's time.ParseDuration grammar: [-+]?([0-9]*(\.[0-9]*)?[a-z]+)+ with a known unit, or "0".
# "ms" precedes "m" in the alternation so "5ms" is not read as 5 minutes and a stray "s".
_DURATION_PART = re.compile(r"([0-9]+\.?[0-9]*|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h)")
_DURATION = re.compile(rf"([-+]?)((?:{_DURATION_PART.pattern})+)")
_NUMBER = re.compile(r"[-+]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?")
# Go's runtime reads GOMEMLIMIT as ^[0-9]+(([KMGT]i)?B)?$ (or "off") and exits at start on
# anything else, so a typo here would surface only as a sidecar that dies before it is ready.
_MEMORY_LIMIT = re.compile(r"([0-9]+)((?:[KMGT]i)?B)?")
_MEMORY_UNITS = {None: 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}
_INT64_MAX = (1 << 63) - 1

_DURATION_HINT = "use Go syntax like '60s', '1m30s', '250ms' or a number of seconds"
_LISTEN_HINT = "use 127.0.0.1:PORT (0 picks a free port; IPv6 as [::1]:PORT)"
_INSTANCES_EXAMPLE = (
    "  sidecar:\n"
    "    enabled: true\n"
    "    instances:\n"
    "      - name: nvcf\n"
    "        upstream: https://api.example.com\n"
    "        listen: 127.0.0.1:1250"
)
_NODES_REMOVED = (
    "is not supported: the sidecar always runs next to the servers that call it "
    "(one per node, started by gym env start there); remove it"
)


class _Omit:
    """Marker: the message has no value to quote (a missing key, an empty list described in words)."""


_OMIT = _Omit()


class _Problem(ValueError):
    """A validation failure already worded for the user, minus the field path and quoted value.

    Raised inside validators (pydantic turns it into a ``value_error`` whose context keeps this
    object), so the translator can prefix the full field path, which a validator cannot know.
    ``path`` extends pydantic's location for model-level checks that blame one nested field.
    """

    def __init__(self, what: str, *, path: tuple[str | int, ...] = (), value: object = None) -> None:
        super().__init__(what)
        self.what = what
        self.path = path
        self.value = value


# --------------------------------------------------------------------------------------------
# Durations
# --------------------------------------------------------------------------------------------


def _duration_seconds(value: object, example: str = "60s") -> float:
    """Seconds in a Go duration or a number of seconds; raises ``_Problem`` (no field, no value)."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise _Problem(f"is not a duration; {_DURATION_HINT}")
    if isinstance(value, str):
        text = value.strip()
        if _NUMBER.fullmatch(text):
            seconds = float(text)
        else:
            match = _DURATION.fullmatch(text)
            if match is None:
                raise _Problem(f"is not a duration; {_DURATION_HINT}")
            seconds = sum(
                float(number) * _UNIT_SECONDS[unit] for number, unit in _DURATION_PART.findall(match[2])
            )
            if match[1] == "-":
                seconds = -seconds
    else:
        seconds = float(value)
    if not math.isfinite(seconds):
        raise _Problem(f"is not a duration; {_DURATION_HINT}")
    if seconds < 0:
        raise _Problem(f"must not be negative; use a duration like '{example}'")
    if seconds * 1e9 > _INT64_MAX:
        # Go counts a duration in int64 nanoseconds; the proxy would refuse the flag at start.
        raise _Problem(f"is longer than go allows (about 292 years); use a duration like '{example}'")
    return seconds + 0.0  # -0.0 (from "-0s") reads as 0 everywhere it is shown


def parse_duration_seconds(
    value: str | int | float, field: str = "duration", *, example: str = "60s"
) -> float:
    """Seconds in ``value``: a Go duration (``60s``, ``1m30s``, ``250ms``, ``1h``) or a number of seconds.

    Pure. Raises ``ConfigError`` naming ``field`` and the value for text that is not a duration
    and for a negative one (no field of the block accepts a negative duration). ``example`` is
    the value suggested in the message.
    """
    try:
        return _duration_seconds(value, example)
    except _Problem as problem:
        raise ConfigError(f"{field}: '{_show(value)}' {problem.what}") from None


def format_go_duration(seconds: float) -> str:
    """``seconds`` as a Go duration string: 90 -> ``1m30s``, 0 -> ``0s``, 0.25 -> ``250ms``, 3600 -> ``1h``.

    Zero components are left out (Go's own ``String()`` would write ``1h0m0s``; both parse the
    same). Precision is the nanosecond, as in Go. Negative values get a leading ``-``.
    """
    ns = round(seconds * 1e9)
    if ns < 0:
        return "-" + format_go_duration(-seconds)
    if ns == 0:
        return "0s"
    if ns < 1_000_000_000:
        for unit, size in (("ms", 1_000_000), ("us", 1_000)):
            if ns >= size:
                return _decimal(ns, size) + unit
        return f"{ns}ns"
    hours, ns = divmod(ns, 3_600_000_000_000)
    minutes, ns = divmod(ns, 60_000_000_000)
    text = (f"{hours}h" if hours else "") + (f"{minutes}m" if minutes else "")
    if ns or not text:
        text += _decimal(ns, 1_000_000_000) + "s"
    return text


def _decimal(count: int, unit: int) -> str:
    whole, rest = divmod(count, unit)
    if not rest:
        return str(whole)
    digits = str(rest).rjust(len(str(unit)) - 1, "0").rstrip("0")
    return f"{whole}.{digits}"


def _normalize_duration(value: object, example: str) -> tuple[str, float]:
    """(the Go duration string kept in the config, its seconds).

    A string already in Go syntax is kept as written (``60s`` stays ``60s``, as Gym passed it to
    the flags); a number, or a number in a string, becomes ``format_go_duration`` of it.
    """
    seconds = _duration_seconds(value, example)
    if isinstance(value, str) and not _NUMBER.fullmatch(value.strip()):
        return value.strip(), seconds
    # Checks apply to what the proxy will be given: 1e-10 seconds becomes "0s", which is 0.
    text = format_go_duration(seconds)
    return text, _duration_seconds(text)


# --------------------------------------------------------------------------------------------
# Addresses
# --------------------------------------------------------------------------------------------


def is_loopback_host(host: str) -> bool:
    """Whether ``host`` (a name or IP literal, brackets allowed) only accepts local connections.

    ``localhost`` counts (it resolves to loopback by convention and in Go's resolver); no other
    name does, since deciding that would need a DNS lookup and this module does no I/O.
    """
    host = host.strip().strip("[]").lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


def split_listen(listen: str) -> tuple[str, int]:
    """(host, port) of a ``host:port`` listen address; an IPv6 host comes without its brackets.

    Raises ``ValueError`` with "what is wrong; what to do" (no field, no value) for a missing or
    bad host, an unbracketed IPv6 address, or a port that is not a number in 0-65535.
    """
    text = listen.strip()
    if text.startswith("["):
        host, sep, port = text[1:].partition("]:")
        if not sep:
            raise ValueError(f"is not host:port; {_LISTEN_HINT}")
        try:
            ipaddress.IPv6Address(host.split("%", 1)[0])
        except ValueError:
            raise ValueError(f"has an invalid IPv6 address; {_LISTEN_HINT}") from None
    else:
        host, sep, port = text.rpartition(":")
        if not sep:
            raise ValueError(f"is not host:port; {_LISTEN_HINT}")
        if ":" in host:
            raise ValueError(f"has an IPv6 host without brackets; write it like [::1]:{port or 'PORT'}")
        if not host:
            raise ValueError("has no host; use 127.0.0.1:PORT, or 0.0.0.0:PORT with allow_non_loopback")
        if not is_valid_host_name(host):
            raise ValueError(f"has an invalid host; {_LISTEN_HINT}")
    if not port.isdigit() or not port.isascii():
        raise ValueError(f"has a port that is not a number; {_LISTEN_HINT}")
    if int(port) > 65535:
        raise ValueError(f"has port {int(port)} outside 0-65535; {_LISTEN_HINT}")
    return host, int(port)


def _bind_key(host: str) -> str:
    """The host as the kernel sees a bind: for telling whether two listens clash."""
    host = host.lower()
    if host == "localhost":
        return "127.0.0.1"  # Go binds localhost to its IPv4 loopback address
    try:
        return ipaddress.ip_address(host.split("%", 1)[0]).compressed
    except ValueError:
        return host


def _listens_clash(a: tuple[str, int], b: tuple[str, int]) -> bool:
    # Port 0 asks the kernel for a free port, so any number of them coexist. A wildcard address
    # takes the port on every interface, so it clashes with any host on the same port.
    if a[1] == 0 or a[1] != b[1]:
        return False
    ha, hb = _bind_key(a[0]), _bind_key(b[0])
    wildcards = {"0.0.0.0", "::"}
    return ha == hb or ha in wildcards or hb in wildcards


# --------------------------------------------------------------------------------------------
# Schema
# --------------------------------------------------------------------------------------------


class _Model(BaseModel):
    """Base of the schema models: every way of building one raises ``ConfigError``, never pydantic's error."""

    model_config = ConfigDict(extra="forbid")

    # Where this model sits in the config, for messages when it is built on its own.
    _where: ClassVar[str] = SIDECAR_KEY

    def __init__(self, /, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise _config_error(exc, type(self)) from None

    # pydantic calls a model's own __init__ for nested values when it thinks __init__ is custom;
    # this one only translates errors, so nested models must be validated as plain pydantic ones
    # (else an inner ConfigError, a ValueError, is wrapped into the outer error and loses its path).
    __init__.__pydantic_base_init__ = True  # type: ignore[attr-defined]

    @classmethod
    def model_validate(cls, obj: Any, *args: Any, **kwargs: Any) -> Self:
        try:
            return super().model_validate(obj, *args, **kwargs)
        except ValidationError as exc:
            raise _config_error(exc, cls) from None

    @classmethod
    def model_validate_json(cls, json_data: str | bytes | bytearray, *args: Any, **kwargs: Any) -> Self:
        try:
            return super().model_validate_json(json_data, *args, **kwargs)
        except ValidationError as exc:
            raise _config_error(exc, cls) from None


def _reject_bool(value: object, what: str) -> object:
    # pydantic's lax mode reads true as 1; "gomaxprocs: true" is a mistake, not a request for 1.
    if isinstance(value, bool):
        raise _Problem(f"is not {what}")
    return value


class RestartPolicy(_Model):
    """What happens when a ``ready`` sidecar's process dies. New in sidecar-fsm (Gym fails the run)."""

    _where: ClassVar[str] = f"{SIDECAR_KEY}.restart"

    max_restarts: int = 0
    """Restarts allowed per instance over the run; ``0`` fails fast, as NeMo Gym does."""

    backoff: str = "1s"
    """Wait this long (a Go duration) before each restart, on the same listen address."""

    @field_validator("max_restarts", mode="before")
    @classmethod
    def _check_max_restarts_type(cls, value: object) -> object:
        return _reject_bool(value, "a whole number; try 2, or 0 to fail fast")

    @field_validator("max_restarts")
    @classmethod
    def _check_max_restarts(cls, value: int) -> int:
        if value < 0:
            raise _Problem("must be 0 or more; try 2, or 0 to fail fast")
        return value

    @field_validator("backoff", mode="before")
    @classmethod
    def _check_backoff(cls, value: object) -> str:
        return _normalize_duration(value, "1s")[0]

    @property
    def backoff_seconds(self) -> float:
        return _duration_seconds(self.backoff)


class SidecarInstanceConfig(_Model):
    """One proxy process: a loopback listener that forwards to a single HTTPS upstream."""

    _where: ClassVar[str] = f"{SIDECAR_KEY}.instance"

    name: str = "nvcf"
    """Used in log and ready file names, the state database and messages; unique in the block."""

    upstream: str
    """The https:// origin to forward to, kept as ``https://host[:port]``: host lower-cased,
    port 443 dropped, path dropped (clients keep sending their path on every request)."""

    listen: str = DEFAULT_LISTEN
    """``host:port`` the proxy binds; port 0 picks a free one. Loopback unless
    ``allow_non_loopback``: the proxy adds no authentication of its own."""

    @field_validator("name")
    @classmethod
    def _check_name(cls, value: str) -> str:
        if not _NAME.fullmatch(value):
            raise _Problem(
                "is not a valid name; use letters, digits, '_' and '-', starting with a letter or digit"
            )
        return value

    @field_validator("upstream")
    @classmethod
    def _check_upstream(cls, value: str) -> str:
        try:
            return normalize_upstream(value)
        except ValueError as exc:
            raise _Problem(str(exc)) from None

    @field_validator("listen")
    @classmethod
    def _check_listen(cls, value: str) -> str:
        try:
            split_listen(value)
        except ValueError as exc:
            raise _Problem(str(exc)) from None
        return value.strip()

    @property
    def listen_host(self) -> str:
        """The host part of ``listen``, without IPv6 brackets."""
        return split_listen(self.listen)[0]

    @property
    def listen_port(self) -> int:
        """The port part of ``listen``; 0 means the kernel picks one when the proxy binds."""
        return split_listen(self.listen)[1]


_DURATION_LIMITS: dict[str, tuple[float, float | None, str]] = {
    # field: (exclusive lower bound or -1 for "any non-negative", exclusive upper bound, message)
    "ping_interval": (
        0.0,
        GLOBAL_ACCELERATOR_IDLE_TIMEOUT_SECONDS,
        "must be above 0 and below 340s (the idle limit it exists to beat); try '60s'",
    ),
    "ping_timeout": (0.0, None, "must be above 0; try '15s'"),
    "max_conn_age": (
        -1.0,
        LOAD_BALANCER_KEEP_ALIVE_SECONDS,
        "must be below 3600s (the load balancer's connection age limit); try '50m', or '0s' to disable",
    ),
}
_DURATION_EXAMPLES = {
    "ping_interval": "60s",
    "ping_timeout": "15s",
    "shutdown_grace": "60s",
    "max_conn_age": "50m",
}


class H2PingSidecarConfig(_Model):
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
    """Bodies up to this many bytes are buffered so a request refused by GOAWAY can be re-sent;
    0 disables buffering."""

    max_conn_age: str = "50m"
    """Move new requests to a fresh upstream connection after 90-100 % of this; below 3600s,
    ``0``/``0s`` disables rotation."""

    insecure_skip_verify: bool = False
    """Skip upstream TLS verification. Tests only; prefer ``ca_file``."""

    gomemlimit: str | None = None
    """Go runtime soft memory limit, passed as ``GOMEMLIMIT`` (``1GiB``, ``512MiB``, bytes, ``off``)."""

    gomaxprocs: int | None = None
    """Go runtime threads, passed as ``GOMAXPROCS``; positive. Null leaves it to the runtime."""

    startup_timeout_seconds: float = 30.0
    """How long all instances together may take to become ready; above 0."""

    log_dir: str | None = None
    """Where logs, ready files and the state database go; default ``nemo_gym_log_dir``, then a
    per-user temp dir. An empty string means the default, as in Gym."""

    rewrite_base_urls: bool = True
    """Point every model ``*base_url`` aimed at an instance's upstream at that instance instead."""

    ca_file: str | None = None
    """New: a PEM file of extra roots for the upstream's certificate (``-ca-file``)."""

    allow_non_loopback: bool = False
    """New: allow listen addresses off loopback. The proxy authenticates nobody: leave it off."""

    exit_with_owner: bool = True
    """New: pass ``-exit-with-pid`` so a sidecar never outlives a killed launcher by more than its grace."""

    restart: RestartPolicy = Field(default_factory=RestartPolicy)
    """New: restart policy for a sidecar that dies while ready; default fails fast, as Gym does."""

    @field_validator("ping_interval", "ping_timeout", "shutdown_grace", "max_conn_age", mode="before")
    @classmethod
    def _check_duration(cls, value: object, info: ValidationInfo) -> str:
        field = str(info.field_name)
        text, seconds = _normalize_duration(value, _DURATION_EXAMPLES[field])
        limits = _DURATION_LIMITS.get(field)
        if limits is not None:
            low, high, message = limits
            if seconds <= low or (high is not None and seconds >= high):
                raise _Problem(message)
        return text

    @field_validator("retry_body_limit", mode="before")
    @classmethod
    def _check_retry_body_limit_type(cls, value: object) -> object:
        return _reject_bool(value, "a whole number of bytes; try 16777216, or 0 to disable buffering")

    @field_validator("retry_body_limit")
    @classmethod
    def _check_retry_body_limit(cls, value: int) -> int:
        if value < 0:
            raise _Problem("must be 0 or more; try 16777216, or 0 to disable buffering")
        return value

    @field_validator("gomaxprocs", mode="before")
    @classmethod
    def _check_gomaxprocs_type(cls, value: object) -> object:
        return _reject_bool(value, "a whole number; try 2, or null to leave it to the go runtime")

    @field_validator("gomaxprocs")
    @classmethod
    def _check_gomaxprocs(cls, value: int | None) -> int | None:
        if value is not None and value < 1:
            raise _Problem("must be a positive whole number; try 2, or null to leave it to the go runtime")
        return value

    @field_validator("startup_timeout_seconds", mode="before")
    @classmethod
    def _check_startup_timeout_type(cls, value: object) -> object:
        return _reject_bool(value, "a number of seconds; try 30")

    @field_validator("startup_timeout_seconds")
    @classmethod
    def _check_startup_timeout(cls, value: float) -> float:
        if not math.isfinite(value) or value <= 0:
            raise _Problem("must be a number of seconds above 0; try 30")
        return value

    @field_validator("gomemlimit", mode="before")
    @classmethod
    def _check_gomemlimit(cls, value: object) -> object:
        if value is None or (isinstance(value, str) and value.strip() == "off"):
            return None if value is None else "off"
        if isinstance(value, int) and not isinstance(value, bool):
            value = str(value)
        hint = "use bytes or a KiB, MiB, GiB or TiB count like '1GiB', or 'off'"
        if not isinstance(value, str):
            raise _Problem(f"is not a go memory limit; {hint}")
        match = _MEMORY_LIMIT.fullmatch(value.strip())
        if match is None:
            raise _Problem(f"is not a go memory limit; {hint}")
        if int(match[1]) * _MEMORY_UNITS[match[2]] > _INT64_MAX:
            raise _Problem(f"is larger than go allows (2^63-1 bytes); {hint}")
        return value.strip()

    @field_validator("binary", "log_dir", "ca_file", mode="before")
    @classmethod
    def _empty_path_is_unset(cls, value: object) -> object:
        # Gym treats an empty binary or log_dir as "use the default"; keep that meaning visible.
        if isinstance(value, str) and not value.strip():
            return None
        return value

    @field_validator("restart", mode="before")
    @classmethod
    def _null_restart_is_default(cls, value: object) -> object:
        return {} if value is None else value

    @model_validator(mode="after")
    def _check_instances(self) -> Self:
        if self.enabled and not self.instances:
            raise _Problem(
                "is empty but sidecar.enabled is true; add one instance per upstream, for example:\n"
                + _INSTANCES_EXAMPLE,
                path=("instances",),
                value=_OMIT,
            )
        seen_names: dict[str, int] = {}
        seen_listens: list[tuple[int, tuple[str, int]]] = []
        for index, instance in enumerate(self.instances):
            if instance.name in seen_names:
                raise _Problem(
                    f"is also the name of instances[{seen_names[instance.name]}]; "
                    "give each instance its own name",
                    path=("instances", index, "name"),
                    value=instance.name,
                )
            seen_names[instance.name] = index
            address = split_listen(instance.listen)
            if not self.allow_non_loopback and not is_loopback_host(address[0]):
                raise _Problem(
                    "is not loopback; use 127.0.0.1:PORT or allow_non_loopback",
                    path=("instances", index, "listen"),
                    value=instance.listen,
                )
            for other_index, other in seen_listens:
                if _listens_clash(address, other):
                    raise _Problem(
                        f"clashes with instances[{other_index}].listen "
                        f"'{self.instances[other_index].listen}'; give each instance its own port, "
                        "or 0 for any free port",
                        path=("instances", index, "listen"),
                        value=instance.listen,
                    )
            seen_listens.append((index, address))
        return self

    @property
    def ping_interval_seconds(self) -> float:
        return _duration_seconds(self.ping_interval)

    @property
    def ping_timeout_seconds(self) -> float:
        return _duration_seconds(self.ping_timeout)

    @property
    def shutdown_grace_seconds(self) -> float:
        return _duration_seconds(self.shutdown_grace)

    @property
    def max_conn_age_seconds(self) -> float:
        """0 when rotation is disabled."""
        return _duration_seconds(self.max_conn_age)


# --------------------------------------------------------------------------------------------
# Reading the block and wording errors
# --------------------------------------------------------------------------------------------


def h2_ping_sidecar_config_from_global_config(global_config_dict: Any) -> H2PingSidecarConfig:
    """The validated ``sidecar:`` block of a NeMo Gym global config; absent or null means disabled.

    Accepts an OmegaConf ``DictConfig`` (interpolations such as ``${oc.env:NVCF_URL}`` are resolved
    first, against the whole config) or a plain mapping. Read-only: the config is not changed.
    Raises ``ConfigError`` with one first line naming the field and value, for an interpolation
    that cannot be resolved, a block that is not a mapping, and every rule of the schema.
    """
    block = _resolved_block(global_config_dict)
    if block is None:
        return H2PingSidecarConfig()
    if not isinstance(block, Mapping):
        raise ConfigError(
            f"{SIDECAR_KEY}: '{_show(block)}' is not a mapping of settings; write it as a block of "
            "keys like enabled: true, or remove it"
        )
    return H2PingSidecarConfig.model_validate(dict(block))


def _resolved_block(global_config_dict: Any) -> Any:
    if global_config_dict is None:
        return None
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
        raise _resolution_error(global_config_dict, exc) from None


def _has_interpolation(value: Any) -> bool:
    if isinstance(value, str):
        return "${" in value
    if isinstance(value, Mapping):
        return any(_has_interpolation(item) for item in value.values())
    if isinstance(value, (list, tuple)):
        return any(_has_interpolation(item) for item in value)
    return False


def _resolution_error(config: DictConfig, exc: OmegaConfBaseException) -> ConfigError:
    where = str(getattr(exc, "full_key", "") or SIDECAR_KEY)
    raw: Any = _OMIT
    try:
        raw = OmegaConf.to_container(config, resolve=False)
        for part in re.findall(r"[^.\[\]]+|\[\d+\]", where):
            raw = raw[int(part[1:-1])] if part.startswith("[") else raw[part]
    except (LookupError, TypeError, ValueError, OmegaConfBaseException):
        raw = _OMIT
    reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    # "KeyError raised while resolving interpolation: \"Environment variable 'X' not found\""
    reason = reason.split("raised while resolving interpolation: ", 1)[-1].strip().strip("\"'")
    if type(exc).__name__ == "MissingMandatoryValue":
        what = "is a mandatory value that was never set; set it in the config or on the command line"
    else:
        reason = reason[:1].lower() + reason[1:]
        what = f"cannot be resolved ({reason}); set what it refers to, or write the value"
    value = "" if isinstance(raw, _Omit) else f" '{_show(raw)}'"
    return ConfigError(f"{where}:{value} {what}")


def _show(value: object) -> str:
    """A value as it is quoted in a message: YAML-like scalars, compact containers, no credentials."""
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif value is None:
        text = "null"
    elif isinstance(value, str):
        text = without_userinfo(value)
    elif isinstance(value, (int, float)):
        text = str(value)
    else:
        try:
            text = json.dumps(value, default=str, ensure_ascii=False)
        except (TypeError, ValueError):
            text = str(value)
    text = text.replace("\n", "\\n")
    return text if len(text) <= 120 else text[:117] + "..."


_NESTED_MODELS: dict[str, type[_Model]] = {"instances": SidecarInstanceConfig, "restart": RestartPolicy}


def _model_at(root: type[_Model], loc: tuple[str | int, ...]) -> type[_Model]:
    """The model class that holds the key at ``loc`` (for listing the keys it knows)."""
    model = root
    for part in loc[:-1]:
        if isinstance(part, str) and part in _NESTED_MODELS:
            model = _NESTED_MODELS[part]
    return model


def _where(root: type[_Model], loc: tuple[str | int, ...]) -> str:
    text = root._where
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else f".{part}"
    return text


_TYPE_MESSAGES = {
    "bool_type": "is not a boolean; use true or false",
    "bool_parsing": "is not a boolean; use true or false",
    "int_type": "is not a whole number",
    "int_parsing": "is not a whole number",
    "int_from_float": "is not a whole number",
    "float_type": "is not a number",
    "float_parsing": "is not a number",
    "finite_number": "is not a finite number",
    "string_type": "is not a string",
    "list_type": "is not a list",
    "dict_type": "is not a mapping of keys",
    "model_type": "is not a mapping of keys",
    "model_attributes_type": "is not a mapping of keys",
}
_TYPE_HINTS = {
    "instances": "write a list of {name, upstream, listen} entries",
    "restart": "write {max_restarts: N, backoff: 1s}",
    "listen": "use a string like '127.0.0.1:1250'",
    "upstream": "use a string like 'https://api.example.com'",
}


def _describe(error: ErrorDetails, root: type[_Model]) -> str:
    loc = tuple(error["loc"])
    value: object = error.get("input")
    kind = error["type"]
    cause = (error.get("ctx") or {}).get("error")
    if isinstance(cause, _Problem):
        loc += cause.path
        if cause.path:
            value = cause.value
        where = _where(root, loc)
        shown = "" if isinstance(value, _Omit) else f" '{_show(value)}'"
        return f"{where}:{shown} {cause.what}"
    where = _where(root, loc)
    if kind == "extra_forbidden":
        key = str(loc[-1]) if loc else "?"
        if key == "nodes" and _model_at(root, loc) is H2PingSidecarConfig:
            return f"{where}: NeMo Gym's old 'nodes' key {_NODES_REMOVED}"
        known = sorted(_model_at(root, loc).model_fields)
        close = difflib.get_close_matches(key, known, n=1)
        hint = f"did you mean '{close[0]}'?" if close else "known keys are " + ", ".join(known)
        return f"{where}: unknown key; {hint}"
    if kind == "missing":
        if loc and loc[-1] == "upstream":
            return f"{where}: is required; set it to the https:// url to forward to, like https://api.example.com"
        return f"{where}: is required; set it"
    if kind in _TYPE_MESSAGES:
        name = next((str(part) for part in reversed(loc) if isinstance(part, str)), "")
        what = _TYPE_MESSAGES[kind]
        if kind in {"string_type", "list_type", "dict_type", "model_type"} and name in _TYPE_HINTS:
            what = f"{what}; {_TYPE_HINTS[name]}"
        elif kind == "string_type":
            what = f"{what}; quote it"
        return f"{where}: '{_show(value)}' {what}"
    message = str(error.get("msg", "is invalid"))
    return f"{where}: '{_show(value)}' {message[:1].lower()}{message[1:]}"


def _config_error(exc: ValidationError, root: type[_Model]) -> ConfigError:
    """One ``ConfigError`` for a pydantic failure: the first problem on the first line, the rest after."""
    messages = [_describe(error, root) for error in exc.errors()]
    if not messages:
        return ConfigError(f"{root._where}: is invalid")
    first, *rest = messages
    return ConfigError(first + "".join(f"\n  also {message}" for message in rest))
