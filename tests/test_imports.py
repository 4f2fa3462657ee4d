"""deploybench's modules import each other one way: no module depends on itself through others.

Every ``.py`` under ``deploybench/`` is parsed (nothing is imported) and every import of a
deploybench module counts, wherever it is written: at the top, inside a function (a lazy
import is still a dependency, it only runs later), and under ``if TYPE_CHECKING:`` (a type-only
import still ties the two modules' designs together; it is how cycles get hidden). Importing a
submodule is not counted as importing its package's ``__init__`` (a package that imports its own
submodules is not a cycle).
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = "deploybench"
ROOT = Path(__file__).resolve().parents[1] / PACKAGE


def _modules(root: Path) -> dict[str, Path]:
    """Dotted module name → file, e.g. ``deploybench.models`` → ``models/__init__.py``."""
    out = {}
    for file in sorted(root.rglob("*.py")):
        parts = (root.name, *file.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = file
    return out


def _imports(name: str, file: Path, modules: dict[str, Path]) -> set[str]:
    """The modules of ``modules`` that ``name`` imports, anywhere in its file."""
    package = name if file.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(file.read_text(), filename=str(file))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*base_parts, *([node.module] if node.module else [])])
            else:
                base = node.module or ""
            # ``from . import provenance`` imports a module; ``from .io import atomic_path`` a
            # name of one.
            targets = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        else:
            continue
        for target in targets:
            # ``import deploybench.models.tft`` depends on the module it names.
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target in modules and target != name:
                found.add(target)
    return found


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as ``[a, b, …, a]``, or None (depth-first search, deterministic order)."""
    state: dict[str, str] = {}  # "open" while on the path, "done" once fully explored
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def _graph(root: Path = ROOT) -> dict[str, set[str]]:
    modules = _modules(root)
    return {name: _imports(name, file, modules) for name, file in modules.items()}


def test_deploybench_imports_have_no_cycle():
    cycle = _find_cycle(_graph())
    assert cycle is None, "import cycle: " + " → ".join(cycle or [])


def test_checkpoint_io_is_a_leaf_models_use():
    """The checkpoint file readers import no model code; models and the family-level
    checkpoint module use them."""
    graph = _graph()
    assert graph["deploybench.errors"] == set()  # the exception hierarchy is a leaf too
    assert graph["deploybench.unpickle"] <= {"deploybench.errors"}
    assert graph["deploybench.checkpoint_io"] <= {
        "deploybench.errors",
        "deploybench.io",
        "deploybench.unpickle",
    }
    assert "deploybench.checkpoint_io" in graph["deploybench.models.base"]
    assert "deploybench.checkpoint_io" in graph["deploybench.checkpoint"]
    assert "deploybench.unpickle" in graph["deploybench.models.tft"]
    assert not any(m.startswith("deploybench.checkpoint") for m in graph["deploybench.models"])


def test_lazy_and_type_checking_imports_count_and_a_cycle_is_named(tmp_path):
    """A package whose cycle is hidden in a function body and a TYPE_CHECKING block."""
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("from .b import B\n")
    (package / "a.py").write_text("def f():\n    from .sub import b\n    return b\n")
    (package / "sub" / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..a import f\nB = 1\n"
    )
    graph = _graph(package)
    assert graph == {
        "pkg": set(),
        "pkg.a": {"pkg.sub", "pkg.sub.b"},
        "pkg.sub": {"pkg.sub.b"},
        "pkg.sub.b": {"pkg.a"},
    }
    assert _find_cycle(graph) == ["pkg.a", "pkg.sub", "pkg.sub.b", "pkg.a"]
