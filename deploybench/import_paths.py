"""A job in a container imports from its image, not from the login node.

Under ``--sdm apptainer`` Snakemake binds every directory of the driver's ``sys.path`` into the
container at ``/mnt/snakemake_searchpaths/item_<i>`` and a ``script:`` job's preamble appends
them to ``sys.path``, so that the job can unpickle its ``snakemake`` object (snakemake 9.27.1
``deployment/singularity.py`` ``get_snakemake_searchpath_mountpoints``, ``script/__init__.py``
``PythonScript.get_preamble``). Everything else the image lacks would load from there too,
silently: a package of another Python, or ``pytriton``, which would start the login node's
``tritonserver``. :func:`confine_to_image` keeps from there only Snakemake and what it requires,
and fails, naming them, if anything else already came from there.
"""

from __future__ import annotations

import importlib.machinery
import importlib.metadata
import re
import sys
from collections.abc import Iterable, Sequence
from importlib.abc import MetaPathFinder
from importlib.machinery import ModuleSpec
from types import ModuleType

from .errors import DeploybenchError
from .locks import canonical

# snakemake deployment/singularity.py: Path("/mnt/snakemake_searchpaths") / f"item_{i}"
MOUNT_PREFIX = "/mnt/snakemake_searchpaths/"


class LeakFromDriver(DeploybenchError, ImportError):
    """A job in a container imported a module its image lacks from the driver's environment."""


def _requirement_name(requirement: str) -> str | None:
    """The name of a ``Requires-Dist`` entry that applies without extras (None: it does not)."""
    name, _, marker = requirement.partition(";")
    if "extra" in marker:
        return None
    return canonical(re.split(r"[\s\[<>=!~(]", name.strip(), maxsplit=1)[0])


def snakemake_modules(paths: Sequence[str]) -> set[str]:
    """The top-level modules of ``snakemake`` and what it requires, transitively, as the
    distributions on ``paths`` have them."""
    dists = {
        canonical(d.metadata["Name"]): d
        for d in importlib.metadata.distributions(path=list(paths))
        if d.metadata["Name"]
    }
    todo, seen = ["snakemake"], set()
    while todo:
        name = todo.pop()
        if name in seen or name not in dists:
            continue
        seen.add(name)
        todo += [n for r in dists[name].requires or [] if (n := _requirement_name(r))]
    modules = {"snakemake"}
    for name in seen:
        top_level = dists[name].read_text("top_level.txt")
        if top_level:
            modules |= {line.strip() for line in top_level.splitlines() if line.strip()}
        for file in dists[name].files or []:
            first = file.parts[0]
            if not first.endswith((".dist-info", ".data")) and first != "..":
                modules.add(first.removesuffix(".py"))
    return modules


def _origin(module: ModuleType) -> str:
    return str(getattr(module, "__file__", None) or "")


def leaked(modules: dict[str, ModuleType], paths: Sequence[str], allowed: set[str]) -> list[str]:
    """The modules loaded from ``paths`` that are not of ``allowed`` top-level names."""
    return sorted(
        name
        for name, module in modules.items()
        if _origin(module).startswith(tuple(paths)) and name.split(".")[0] not in allowed
    )


class SnakemakeOnly(MetaPathFinder):
    """Finds, on the search paths, only the allowed top-level packages (a Snakemake module
    imported later); anything else there is not found, as if the image had not got it."""

    def __init__(self, paths: Iterable[str], allowed: set[str]) -> None:
        self.paths = list(paths)
        self.allowed = allowed

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if path is not None or fullname.split(".")[0] not in self.allowed:
            return None
        return importlib.machinery.PathFinder.find_spec(fullname, self.paths)


def confine_to_image(prefix: str = MOUNT_PREFIX) -> list[str]:
    """Take Snakemake's search paths off ``sys.path``, keeping Snakemake's own modules
    findable there; fail if a job module already came from there. Returns the paths (none:
    the job is not in a container)."""
    paths = [p for p in sys.path if p.startswith(prefix)]
    if not paths:
        return []
    allowed = snakemake_modules(paths)
    found = leaked(dict(sys.modules), paths, allowed)
    if found:
        where = sorted({_origin(sys.modules[n]) for n in found})[:3]
        raise LeakFromDriver(
            f"imported from the driver's environment, not the image: {', '.join(found)} "
            f"({'; '.join(where)}). Snakemake binds the driver's sys.path into the container for "
            "its own modules only: add what is missing to the image's requirements and lock"
        )
    sys.path[:] = [p for p in sys.path if p not in paths]
    sys.meta_path.append(SnakemakeOnly(paths, allowed))
    return paths
