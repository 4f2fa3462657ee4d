"""What a job imports, and so what the image that runs it must hold: one source, read from code.

Every rule's script calls :func:`deploybench.jobs.run_rule`, which calls the rule's job
(:data:`deploybench.jobs.JOBS`); a job imports what it needs inside its body. So the modules a
rule's job imports are read from that function's source, and the modules an image must import
are those of the rules that declare it (``container:``, rules/common.smk ``container_of``). The
preflight imports them in the image (``deploybench_imports``); the tests check them against each
image's lock and the packages its base ships.
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
import json
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterable, Mapping
from typing import Any

PACKAGE = "deploybench"


def function_imports(function: Callable[..., object]) -> list[str]:
    """The modules ``function``'s body imports (stdlib left out), with those of the functions
    of its own module it calls by name (its module's helpers), in first-seen order. Relative
    imports resolve against the function's package: in ``deploybench.jobs.pages``,
    ``from ..report import x`` is ``deploybench.report`` and ``from .. import plots`` is
    ``deploybench.plots``; ``import altair as alt`` is ``altair``."""
    found: list[str] = []
    seen: set[str] = set()
    todo = [function]
    while todo:
        current = todo.pop(0)
        if current.__qualname__ in seen:
            continue
        seen.add(current.__qualname__)
        for node in ast.walk(ast.parse(textwrap.dedent(inspect.getsource(current)))):
            for name in _imported(node, current.__module__):
                if name.split(".")[0] not in sys.stdlib_module_names and name not in found:
                    found.append(name)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                called = current.__globals__.get(node.func.id)  # type: ignore[attr-defined]
                if inspect.isfunction(called) and called.__module__ == current.__module__:
                    todo.append(called)
    return found


def _imported(node: ast.AST, module: str) -> list[str]:
    """The modules an import statement in ``module`` names (relative ones resolved against
    ``module``'s package)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom):
        if node.level == 0:
            return [str(node.module)]
        package = module.rpartition(".")[0]
        base = importlib.util.resolve_name("." * node.level + (node.module or ""), package)
        if node.module:
            return [base]
        return [f"{base}.{alias.name}" for alias in node.names]
    return []


def rule_imports(rule: str) -> list[str]:
    """What the job of ``rule`` imports: ``deploybench.jobs`` (its script's one import), the
    module of the rule's job, and what the job imports."""
    from .jobs import JOBS

    if rule not in JOBS:
        raise ValueError(f"no job for rule {rule!r}; valid choices: {', '.join(sorted(JOBS))}")
    job = JOBS[rule]
    own = [f"{PACKAGE}.jobs", *([job.__module__] if job.__module__ != f"{PACKAGE}.jobs" else [])]
    return [*own, *(m for m in function_imports(job) if m not in own)]


# The role of a `container:` function that runs whichever image its job is for (the preflight's):
# its job imports in every image.
EVERY_ROLE = "*"
# The role of the rules that run where Snakemake runs, in its environment (no image).
DRIVER_ROLE = "driver"


def rules_by_role(rules: Iterable[Any]) -> dict[str, list[str]]:
    """Role → the names of the rules whose ``container:`` is that role's image (a Snakemake
    rule's ``container_img``, made by rules/common.smk ``container_of``, carries its ``role``);
    a rule of ``EVERY_ROLE`` counts for each role. Rules with no container are left out."""
    declared = [(r.name, getattr(r.container_img, "role", None)) for r in rules]
    roles = sorted({role for _, role in declared if role not in (None, EVERY_ROLE)})
    return {
        role: sorted(name for name, own in declared if own in (role, EVERY_ROLE)) for role in roles
    }


def role_imports(rules_of_role: Mapping[str, Iterable[str]]) -> dict[str, list[str]]:
    """Role (framework | triton) → the modules the jobs of its rules import, sorted."""
    return {
        role: sorted({module for rule in rules for module in rule_imports(rule)})
        for role, rules in rules_of_role.items()
    }


DISTRIBUTIONS_PROBE = """
import importlib, importlib.metadata, json, sys
before = set(sys.modules)
for name in sys.argv[1:]:
    importlib.import_module(name)
owners = importlib.metadata.packages_distributions()
loaded = {n.split(".")[0] for n in set(sys.modules) - before}
print(json.dumps({top: sorted(set(owners.get(top, []))) for top in sorted(loaded)}))
"""


def distributions_imported(
    modules: Iterable[str], python: str = sys.executable
) -> dict[str, list[str]]:
    """Top-level module → the distributions providing it, of everything importing ``modules``
    loads in ``python`` (one that has them all: the dev venv), stdlib and this package left out."""
    out = subprocess.run(
        [python, "-c", DISTRIBUTIONS_PROBE, *modules], capture_output=True, text=True, check=True
    ).stdout
    found: dict[str, list[str]] = json.loads(out.splitlines()[-1])
    return {
        top: dists
        for top, dists in found.items()
        if top not in sys.stdlib_module_names and top != PACKAGE and dists
    }
