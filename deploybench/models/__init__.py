"""Model families: one module per model; which one a config entry uses is data (``module:``).

A model is one module here plus one config block: ``module: tft`` names
``deploybench/models/tft.py``, whose one class deriving from ``TorchFamily`` or ``KerasFamily``
is the family. Its framework is that base class's: the workflow reads it from the module's
source (``framework_of``) while it builds the DAG, without importing the module, which imports
torch or TensorFlow.
"""

from __future__ import annotations

import ast
import functools
import importlib
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..tensors import TensorSpec
from .base import Batch, Family, KerasFamily, TorchFamily

__all__ = [
    "CHECKPOINT_FILES",
    "Batch",
    "Family",
    "KerasFamily",
    "TensorSpec",
    "TorchFamily",
    "framework_of",
    "load_family",
    "model_modules",
]

MODELS_DIR = Path(__file__).resolve().parent
# Modules of this package that hold no model.
# what models/ holds beside the model modules: the base classes, a model's own helpers
NOT_MODELS = frozenset({"__init__", "base", "fastpitch_data"})
# The base class a family derives from -> its framework.
FRAMEWORK_BASES = {base.__name__: base.framework for base in (TorchFamily, KerasFamily)}

# The workflow's checkpoint file per framework: torch archives for PyTorch, numpy archives for
# Keras (a TensorFlow container has no torch).
CHECKPOINT_FILES = {"pytorch": "checkpoint.pt", "tensorflow": "checkpoint.npz"}


def model_modules() -> list[str]:
    """The modules a config's ``module:`` may name: every model module of this package."""
    return sorted(p.stem for p in MODELS_DIR.glob("*.py") if p.stem not in NOT_MODELS)


@functools.cache
def _family_class(module: str) -> tuple[str, str]:
    """The family class's name in ``module`` and its framework, read from the source."""
    valid = model_modules()
    if module not in valid:
        raise ConfigError(f"unknown model module {module!r}; valid: {valid}")
    path = MODELS_DIR / f"{module}.py"
    found = [
        (node.name, FRAMEWORK_BASES[base.id])
        for node in ast.parse(path.read_text(), filename=str(path)).body
        if isinstance(node, ast.ClassDef)
        for base in node.bases
        if isinstance(base, ast.Name) and base.id in FRAMEWORK_BASES
    ]
    if len(found) != 1:
        raise ConfigError(
            f"{path}: a model module defines exactly one family class, deriving from one of "
            f"{sorted(FRAMEWORK_BASES)}; found {[name for name, _ in found] or 'none'}"
        )
    return found[0]


def framework_of(module: str) -> str:
    """The framework of ``module``'s family (``pytorch`` | ``tensorflow``), without importing it."""
    return _family_class(module)[1]


def load_family(module: str, hparams: dict[str, Any]) -> Family:
    name, framework = _family_class(module)
    family: Family = getattr(importlib.import_module(f"{__name__}.{module}"), name)(hparams)
    if family.framework != framework:  # the DAG planned this model's jobs for ``framework``
        raise ConfigError(
            f"{name}.framework is {family.framework!r}, but its base class says {framework!r}; "
            "a family takes its framework from TorchFamily or KerasFamily"
        )
    return family
