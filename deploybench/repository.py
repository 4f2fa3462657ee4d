"""Triton model repository: ``<repo>/<model>/config.pbtxt`` and version ``1/``.

On a GPU the artifact is served by Triton's native backend for its format (``platform``
``tensorrt_plan``, ``onnxruntime_onnx``, ``pytorch_libtorch`` or ``tensorflow_savedmodel``),
``KIND_GPU`` instances, optionally with the backend's TensorRT execution accelerator (ONNX Runtime,
TensorFlow) and CUDA graphs (TensorRT). On the embedded CPU default it is served by the python
backend running the artifact with onnxruntime / TorchScript in-process (pytriton's tritonserver
ships no other backend); the config's parameters say so, and so does every result's provenance.
The config is Triton's own ``ModelConfig`` protobuf, written as text (``triton_config``). How a
run is served (backend, platform, accelerators) is decided by :func:`deploybench.plan.serving`;
this module writes what it is given.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

from tritonclient.grpc import model_config_pb2

from .tensors import TensorSpec
from .triton_config import build_model_config, to_pbtxt

PACKAGE_DIR = Path(__file__).parent


def model_config(
    *,
    name: str,
    serving: dict[str, Any],
    triton: dict[str, Any],
    device: str,
    inputs: list[TensorSpec],
    outputs: list[TensorSpec],
    artifact_name: str,
) -> model_config_pb2.ModelConfig:
    """The model's ``config.pbtxt``, as Triton's ``ModelConfig`` message, from the run's Triton
    settings and how it is served.

    ``inputs`` are those the artifact takes (a native backend rejects a config naming an input
    its model lacks); a native backend serves its tensor types (``serving['tensor_types']``).
    """
    if serving["backend"] == "python":
        served: dict[str, Any] = {
            "backend": serving["backend"],
            "parameters": {
                "runtime": serving["runtime"],
                "artifact": artifact_name,
                "intra_op_threads": str(triton.get("intra_op_threads", 0)),
            },
        }
    else:
        types: dict[str, str] = serving.get("tensor_types") or {}
        inputs = [_retyped(s, types) for s in inputs]
        outputs = [_retyped(s, types) for s in outputs]
        served = {
            "platform": serving["platform"],
            "cuda_graphs": bool(serving.get("cuda_graphs")),
            "gpu_accelerators": list(serving.get("gpu_accelerators") or []),
        }
    return build_model_config(
        name=name,
        max_batch_size=int(triton["max_batch_size"]),
        inputs=inputs,
        outputs=outputs,
        instance_count=int(triton["model_instances"]),
        instance_kind="KIND_CPU" if device == "cpu" else "KIND_GPU",
        preferred_batch_sizes=[int(b) for b in triton["preferred_batch_sizes"]],
        max_queue_delay_us=int(triton["max_queue_delay_us"]),
        **served,
    )


def _retyped(spec: TensorSpec, types: dict[str, str]) -> TensorSpec:
    return TensorSpec(spec.name, types.get(spec.dtype, spec.dtype), spec.shape)


def build_repository(
    config: model_config_pb2.ModelConfig, artifact: Path, artifact_name: str, out: Path
) -> None:
    """Write the repository to ``out`` whole: built in a temporary folder, then renamed."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        model_dir = staging / config.name
        version = model_dir / "1"
        version.mkdir(parents=True)
        (model_dir / "config.pbtxt").write_text(to_pbtxt(config))
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
