"""Model families: one module per model; which one a config entry uses is data (``module:``)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from ..tensors import TensorSpec

if TYPE_CHECKING:
    from torch import nn

__all__ = ["FAMILIES", "ModelFamily", "TensorSpec", "framework_outputs", "load_family"]

# module name in config -> (python module, class). Extend here when a model is added.
FAMILIES: dict[str, tuple[str, str]] = {
    "tft": ("deploybench.models.tft", "TFTFamily"),
}


class ModelFamily(Protocol):
    framework: str

    @property
    def inputs(self) -> list[TensorSpec]: ...

    @property
    def outputs(self) -> list[TensorSpec]: ...

    def init_state(self, seed: int) -> dict[str, Any]: ...

    def serving_module(self, checkpoint: dict[str, Any]) -> nn.Module: ...

    def example_inputs(self, batch: int, seed: int) -> dict[str, np.ndarray]: ...


def framework_outputs(
    family: ModelFamily, module: nn.Module, feeds: dict[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """The framework's outputs for ``feeds``, by output name: the reference for every check."""
    import torch  # here, so the package imports without torch at DAG time

    with torch.no_grad():
        out = module(*(torch.from_numpy(feeds[s.name]) for s in family.inputs))
    outs = out if isinstance(out, (tuple, list)) else (out,)
    return {s.name: t.numpy() for s, t in zip(family.outputs, outs, strict=True)}


def load_family(module: str, hparams: dict[str, Any]) -> ModelFamily:
    if module not in FAMILIES:
        raise ValueError(f"unknown model module {module!r}; valid: {sorted(FAMILIES)}")
    path, cls = FAMILIES[module]
    family: ModelFamily = getattr(importlib.import_module(path), cls)(hparams)
    return family
