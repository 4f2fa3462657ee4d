"""Tensor signatures, shared by model families and the repository (no framework imports)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str  # numpy dtype name
    shape: tuple[int, ...]  # per example, without the batch dimension
