"""A run's checkpoint: a configured DLE checkpoint, or a seeded-random initialisation written once.

What needs a model family lives here: reading a source checkpoint through the family (which
maps DLE's names to its own), checking it fits the configured hyper-parameters, and writing
and reading the workflow's checkpoint in the family's framework. The files themselves (finding,
unpickling, saving) are ``deploybench.checkpoint_io``'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .checkpoint_io import (
    load_checkpoint,
    non_finite_tensors,
    read_framework_checkpoint,
    read_state_dict,
    resolve_checkpoint_file,
    write_framework_checkpoint,
)
from .errors import CheckpointError, InputNotFound
from .io import sha256_of

if TYPE_CHECKING:
    from .models import Family

# The file readers, for callers that read a checkpoint without a family.
__all__ = [
    "load_checkpoint",
    "prepare_checkpoint",
    "read_state_dict",
    "read_workflow_checkpoint",
    "resolve_checkpoint_file",
    "save_checkpoint",
    "source_digest",
    "write_seeded_checkpoint",
]


def save_checkpoint(family: Family, obj: dict[str, Any], out: str | Path) -> None:
    """The workflow's checkpoint (``{"model": weights}``) in ``family``'s framework."""
    write_framework_checkpoint(family.framework, obj, out)


def read_workflow_checkpoint(family: Family, path: str | Path) -> dict[str, Any]:
    """A checkpoint this workflow wrote (``prepare_checkpoint``), for ``family``."""
    return read_framework_checkpoint(family.framework, path)


def write_seeded_checkpoint(family: Family, seed: int, out: str | Path) -> None:
    """Write the seeded initialisation; same seed → same bytes."""
    save_checkpoint(family, family.init_state(seed), out)


def prepare_model_checkpoint(family: Family, model: Mapping[str, Any], out: str | Path) -> str:
    """:func:`prepare_checkpoint` for the model a job spec names (``ModelPlan.identity``:
    checkpoint, checkpoint_ema, seed), as the ``prepare_checkpoint`` job makes it."""
    return prepare_checkpoint(
        family,
        model.get("checkpoint"),
        int(model["seed"]),
        out,
        ema=bool(model.get("checkpoint_ema")),
    )


def source_digest(source: str | Path | None) -> dict[str, str | None] | None:
    """The configured checkpoint's file and its sha256, hashed once, by the job that reads it
    (``prepare_checkpoint``): what ``models.<m>.published_needs.checkpoint_sha256`` pins. The
    file a PyTorch family reads from a file or a checkpoint directory
    (:func:`resolve_checkpoint_file`), else the configured file itself; a directory of another
    layout (a TensorFlow checkpoint's) is not hashed (sha256 None). None: seeded weights."""
    if not source:
        return None
    try:
        file = resolve_checkpoint_file(source)
    except (InputNotFound, CheckpointError):
        file = Path(source)
    return {"file": str(file), "sha256": sha256_of(file) if file.is_file() else None}


def prepare_checkpoint(
    family: Family, source: str | None, seed: int, out: str | Path, *, ema: bool = False
) -> str:
    """Materialise the run's checkpoint at ``out``; returns a description of its origin.
    ``ema``: read the checkpoint's exponential-moving-average weights."""
    if source:
        data = family.read_checkpoint(source, ema=ema)
        bad = non_finite_tensors(data["model"], family.infinite_by_design)
        if bad:
            shown = ", ".join(bad[:5]) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
            raise CheckpointError(
                f"checkpoint {source}: {len(bad)} tensor(s) hold NaN or Inf (a diverged "
                f"training run?): {shown}. Configure a checkpoint saved before the divergence"
            )
        family.serving_module(data)  # fails early if it does not fit the hyper-parameters
        save_checkpoint(family, {"model": data["model"]}, out)
        return f"checkpoint {source}" + (" (EMA weights)" if ema else "")
    write_seeded_checkpoint(family, seed, out)
    return f"seeded-random initialisation (seed {seed})"
