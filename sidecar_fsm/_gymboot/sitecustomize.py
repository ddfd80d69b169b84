"""``sidecar-fsm exec``'s bootstrap: NeMo Gym's sidecar launcher resolves to sidecar-fsm's.

Python imports ``sitecustomize`` at start-up from the first folder on ``sys.path`` that has one.
``sidecar-fsm exec`` puts this folder first on ``PYTHONPATH``, so every Python process of the
command, and of the children it starts (they inherit the variable: Gym's servers, Ray workers),
runs this before any code of its own. It installs two ``sys.meta_path`` finders, then runs the
``sitecustomize`` that would have run without us:

- first on the path, for exactly ``nemo_gym.h2_ping_sidecar.launcher`` and ``.config``: the
  module is sidecar-fsm's own module object (``sidecar_fsm.launcher`` / ``.config``), so Gym's
  ``except SidecarError`` and ``patch.object(launcher, ...)`` see the same classes and globals;
- last on the path, for ``nemo_gym`` and ``nemo_gym.h2_ping_sidecar`` only when no one else
  provides them: empty packages, so the launcher resolves without NeMo Gym installed. With it
  installed, every other module of ``nemo_gym`` stays Gym's.

Must stay cheap and import nothing of sidecar_fsm at start-up: most Python processes of a run
never import the launcher, and sidecar_fsm may not be importable in every interpreter the
command starts (that import then fails with one line saying so). Standard library only.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Sequence
from types import ModuleType

# Mirrored by sidecar_fsm.gymexec.REDIRECTED_MODULES (a test keeps the two equal): this file
# cannot import it without importing sidecar_fsm in every Python process.
_ALIASES = {
    "nemo_gym.h2_ping_sidecar.launcher": "sidecar_fsm.launcher",
    "nemo_gym.h2_ping_sidecar.config": "sidecar_fsm.config",
}
_PARENTS = ("nemo_gym", "nemo_gym.h2_ping_sidecar")
_MARK = "_sidecar_fsm_exec"


class _AliasLoader(importlib.abc.Loader):
    """Loads an alias as the target module itself: one module object under two names."""

    def __init__(self, target: str) -> None:
        self._target = target
        self._own_spec: importlib.machinery.ModuleSpec | None = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        try:
            module = importlib.import_module(self._target)
        except ImportError as error:
            raise ImportError(
                f"{spec.name} is {self._target} under sidecar-fsm exec, but that cannot be imported "
                f"in {sys.executable} ({error}); install sidecar-fsm into this environment",
                name=spec.name,
            ) from error
        self._own_spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        # The import system stamped the alias's spec on the module; it keeps its own, so a
        # reload or pickle by its real name still works.
        if self._own_spec is not None:
            module.__spec__ = self._own_spec


class _AliasFinder(importlib.abc.MetaPathFinder):
    _sidecar_fsm_exec = True

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        aliased = _ALIASES.get(fullname)
        if aliased is None:
            return None
        return importlib.util.spec_from_loader(fullname, _AliasLoader(aliased))


class _EmptyPackageLoader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None

    def exec_module(self, module: ModuleType) -> None:
        module.__doc__ = "Stand-in parent created by sidecar-fsm exec: NeMo Gym is not installed here."


class _ParentFinder(importlib.abc.MetaPathFinder):
    _sidecar_fsm_exec = True

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in _PARENTS:
            return None
        return importlib.machinery.ModuleSpec(fullname, _EmptyPackageLoader(), is_package=True)


def _install() -> None:
    # A nested `sidecar-fsm exec` from another install chains into a second copy of this file.
    if any(getattr(finder, _MARK, False) for finder in sys.meta_path):
        return
    sys.meta_path.insert(0, _AliasFinder())
    sys.meta_path.append(_ParentFinder())


def _chain() -> None:
    """Run the ``sitecustomize`` further on the path, as Python would have without this folder."""
    here = os.path.dirname(os.path.abspath(__file__))
    folders = [os.path.abspath(entry or os.curdir) for entry in sys.path]
    # Only what comes after this folder: a second bootstrap copy earlier on the path (nested
    # exec from another install) chaining back to us would otherwise loop forever.
    after = folders.index(here) + 1 if here in folders else 0
    pairs = zip(sys.path[after:], folders[after:], strict=True)
    rest = [entry for entry, folder in pairs if folder != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    # Under the name Python gave it, so `import sitecustomize` later finds the user's module.
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


_install()
_chain()
