"""``sidecar-fsm exec``'s bootstrap: NeMo Gym's sidecar launcher resolves to sidecar-fsm's.

``sidecar-fsm exec`` puts this folder first on ``PYTHONPATH``, so every Python process of the
command and its children (Gym's servers, Ray workers) runs this first. Two ``sys.meta_path``
finders: first on the path, Gym's ``launcher`` and ``config`` *are* sidecar-fsm's module objects
(so ``except SidecarError`` and ``patch.object(launcher, ...)`` see the same classes and globals);
last, empty ``nemo_gym`` parents only when NeMo Gym is not installed. Then the ``sitecustomize``
that would have run without us runs. Standard library only and cheap: most processes never
import the launcher, and sidecar_fsm may not be importable in every interpreter.
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

# Mirrored by sidecar_fsm.gymexec.REDIRECTED_MODULES (a test keeps the two equal).
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
