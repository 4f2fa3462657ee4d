"""The example perf_analyzer sends: its ``--input-data`` file, DLE's raw input files read as
numbers, and the digests a row's provenance records of it."""

from __future__ import annotations

import base64
import hashlib
import json
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from .errors import DataError
from .tensors import TensorSpec

# Types perf_analyzer 2.41 refuses as a JSON number list ("Can not use explicit tensor
# description for fp16 datatype", triton-inference-server/client r23.12,
# src/c++/perf_analyzer/perf_utils.cc SerializeExplicitTensor; bf16 the same): they go as
# base64 of their little-endian bytes, `{"content": {"b64": ...}, "shape": [...]}`
# (docs/input_data.md of the same tag; read by data_loader.cc ReadTensorData).
BASE64_TYPES = frozenset({"float16", "bfloat16"})


def _tensor_data(example: np.ndarray) -> dict[str, Any]:
    """One example of one input as perf_analyzer's ``--input-data`` takes it."""
    shape = list(example.shape)
    if example.dtype.name in BASE64_TYPES:
        raw = np.ascontiguousarray(example, dtype=example.dtype.newbyteorder("<")).tobytes()
        return {"content": {"b64": base64.b64encode(raw).decode("ascii")}, "shape": shape}
    return {"content": example.ravel().tolist(), "shape": shape}


def read_input_files(directory: Path, inputs: Iterable[TensorSpec]) -> dict[str, np.ndarray]:
    """One example (batch 1) from perf_analyzer input files as DLE's ``prepare_input_data.py``
    wrote them: ``<directory>/<input name>``, raw little-endian values of the input's type,
    exactly its shape's count (FastPitch's ``INPUT__0``: 128 int64 symbol ids). Read as
    numbers only (``np.frombuffer``), never as code; a file's sha256 is its input's
    :func:`raw_sha256` (it holds exactly those bytes)."""
    feeds = {}
    for spec in inputs:
        path = Path(directory) / spec.name
        if not path.is_file():
            raise DataError(f"{path}: no input file for {spec.name} (perf.input_data)")
        raw = path.read_bytes()
        dtype = np.dtype(spec.dtype).newbyteorder("<")
        count = math.prod(spec.shape)
        if len(raw) != count * dtype.itemsize:
            raise DataError(
                f"{path}: {len(raw) / dtype.itemsize:g} {spec.dtype} values, but {spec.name} "
                f"takes {count} (shape {list(spec.shape)})"
            )
        values = np.frombuffer(raw, dtype=dtype)
        feeds[spec.name] = values.astype(spec.dtype).reshape((1, *spec.shape))
    return feeds


def raw_sha256(feeds: dict[str, np.ndarray]) -> dict[str, str]:
    """Each input's sha256, by name, of its example's values as a raw little-endian file holds
    them (DLE's ``prepare_input_data.py`` ``tofile``): the same digest whether the example was
    read from DLE's file or made here, which ``published_needs.input_sha256`` pins."""
    return {
        name: hashlib.sha256(
            np.ascontiguousarray(array[0], dtype=array.dtype.newbyteorder("<")).tobytes()
        ).hexdigest()
        for name, array in sorted(feeds.items())
    }


def inputs_digest(feeds: dict[str, np.ndarray]) -> str:
    """sha256 of the example perf_analyzer sends (names, types, shapes and bytes): what a row
    was measured with, comparable across runs."""
    digest = hashlib.sha256()
    for name in sorted(feeds):
        array = np.ascontiguousarray(feeds[name])
        digest.update(f"{name}:{array.dtype.str}:{list(array.shape)}:".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


def write_input_data(feeds: dict[str, np.ndarray], path: Path) -> None:
    """perf_analyzer ``--input-data`` JSON: one example (no batch dimension); perf_analyzer
    repeats it to the requested batch size."""
    data = {"data": [{name: _tensor_data(array[0]) for name, array in feeds.items()}]}
    path.write_text(json.dumps(data))
