"""The words of a bad ``sidecar:`` block: each problem as one line, raised as pydantic's error.

Owns every message the block produces, ``sidecar.<path>: '<value>' <what is wrong>; <what to do>``,
and the exception that carries them: a ``pydantic.ValidationError``, as NeMo Gym's schema raises,
so Gym's ``except ValidationError`` keeps working. Each error keeps pydantic's ``type`` and
``loc``; its ``msg`` is our line, which alone quotes the input (credentials masked).
``describe_error`` renders any config error as the text the CLI prints. Must not validate
anything (``config`` decides; this module words) nor do I/O.
"""

from __future__ import annotations

import difflib
import json
import re
from typing import Any, get_args

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException
from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails, InitErrorDetails, PydanticCustomError

from sidecar_fsm.base.urls import without_userinfo

_NODES_REMOVED = (
    "is not supported: the sidecar always runs next to the servers that call it "
    "(one per node, started by gym env start there); remove it"
)


# One step of OmegaConf's full_key: "sidecar.instances[0].upstream" -> sidecar, instances, [0], upstream
_KEY_PART = re.compile(r"[^.\[\]]+|\[\d+\]")


class Omit:
    """Marker: the message has no value to quote (a missing key, an empty list described in words)."""


OMIT = Omit()


class Problem(ValueError):
    """A validation failure already worded for the user, minus the field path and quoted value,
    which the translator adds (a validator cannot know the path). ``path`` extends pydantic's
    location for a model-level check that blames one nested field, whose ``value`` is quoted.
    """

    def __init__(self, what: str, *, path: tuple[str | int, ...] = (), value: object = None) -> None:
        super().__init__(what)
        self.path = path
        self.value = value


def show_value(value: object) -> str:
    """A value as a message quotes it: YAML-like scalars, compact containers, no credentials."""
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


def field_path(where: str, loc: tuple[str | int, ...]) -> str:
    """``where`` extended by a pydantic location: ``sidecar`` + ``("instances", 1, "name")``."""
    for part in loc:
        where += f"[{part}]" if isinstance(part, int) else f".{part}"
    return where


def config_error(title: str, loc: tuple[str | int, ...], line: str) -> ValidationError:
    """A ``ValidationError`` with one problem already worded (``line``); for checks outside a model."""
    return _validation_error(title, [("value_error", loc, line)])


def translate(exc: ValidationError, root: type[BaseModel], where: str) -> ValidationError:
    """``exc`` (raised by ``root``, which sits at ``where`` in the config) with every message ours."""
    worded = [_describe(error, root, where) for error in exc.errors()]
    return _validation_error(exc.title, worded)


def describe_error(exc: BaseException) -> str:
    """The text the CLI prints for a config error (a ``ValidationError`` or any exception, such
    as ``ConfigError``): the first problem on line one, then the rest."""
    if not isinstance(exc, ValidationError):
        return str(exc).strip() or type(exc).__name__
    lines = [_line_of(error) for error in exc.errors()]
    if not lines:
        return f"{exc.title}: is invalid"
    first, *rest = lines
    return first + "".join(f"\n  also {line}" for line in rest)


def resolution_error(title: str, config: DictConfig, exc: OmegaConfBaseException) -> ValidationError:
    """The error for a ``${...}`` in the block that OmegaConf cannot resolve, naming its key."""
    where = str(getattr(exc, "full_key", "") or "sidecar")
    loc = tuple(int(part[1:-1]) if part.startswith("[") else part for part in _KEY_PART.findall(where))
    raw: Any = OMIT
    try:
        raw = OmegaConf.to_container(config, resolve=False)
        for part in loc:
            raw = raw[part]
    except (LookupError, TypeError, ValueError, OmegaConfBaseException):
        raw = OMIT
    reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    # "KeyError raised while resolving interpolation: \"Environment variable 'X' not found\""
    reason = reason.split("raised while resolving interpolation: ", 1)[-1].strip().strip("\"'")
    if type(exc).__name__ == "MissingMandatoryValue":
        what = "is a mandatory value that was never set; set it in the config or on the command line"
    else:
        reason = reason[:1].lower() + reason[1:]
        what = f"cannot be resolved ({reason}); set what it refers to, or write the value"
    value = "" if isinstance(raw, Omit) else f" '{show_value(raw)}'"
    # loc is relative to the block, as pydantic's would be: "sidecar" itself is left out.
    return _validation_error(title, [("value_error", loc[1:], f"{where}:{value} {what}")])


def _validation_error(title: str, worded: list[tuple[str, tuple[str | int, ...], str]]) -> ValidationError:
    # The template only places our line: a brace inside it ({name, upstream, listen}) is text.
    # ``input`` is None and hide_input set, so an upstream's credentials never reach str(exc)
    # or errors(); the line quotes the value with them masked.
    details: list[InitErrorDetails] = [
        {"type": PydanticCustomError(kind, "{message}", {"message": line}), "loc": loc, "input": None}
        for kind, loc, line in worded
    ]
    return ValidationError.from_exception_data(title, details, hide_input=True)


def _line_of(error: ErrorDetails) -> str:
    line = (error.get("ctx") or {}).get("message")
    if isinstance(line, str):
        return line
    loc = ".".join(str(part) for part in error["loc"]) or "config"
    message = str(error.get("msg", "is invalid"))
    return f"{loc}: {message[:1].lower()}{message[1:]}"


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
_REQUIRED_HINTS = {
    "upstream": "set it to the https:// url to forward to, like https://api.example.com",
}


def _describe(
    error: ErrorDetails, root: type[BaseModel], where: str
) -> tuple[str, tuple[str | int, ...], str]:
    """(pydantic's error type, the location blamed, our line) for one pydantic error."""
    loc = tuple(error["loc"])
    kind = error["type"]
    value: object = error.get("input")
    cause = (error.get("ctx") or {}).get("error")
    if isinstance(cause, ValueError):
        if isinstance(cause, Problem) and cause.path:
            loc += cause.path
            value = cause.value
        if isinstance(value, Omit):  # "sidecar.instances is required ...": nothing to quote
            return kind, loc, f"{field_path(where, loc)} {cause}"
        return kind, loc, f"{field_path(where, loc)}: '{show_value(value)}' {cause}"
    path = field_path(where, loc)
    if kind == "extra_forbidden":
        key = str(loc[-1]) if loc else "?"
        if path == "sidecar.nodes":
            return kind, loc, f"{path}: NeMo Gym's old 'nodes' key {_NODES_REMOVED}"
        known = sorted(_model_at(root, loc).model_fields)
        close = difflib.get_close_matches(key, known, n=1)
        hint = f"did you mean '{close[0]}'?" if close else "known keys are " + ", ".join(known)
        return kind, loc, f"{path}: unknown key; {hint}"
    name = next((str(part) for part in reversed(loc) if isinstance(part, str)), "")
    if kind == "missing":
        return kind, loc, f"{path} is required; {_REQUIRED_HINTS.get(name, 'set it')}"
    if kind in _TYPE_MESSAGES:
        what = _TYPE_MESSAGES[kind]
        if kind in {"string_type", "list_type", "dict_type", "model_type"} and name in _TYPE_HINTS:
            what = f"{what}; {_TYPE_HINTS[name]}"
        elif kind == "string_type":
            what = f"{what}; quote it"
        return kind, loc, f"{path}: '{show_value(value)}' {what}"
    message = str(error.get("msg", "is invalid"))
    return kind, loc, f"{path}: '{show_value(value)}' {message[:1].lower()}{message[1:]}"


def _model_at(root: type[BaseModel], loc: tuple[str | int, ...]) -> type[BaseModel]:
    """The model class that holds the key at ``loc`` (for listing the keys it knows)."""
    model = root
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        field = model.model_fields.get(part)
        nested = _model_in(field.annotation) if field is not None else None
        if nested is None:
            break
        model = nested
    return model


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The model inside a field's type: ``RestartPolicy``, ``list[SidecarInstanceConfig]``."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None
