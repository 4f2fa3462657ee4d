"""Conversions from an export to the served artifact (GPU steps).

TensorRT engines are hardware-specific, so converted artifacts are keyed on ``{gpu}``. These
steps need a GPU node; on a machine without one they stop with a clear message before doing
anything. The command lines are built here so they can be checked without a GPU.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from .tensors import TensorSpec

CONVERTERS = ("tensorrt", "onnx-fp16", "torchscript-fp16", "tf-trt")


class NeedsGPU(RuntimeError):
    """The step must run on a GPU node (e.g. submitted with ``--profile profiles/slurm``)."""


def gpu_visible() -> bool:
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return False
    return shutil.which("nvidia-smi") is not None and Path("/dev/nvidiactl").exists()


def shape_arg(inputs: list[TensorSpec], batch: int) -> str:
    return ",".join(f"{s.name}:{'x'.join(str(d) for d in (batch, *s.shape))}" for s in inputs)


def tensorrt_command(
    *,
    onnx: Path,
    plan: Path,
    precision: str,
    inputs: list[TensorSpec],
    min_batch: int,
    opt_batch: int,
    max_batch: int,
    workspace_mb: int,
) -> list[str]:
    """``trtexec`` building an engine with one optimisation profile over the batch dimension."""
    cmd = [
        "trtexec",
        f"--onnx={onnx}",
        f"--saveEngine={plan}",
        f"--minShapes={shape_arg(inputs, min_batch)}",
        f"--optShapes={shape_arg(inputs, opt_batch)}",
        f"--maxShapes={shape_arg(inputs, max_batch)}",
        f"--memPoolSize=workspace:{workspace_mb}M",
        "--skipInference",
    ]
    if precision == "fp16":
        cmd.append("--fp16")
    return cmd


def convert(
    converter: str,
    *,
    source: Path,
    out: Path,
    precision: str,
    inputs: list[TensorSpec],
    max_batch: int,
    workspace_mb: int = 10000,
) -> list[str]:
    """Run the conversion; returns the command it ran."""
    if converter not in CONVERTERS:
        raise ValueError(f"unknown converter {converter!r}; valid choices: {', '.join(CONVERTERS)}")
    if not gpu_visible():
        raise NeedsGPU(
            f"conversion {converter!r} to {precision} needs a GPU node (no GPU is visible here); "
            "submit it to the cluster with `--profile profiles/slurm`"
        )
    if converter != "tensorrt":
        raise NotImplementedError(f"converter {converter!r} is not implemented yet")
    cmd = tensorrt_command(
        onnx=source,
        plan=out,
        precision=precision,
        inputs=inputs,
        min_batch=1,
        opt_batch=max_batch,
        max_batch=max_batch,
        workspace_mb=workspace_mb,
    )
    subprocess.run(cmd, check=True)
    return cmd
