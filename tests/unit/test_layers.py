"""The package's folders are its layers, and imports only go down them.

``view`` → ``run`` → ``observe`` → ``state`` → ``config`` → ``base`` / ``errors`` / ``lab``, with
the public modules (``cli``, ``launcher``, ``demo``, ``gymexec``, ...) above them all. An import that goes
up a layer (a leaf reaching for the store, the state layer reaching for a running child) fails
here, naming the file and the import, before it becomes a cycle nobody can cut.
"""

from __future__ import annotations

import ast
from pathlib import Path

import sidecar_fsm

PACKAGE = Path(sidecar_fsm.__file__).parent

# Higher numbers may import lower ones and their own layer, never higher ones.
# configblocks: the nested blocks config builds on, in the config layer.
RANK = {"base": 0, "errors": 0, "lab": 0, "config": 1, "configblocks": 1}
RANK |= {"state": 2, "observe": 3, "run": 4, "view": 5}
PUBLIC = 6


def _rank(module: str) -> int:
    """The layer of ``sidecar_fsm.<first>...``: a subpackage's, or the public surface's."""
    first = module.split(".")[1] if "." in module else ""
    return RANK.get(first, PUBLIC)


def _imports(path: Path) -> list[tuple[int, str]]:
    """Every ``sidecar_fsm`` module ``path`` imports, with its line (TYPE_CHECKING ones too:
    an annotation that names an upper layer is the same dependency, deferred)."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "sidecar_fsm":
                found += [(node.lineno, f"sidecar_fsm.{alias.name}") for alias in node.names]
            elif node.module.startswith("sidecar_fsm."):
                found.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.startswith("sidecar_fsm.")]
    return found


def test_every_layer_is_a_package_with_a_docstring_that_says_what_it_owns() -> None:
    for layer in ("state", "observe", "run", "view", "base", "lab"):
        init = PACKAGE / layer / "__init__.py"
        assert ast.get_docstring(ast.parse(init.read_text())), f"{init}: no docstring"


def test_no_import_goes_up_a_layer() -> None:
    upward: list[str] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE.parent).with_suffix("")
        module = ".".join(relative.parts).removesuffix(".__init__")
        if "_gymboot" in relative.parts:
            continue
        own = _rank(module)
        for line, imported in _imports(path):
            if _rank(imported) > own:
                upward.append(f"{path.relative_to(PACKAGE.parent)}:{line} imports {imported}")
    assert upward == []


def test_the_rule_catches_an_upward_import() -> None:
    """The walk above would pass vacuously if it found no imports at all."""
    assert _rank("sidecar_fsm.state.store") > _rank("sidecar_fsm.base.procs")
    store, observe, reap = "sidecar_fsm.state.store", "sidecar_fsm.observe.runs", "sidecar_fsm.run.reap"
    assert _rank(store) < _rank(observe) < _rank(reap)
    assert ("sidecar_fsm.state.store", 2) in [
        (name, _rank(name)) for _, name in _imports(PACKAGE / "run" / "reap.py")
    ]
