"""Checkpoints: a configured DLE checkpoint, or a seeded-random initialisation written once.

DLE's layout is ``<dir>/checkpoint.pt`` holding ``{"model": state_dict, "config": <config
object>}``. Its ``config`` is a pickled class from DLE's source tree; it is not needed (the
hyper-parameters come from config/ and the state dict is checked against them), so unknown
classes load as inert placeholders instead of requiring DLE's code.
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from .io import atomic_path
from .models import Family

# Modules whose globals a checkpoint may reference for real (tensors, containers, numbers).
_TRUSTED_MODULES = ("torch", "collections", "numpy", "builtins", "_codecs", "copyreg")


class _Placeholder:
    """Stands in for a class from DLE's source tree (e.g. ``configuration.ElectricityConfig``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args = args

    def __setstate__(self, state: Any) -> None:
        self.state = state


class _LenientUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if module.split(".")[0] in _TRUSTED_MODULES:
            return super().find_class(module, name)
        return _Placeholder


class _LenientPickle:
    """A ``pickle_module`` for ``torch.load`` that does not import a checkpoint's own classes."""

    Unpickler = _LenientUnpickler
    load = staticmethod(pickle.load)
    __name__ = "deploybench_lenient_pickle"


def resolve_checkpoint_file(path: str | Path) -> Path:
    """A checkpoint file from a file or a DLE checkpoint directory; a clear error if missing."""
    p = Path(path)
    candidate = p / "checkpoint.pt" if p.is_dir() else p
    if not candidate.is_file():
        raise FileNotFoundError(
            f"checkpoint {str(path)!r} not found (expected a file, or a directory holding "
            "checkpoint.pt as DLE writes it)"
        )
    return candidate


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    file = resolve_checkpoint_file(path)
    try:
        try:
            import torch  # here: a TensorFlow container has no torch, and needs none

            data = torch.load(file, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError:
            # A DLE checkpoint pickles its config class; read it without importing DLE's code.
            data = torch.load(
                file, map_location="cpu", weights_only=False, pickle_module=_LenientPickle
            )
    except Exception as err:
        raise ValueError(
            f"{file}: not a readable checkpoint ({type(err).__name__}: {err})"
        ) from err
    if not isinstance(data, dict) or "model" not in data:
        raise ValueError(f"{file}: not a DLE-layout checkpoint (a dict with a 'model' state dict)")
    return data


def _save(obj: dict[str, Any], out: str | Path) -> None:
    """``torch.save`` through a buffer: the archive's inner name is then fixed (a file's name
    would be embedded), so the same object gives the same bytes; written atomically."""
    import torch

    buffer = io.BytesIO()
    torch.save(obj, buffer)
    with atomic_path(out) as tmp:
        tmp.write_bytes(buffer.getvalue())


def _save_arrays(obj: dict[str, Any], out: str | Path) -> None:
    """Weights by variable path into an ``.npz``, written atomically."""
    buffer = io.BytesIO()
    np.savez(buffer, **{name: np.asarray(v) for name, v in obj["model"].items()})
    with atomic_path(out) as tmp:
        tmp.write_bytes(buffer.getvalue())


def _load_arrays(path: str | Path) -> dict[str, Any]:
    try:
        with np.load(path) as data:
            return {"model": {name: data[name] for name in data.files}}
    except Exception as err:
        raise ValueError(
            f"{path}: not a readable checkpoint ({type(err).__name__}: {err})"
        ) from err


# How the workflow's checkpoint file is written and read, per framework (see CHECKPOINT_FILES).
_CHECKPOINT_IO: dict[
    str, tuple[Callable[[dict[str, Any], str | Path], None], Callable[[str | Path], dict[str, Any]]]
] = {
    "pytorch": (_save, load_checkpoint),
    "tensorflow": (_save_arrays, _load_arrays),
}


def save_checkpoint(family: Family, obj: dict[str, Any], out: str | Path) -> None:
    _CHECKPOINT_IO[family.framework][0](obj, out)


def read_workflow_checkpoint(family: Family, path: str | Path) -> dict[str, Any]:
    """A checkpoint this workflow wrote (``prepare_checkpoint``), for ``family``."""
    return _CHECKPOINT_IO[family.framework][1](path)


def write_seeded_checkpoint(family: Family, seed: int, out: str | Path) -> None:
    """Write the seeded initialisation; same seed → same bytes."""
    save_checkpoint(family, family.init_state(seed), out)


def prepare_checkpoint(family: Family, source: str | None, seed: int, out: str | Path) -> str:
    """Materialise the run's checkpoint at ``out``; returns a description of its origin."""
    if source:
        data = family.read_checkpoint(source)
        family.serving_module(data)  # fails early if it does not fit the hyper-parameters
        save_checkpoint(family, {"model": data["model"]}, out)
        return f"checkpoint {source}"
    write_seeded_checkpoint(family, seed, out)
    return f"seeded-random initialisation (seed {seed})"
