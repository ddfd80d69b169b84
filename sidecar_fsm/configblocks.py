"""The parts of the ``sidecar:`` schema that ``config`` builds on: the models' base, the numeric
key rules, and the nested ``restart:`` and ``nvcf:`` blocks.

``config`` re-exports the public names, so ``sidecar_fsm.config`` stays the one import path.
Must not do I/O and must not import ``config``: it sits below it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, ValidationError, ValidationInfo, field_validator
from typing_extensions import Self

from sidecar_fsm.base.configerrors import show_value, translate
from sidecar_fsm.base.gosyntax import duration_seconds, normalize_duration
from sidecar_fsm.base.urls import split_url
from sidecar_fsm.errors import ConfigError

__all__ = ["SIDECAR_KEY", "NvcfConfig", "RestartPolicy", "SchemaModel", "parse_duration_seconds"]

SIDECAR_KEY = "sidecar"

# NVCF reads NVCF-POLL-SECONDS as whole seconds, at most 3600 (its invocation service).
NVCF_POLL_WINDOW_MAX_SECONDS = 3600
NVCF_STATUS_EXAMPLE = "https://api.nvcf.nvidia.com/v2/nvcf/pexec/status/{reqid}"


def parse_duration_seconds(
    value: str | int | float, field: str = "duration", *, example: str = "60s"
) -> float:
    """Seconds in ``value``: a Go duration (``60s``, ``1m30s``) or a number of seconds (NeMo Gym's helper).

    A string needs its unit (``'60'`` is refused, as Go refuses it). Raises ``ConfigError`` naming
    ``field`` and the value, suggesting ``example``.
    """
    try:
        return duration_seconds(value, example)
    except ValueError as exc:
        raise ConfigError(f"{field}: '{show_value(value)}' {exc}") from None


class SchemaModel(BaseModel):
    """Base of the schema models: every way of building one raises our worded ``ValidationError``."""

    model_config = ConfigDict(extra="forbid")

    # Where this model sits in the config, for messages when it is built on its own.
    _where: ClassVar[str] = SIDECAR_KEY

    def __init__(self, /, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise translate(exc, type(self), self._where) from None

    # pydantic calls a model's own __init__ for nested values when it thinks __init__ is custom;
    # this one only rewords errors, so nested models are validated as plain pydantic ones and
    # their errors reach the outermost model with their full location.
    __init__.__pydantic_base_init__ = True  # type: ignore[attr-defined]

    @classmethod
    def model_validate(cls, obj: Any, *args: Any, **kwargs: Any) -> Self:
        try:
            return super().model_validate(obj, *args, **kwargs)
        except ValidationError as exc:
            raise translate(exc, cls, cls._where) from None

    @classmethod
    def model_validate_json(cls, json_data: str | bytes | bytearray, *args: Any, **kwargs: Any) -> Self:
        try:
            return super().model_validate_json(json_data, *args, **kwargs)
        except ValidationError as exc:
            raise translate(exc, cls, cls._where) from None


@dataclass(frozen=True)
class _Number:
    """A numeric key's rule: what it is (for a bool given instead), the bound it must be above."""

    kind: str
    above: float
    rule: str
    hint: str


_NUMBERS = {
    "max_restarts": _Number("a whole number", -1, "must be 0 or more", "try 2, or 0 to fail fast"),
    "retry_body_limit": _Number(
        "a whole number of bytes", -1, "must be 0 or more", "try 16777216, or 0 to disable buffering"
    ),
    "gomaxprocs": _Number(
        "a whole number", 0, "must be a positive whole number", "try 2, or null to leave it to the go runtime"
    ),
    "startup_timeout_seconds": _Number(
        "a number of seconds", 0, "must be a number of seconds above 0", "try 30"
    ),
    "upstream_check_seconds": _Number(
        "a number of seconds", 0, "must be a number of seconds above 0", "try 10, or upstream_check: off"
    ),
    "log_backups": _Number(
        "a whole number", -1, "must be 0 or more", "try 5, or 0 to cut the log in place when it is full"
    ),
}


def number_type(value: object, info: ValidationInfo) -> object:
    """Before pydantic reads it: refuse a bool, which its lax mode would read as 1 or 0."""
    # "gomaxprocs: true" is a mistake, not a request for 1.
    if isinstance(value, bool):
        number = _NUMBERS[str(info.field_name)]
        raise ValueError(f"is not {number.kind}; {number.hint}")
    return value


def number_range(value: float | None, info: ValidationInfo) -> float | None:
    """After pydantic read it: a finite value above the key's bound; None (where allowed) passes."""
    number = _NUMBERS[str(info.field_name)]
    if value is not None and (not math.isfinite(value) or value <= number.above):
        raise ValueError(f"{number.rule}; {number.hint}")
    return value


class RestartPolicy(SchemaModel):
    """What happens when a ``ready`` sidecar's process dies. New in sidecar-fsm (Gym fails the run)."""

    _where: ClassVar[str] = f"{SIDECAR_KEY}.restart"

    max_restarts: int = 0
    """Restarts allowed per instance over the run; ``0`` fails fast, as NeMo Gym does."""

    backoff: str = "1s"
    """Wait this long (a Go duration) before each restart, on the same listen address."""

    _check_number_type = field_validator("max_restarts", mode="before")(number_type)
    _check_number_range = field_validator("max_restarts")(number_range)

    @field_validator("backoff", mode="before")
    @classmethod
    def _check_backoff(cls, value: object) -> str:
        return normalize_duration(value, "1s")[0]

    @property
    def backoff_seconds(self) -> float:
        return duration_seconds(self.backoff)


class NvcfConfig(SchemaModel):
    """New: what the proxy does with NVCF's ``202`` past its poll window (SPEC section "NVCF"); per
    instance too, where a block overrides only the keys it sets (``H2PingSidecarConfig.nvcf_of``)."""

    _where: ClassVar[str] = f"{SIDECAR_KEY}.nvcf"

    follow: bool = True
    """On a ``202`` carrying ``NVCF-REQID``, poll the status URL for the real answer; false passes it."""

    poll_window: str | None = None
    """``NVCF-POLL-SECONDS`` (whole seconds, 1s to 3600s) for requests that lack it; null: NVCF's 60 s."""

    budget: str = "60m"
    """Past this the client gets ``504`` with ``NVCF-REQID``; keep it below the client's own timeout."""

    status_url: str | None = None
    """Where to poll: an https template with ``{reqid}``; null: the upstream's NVCF status path."""

    @field_validator("poll_window", mode="before")
    @classmethod
    def _check_poll_window(cls, value: object) -> str | None:
        if value is None:
            return None
        text, seconds = normalize_duration(value, "60s")
        if seconds != int(seconds) or not 1 <= seconds <= NVCF_POLL_WINDOW_MAX_SECONDS:
            raise ValueError(
                "must be whole seconds from 1s to 3600s (NVCF-POLL-SECONDS); "
                "try '60s', or null to leave it to each client"
            )
        return text

    @field_validator("budget", mode="before")
    @classmethod
    def _check_budget(cls, value: object) -> str:
        text, seconds = normalize_duration(value, "60m")
        if seconds <= 0:
            raise ValueError("must be above 0; try '60m', below the client's own timeout")
        return text

    @field_validator("status_url", mode="before")
    @classmethod
    def _check_status_url(cls, value: object) -> object:
        if not isinstance(value, str):
            return value  # None, or pydantic's own "is not a string"
        text = value.strip()
        try:
            parts = split_url(text)
        except ValueError:
            parts = None
        if parts is None or parts.scheme != "https" or not parts.hostname:
            raise ValueError(f"must be an https:// URL template; try '{NVCF_STATUS_EXAMPLE}'")
        if parts.username is not None or parts.password is not None:
            raise ValueError("must not carry credentials (the client's Authorization is sent); drop them")
        if "{reqid}" not in text:
            raise ValueError(f"has no {{reqid}} for the request id; try '{NVCF_STATUS_EXAMPLE}'")
        return text

    @property
    def budget_seconds(self) -> float:
        return duration_seconds(self.budget)

    @property
    def poll_window_seconds(self) -> int | None:
        return None if self.poll_window is None else int(duration_seconds(self.poll_window))
