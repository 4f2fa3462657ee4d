"""Model families: one module per model; which one a config entry uses is data (``module:``)."""

from __future__ import annotations

import importlib
from typing import Any

from ..errors import ConfigError
from ..tensors import TensorSpec
from .base import Batch, Family, KerasFamily, TorchFamily

__all__ = [
    "CHECKPOINT_FILES",
    "FAMILIES",
    "Batch",
    "Family",
    "KerasFamily",
    "TensorSpec",
    "TorchFamily",
    "framework_of",
    "load_family",
]

# module name in config -> (python module, class, framework). Extend here when a model is added.
# The framework is here (not only on the class) so the workflow knows it without importing
# torch or TensorFlow while it builds the DAG.
FAMILIES: dict[str, tuple[str, str, str]] = {
    "tft": ("deploybench.models.tft", "TFTFamily", "pytorch"),
    "fastpitch": ("deploybench.models.fastpitch", "FastPitchFamily", "pytorch"),
    "nnunet": ("deploybench.models.nnunet", "NnUNetFamily", "pytorch"),
    "bert": ("deploybench.models.bert", "BertFamily", "pytorch"),
    "resnet50": ("deploybench.models.resnet50", "ResNet50Family", "tensorflow"),
}

# The workflow's checkpoint file per framework: torch archives for PyTorch, numpy archives for
# Keras (a TensorFlow container has no torch).
CHECKPOINT_FILES = {"pytorch": "checkpoint.pt", "tensorflow": "checkpoint.npz"}


def framework_of(module: str) -> str:
    _check(module)
    return FAMILIES[module][2]


def _check(module: str) -> None:
    if module not in FAMILIES:
        raise ConfigError(f"unknown model module {module!r}; valid: {sorted(FAMILIES)}")


def load_family(module: str, hparams: dict[str, Any]) -> Family:
    _check(module)
    path, cls, _ = FAMILIES[module]
    family: Family = getattr(importlib.import_module(path), cls)(hparams)
    return family
