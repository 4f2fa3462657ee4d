"""Triton model repository: ``<repo>/<model>/config.pbtxt`` and version ``1/``.

On a GPU the artifact is served by Triton's native backend for its format (``platform``
``tensorrt_plan``, ``onnxruntime_onnx``, ``pytorch_libtorch`` or ``tensorflow_savedmodel``),
``KIND_GPU`` instances, optionally with the backend's TensorRT execution accelerator (ONNX Runtime,
TensorFlow) and CUDA graphs (TensorRT). On the embedded CPU default it is served by the python
backend running the artifact with onnxruntime / TorchScript in-process (pytriton's tritonserver
ships no other backend); the config's parameters say so, and so does every result's provenance.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .config import ConfigError, Run
from .tensors import TensorSpec

TRITON_TYPES = {
    "float32": "TYPE_FP32",
    "float16": "TYPE_FP16",
    "int64": "TYPE_INT64",
    "int32": "TYPE_INT32",
    "int8": "TYPE_INT8",
    "uint8": "TYPE_UINT8",
    "bool": "TYPE_BOOL",
}
PACKAGE_DIR = Path(__file__).parent
# Triton's platform for each native backend's artifact (the file names are Triton's defaults:
# model.plan, model.onnx, model.pt, model.savedmodel/).
PLATFORMS = {
    "tensorrt": "tensorrt_plan",
    "onnxruntime": "onnxruntime_onnx",
    "pytorch": "pytorch_libtorch",
    "tensorflow": "tensorflow_savedmodel",
}
# Which converter's settings (`models.<m>.convert.<name>`) size a backend's TensorRT accelerator.
ACCELERATOR_SETTINGS = {"onnxruntime": "tensorrt", "tensorflow": "tf-trt"}
MIB = 2**20


@dataclass
class ModelConfig:
    """The fields of ``config.pbtxt`` this workflow sets."""

    name: str
    backend: str
    max_batch_size: int
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    instance_count: int
    instance_kind: str  # KIND_CPU | KIND_GPU
    preferred_batch_sizes: list[int]
    max_queue_delay_us: int
    parameters: dict[str, str] = field(default_factory=dict)
    platform: str | None = None  # native backends: named by platform instead of backend
    cuda_graphs: bool = False
    # gpu_execution_accelerator entries: name and string parameters, in priority order
    gpu_accelerators: list[dict[str, Any]] = field(default_factory=list)

    def to_pbtxt(self) -> str:
        def tensors(specs: list[TensorSpec]) -> str:
            rows = [
                f'  {{ name: "{s.name}" data_type: {TRITON_TYPES[s.dtype]} '
                f"dims: [ {', '.join(str(d) for d in s.shape)} ] }}"
                for s in specs
            ]
            return ",\n".join(rows)

        preferred = ", ".join(str(b) for b in self.preferred_batch_sizes)
        kind = f'platform: "{self.platform}"' if self.platform else f'backend: "{self.backend}"'
        lines = [
            f'name: "{self.name}"',
            kind,
            f"max_batch_size: {self.max_batch_size}",
            f"input [\n{tensors(self.inputs)}\n]",
            f"output [\n{tensors(self.outputs)}\n]",
            f"instance_group [ {{ count: {self.instance_count} kind: {self.instance_kind} }} ]",
            "dynamic_batching {",
            f"  preferred_batch_size: [ {preferred} ]",
            f"  max_queue_delay_microseconds: {self.max_queue_delay_us}",
            "}",
            *self._optimization(),
        ]
        for key, value in self.parameters.items():
            lines.append(f'parameters {{ key: "{key}" value: {{ string_value: "{value}" }} }}')
        return "\n".join(lines) + "\n"

    def _optimization(self) -> list[str]:
        """``optimization { ... }`` (model_config.proto ModelOptimizationPolicy), if any."""
        body = []
        if self.cuda_graphs:
            body.append("  cuda { graphs: true }")
        if self.gpu_accelerators:
            entries = []
            for acc in self.gpu_accelerators:
                params = "".join(
                    f'\n      parameters {{ key: "{k}" value: "{v}" }}'
                    for k, v in acc.get("parameters", {}).items()
                )
                entries.append(f'    {{\n      name: "{acc["name"]}"{params}\n    }}')
            body += [
                "  execution_accelerators {",
                "    gpu_execution_accelerator: [",
                ",\n".join(entries),
                "    ]",
                "  }",
            ]
        return ["optimization {", *body, "}"] if body else []


def serving(run: Run) -> dict[str, Any]:
    """How the run is served: Triton backend, and the runtime inside it on CPU."""
    if run.device == "cpu":
        runtime = run.format_settings.get("cpu_runtime")
        if not runtime:
            raise ValueError(f"format {run.format!r} has no CPU runtime")
        return {"backend": "python", "runtime": str(runtime)}
    backend = str(run.format_settings["backend"])
    accelerator = str(run.format_settings.get("accelerator", "none"))
    how: dict[str, Any] = {
        "backend": backend,
        "runtime": backend if accelerator == "none" else f"{backend}+{accelerator}",
        "platform": PLATFORMS[backend],
        # TensorRT before 10 has no INT64 bindings: the plan takes int32 where the model has int64.
        "tensor_types": dict(run.format_settings.get("tensor_types") or {}),
        # Triton's CUDA graphs are recognised by the TensorRT backend only.
        "cuda_graphs": backend == "tensorrt" and bool(run.settings["triton"].get("cuda_graphs")),
        "gpu_accelerators": [],
    }
    if accelerator == "tensorrt":
        how["gpu_accelerators"] = [tensorrt_accelerator(run, backend)]
    return how


def tensorrt_accelerator(run: Run, backend: str) -> dict[str, Any]:
    """The backend's TensorRT execution accelerator at the run's precision; its workspace from
    the model's TensorRT (ONNX Runtime) or TF-TRT (TensorFlow) conversion settings, if set."""
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
    if "workspace_mb" in section:
        parameters["max_workspace_size_bytes"] = str(int(section["workspace_mb"]) * MIB)
    return {"name": "tensorrt", "parameters": parameters}


def model_config(
    *,
    name: str,
    serving: dict[str, Any],
    triton: dict[str, Any],
    device: str,
    inputs: list[TensorSpec],
    outputs: list[TensorSpec],
    artifact_name: str,
) -> ModelConfig:
    """The model's ``config.pbtxt`` from the run's Triton settings and how it is served.

    ``inputs`` are those the artifact takes (a native backend rejects a config naming an input
    its model lacks); a native backend serves its tensor types (``serving['tensor_types']``).
    """
    parameters: dict[str, str] = {}
    native: dict[str, Any] = {}
    if serving["backend"] == "python":
        parameters = {
            "runtime": serving["runtime"],
            "artifact": artifact_name,
            "intra_op_threads": str(triton.get("intra_op_threads", 0)),
        }
    else:
        types: dict[str, str] = serving.get("tensor_types") or {}
        inputs = [_retyped(s, types) for s in inputs]
        outputs = [_retyped(s, types) for s in outputs]
        native = {
            "platform": serving.get("platform") or PLATFORMS[serving["backend"]],
            "cuda_graphs": bool(serving.get("cuda_graphs")),
            "gpu_accelerators": list(serving.get("gpu_accelerators") or []),
        }
    return ModelConfig(
        name=name,
        backend=serving["backend"],
        max_batch_size=int(triton["max_batch_size"]),
        inputs=inputs,
        outputs=outputs,
        instance_count=int(triton["model_instances"]),
        instance_kind="KIND_CPU" if device == "cpu" else "KIND_GPU",
        preferred_batch_sizes=[int(b) for b in triton["preferred_batch_sizes"]],
        max_queue_delay_us=int(triton["max_queue_delay_us"]),
        parameters=parameters,
        **native,
    )


def _retyped(spec: TensorSpec, types: dict[str, str]) -> TensorSpec:
    return TensorSpec(spec.name, types.get(spec.dtype, spec.dtype), spec.shape)


def build_repository(config: ModelConfig, artifact: Path, artifact_name: str, out: Path) -> None:
    """Write the repository to ``out`` whole: built in a temporary folder, then renamed."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        model_dir = staging / config.name
        version = model_dir / "1"
        version.mkdir(parents=True)
        (model_dir / "config.pbtxt").write_text(config.to_pbtxt())
        if Path(artifact).is_dir():  # a SavedModel
            shutil.copytree(artifact, version / artifact_name)
        else:
            shutil.copy2(artifact, version / artifact_name)
        if config.backend == "python":
            shutil.copy2(PACKAGE_DIR / "triton_model.py", version / "model.py")
            shutil.copy2(PACKAGE_DIR / "runtime.py", version / "runtime.py")
        if out.exists():
            shutil.rmtree(out)
        staging.rename(out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
