"""Where the files read at run time live: the proxy's Go sources and the SQLite migrations.

In a source checkout (and an editable install) they are the top-level ``go/`` and ``migrations/``
folders; a wheel carries them inside the package as ``_go/`` and ``_migrations/`` (see
``pyproject.toml``). Must not read or hash them: it only says where they are.
"""

from pathlib import Path

_PACKAGE_DIR = Path(__file__).resolve().parent


def _bundled_or_checkout(name: str) -> Path:
    bundled = _PACKAGE_DIR / f"_{name}"
    return bundled if bundled.is_dir() else _PACKAGE_DIR.parent / name


SIDECAR_SOURCE_DIR: Path = _bundled_or_checkout("go")
MIGRATIONS_DIR: Path = _bundled_or_checkout("migrations")
