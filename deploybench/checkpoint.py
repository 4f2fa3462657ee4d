"""Checkpoints: a configured DLE checkpoint, or a seeded-random initialisation written once.

A configured checkpoint is read in the container DLE's training script wrote
(``read_state_dict``: TFT's ``<dir>/checkpoint.pt`` = ``{"model": state_dict, "config": <config
object>, "args": …}``, FastPitch's ``{"state_dict", "ema_state_dict", "optimizer", …}``, a
Lightning ``.ckpt``, a bare state dict) and then mapped to the family's names
(``Family.adapt_state_dict``). Pickled classes from DLE's source tree (configs, argparse
namespaces) are not needed — the hyper-parameters come from config/ and the state dict is
checked against them — so unknown classes load as inert placeholders instead of requiring DLE's
code. The workflow's own checkpoint is ``{"model": state_dict}`` (``load_checkpoint``).
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


# The file a DLE training script names in its output directory, where it names one.
CHECKPOINT_FILE_NAMES = ("checkpoint.pt", "pytorch_model.bin")


def resolve_checkpoint_file(path: str | Path) -> Path:
    """A checkpoint file from a file or a checkpoint directory; a clear error if missing.

    A directory holds ``checkpoint.pt`` (TFT's train.py) or ``pytorch_model.bin`` (BERT's
    run_squad.py), or exactly one ``*.ckpt`` (a Lightning run, e.g. nnU-Net) or ``*.pt`` file
    (e.g. one ``FastPitch_checkpoint_<epoch>.pt``).
    """
    p = Path(path)
    if p.is_dir():
        for name in CHECKPOINT_FILE_NAMES:
            if (p / name).is_file():
                return p / name
        candidates = sorted([*p.glob("*.ckpt"), *p.glob("*.pt")])
        if len(candidates) == 1:
            return candidates[0]
        if candidates:
            raise ValueError(
                f"checkpoint directory {str(path)!r} holds {len(candidates)} checkpoints "
                f"({', '.join(c.name for c in candidates)}): configure one file"
            )
    elif p.is_file():
        return p
    raise FileNotFoundError(
        f"checkpoint {str(path)!r} not found (expected a file, or a directory holding "
        f"{' or '.join(CHECKPOINT_FILE_NAMES)}, or one *.ckpt or *.pt file, as DLE's training "
        "scripts write them)"
    )


def _torch_load(file: Path) -> Any:
    """``torch.load`` of a checkpoint file; pickled DLE classes load as inert placeholders."""
    try:
        import torch  # here: a TensorFlow container has no torch, and needs none

        try:
            return torch.load(file, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError:
            # DLE checkpoints pickle their config class and argparse namespace; read them
            # without importing DLE's code.
            return torch.load(
                file, map_location="cpu", weights_only=False, pickle_module=_LenientPickle
            )
    except Exception as err:
        raise ValueError(
            f"{file}: not a readable checkpoint ({type(err).__name__}: {err})"
        ) from err


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """A checkpoint in the workflow's layout (``{"model": state_dict, ...}``)."""
    file = resolve_checkpoint_file(path)
    data = _torch_load(file)
    if not isinstance(data, dict) or "model" not in data:
        raise ValueError(f"{file}: not a DLE-layout checkpoint (a dict with a 'model' state dict)")
    return data


# Where DLE's training scripts keep the network's weights inside the saved dict, in order:
# TFT train.py and BERT run_squad.py save {"model": ...}; FastPitch train.py and PyTorch
# Lightning (nnU-Net) save {"state_dict": ...}.
STATE_DICT_KEYS = ("model", "state_dict")
# FastPitch train.py keeps its exponential moving average beside "state_dict".
EMA_STATE_DICT_KEY = "ema_state_dict"
# Prefixes of wrappers around the network: DistributedDataParallel's ``module``, and the
# attribute that holds the network in DLE's Lightning module (nnU-Net's ``self.model``).
DDP_PREFIX = "module."
LIGHTNING_PREFIX = "model."


def _is_lightning(file: Path, data: dict[str, Any]) -> bool:
    return file.suffix == ".ckpt" or "pytorch-lightning_version" in data


def _is_state_dict(data: Any) -> bool:
    import torch

    return (
        isinstance(data, dict)
        and bool(data)
        and all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in data.items())
    )


def read_state_dict(path: str | Path, *, ema: bool = False, model: str = "DLE") -> dict[str, Any]:
    """The network's weights from a checkpoint as DLE's training scripts write it.

    Reads a bare state dict or one inside the dict the script saved (``STATE_DICT_KEYS``, or
    ``ema_state_dict`` with ``ema``), strips DDP's ``module.`` and a Lightning module's
    ``model.`` prefix (other Lightning members, e.g. loss weights, are dropped), and makes every
    tensor contiguous (channels-last training leaves permuted strides; the values are what
    count). ``model`` names the model in messages. Names are the family's business
    (``adapt_state_dict``).
    """
    file = resolve_checkpoint_file(path)
    data = _torch_load(file)
    keys = sorted(map(str, data)) if isinstance(data, dict) else []
    if ema:
        if EMA_STATE_DICT_KEY not in keys:
            raise ValueError(
                f"{file}: checkpoint_ema is set but the checkpoint has no {EMA_STATE_DICT_KEY!r} "
                f"(keys: {keys}); set checkpoint_ema: false to read its weights"
            )
        state = data[EMA_STATE_DICT_KEY]
    elif _is_state_dict(data):
        state = data
    else:
        key = next((k for k in STATE_DICT_KEYS if k in keys), None)
        if key is None:
            found = f"keys: {keys}" if isinstance(data, dict) else f"a {type(data).__name__}"
            raise ValueError(
                f"{file}: not a {model} checkpoint (a dict of weights, or a dict holding them "
                f"under {' or '.join(map(repr, STATE_DICT_KEYS))}; found {found})"
            )
        state = data[key]
    if not _is_state_dict(state):
        raise ValueError(f"{file}: the checkpoint's weights are not a state dict of tensors")
    if _is_lightning(file, data) and any(k.startswith(LIGHTNING_PREFIX) for k in state):
        state = {
            k.removeprefix(LIGHTNING_PREFIX): v
            for k, v in state.items()
            if k.startswith(LIGHTNING_PREFIX)
        }
    return {k.removeprefix(DDP_PREFIX): v.contiguous() for k, v in state.items()}


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


def prepare_checkpoint(
    family: Family, source: str | None, seed: int, out: str | Path, *, ema: bool = False
) -> str:
    """Materialise the run's checkpoint at ``out``; returns a description of its origin.
    ``ema``: read the checkpoint's exponential-moving-average weights."""
    if source:
        data = family.read_checkpoint(source, ema=ema)
        family.serving_module(data)  # fails early if it does not fit the hyper-parameters
        save_checkpoint(family, {"model": data["model"]}, out)
        return f"checkpoint {source}" + (" (EMA weights)" if ema else "")
    write_seeded_checkpoint(family, seed, out)
    return f"seeded-random initialisation (seed {seed})"
