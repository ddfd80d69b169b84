"""Where things live: the proxy's Go sources, the SQLite migrations, the packaged proxy, the log dir.

In a source checkout (and an editable install) they are the top-level ``go/`` and ``migrations/``
folders; a wheel carries them inside the package as ``_go/`` and ``_migrations/`` (see
``pyproject.toml``), and the proxy compiled at wheel-build time (``hatch_build.py``) as
``_bin/h2-ping-sidecar`` with the sources hash it was built from beside it. Must not read or hash
them: it only says where they are.
"""

import os
import shlex
import tempfile
from pathlib import Path

_PACKAGE_DIR = Path(__file__).resolve().parent.parent


def _bundled_or_checkout(name: str) -> Path:
    bundled = _PACKAGE_DIR / f"_{name}"
    return bundled if bundled.is_dir() else _PACKAGE_DIR.parent / name


SIDECAR_SOURCE_DIR: Path = _bundled_or_checkout("go")
MIGRATIONS_DIR: Path = _bundled_or_checkout("migrations")
# Only a wheel has these (an editable install and a source checkout build from go/ instead).
PACKAGED_BIN_DIR: Path = _PACKAGE_DIR / "_bin"
PACKAGED_BINARY_NAME = "h2-ping-sidecar"
# One line: the sources hash (``gobuild.digest_of``) of the go/ the packaged binary was built from.
PACKAGED_SOURCES_NAME = "h2-ping-sidecar.sources"


def default_log_dir() -> str:
    """``<tmp>/nemo_gym_h2ping-<uid>``: NeMo Gym's fallback when neither ``sidecar.log_dir`` nor
    ``nemo_gym_log_dir`` is set, and so where the CLI looks when ``--log-dir`` is not given.

    Per user, so two users of one host never share a state database or ready files.
    """
    return os.path.join(tempfile.gettempdir(), f"nemo_gym_h2ping-{os.getuid()}")


def command_hint(command: str, log_dir: str | os.PathLike[str] | None = None) -> str:
    """``sidecar-fsm COMMAND`` as a user should type it to look at ``log_dir``: with ``--log-dir``
    unless it is the default, or the hint would show an older, unrelated run."""
    if log_dir is None or os.path.abspath(log_dir) == os.path.abspath(default_log_dir()):
        return f"sidecar-fsm {command}"
    return f"sidecar-fsm --log-dir {shlex.quote(os.fspath(log_dir))} {command}"
