"""The ``model_networks`` check: every model whose jobs run in the image builds its network there,
with the run's own hyper-parameters (a child process; a PyTorch network on the ``meta`` device:
every constructor runs, no weight is allocated), and the libraries that build it see each other
as the jobs will.

An import that succeeds is not a library that works: transformers imports under any torch but
enables its PyTorch classes only where its version gate passes (``is_torch_available``; 5.20 and
later want ``torch >= 2.6.0``, which NGC's pre-release builds such as ``2.6.0a0+ecf3bae40a`` fail
under PEP 440), and then ``BertForQuestionAnswering`` is a placeholder that raises when built."""

from __future__ import annotations

import json
import textwrap
from typing import Any

from ..probe import python_probe
from .spec import FAIL, PASS, SKIP, Check, PreflightSpec

NETWORKS_TIMEOUT_S = 300  # importing TensorFlow from a shared file system is slow

NETWORKS_PROBE = textwrap.dedent(
    """
    import importlib.metadata, json, logging, sys
    models = json.loads(sys.argv[1])
    result = {"versions": {}, "models": {}}
    for name in ("torch", "transformers", "tensorflow"):
        try:
            result["versions"][name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            result["versions"][name] = None
    if result["versions"]["transformers"] and result["versions"]["torch"]:
        said = []
        class Keep(logging.Handler):
            def emit(self, record):
                said.append(record.getMessage())
        logging.getLogger("transformers").addHandler(Keep())
        try:
            from transformers.utils import is_torch_available
            result["transformers_torch"] = {"available": bool(is_torch_available()), "said": said}
        except Exception as exc:
            result["transformers_torch"] = {"available": False,
                                            "said": said + [f"{type(exc).__name__}: {exc}"]}
    import contextlib
    from deploybench.models import load_family
    for name, model in models.items():
        try:
            family = load_family(model["module"], model["hparams"])
            where = contextlib.nullcontext()
            if family.framework == "pytorch":  # its structure, no weights: BERT-large in 0.1 s
                import torch
                where = torch.device("meta")
            with where:
                network = family.build()
            result["models"][name] = {"built": type(network).__name__}
        except Exception as exc:
            result["models"][name] = {"error": f"{type(exc).__name__}: {exc}"}
    print("PREFLIGHT " + json.dumps(result))
    """
)


def transformers_disables_torch(info: dict[str, Any]) -> str:
    """Why transformers will not use the image's torch ("" when it will, or is not there)."""
    gate = info.get("transformers_torch")
    if not gate or gate["available"]:
        return ""
    versions = info["versions"]
    said = "; ".join(gate["said"][-2:]) or "its is_torch_available() is False"
    return (
        f"transformers {versions['transformers']} disables PyTorch under the image's torch "
        f"{versions['torch']} ({said}): its models cannot be built"
    )


def check_model_networks(spec: PreflightSpec) -> Check:
    name = "model_networks"
    models = spec.get("models") or {}
    if not models:
        return Check(name, SKIP, "no model's job builds a network in this image")
    info, why = python_probe(NETWORKS_PROBE, [json.dumps(models)], NETWORKS_TIMEOUT_S)
    if not info:
        return Check(name, FAIL, f"the network probe failed: {why}", "see the job's log")
    facts = {
        "versions": info["versions"],
        "transformers_torch": info.get("transformers_torch"),
        "models": info["models"],
    }
    lock = f"images.{spec['image']}.pins and its lock (make locks)"
    failures, fixes = [], []
    disabled = transformers_disables_torch(info)
    if disabled:
        failures.append(disabled)
        fixes.append(
            f"pin a transformers whose is_torch_available() accepts torch "
            f"{info['versions']['torch']} ({lock})"
        )
    broken = {m: r["error"] for m, r in info["models"].items() if "error" in r}
    if broken:
        failures.append("; ".join(f"{m}: {e}" for m, e in broken.items()))
        if not disabled:
            fixes.append(f"install what the network needs in the image ({lock})")
    built = ", ".join(f"{m} ({r['built']})" for m, r in info["models"].items() if "built" in r)
    versions = ", ".join(f"{k} {v}" for k, v in info["versions"].items() if v)
    if failures:
        return Check(name, FAIL, "; ".join(failures), "; ".join(fixes), facts)
    return Check(name, PASS, f"built {built} with {versions}", facts=facts)
