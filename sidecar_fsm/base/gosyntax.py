"""Values the Go side reads: durations (``time.ParseDuration``, the proxy's flags) and GOMEMLIMIT.

Owns parsing and formatting them exactly as Go will, so a value the config accepts is never one
the proxy refuses at start (a sidecar that dies before it is ready). Errors are ``ValueError``
saying only "what is wrong; what to do". Must not do I/O and imports nothing from this package.
"""

from __future__ import annotations

import math
import re

DURATION_HINT = "use Go syntax like '60s', '1m30s', '250ms' or a number of seconds"
MEMORY_LIMIT_HINT = "use bytes or a KiB, MiB, GiB or TiB count like '1GiB', or 'off'"
SIZE_HINT = "use bytes or a KiB, MiB, GiB or TiB count like '100MiB', or 0 to never rotate"

_UNIT_SECONDS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
# Go's time.ParseDuration grammar: [-+]?([0-9]*(\.[0-9]*)?[a-z]+)+ with a known unit, or "0".
# "ms" precedes "m" in the alternation so "5ms" is not read as 5 minutes and a stray "s".
_DURATION_PART = re.compile(r"([0-9]+\.?[0-9]*|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h)")
_DURATION = re.compile(rf"([-+]?)((?:{_DURATION_PART.pattern})+)")
_NUMBER = re.compile(r"[-+]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?")
# Go's runtime reads GOMEMLIMIT as ^[0-9]+(([KMGT]i)?B)?$ (or "off") and exits at start on
# anything else.
_MEMORY_LIMIT = re.compile(r"([0-9]+)((?:[KMGT]i)?B)?")
_MEMORY_UNITS = {None: 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}
_INT64_MAX = (1 << 63) - 1


def duration_seconds(value: object, example: str = "60s") -> float:
    """Seconds in ``value``: a Go duration string (``60s``, ``1m30s``, ``250ms``) or a number.

    A string needs its unit, as in Go (only ``0`` may go without): ``'60'`` is refused, the
    number ``60`` is seconds. Raises ``ValueError`` for anything else, a negative duration and
    one longer than Go's int64 nanoseconds; ``example`` is the value the message suggests.
    """
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ValueError(f"is not a duration; {DURATION_HINT}")
    seconds = _parse_go_duration(value.strip()) if isinstance(value, str) else float(value)
    if not math.isfinite(seconds):
        raise ValueError(f"is not a duration; {DURATION_HINT}")
    if seconds < 0:
        raise ValueError(f"must not be negative; use a duration like '{example}'")
    if seconds * 1e9 > _INT64_MAX:
        raise ValueError(f"is longer than go allows (about 292 years); use a duration like '{example}'")
    return seconds + 0.0  # -0.0 (from "-0s") reads as 0 everywhere it is shown


def _parse_go_duration(text: str) -> float:
    if text in {"0", "+0", "-0"}:
        return 0.0
    if _NUMBER.fullmatch(text):
        number = float(text)
        if number < 0:
            return number  # refused as negative, the more useful thing to say
        with_unit = f"{text}s" if _DURATION.fullmatch(f"{text}s") else format_go_duration(number)
        raise ValueError(f"has no unit; write '{with_unit}', or the number {text} unquoted for seconds")
    match = _DURATION.fullmatch(text)
    if match is None:
        raise ValueError(f"is not a duration; {DURATION_HINT}")
    seconds = sum(float(number) * _UNIT_SECONDS[unit] for number, unit in _DURATION_PART.findall(match[2]))
    return -seconds if match[1] == "-" else seconds


def normalize_duration(value: object, example: str = "60s") -> tuple[str, float]:
    """(the Go duration string to keep in the config and pass to the flag, its seconds).

    A string is kept as written, stripped (as NeMo Gym passed it); a number becomes its
    ``format_go_duration``, whose seconds are returned, so checks apply to what the proxy gets.
    """
    seconds = duration_seconds(value, example)
    if isinstance(value, str):
        return value.strip(), seconds
    text = format_go_duration(seconds)
    return text, duration_seconds(text)


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


def _byte_count(value: object, what: str, hint: str) -> tuple[str, int]:
    """(the stripped text, its bytes) of an int or GOMEMLIMIT-style text; ``ValueError`` else."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    match = _MEMORY_LIMIT.fullmatch(value.strip()) if isinstance(value, str) else None
    if match is None:
        raise ValueError(f"is not {what}; {hint}")
    return match[0], int(match[1]) * _MEMORY_UNITS[match[2]]


def size_bytes(value: object) -> int:
    """``value`` as a byte count: a whole number of bytes, or ``100MiB``/``512KiB``/``1GiB`` text.

    GOMEMLIMIT's units, so one spelling works for both. Raises ``ValueError`` for anything else
    (``100MB``, ``1.5GiB``, a bool) and a size above 2^63-1 bytes (the proxy's int64 flag).
    """
    _, size = _byte_count(value, "a size", SIZE_HINT)
    if size > _INT64_MAX:
        raise ValueError(f"is larger than the proxy allows (2^63-1 bytes); {SIZE_HINT}")
    return size


def normalize_memory_limit(value: object) -> str:
    """``value`` as GOMEMLIMIT text: ``1GiB``, ``512MiB``, a byte count (an int is one), or ``off``.

    Raises ``ValueError`` for what Go's runtime would refuse (``1GB``, ``1 GiB``, ``1.5GiB``, a
    limit above 2^63-1 bytes).
    """
    if isinstance(value, str) and value.strip() == "off":
        return "off"
    text, size = _byte_count(value, "a go memory limit", MEMORY_LIMIT_HINT)
    if size > _INT64_MAX:
        raise ValueError(f"is larger than go allows (2^63-1 bytes); {MEMORY_LIMIT_HINT}")
    return text
