"""What the docs name in backticks exists: a repository path, a ``module.function`` of the
package and a config key. ``mkdocs build --strict`` checks links only; these names drift when
code moves (issue 51). Generated from the pages, one test per page; a name that does not
resolve fails by page and name.

What counts as which:

- a path: a span whose first part is a top-level entry of the repository (``deploybench/…``,
  ``tests/…``, ``config/…``, ``Snakefile``); ``*`` and ``<placeholder>`` parts match any name;
  ``:line`` and ``#anchor`` suffixes are dropped;
- a ``module.attribute``: a span ``a.b`` or ``deploybench.a.b`` whose first part is a module
  of the package or of its planning wing (``run_plan.plan_run``,
  ``report_published.published_rows``, ``perf.MeasureSettings.requests_held``),
  resolved by import and attribute lookup;
- a config key: a span whose first part is a top-level key of the config schema
  (``models.<m>.perf.input_data``, ``gpus.<g>.slurm.max_runtime``), walked through the schema;
  ``<placeholder>`` parts stand for any name, and a key under a free-form mapping (``hparams``)
  ends the walk.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

import deploybench
import deploybench.planning

REPO = Path(__file__).resolve().parents[1]
PAGES = sorted((REPO / "docs").glob("*.md")) + [REPO / "README.md"]
SCHEMA = yaml.safe_load((REPO / "config" / "schema" / "config.schema.yaml").read_text())
TOP_LEVEL = {p.name for p in REPO.iterdir() if not p.name.startswith(".")} - {"site"}
# A module by the name the docs give it: the package's own, and the planning wing's by their
# own names too (``run_plan.plan_run``), which no top-level module shares.
MODULES = {m.name: f"deploybench.{m.name}" for m in pkgutil.iter_modules(deploybench.__path__)}
MODULES |= {
    m.name: f"deploybench.planning.{m.name}"
    for m in pkgutil.iter_modules(deploybench.planning.__path__)
    if m.name not in MODULES
}
SPAN = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
PLACEHOLDER = re.compile(r"^<[^>]+>$|^\{[^}]+\}$")


def spans(page: Path) -> Iterator[str]:
    """The page's inline code spans (fenced blocks left out)."""
    prose = re.sub(r"```.*?```", "", page.read_text(), flags=re.DOTALL)
    yield from SPAN.findall(prose)


# A bare file name (``config.pbtxt``, ``accuracy.csv``) names a kind of file, not one file.
FILE_SUFFIXES = {
    "pbtxt", "csv", "json", "py", "md", "h", "cc", "c", "pt", "lock", "txt", "yaml", "yml",
    "sh", "png", "html", "svg", "sif", "def", "onnx", "plan", "log", "zip", "toml", "bin",
    "index",
}  # fmt: skip
# Where runs and GPU kit calls write (the Snakefile's results/, logs/, reports/;
# benchmarks/gpu/kit/keep.py's --results): a path there need not exist in a clone.
WRITTEN = ("results/", "logs/", "reports/", "benchmarks/gpu/results/")


def path_found(span: str) -> bool | None:
    """Whether the repository path ``span`` exists (None: it is no path of this repository).
    ``tests/x.py::name`` needs ``def name`` in the file."""
    text = re.sub(r"(:\d+(-\d+)?|#[\w-]+)$", "", span.strip())
    text, _, test = text.partition("::")
    parts = text.rstrip("/").split("/")
    if " " in text or len(parts) < 2 or parts[0] not in TOP_LEVEL | {"reports"}:
        return None
    if text.startswith(WRITTEN):
        return True
    candidates = [REPO]
    for part in parts:
        pattern = re.sub(r"<[^>]+>|\{[^}]+\}", "*", part)
        if "*" in pattern:
            candidates = [c for d in candidates if d.is_dir() for c in d.glob(pattern)]
        else:
            candidates = [d / part for d in candidates if (d / part).exists()]
    if test:
        return any(f"def {test}(" in c.read_text() for c in candidates if c.is_file())
    return bool(candidates)


def attribute_found(span: str) -> bool | None:
    """Whether ``span`` (``module.attr[.attr…]``, ``deploybench.`` optional) names something in
    the package (None: its first part is no module of it)."""
    text = span.strip().removesuffix("()")
    if not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+", text):
        return None
    parts = text.split(".")
    if parts[0] == "deploybench":
        parts = parts[1:]
    if not parts or parts[0] not in MODULES:
        return None
    name = MODULES[parts[0]]
    target: Any = importlib.import_module(name)
    for i, part in enumerate(parts[1:], start=1):
        if hasattr(target, part):
            target = getattr(target, part)
            continue
        try:
            target = importlib.import_module(f"{name}.{'.'.join(parts[1 : i + 1])}")
        except ImportError:
            return False
    return True


def _resolved(node: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        ref = node["$ref"]
        assert ref.startswith("#/$defs/"), ref
        rest = {k: v for k, v in node.items() if k != "$ref"}
        node = {**SCHEMA["$defs"][ref.removeprefix("#/$defs/")], **rest}
    return node


def _children(node: dict[str, Any], key: str) -> list[dict[str, Any]]:
    """The schemas ``key`` may have under ``node`` (empty: none)."""
    node = _resolved(node)
    found = []
    variants = [node, *node.get("anyOf", []), *node.get("oneOf", []), *node.get("allOf", [])]
    for variant in map(_resolved, variants):
        properties = variant.get("properties", {})
        if key in properties:
            found.append(properties[key])
            continue
        if PLACEHOLDER.match(key):  # <scenario>: any of the named keys
            found += list(properties.values())
        extra = variant.get("additionalProperties")
        if isinstance(extra, dict):
            found.append(extra)
        patterns = variant.get("patternProperties", {})
        found += [s for p, s in patterns.items() if PLACEHOLDER.match(key) or re.search(p, key)]
    return found


def _free_form(node: dict[str, Any]) -> bool:
    """A mapping whose keys the schema leaves open (``hparams``: any object)."""
    node = _resolved(node)
    open_keys = node.get("additionalProperties", True) is True
    types = node.get("type")
    is_object = "object" in (types if isinstance(types, list) else [types])
    return is_object and "properties" not in node and open_keys


def _walk(nodes: list[dict[str, Any]], parts: list[str]) -> bool:
    """Whether ``parts`` lead somewhere from ``nodes``; a name may hold dots (an image
    ``triton-25.01``, a compute capability ``7.0``): parts are joined where one alone leads
    nowhere."""
    if not parts or any(_free_form(n) for n in nodes):
        return True
    for take in range(1, len(parts) + 1):
        if take > 1 and any(PLACEHOLDER.match(p) for p in parts[:take]):
            break  # a placeholder is one name
        children = [c for n in nodes for c in _children(n, ".".join(parts[:take]))]
        if children and _walk(children, parts[take:]):
            return True
    return False


def _nodes(node: Any) -> Iterator[dict[str, Any]]:
    """Every schema node under ``node`` that names properties."""
    if isinstance(node, dict):
        if isinstance(node.get("properties"), dict):
            yield node
        for value in node.values():
            yield from _nodes(value)
    elif isinstance(node, list):
        for value in node:
            yield from _nodes(value)


def key_found(span: str) -> bool | None:
    """Whether the config key ``span`` is in the schema (None: it is no key): from the top
    (``models.<m>.perf.input_data``) or, a key relative to a block (``perf.min_duration_ms``,
    ``slurm.max_runtime``), from any block that holds its first part."""
    text = span.strip().split(":", 1)[0].strip()
    if not re.fullmatch(r"[\w-]+(\.(<[^>]+>|[\w-]+))+", text):
        return None
    parts = text.split(".")
    starts = [n for n in _nodes(SCHEMA) if parts[0] in n["properties"]]
    if parts[0] in SCHEMA["properties"]:
        starts.insert(0, SCHEMA)
    return _walk(starts, parts) if starts else None


def problem(span: str) -> str | None:
    """Why ``span`` names nothing here (None: it names something, or it is no such name)."""
    stripped = span.strip()
    suffix = stripped.rsplit(".", 1)[-1]
    if "/" not in stripped and "." in stripped and suffix in FILE_SUFFIXES:
        return None  # a kind of file
    if stripped.startswith("config."):
        return None  # a field of a run's provenance record (its "config")
    verdicts = [check(span) for check in (path_found, attribute_found, key_found)]
    if any(verdicts) or all(v is None for v in verdicts):
        return None
    return f"names nothing here: {span}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_what_a_page_names_exists(page):
    problems = [p for span in spans(page) if (p := problem(span))]
    assert not problems, f"{page.name}: {len(problems)} names resolve to nothing: {problems}"


@pytest.mark.parametrize(
    ("span", "names_something"),
    [
        ("deploybench/report.py", True),
        ("deploybench/models/<x>.py", True),
        ("tests/conftest.py::leaked_shm", True),
        ("report_published.published_rows", True),
        ("deploybench.perf.MeasureSettings.requests_held", True),
        ("models.<m>.perf.input_data", True),
        ("perf.min_duration_ms", True),  # a model block's key
        ("images.triton-25.01.release.compute_capability.maximum", True),  # a dotted name
        ("results/tft/cpu/onnx/fp32/", True),  # written by a run
        ("deploybench/reports.py", False),
        ("tests/conftest.py::no_such_fixture", False),
        ("report.no_such_function", False),
        ("models.<m>.perf.no_such_key", False),
        ("gpus.<g>.slurm.no_such_key", False),
    ],
)
def test_the_check_tells_a_name_from_a_drifted_one(span, names_something):
    assert (problem(span) is None) == names_something, problem(span)
