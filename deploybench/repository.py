"""Triton model repository: ``<repo>/<model>/config.pbtxt`` and version ``1/``.

On a GPU the artifact is served by Triton's native backend for its format. On the embedded CPU
default it is served by the python backend running the artifact with onnxruntime / TorchScript
in-process (pytriton's tritonserver ships no other backend); the config's parameters say so, and
so does every result's provenance.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .config import Run
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

    def to_pbtxt(self) -> str:
        def tensors(specs: list[TensorSpec]) -> str:
            rows = [
                f'  {{ name: "{s.name}" data_type: {TRITON_TYPES[s.dtype]} '
                f"dims: [ {', '.join(str(d) for d in s.shape)} ] }}"
                for s in specs
            ]
            return ",\n".join(rows)

        preferred = ", ".join(str(b) for b in self.preferred_batch_sizes)
        lines = [
            f'name: "{self.name}"',
            f'backend: "{self.backend}"',
            f"max_batch_size: {self.max_batch_size}",
            f"input [\n{tensors(self.inputs)}\n]",
            f"output [\n{tensors(self.outputs)}\n]",
            f"instance_group [ {{ count: {self.instance_count} kind: {self.instance_kind} }} ]",
            "dynamic_batching {",
            f"  preferred_batch_size: [ {preferred} ]",
            f"  max_queue_delay_microseconds: {self.max_queue_delay_us}",
            "}",
        ]
        for key, value in self.parameters.items():
            lines.append(f'parameters {{ key: "{key}" value: {{ string_value: "{value}" }} }}')
        return "\n".join(lines) + "\n"


def serving(run: Run) -> dict[str, str]:
    """How the run is served: Triton backend, and the runtime inside it on CPU."""
    if run.device == "cpu":
        runtime = run.format_settings.get("cpu_runtime")
        if not runtime:
            raise ValueError(f"format {run.format!r} has no CPU runtime")
        return {"backend": "python", "runtime": str(runtime)}
    backend = str(run.format_settings["backend"])
    return {"backend": backend, "runtime": backend}


def model_config(
    *,
    name: str,
    serving: dict[str, str],
    triton: dict[str, Any],
    device: str,
    inputs: list[TensorSpec],
    outputs: list[TensorSpec],
    artifact_name: str,
) -> ModelConfig:
    """The model's ``config.pbtxt`` from the run's Triton settings and how it is served."""
    parameters: dict[str, str] = {}
    if serving["backend"] == "python":
        parameters = {
            "runtime": serving["runtime"],
            "artifact": artifact_name,
            "intra_op_threads": str(triton.get("intra_op_threads", 0)),
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
    )


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
