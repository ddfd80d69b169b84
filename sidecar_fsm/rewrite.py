"""Base-URL rewriting: points the model servers' URLs at the sidecars, in a live ``DictConfig`` (or dict).

Owns matching every model server's ``*base_url`` by resolved value and writing a literal for that
field only, so the keys a value was resolved from (``policy_base_url``, an aliased list, an
environment variable) keep their meaning. No I/O, no printing (the launcher reports the changes);
every change is planned before any is made, so a value that raises leaves the config as it was.
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
import dataclasses
from collections.abc import Iterator, Mapping, MutableMapping, Sequence
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict, read_write
from omegaconf.errors import OmegaConfBaseException

from sidecar_fsm.base.urls import Origin, parse_origin, split_url, without_userinfo
from sidecar_fsm.config import SidecarInstanceConfig
from sidecar_fsm.errors import ConfigError

MODEL_SERVER_TYPE = "responses_api_models"
BASE_URL_KEY_SUFFIX = "base_url"

_FIX_HINT = "fix the url, or set sidecar.rewrite_base_urls: false"

# A DictConfig key (OmegaConf allows str, int, Enum, ...) or a list index.
Key = Any
# One write of a rewrite, to put back: the container, the key, the raw value it replaced.
Undo = tuple[Any, Any, Any]

# Where ``rewrite_base_urls`` records its writes when no ``undo`` list is passed: set by
# ``recording_undo``. The launcher records this way, not by passing a third argument, because
# NeMo Gym's own tests replace ``launcher.rewrite_base_urls`` with a two-argument function and
# its public signature is Gym's ``(global_config_dict, instances)``.
_RECORDING: contextvars.ContextVar[list[Undo] | None] = contextvars.ContextVar(
    "sidecar_fsm_undo", default=None
)


@contextlib.contextmanager
def recording_undo(undo: list[Undo]) -> Iterator[list[Undo]]:
    """Within the block, every ``rewrite_base_urls`` call records its writes into ``undo``."""
    token = _RECORDING.set(undo)
    try:
        yield undo
    finally:
        _RECORDING.reset(token)


@dataclasses.dataclass(frozen=True)
class RewrittenUrl:
    """One rewritten field: where (``top.responses_api_models.server.base_url[1]``), the resolved
    value it had, and the local URL it has now. ``old`` may hold credentials: redact it before
    printing or storing (``urls.redact_url``)."""

    location: str
    old: str
    new: str


@dataclasses.dataclass(frozen=True)
class _Match:
    """One field (or list item) aimed at an instance's upstream, and what its local URL keeps."""

    path: tuple[Key, ...]  # keys from the root to the field (list index last for list items)
    location: str
    old: str
    instance: str  # the name of the instance it is aimed at
    userinfo: str  # "user:pass@" or ""
    rest: str  # path, ?query and #fragment, as written

    def local_url(self, listen: str) -> str:
        return f"http://{self.userinfo}{listen}{self.rest}"


class _Unresolved:
    """A value OmegaConf cannot produce (bad interpolation, ``???``): left for the server to report."""


_UNRESOLVED = _Unresolved()


def rewrite_base_urls(
    global_config_dict: DictConfig | MutableMapping[Any, Any],
    instances: Sequence[SidecarInstanceConfig],
    undo: list[Undo] | None = None,
) -> list[RewrittenUrl]:
    """Point every model ``*base_url`` aimed at an instance's upstream at that instance, in place.

    A string (or each string of a list) matches when it is an https URL with an instance's
    ``upstream`` origin; it becomes ``http://<listen><path>[?query][#fragment]``, userinfo kept (a
    client that authenticates with it must keep doing so). ``instances`` carry the bound addresses;
    the first wins if two share an upstream. An alias on the way (the field, its list, its server
    block) gets a resolved copy, and so does a plain dict's object reachable from two places (a
    PyYAML anchor), so the place a value came from never changes. Unresolvable values, non-strings
    and non-https URLs are left alone; an unparseable URL raises ``ConfigError`` before any write.
    ``undo`` (default: an enclosing ``recording_undo``'s list) gets each replaced raw value.
    """
    if undo is None:
        undo = _RECORDING.get()
    if not isinstance(global_config_dict, DictConfig):
        return _rewrite_plain(global_config_dict, instances, undo)
    matches = _find(global_config_dict, instances)
    changes = _changes(matches, instances)
    for match, change in zip(matches, changes, strict=True):
        _apply(global_config_dict, match.path, change.new, undo)
    return changes


def undo_writes(undo: list[Undo]) -> None:
    """Put back, last first, every value a rewrite recorded in ``undo``; empties it."""
    while undo:
        container, key, raw = undo.pop()
        if isinstance(container, (DictConfig, ListConfig)):
            _assign(container, key, raw)
        else:
            container[key] = raw


def _rewrite_plain(
    root: MutableMapping[Any, Any], instances: Sequence[SidecarInstanceConfig], undo: list[Undo] | None = None
) -> list[RewrittenUrl]:
    """``rewrite_base_urls`` of a plain mapping: matched on an OmegaConf copy, written into ``root``."""
    try:
        view = OmegaConf.create(dict(root))
    except (OmegaConfBaseException, ValueError) as exc:
        raise ConfigError(
            f"global config: cannot be read as a config ({exc}); pass a DictConfig or a plain dict"
        ) from None
    matches = _find(view, instances)
    changes = _changes(matches, instances)
    shared = _shared_containers(root)
    for match, change in zip(matches, changes, strict=True):
        _apply_plain(root, view, match.path, change.new, shared, undo)
    return changes


def _shared_containers(root: object) -> set[int]:
    """The ids of the dicts and lists reachable from ``root`` by more than one path."""
    seen: set[int] = set()
    shared: set[int] = set()
    stack = [root]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            shared.add(id(node))
            continue
        seen.add(id(node))
        children = node.values() if isinstance(node, Mapping) else node if isinstance(node, list) else ()
        stack.extend(child for child in children if isinstance(child, (Mapping, list)))
    return shared


def _apply_plain(
    root: MutableMapping[Any, Any],
    view: DictConfig,
    path: tuple[Key, ...],
    new: str,
    shared: set[int],
    undo: list[Undo] | None = None,
) -> None:
    container: Any = root
    node: Any = view
    for depth, key in enumerate(path[:-1]):
        child = container[key]
        if isinstance(child, DictConfig):
            _apply(child, path[depth + 1 :], new, undo)  # a DictConfig inside the dict: its own rules
            return
        # A "${...}" string standing for a whole block gets the resolved copy; a container reached
        # from another place too gets its own copy, as writing into it would change that place.
        alias = not isinstance(child, (MutableMapping, list))
        if alias or id(child) in shared:
            if undo is not None:
                undo.append((container, key, child))
            container[key] = child = _resolved_copy(node[key]) if alias else copy.deepcopy(child)
        container, node = child, node[key]
    if undo is not None:
        undo.append((container, path[-1], container[path[-1]]))
    container[path[-1]] = new


def plan_base_urls(
    global_config_dict: DictConfig, instances: Sequence[SidecarInstanceConfig]
) -> list[RewrittenUrl]:
    """The changes ``rewrite_base_urls`` would make (the same ``ConfigError``), without making them."""
    return _changes(_find(global_config_dict, instances), instances)


def _changes(matches: list[_Match], instances: Sequence[SidecarInstanceConfig]) -> list[RewrittenUrl]:
    listens = {instance.name: instance.listen for instance in instances}
    return [RewrittenUrl(m.location, m.old, m.local_url(listens[m.instance])) for m in matches]


def _find(root: DictConfig, instances: Sequence[SidecarInstanceConfig]) -> list[_Match]:
    by_origin: dict[Origin, SidecarInstanceConfig] = {}
    for instance in instances:
        by_origin.setdefault(parse_origin(instance.upstream), instance)
    matches: list[_Match] = []

    def consider(value: object, path: tuple[Key, ...], location: str) -> None:
        if isinstance(value, str):
            match = _match(value, by_origin, path, location)
            if match is not None:
                matches.append(match)

    for top_key, top in _resolved_items(root):
        if not isinstance(top, DictConfig) or MODEL_SERVER_TYPE not in top:
            continue
        servers = _get(top, MODEL_SERVER_TYPE)
        if not isinstance(servers, DictConfig):
            continue
        for server_name, server in _resolved_items(servers):
            if not isinstance(server, DictConfig):
                continue
            for key, value in _resolved_items(server):
                if not str(key).endswith(BASE_URL_KEY_SUFFIX):
                    continue
                path: tuple[Key, ...] = (top_key, MODEL_SERVER_TYPE, server_name, key)
                location = ".".join(str(part) for part in path)
                if isinstance(value, ListConfig):
                    for index in range(len(value)):
                        consider(_get(value, index), (*path, index), f"{location}[{index}]")
                else:
                    consider(value, path, location)
    return matches


def _match(
    url: str, by_origin: dict[Origin, SidecarInstanceConfig], path: tuple[Key, ...], location: str
) -> _Match | None:
    """``url``'s match when it is aimed at an instance's upstream, else None."""
    try:
        parts = split_url(url)
        # An https URL whose host or port cannot be read might be aimed at an upstream; guessing
        # either way would route (or not route) a model's traffic silently.
        https = parts.scheme.lower() == "https"
        instance = by_origin.get(parse_origin(url)) if https else None
    except ValueError as exc:
        raise ConfigError(f"{location}: '{without_userinfo(url)}' {exc}; {_FIX_HINT}") from None
    if instance is None:
        return None
    userinfo, at, _ = parts.netloc.rpartition("@")
    rest = parts.path
    if parts.query:
        rest += f"?{parts.query}"
    if parts.fragment:
        rest += f"#{parts.fragment}"
    return _Match(path, location, url, instance.name, userinfo + at, rest)


def _resolved_items(container: DictConfig) -> Iterator[tuple[Key, Any]]:
    """``container``'s keys with their values as ``_get`` gives them, resolving only what needs it.

    OmegaConf resolves on every access (~25 us a node); a config is mostly plain values, so this
    made the walk before a start's first process twice as fast.
    """
    for key, raw in container.items_ex(resolve=False):
        if isinstance(raw, str) and ("${" in raw or raw == "???"):
            yield key, _get(container, key)
        else:
            yield key, raw


def _get(container: Any, key: Key) -> Any:
    """``container[key]`` resolved, or ``_UNRESOLVED`` when OmegaConf cannot produce it."""
    try:
        return container[key]
    except OmegaConfBaseException:
        return _UNRESOLVED


def _apply(root: DictConfig, path: tuple[Key, ...], new: str, undo: list[Undo] | None = None) -> None:
    container: Any = root
    for key in path[:-1]:
        if OmegaConf.is_interpolation(container, key):
            # Writing through an alias would change the node it points at (another server's
            # block, a shared list): give this field its own resolved copy instead.
            _remember(undo, container, key)
            _assign(container, key, _resolved_copy(container[key]))
        child = container[key]
        assert isinstance(child, (DictConfig, ListConfig)), path
        container = child
    _remember(undo, container, path[-1])
    _assign(container, path[-1], new)


def _remember(undo: list[Undo] | None, container: Any, key: Key) -> None:
    """Record the raw value (an interpolation as written, or a leaf) that a write replaces."""
    if undo is not None:
        node = container._get_node(key)
        undo.append((container, key, node._value()))


def _assign(container: Any, key: Key, value: Any) -> None:
    # Struct and read-only flags guard against typos in user code; this write replaces an
    # existing key with a value of the same kind, which is the launcher's documented job.
    # Lifting a flag invalidates OmegaConf's flag cache below the node, so it is done only
    # when a flag is set (a Gym config usually has none).
    if not OmegaConf.is_readonly(container) and not OmegaConf.is_struct(container):
        container[key] = value
        return
    with read_write(container), open_dict(container):
        container[key] = value


def _resolved_copy(node: Any) -> Any:
    """A plain copy of ``node`` with every value resolved; one that cannot be (``${oc.env:MISSING}``)
    is copied as written, so the server reports it exactly as it would have."""
    if not isinstance(node, (DictConfig, ListConfig)):
        return node
    raw = OmegaConf.to_container(node, resolve=False)
    if isinstance(raw, dict):
        return {key: _resolved_item(node, key, value) for key, value in raw.items()}
    assert isinstance(raw, list)
    return [_resolved_item(node, index, value) for index, value in enumerate(raw)]


def _resolved_item(container: Any, key: Key, raw: Any) -> Any:
    value = _get(container, key)
    return raw if isinstance(value, _Unresolved) else _resolved_copy(value)
