"""Tensor signatures and the one table of tensor types, shared by model families, conversion,
the repository and the Triton client (no framework imports)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str  # numpy dtype name
    shape: tuple[int, ...]  # per example, without the batch dimension


@dataclass(frozen=True)
class TensorType:
    """One tensor type in each vocabulary that names it."""

    numpy: str  # numpy's dtype name, as TensorSpec.dtype and the config's `dtype` enum
    triton: str  # Triton's inference-protocol datatype (model metadata, InferInput)
    onnx: int  # ONNX's TensorProto element type

    @property
    def triton_config(self) -> str:
        """model_config.proto's DataType name: the protocol's datatype with Triton's prefix."""
        return f"TYPE_{self.triton}"


# The types deploybench serves; config/schema's `dtype` enum lists the same names (tested).
TENSOR_TYPES = (
    TensorType("float32", "FP32", 1),
    TensorType("float16", "FP16", 10),
    TensorType("int64", "INT64", 7),
    TensorType("int32", "INT32", 6),
    TensorType("int8", "INT8", 3),
    TensorType("uint8", "UINT8", 2),
    TensorType("bool", "BOOL", 9),
)
NUMPY_TO_TRITON = {t.numpy: t.triton for t in TENSOR_TYPES}
TRITON_TO_NUMPY = {t.triton: t.numpy for t in TENSOR_TYPES}
NUMPY_TO_TRITON_CONFIG = {t.numpy: t.triton_config for t in TENSOR_TYPES}
ONNX_TO_NUMPY = {t.onnx: t.numpy for t in TENSOR_TYPES}
