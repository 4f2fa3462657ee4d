"""Export a model family's serving module to the formats Triton serves, and check each export.

Exporters are keyed on ``(framework, export format)``. After writing, the artifact is loaded in
its runtime and compared with the framework on deterministic inputs; a mismatch beyond the
configured tolerance fails the export and leaves nothing behind.
"""

from __future__ import annotations

import copy
import importlib
import logging
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .accuracy import compare_outputs
from .convert import fp16_feeds
from .io import atomic_path
from .models import Family, load_family
from .progress import say
from .runtime import load_runner

log = logging.getLogger(__name__)

# The runtime that loads each export format (to check it, and on CPU to serve it).
EXPORT_RUNTIME = {
    "onnx": "onnxruntime",
    "ts-trace": "torchscript",
    "ts-script": "torchscript",
    "tf-savedmodel": "tensorflow",
}


@dataclass(frozen=True)
class ExportOptions:
    opset: int = 13
    # fp16: the module is halved and its float inputs are float16 (DLE's export_precision fp16)
    precision: str = "fp32"
    # A format exported from another export (ResNet's onnx comes from its SavedModel).
    source: Path | None = None
    extra: dict[str, Any] = field(default_factory=dict)


Exporter = Callable[[Any, Family, Path, ExportOptions], None]


def _torch_inputs(
    family: Family, batch: int, seed: int, precision: str = "fp32"
) -> tuple[Any, ...]:
    import torch

    feeds = artifact_feeds(family.example_inputs(batch, seed), precision)
    return tuple(torch.from_numpy(feeds[s.name]) for s in family.inputs)


def artifact_feeds(feeds: dict[str, Any], precision: str) -> dict[str, Any]:
    """``feeds`` as an export at ``precision`` takes them: float16 for an fp16 export's floats."""
    return fp16_feeds(feeds) if precision == "fp16" else feeds


# Exports an export job can make at fp16 (the module halved, then exported, as DLE's runners
# did with export_precision fp16); other formats' fp16 comes from a converter.
FP16_EXPORTS = frozenset({("pytorch", "onnx")})


def dynamic_axes(family: Family) -> dict[str, dict[int, str]]:
    """The batch axis of every tensor, and every axis the signature declares as -1."""
    axes: dict[str, dict[int, str]] = {}
    for spec in [*family.inputs, *family.outputs]:
        axes[spec.name] = {0: "batch"}
        for i, dim in enumerate(spec.shape, start=1):
            if dim == -1:
                axes[spec.name][i] = f"{spec.name}_dim{i}"
    return axes


def export_torch_onnx(module: Any, family: Family, out: Path, options: ExportOptions) -> None:
    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the legacy exporter's deprecation and RNN notes
        # dynamo=False: the TorchScript-based exporter; torch 2.13's default needs onnxscript
        # and does not handle every model here.
        torch.onnx.export(
            module,
            _torch_inputs(family, 2, 0, options.precision),
            str(out),
            input_names=[s.name for s in family.inputs],
            output_names=[s.name for s in family.outputs],
            dynamic_axes=dynamic_axes(family),
            opset_version=options.opset,
            dynamo=False,
        )


def export_torchscript_trace(
    module: Any, family: Family, out: Path, options: ExportOptions
) -> None:
    import torch

    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(module, _torch_inputs(family, 2, 0), check_trace=False)
    torch.jit.save(traced, str(out))


def export_torchscript_script(
    module: Any, family: Family, out: Path, options: ExportOptions
) -> None:
    import torch

    if not getattr(family, "scriptable", False):
        raise ValueError(f"{family.name or type(family).__name__} cannot be exported as ts-script")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        scripted = torch.jit.script(module)
    torch.jit.save(scripted, str(out))


EXPORTERS: dict[tuple[str, str], Exporter] = {
    ("pytorch", "onnx"): export_torch_onnx,
    ("pytorch", "ts-trace"): export_torchscript_trace,
    ("pytorch", "ts-script"): export_torchscript_script,
}


# Exporters of other frameworks live in their own modules, imported only when needed (a
# PyTorch job need not import TensorFlow, nor the reverse).
FRAMEWORK_EXPORTERS = {"tensorflow": ("deploybench.export_tf", "TF_EXPORTERS")}


def _exporters(framework: str) -> dict[tuple[str, str], Exporter]:
    if framework in FRAMEWORK_EXPORTERS and not any(fw == framework for fw, _ in EXPORTERS):
        module, name = FRAMEWORK_EXPORTERS[framework]
        EXPORTERS.update(getattr(importlib.import_module(module), name))
    return EXPORTERS


def export_formats(framework: str) -> list[str]:
    return sorted(fmt for fw, fmt in _exporters(framework) if fw == framework)


def export_model(
    family: Family,
    checkpoint: dict[str, Any],
    export_format: str,
    precision: str,
    out: str | Path,
    *,
    opset: int = 13,
    tolerance: dict[str, dict[str, float]],
    check_batch: int = 3,
    source: str | Path | None = None,
) -> dict[str, Any]:
    """Export, verify in the runtime, and return the verification report."""
    exporter = _exporters(family.framework).get((family.framework, export_format))
    if exporter is None:
        raise ValueError(
            f"unknown export format {export_format!r} for a {family.framework} model; "
            f"valid choices: {', '.join(export_formats(family.framework))}"
        )
    if precision != "fp32" and (family.framework, export_format) not in FP16_EXPORTS:
        raise ValueError(
            f"export precision {precision!r} of {export_format} is not made by an export; valid: "
            f"fp32, or fp16 for {sorted(f for _, f in FP16_EXPORTS)} (else the convert step "
            "makes lower precisions)"
        )
    module = family.serving_module(checkpoint)
    options = ExportOptions(
        opset=opset, source=Path(source) if source else None, precision=precision
    )
    # fp16: the halved module is exported, the fp32 one stays the reference of its check
    exported = copy.deepcopy(module).half() if precision == "fp16" else module
    with atomic_path(out) as tmp:
        tmp.unlink()  # the exporter creates it (a file, or a SavedModel directory)
        exporter(exported, family, tmp, options)
        say(
            "export: checking %s in %s against the framework (batch %d) …",
            Path(out).name,
            EXPORT_RUNTIME[export_format],
            check_batch,
        )
        report = verify_artifact(
            module, family, tmp, export_format, tolerance, check_batch, precision
        )
    return report


def verify_artifact(
    module: Any,
    family: Family,
    artifact: Path,
    export_format: str,
    tolerance: dict[str, dict[str, float]],
    batch: int,
    precision: str = "fp32",
) -> dict[str, Any]:
    """Load the artifact in its runtime and compare it with the (fp32) framework module; an
    fp16 export is fed float16 and its float16 outputs compared at ``tolerance``."""
    runner = load_runner(
        EXPORT_RUNTIME[export_format],
        artifact,
        input_names=[s.name for s in family.inputs],
        output_names=[s.name for s in family.outputs],
    )
    feeds = family.example_inputs(batch, seed=7)
    reference = family.framework_outputs(module, feeds)
    # float16 outputs are compared in float64, as compare_outputs compares every output
    outputs = runner(artifact_feeds(feeds, precision))
    actual = dict(zip(runner.output_names, outputs, strict=True))
    rows = compare_outputs(reference, actual, tolerance, batch)
    failed = [r for r in rows if not r["passed"]]
    if failed:
        raise ValueError(f"exported {export_format} artifact differs from the framework: {failed}")
    return {"runtime": EXPORT_RUNTIME[export_format], "checks": rows}


@dataclass(frozen=True)
class PreparedModel:
    """A model as the workflow's jobs hold it: the checkpoint the ``prepare_checkpoint`` job
    writes, read back as the export and convert jobs read it (for a benchmark or a test that
    makes what the jobs make, in process)."""

    family: Family
    checkpoint: dict[str, Any]
    checkpoint_file: Path
    origin: str  # where the weights came from (``prepare_checkpoint``'s answer)

    def export(
        self, spec: Mapping[str, Any], out: str | Path, source: str | Path | None = None
    ) -> dict[str, Any]:
        """The export job's export to ``out`` (:func:`export_spec`)."""
        return export_spec(self.family, self.checkpoint, spec, out, source)


def export_spec(
    family: Family,
    checkpoint: dict[str, Any],
    spec: Mapping[str, Any],
    out: str | Path,
    source: str | Path | None = None,
) -> dict[str, Any]:
    """The export job's export to ``out``: ``spec`` is its spec (``ExportPlan.spec()``:
    export_format, precision, opset, tolerance, check_batch); ``source``: the export it is made
    from, if any. Returns the runtime check's report."""
    return export_model(
        family,
        checkpoint,
        spec["export_format"],
        spec["precision"],
        out,
        opset=int(spec["opset"]),
        tolerance=spec["tolerance"],
        check_batch=int(spec["check_batch"]),
        source=source,
    )


def prepare_model(identity: Mapping[str, Any], checkpoint_file: str | Path) -> PreparedModel:
    """The model's checkpoint written to ``checkpoint_file`` as the ``prepare_checkpoint`` job
    writes it, and read back. ``identity``: what a job spec names the model by (module, hparams,
    checkpoint, checkpoint_ema, seed: ``ModelPlan.identity``)."""
    from .checkpoint import prepare_model_checkpoint, read_workflow_checkpoint

    family = load_family(identity["module"], dict(identity["hparams"]))
    path = Path(checkpoint_file)
    origin = prepare_model_checkpoint(family, identity, path)
    return PreparedModel(family, read_workflow_checkpoint(family, path), path, origin)
