"""The image checks: which image the job runs in (``image``) and whether the deploybench modules
its jobs import import there (``deploybench_imports``)."""

from __future__ import annotations

import textwrap

from ..images import running_image
from ..probe import python_probe
from .spec import FAIL, PASS, SKIP, Check, PreflightSpec

IMPORTS_TIMEOUT_S = 300

IMPORTS_PROBE = textwrap.dedent(
    """
    import importlib, importlib.metadata, json, sys
    result = {"errors": {}}
    for name in sys.argv[1:]:
        try:
            importlib.import_module(name)
        except Exception as exc:
            result["errors"][name] = f"{type(exc).__name__}: {exc}"
    module = sys.modules.get("deploybench")
    result["file"] = getattr(module, "__file__", None)
    try:
        result["version"] = importlib.metadata.version("deploybench")
    except importlib.metadata.PackageNotFoundError:
        result["version"] = None
    print("PREFLIGHT " + json.dumps(result))
    """
)


def check_image(spec: PreflightSpec) -> Check:
    """Which image the job runs in, and its digest: the workflow's build (with its record) or a
    prebuilt one (``images.<image>.image``), named the same way as in every result's
    provenance."""
    name = "image"
    info = running_image()
    if info["image"] is None:
        return Check(name, SKIP, "not in a container (native venv)", facts=info)
    origin = "built by rule container_image" if "record" in info else "prebuilt, used as is"
    digest = info.get("sha256")
    where = f"sha256 {digest}" if digest else "no digest (not a file)"
    return Check(name, PASS, f"{info['image']} ({origin}), {where}", facts=info)


def check_deploybench_imports(spec: PreflightSpec) -> Check:
    name = "deploybench_imports"
    modules = ["deploybench", *spec["modules"]]
    info, why = python_probe(IMPORTS_PROBE, modules, IMPORTS_TIMEOUT_S)
    if not info:
        return Check(name, FAIL, f"the import probe failed: {why}", "see the job's log")
    where = f"deploybench {info['version'] or '(not installed)'} from {info['file']}"
    facts = {"modules": modules, "file": info["file"], "version": info["version"]}
    if info["errors"]:
        failed = "; ".join(f"{m}: {e}" for m, e in info["errors"].items())
        fix = (
            "run the job from the workflow's directory (it is bound into the container) or put "
            "deploybench's source on PYTHONPATH"
            if "deploybench" in info["errors"]
            else f"install what is missing in the image (images.{spec['image']}.requirements "
            "and its lock)"
        )
        return Check(name, FAIL, f"{failed} ({where})", fix, facts)
    return Check(name, PASS, f"{len(modules)} modules import; {where}", facts=facts)
