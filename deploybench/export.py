"""Export a model family's serving module to ONNX or TorchScript (trace), and check it.

After writing, the artifact is loaded in its runtime and compared with the framework on
deterministic inputs; a mismatch beyond the configured tolerance fails the export.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import Any

import torch

from .accuracy import compare_outputs
from .io import atomic_path
from .models import Family
from .runtime import load_runner

log = logging.getLogger(__name__)

EXPORT_RUNTIME = {"onnx": "onnxruntime", "ts-trace": "torchscript"}


def _torch_inputs(family: Family, batch: int, seed: int) -> tuple[torch.Tensor, ...]:
    feeds = family.example_inputs(batch, seed)
    return tuple(torch.from_numpy(feeds[s.name]) for s in family.inputs)


def export_onnx(module: torch.nn.Module, family: Family, out: Path, opset: int) -> None:
    names = [s.name for s in family.inputs]
    outputs = [s.name for s in family.outputs]
    dynamic = {n: {0: "batch"} for n in names + outputs}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the legacy exporter's deprecation and RNN notes
        # dynamo=False: the TorchScript-based exporter; torch 2.13's default needs onnxscript
        # and does not handle every model here.
        torch.onnx.export(
            module,
            _torch_inputs(family, 2, 0),
            str(out),
            input_names=names,
            output_names=outputs,
            dynamic_axes=dynamic,
            opset_version=opset,
            dynamo=False,
        )


def export_torchscript_trace(module: torch.nn.Module, family: Family, out: Path) -> None:
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(module, _torch_inputs(family, 2, 0), check_trace=False)
    torch.jit.save(traced, str(out))


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
) -> dict[str, Any]:
    """Export, verify in the runtime, and return the verification report."""
    if export_format not in EXPORT_RUNTIME:
        raise ValueError(
            f"unknown export format {export_format!r}; valid choices: {', '.join(EXPORT_RUNTIME)}"
        )
    if precision != "fp32":
        raise ValueError(
            f"export precision {precision!r} needs a GPU; the embedded default exports fp32 "
            "(lower precisions are made by the convert step)"
        )
    module = family.serving_module(checkpoint)
    with atomic_path(out) as tmp:
        if export_format == "onnx":
            export_onnx(module, family, tmp, opset)
        else:
            export_torchscript_trace(module, family, tmp)
        report = verify_artifact(module, family, tmp, export_format, tolerance, check_batch)
    return report


def verify_artifact(
    module: torch.nn.Module,
    family: Family,
    artifact: Path,
    export_format: str,
    tolerance: dict[str, dict[str, float]],
    batch: int,
) -> dict[str, Any]:
    """Load the artifact in its runtime and compare it with the framework module."""
    runner = load_runner(
        EXPORT_RUNTIME[export_format],
        artifact,
        input_names=[s.name for s in family.inputs],
        output_names=[s.name for s in family.outputs],
    )
    feeds = family.example_inputs(batch, seed=7)
    reference = family.framework_outputs(module, feeds)
    actual = dict(zip(runner.output_names, runner(feeds)))
    rows = compare_outputs(reference, actual, tolerance, batch)
    failed = [r for r in rows if not r["passed"]]
    if failed:
        raise ValueError(f"exported {export_format} artifact differs from the framework: {failed}")
    return {"runtime": EXPORT_RUNTIME[export_format], "checks": rows}
