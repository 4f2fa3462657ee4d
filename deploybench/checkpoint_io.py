"""Checkpoint files: finding, reading and writing them, with no knowledge of model families.

A configured checkpoint is read in the container DLE's training script wrote
(``read_state_dict``: TFT's ``<dir>/checkpoint.pt`` = ``{"model": state_dict, "config": <config
object>, "args": …}``, FastPitch's ``{"state_dict", "ema_state_dict", "optimizer", …}``, a
Lightning ``.ckpt``, a bare state dict); the family maps the names (``Family.adapt_state_dict``).
Every torch file is unpickled by ``deploybench.unpickle``: pickled classes of DLE's source tree
(configs) load as inert placeholders, argparse namespaces for real, and a file naming any other
callable is refused before anything runs. The workflow's own checkpoint is
``{"model": state_dict}`` (``load_checkpoint``), or weights by variable path in an ``.npz`` for
TensorFlow (``write_framework_checkpoint`` / ``read_framework_checkpoint``).

A leaf: ``models/`` and the jobs import it, it imports neither.
"""

from __future__ import annotations

import fnmatch
import io
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from .errors import CheckpointError, InputNotFound
from .io import atomic_path
from .unpickle import UnsafePickleError, pickle_module

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
            raise CheckpointError(
                f"checkpoint directory {str(path)!r} holds {len(candidates)} checkpoints "
                f"({', '.join(c.name for c in candidates)}): configure one file"
            )
    elif p.is_file():
        return p
    raise InputNotFound(
        f"checkpoint {str(path)!r} not found (expected a file, or a directory holding "
        f"{' or '.join(CHECKPOINT_FILE_NAMES)}, or one *.ckpt or *.pt file, as DLE's training "
        "scripts write them)"
    )


def _is_torchscript_archive(file: Path) -> bool:
    # torch.load hands an archive with constants.pkl to torch.jit.load, which runs the
    # archive's code instead of the pickle_module: a checkpoint is never one.
    if not zipfile.is_zipfile(file):
        return False
    with zipfile.ZipFile(file) as archive:
        return any(name.partition("/")[2] == "constants.pkl" for name in archive.namelist())


def torch_load(file: Path, what: str = "checkpoint") -> Any:
    """A file ``torch.save`` wrote (zip or legacy format), on the CPU, through the restricted
    unpickler; ``what`` names the kind of file in messages."""
    if not file.is_file():
        raise InputNotFound(f"{what} {file} not found")
    if _is_torchscript_archive(file):
        raise CheckpointError(
            f"{what} {file}: a TorchScript archive (torch.jit.save), not a {what}; configure "
            "the file DLE's training script saved"
        )
    try:
        import torch  # here: a TensorFlow container has no torch, and needs none

        return torch.load(
            file,
            map_location="cpu",
            weights_only=False,
            pickle_module=pickle_module(f"{what} {file}"),
        )
    except UnsafePickleError:
        raise
    except Exception as err:
        raise CheckpointError(
            f"{file}: not a readable {what} ({type(err).__name__}: {err})"
        ) from err


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """A checkpoint in the workflow's layout (``{"model": state_dict, ...}``)."""
    file = resolve_checkpoint_file(path)
    data = torch_load(file)
    if not isinstance(data, dict) or "model" not in data:
        raise CheckpointError(
            f"{file}: not a DLE-layout checkpoint (a dict with a 'model' state dict)"
        )
    return data


def non_finite_tensors(
    weights: dict[str, Any], infinite_by_design: tuple[str, ...] = ()
) -> list[str]:
    """The floating-point tensors of ``weights`` (torch tensors or numpy arrays) that hold NaN
    or infinities, each as ``name (k NaN, j Inf)``. Infinities in a tensor matched by a pattern
    of ``infinite_by_design`` (fnmatch, e.g. an attention mask's -inf) are the model's own; NaN
    is never."""
    found = []
    for name, value in weights.items():
        if hasattr(value, "detach"):  # a torch tensor: counted in torch, no copy
            if not value.is_floating_point():
                continue
            nan, inf = int(value.isnan().sum()), int(value.isinf().sum())
        else:
            array = np.asarray(value)
            if not np.issubdtype(array.dtype, np.floating):
                continue
            nan, inf = int(np.isnan(array).sum()), int(np.isinf(array).sum())
        if inf and any(fnmatch.fnmatchcase(name, p) for p in infinite_by_design):
            inf = 0
        if nan or inf:
            found.append(f"{name} ({nan} NaN, {inf} Inf)")
    return found


# Where DLE's training scripts keep the network's weights inside the saved dict, in order:
# TFT train.py and BERT run_squad.py save {"model": ...}; FastPitch train.py and PyTorch
# Lightning (nnU-Net) save {"state_dict": ...}.
STATE_DICT_KEYS = ("model", "state_dict")
# FastPitch train.py keeps its exponential moving average beside "state_dict".
EMA_STATE_DICT_KEY = "ema_state_dict"
# Prefixes of wrappers around the network: DistributedDataParallel's ``module``, and the
# attribute that holds the network in DLE's Lightning module (nnU-Net's ``self.model``; its
# other members, e.g. the 2021 Dice metric's persistent ``dice.n_updates``, are not weights).
DDP_PREFIX = "module."
LIGHTNING_PREFIX = "model."


def _is_lightning(file: Path, data: dict[str, Any]) -> bool:
    return file.suffix == ".ckpt" or "pytorch-lightning_version" in data


def lightning_network(state: dict[str, Any]) -> dict[str, Any]:
    """The network's weights in a Lightning module's state dict: the entries under its
    ``model.`` attribute, prefix stripped, other members dropped; ``state`` as it is if it
    holds no such entries (already stripped, or a network saved on its own)."""
    if not any(k.startswith(LIGHTNING_PREFIX) for k in state):
        return state
    return {
        k.removeprefix(LIGHTNING_PREFIX): v
        for k, v in state.items()
        if k.startswith(LIGHTNING_PREFIX)
    }


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
    data = torch_load(file)
    keys = sorted(map(str, data)) if isinstance(data, dict) else []
    if ema:
        if EMA_STATE_DICT_KEY not in keys:
            raise CheckpointError(
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
            raise CheckpointError(
                f"{file}: not a {model} checkpoint (a dict of weights, or a dict holding them "
                f"under {' or '.join(map(repr, STATE_DICT_KEYS))}; found {found})"
            )
        state = data[key]
    if not _is_state_dict(state):
        raise CheckpointError(f"{file}: the checkpoint's weights are not a state dict of tensors")
    if _is_lightning(file, data):
        state = lightning_network(state)
    return {k.removeprefix(DDP_PREFIX): v.contiguous() for k, v in state.items()}


def save_torch(obj: dict[str, Any], out: str | Path) -> None:
    """``torch.save`` through a buffer: the archive's inner name is then fixed (a file's name
    would be embedded), so the same object gives the same bytes; written atomically."""
    import torch

    buffer = io.BytesIO()
    torch.save(obj, buffer)
    with atomic_path(out) as tmp:
        tmp.write_bytes(buffer.getvalue())


def save_arrays(obj: dict[str, Any], out: str | Path) -> None:
    """Weights by variable path into an ``.npz``, written atomically."""
    buffer = io.BytesIO()
    np.savez(buffer, **{name: np.asarray(v) for name, v in obj["model"].items()})
    with atomic_path(out) as tmp:
        tmp.write_bytes(buffer.getvalue())


def load_arrays(path: str | Path) -> dict[str, Any]:
    """An ``.npz`` ``save_arrays`` wrote, as ``{"model": weights}`` (no pickles allowed)."""
    try:
        with np.load(path, allow_pickle=False) as data:
            return {"model": {name: data[name] for name in data.files}}
    except Exception as err:
        raise CheckpointError(
            f"{path}: not a readable checkpoint ({type(err).__name__}: {err})"
        ) from err


# How the workflow's checkpoint file is written and read, per framework (the file names are
# models.CHECKPOINT_FILES).
_WORKFLOW_CHECKPOINT_IO: dict[
    str, tuple[Callable[[dict[str, Any], str | Path], None], Callable[[str | Path], dict[str, Any]]]
] = {
    "pytorch": (save_torch, load_checkpoint),
    "tensorflow": (save_arrays, load_arrays),
}


def _workflow_io(
    framework: str,
) -> tuple[Callable[[dict[str, Any], str | Path], None], Callable[[str | Path], dict[str, Any]]]:
    if framework not in _WORKFLOW_CHECKPOINT_IO:
        raise CheckpointError(
            f"no workflow checkpoint format for framework {framework!r}; "
            f"valid: {sorted(_WORKFLOW_CHECKPOINT_IO)}"
        )
    return _WORKFLOW_CHECKPOINT_IO[framework]


def write_framework_checkpoint(framework: str, obj: dict[str, Any], out: str | Path) -> None:
    """The workflow's checkpoint (``{"model": weights}``) for a ``framework`` model."""
    _workflow_io(framework)[0](obj, out)


def read_framework_checkpoint(framework: str, path: str | Path) -> dict[str, Any]:
    """A checkpoint ``write_framework_checkpoint`` wrote for a ``framework`` model."""
    return _workflow_io(framework)[1](path)
