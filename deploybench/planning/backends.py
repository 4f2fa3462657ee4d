"""Triton's platform name for each native backend: plain data, no protobuf or client imports, so
that the plan (and so the DAG on a login node's driver venv, envs/driver.sh) can name them."""

from __future__ import annotations

# Triton's platform for each native backend's artifact (the file names are Triton's defaults:
# model.plan, model.onnx, model.pt, model.savedmodel/); the python backend is named as a backend.
PLATFORMS = {
    "tensorrt": "tensorrt_plan",
    "onnxruntime": "onnxruntime_onnx",
    "pytorch": "pytorch_libtorch",
    "tensorflow": "tensorflow_savedmodel",
}
