"""How a run is served: the Triton backend (or the python backend and its runtime), its platform,
tensor types and TensorRT accelerator, and the server settings and environment its jobs use."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..convert import FP16_IO, SERVED_TYPES
from ..errors import ConfigError
from ..io import MIB
from .backends import PLATFORMS
from .engines import ACCELERATOR_WORKSPACE
from .job_specs import ServingSpec
from .workflow_config import Run

# Which converter's settings (`models.<m>.convert.<name>`) size a backend's TensorRT accelerator.
ACCELERATOR_SETTINGS = {"onnxruntime": "tensorrt", "tensorflow": "tf-trt"}


def container_free(gpu_settings: Mapping[str, Any]) -> bool:
    """Whether a `gpus.<gpu>` entry's runs are served without containers (`serving: python`):
    the python backend of this venv's tritonserver, every job native, even under --sdm
    apptainer."""
    return gpu_settings.get("serving", "native") == "python"


def serving(run: Run) -> ServingSpec:
    """How the run is served: Triton backend, and the runtime inside it on CPU or, with
    `gpus.<gpu>.serving: python`, on the GPU (KIND_GPU instances; deploybench/triton_model.py)."""
    if run.device == "cpu" or container_free(run.gpu_settings):
        runtime = run.format_settings.get("cpu_runtime")
        if not runtime:
            where = "a CPU device" if run.device == "cpu" else "served by the python backend"
            raise ConfigError(
                f"format {run.format!r} has no CPU runtime (formats.{run.format}.cpu_runtime): "
                f"it cannot run on gpu {run.gpu!r}, {where}"
            )
        # the converter's served types (fp16 TorchScript's float16 I/O), as a native config's:
        # on a CPU too, so that its fp16 run sends what a GPU's does
        types = served_types(run)
        python: ServingSpec = {"backend": "python", "runtime": str(runtime)}
        if types:
            python["tensor_types"] = dict(types)
        if run.device != "cpu":
            python["entry"] = run.gpu
        return python
    backend = str(run.format_settings["backend"])
    if backend not in PLATFORMS:
        raise ConfigError(
            f"formats.{run.format}.backend: unknown backend {backend!r}; valid choices: "
            f"{', '.join(sorted(PLATFORMS))}"
        )
    accelerator = str(run.format_settings.get("accelerator", "none"))
    how: ServingSpec = {
        "backend": backend,
        "runtime": backend if accelerator == "none" else f"{backend}+{accelerator}",
        "platform": PLATFORMS[backend],
        # the format's (an older TensorRT's int32), then the converter's (fp16 TorchScript)
        "tensor_types": {**(run.format_settings.get("tensor_types") or {}), **served_types(run)},
        # Triton's CUDA graphs are recognised by the TensorRT backend only.
        "cuda_graphs": backend == "tensorrt" and bool(run.settings["triton"].get("cuda_graphs")),
        "gpu_accelerators": [tensorrt_accelerator(run, backend)]
        if accelerator == "tensorrt"
        else [],
    }
    if accelerator == "tensorrt" and backend == "onnxruntime":
        how["engine_build"] = onnxruntime_engine_build(run)
    return how


def onnxruntime_engine_build(run: Run) -> dict[str, Any]:
    """What ONNX Runtime's TensorRT engine is built for while the model loads: opt_batch (if
    set) and the dynamic dimensions' shapes of `models.<m>.convert.tensorrt`. Its batches are
    1..triton.max_batch_size of the repository that serves it (a search candidate's own)."""
    section = (run.settings.get("convert") or {}).get(ACCELERATOR_SETTINGS["onnxruntime"]) or {}
    build: dict[str, Any] = {"shapes": dict(section.get("shapes") or {})}
    if "opt_batch" in section:
        build["opt_batch"] = int(section["opt_batch"])
    return build


# `server` settings that only some runs' jobs read (server_settings).
ENGINE_BUILD_TIMEOUT = "engine_build_timeout_s"


# PyTorch reads it once, as its fp32 matmul precision's default: HIGH (TF32) when set (ATen
# Context.h: `float32_matmul_precision = c10::utils::check_env("TORCH_ALLOW_TF32_CUBLAS_
# OVERRIDE") == true ? HIGH : HIGHEST`), in libtorch under Triton's PyTorch backend too.
TF32_MATMUL_ENV = {"TORCH_ALLOW_TF32_CUBLAS_OVERRIDE": "1"}


def served_types(run: Run) -> dict[str, str]:
    """The tensor types the run's artifact serves in place of the model's: its converter's
    (fp16 TorchScript's float16 I/O), or an fp16 export's (the halved module exported: float16
    I/O, which a TensorRT engine built from it keeps)."""
    if run.export_precision == "fp16":
        return dict(FP16_IO)
    return dict(
        SERVED_TYPES.get(str((run.format_settings.get("convert") or {}).get(run.precision)), {})
    )


def server_environment(run: Run, how: ServingSpec) -> dict[str, Any]:
    """``{"environment": ...}`` for a run whose server runs fp32 matmuls in TF32 as the model's
    published era did (``models.<m>.tf32_matmul``: PyTorch 1.7 to 1.11 allowed TF32 in cuBLAS
    by default, 1.12 and later do not): fp32 TorchScript in Triton's PyTorch backend on a GPU.
    Nothing for any other run (its spec stays as it was)."""
    tf32 = bool(run.settings.get("tf32_matmul")) and run.device == "gpu"
    if not (tf32 and how["backend"] == "pytorch" and run.precision == "fp32"):
        return {}
    return {"environment": dict(TF32_MATMUL_ENV)}


def server_settings(server: Mapping[str, Any], how: ServingSpec, builds: int = 1) -> dict[str, Any]:
    """The run's `server` settings. A run whose engine is built while its model loads
    (``engine_build``: onnx-trt) waits ``engine_build_timeout_s`` more for the server to be
    ready (times ``builds``, the engines its models build: one per model with engines:
    per_batch), and its clients wait as long as one build for an answer; the others' settings
    are the workflow's as they were (so their jobs' specs, and results, stay)."""
    settings = {k: v for k, v in server.items() if k != ENGINE_BUILD_TIMEOUT}
    if "engine_build" in how:
        build_s = float(server[ENGINE_BUILD_TIMEOUT])
        settings["startup_timeout_s"] = float(server["startup_timeout_s"]) + build_s * builds
        settings["client_timeout_s"] = build_s
    return settings


def tensorrt_accelerator(run: Run, backend: str) -> dict[str, Any]:
    """The backend's TensorRT execution accelerator at the run's precision (``precision_mode``
    FP32/FP16) and its workspace, if set: ONNX Runtime's from `models.<m>.convert.tensorrt`
    (accelerator_workspace_mb, else workspace_mb); TensorFlow's from `convert.tf-trt`'s
    accelerator_workspace_mb only, not the conversion's workspace_mb: Model Navigator v0.1.0,
    DLE's ResNet-50 pin, wrote ``precision_mode`` alone (model_navigator/triton/model_config.py
    L111-114), leaving the rest to the TensorFlow backend's defaults
    (docs/config-reference.md#resnet50-formats)."""
    if backend not in ACCELERATOR_SETTINGS:
        raise ConfigError(
            f"format {run.format!r}: backend {backend!r} has no TensorRT accelerator; valid "
            f"choices: {', '.join(sorted(ACCELERATOR_SETTINGS))}"
        )
    if run.precision not in ("fp32", "fp16"):
        raise ConfigError(
            f"{run.path}: the TensorRT accelerator runs fp32 or fp16, not {run.precision!r}"
        )
    parameters = {"precision_mode": run.precision.upper()}
    section = (run.settings.get("convert") or {}).get(ACCELERATOR_SETTINGS[backend]) or {}
    fallback = section.get("workspace_mb") if backend == "onnxruntime" else None
    workspace = section.get(ACCELERATOR_WORKSPACE, fallback)
    if workspace is not None:
        parameters["max_workspace_size_bytes"] = str(int(workspace) * MIB)
    return {"name": "tensorrt", "parameters": parameters}
