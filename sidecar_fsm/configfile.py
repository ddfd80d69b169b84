"""Loading a NeMo Gym config from files and overrides, and writing the rewritten one back.

Owns what ``gym env start --config A.yaml key=value`` does before Gym sees the config (OmegaConf
merge, then dotlist overrides) and ``--write-config``'s YAML. Every failure is a one-line
``ConfigError`` naming the file (and line) or the override. Must not validate the ``sidecar:``
block (``config`` does) or start anything.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence

from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException
from yaml import MarkedYAMLError, YAMLError

from sidecar_fsm.base.atomicfile import write_atomically
from sidecar_fsm.errors import ConfigError

__all__ = [
    "EXAMPLE_CONFIG",
    "EXAMPLE_MODEL_BASE_URL",
    "config_to_write",
    "load_config",
    "load_yaml",
    "write_atomically",
    "yaml_error_line",
]

# The README's example config, word for word (tests/unit/test_first_hour.py holds them equal):
# ``sidecar-fsm lab`` writes it and prints the overrides that point it at the lab.
EXAMPLE_CONFIG = """\
sidecar:
  enabled: true
  instances:
    - name: nvcf
      upstream: https://integrate.api.nvidia.com
      listen: 127.0.0.1:1250        # 127.0.0.1:0 picks a free port
      # metrics_listen: 127.0.0.1:9464  # a fixed /metrics address for Prometheus (default: a free port)
  ping_interval: 60s               # < 340s, the Global Accelerator idle limit
  ping_timeout: 15s
  shutdown_grace: 60s
  max_conn_age: 50m                # rotate before the ALB's 3600 s GOAWAY; 0 disables
  exit_with_owner: true            # a sidecar never outlives a killed launcher
  restart: {max_restarts: 0, backoff: 1s}
  metrics: true                    # /metrics on a free loopback port, read by status and top
  upstream_check: warn             # wait for each proxy's first upstream check (TLS, h2, a PING); fail | off

policy_model:
  responses_api_models:
    openai_model:
      base_url: https://integrate.api.nvidia.com/v1   # rewritten to http://127.0.0.1:1250/v1
"""
# Its model server's base_url, as a dotlist key: what the lab's start line overrides.
EXAMPLE_MODEL_BASE_URL = "policy_model.responses_api_models.openai_model.base_url"


def yaml_error_line(name: str, error: YAMLError) -> str:
    """``FILE:LINE:COLUMN: not valid YAML: problem (context at line L column C)``, counted from 1."""
    if isinstance(error, MarkedYAMLError):
        mark = error.problem_mark or error.context_mark
        where = f"{name}:{mark.line + 1}:{mark.column + 1}" if mark is not None else name
        problem = error.problem or error.context or type(error).__name__
        context = ""
        at = error.context_mark
        if error.context and error.problem and at is not None:
            context = f" ({error.context} at line {at.line + 1} column {at.column + 1})"
        return f"{where}: not valid YAML: {problem}{context}"
    first = str(error).strip().splitlines()
    return f"{name}: not valid YAML: {first[0] if first else type(error).__name__}"


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def load_yaml(name: str, where: str) -> DictConfig:
    """One YAML file as a mapping; a missing, unreadable or malformed file is a one-line error."""
    if not os.path.isfile(name):
        raise ConfigError(f"{where}: '{name}' is not a file; give a YAML config file")
    try:
        loaded = OmegaConf.load(name)
    except YAMLError as error:
        raise ConfigError(f"{where}: {yaml_error_line(name, error)}; fix the file") from error
    except OmegaConfBaseException as error:
        raise ConfigError(f"{where}: {name}: {_first_line(error)}; fix the file") from error
    except UnicodeDecodeError as error:
        raise ConfigError(
            f"{where}: {name}: not UTF-8 text (byte {error.start}); save it as UTF-8"
        ) from error
    except OSError as error:
        raise ConfigError(
            f"{where}: '{name}' cannot be read ({error.strerror or error}); check its permissions"
        ) from error
    if not isinstance(loaded, DictConfig):
        raise ConfigError(f"{where}: {name}: the top level is a list, not a mapping; fix the file")
    return loaded


# ``a.b``, ``a.0.b``, ``a[0].b``: no empty segment (``a..b`` would add a key named "").
_KEY = re.compile(r"[^.\[\]=\s]+(\[\d+\])*(\.[^.\[\]=\s]+(\[\d+\])*)*")
OVERRIDE_EXAMPLE = "sidecar.instances.0.upstream=https://api.example.com"


def load_config(items: Sequence[str], where: str) -> DictConfig:
    """Merge the YAML files (items without ``=``), then apply the ``key=value`` overrides, in order.

    Overrides are OmegaConf's dotlist (``a.0.b=x``, ``a[0].b=x``, ``k=[1,2]``, new keys), but a
    value replaces what is there (a mapping merges into a mapping), so a list may replace a
    mapping, which ``OmegaConf.merge`` of a dotlist would refuse.
    """
    files = [item for item in items if "=" not in item]
    overrides = [item for item in items if "=" in item]
    if not files:
        raise ConfigError(f"{where}: no CONFIG.yaml given; pass at least one YAML file")
    configs = [load_yaml(name, where) for name in files]
    merged = OmegaConf.merge(*configs)
    assert isinstance(merged, DictConfig)  # a merge of mappings is a mapping
    for override in overrides:
        apply_override(merged, override, where)
    return merged


def apply_override(config: DictConfig, override: str, where: str) -> None:
    """Apply one ``key=value`` to ``config`` in place; a malformed one is a one-line ``ConfigError``."""
    key, _, text = override.partition("=")
    hint = f"use key=value, e.g. {OVERRIDE_EXAMPLE}"
    if not key:
        raise ConfigError(f"{where}: override '{override}': no key before '='; {hint}")
    if not _KEY.fullmatch(key):
        raise ConfigError(f"{where}: override '{override}': '{key}' is not a dotted key; {hint}")
    try:
        # The value is parsed as a dotlist value is (YAML: numbers, lists, mappings, null).
        parsed = OmegaConf.to_container(OmegaConf.from_dotlist([f"value={text}"]))
        assert isinstance(parsed, dict)  # a dotlist makes a mapping
        value = parsed["value"]
        current = OmegaConf.select(config, key, throw_on_missing=False)
        merge = isinstance(value, dict) and isinstance(current, DictConfig)
        with open_dict(config):
            OmegaConf.update(config, key, value, merge=merge, force_add=True)
    except (OmegaConfBaseException, YAMLError) as error:
        raise ConfigError(f"{where}: override '{override}': {_first_line(error)}; {hint}") from error


def config_to_write(config: DictConfig, drop_keys: Sequence[str] = ()) -> str:
    """The rewritten config as YAML for ``--write-config``, with ``sidecar.enabled: false``: its
    sidecars already run, so Gym must use them, not start a second set. ``drop_keys`` are top-level
    keys the caller added itself (a ``cache_dir`` the user did not write: Gym reads it too).
    """
    written = OmegaConf.create(OmegaConf.to_container(config, resolve=False))
    assert isinstance(written, DictConfig)
    with open_dict(written):
        written.sidecar.enabled = False
        for key in drop_keys:
            del written[key]
    return OmegaConf.to_yaml(written)
