"""Exporters of TensorFlow/Keras families: a SavedModel, and ONNX converted from it by tf2onnx.

Kept apart from ``export.py`` so that a PyTorch job never imports TensorFlow; ``export.py``
merges ``TF_EXPORTERS`` the first time it exports a TensorFlow family.

The SavedModel's ``serving_default`` signature takes the family's inputs by name and returns a
dict of the family's outputs by name, as DLE's estimator export does (``input`` →
``classes``, ``probabilities`` for ResNet-50), so Triton's TensorFlow backend and tf2onnx see
DLE's tensor names.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from .export import Exporter, ExportOptions
from .models import Family
from .process import die_with_parent

SERVING_SIGNATURE = "serving_default"
# How much of tf2onnx's stderr an error message carries.
STDERR_TAIL_CHARS = 3000


def serving_function(module: Any, family: Family) -> Any:
    """A ``tf.function`` of the Keras model with the family's named, batch-dynamic signature."""
    import tensorflow as tf

    specs = [
        tf.TensorSpec(_dims(s.shape), tf.as_dtype(s.dtype), name=s.name) for s in family.inputs
    ]
    output_names = [s.name for s in family.outputs]

    def serve(*tensors: Any) -> dict[str, Any]:
        feed = list(tensors) if len(tensors) > 1 else tensors[0]
        out = module(feed, training=False)
        outs = out if isinstance(out, (tuple, list)) else (out,)
        return dict(zip(output_names, outs, strict=True))

    # The signature's input keys are the TensorSpec names; its output keys the dict's.
    return tf.function(serve, input_signature=specs, autograph=False).get_concrete_function()


def _dims(shape: tuple[int, ...]) -> tuple[int | None, ...]:
    """A signature's shape: the batch and every ``-1`` dimension dynamic."""
    return (None, *(None if d == -1 else d for d in shape))


def export_savedmodel(module: Any, family: Family, out: Path, options: ExportOptions) -> None:
    """Write a SavedModel directory at ``out`` whose only signature is ``serving_default``."""
    import tensorflow as tf

    holder = tf.Module()
    holder.model = module  # tracks the Keras variables, so they are saved with the graph
    tf.saved_model.save(
        holder, str(out), signatures={SERVING_SIGNATURE: serving_function(module, family)}
    )


def export_onnx_from_savedmodel(
    module: Any, family: Family, out: Path, options: ExportOptions
) -> None:
    """ONNX by tf2onnx from ``options.source`` (a SavedModel), or from one of ``module``.

    tf2onnx runs as a child process: its peak memory (7–8.5 GB for ResNet-50, in its ONNX
    optimiser) is its own, released when it ends, and it dies with the job.
    """
    if options.source is not None:
        convert_savedmodel_to_onnx(options.source, out, options.opset)
        return
    with tempfile.TemporaryDirectory(prefix="savedmodel-", dir=out.parent) as tmp:
        savedmodel = Path(tmp) / "model.savedmodel"
        export_savedmodel(module, family, savedmodel, options)
        convert_savedmodel_to_onnx(savedmodel, out, options.opset)


def convert_savedmodel_to_onnx(savedmodel: Path, out: Path, opset: int) -> None:
    if not (Path(savedmodel) / "saved_model.pb").is_file():
        raise FileNotFoundError(f"{savedmodel} is not a SavedModel directory (no saved_model.pb)")
    command = [
        sys.executable,
        "-m",
        "tf2onnx.convert",
        "--saved-model",
        str(savedmodel),
        "--signature_def",
        SERVING_SIGNATURE,
        "--output",
        str(out),
        "--opset",
        str(opset),
    ]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}  # TensorFlow's start-up chatter
    result = subprocess.run(
        command,
        capture_output=True,
        text=True,
        env=env,
        check=False,
        preexec_fn=die_with_parent(signal.SIGKILL),  # the child only calls prctl
    )
    if result.returncode != 0 or not out.is_file():
        tail = result.stderr[-STDERR_TAIL_CHARS:].strip()
        raise RuntimeError(
            f"tf2onnx failed (exit status {result.returncode}) converting {savedmodel}:\n{tail}"
        )


TF_EXPORTERS: dict[tuple[str, str], Exporter] = {
    ("tensorflow", "tf-savedmodel"): export_savedmodel,
    ("tensorflow", "onnx"): export_onnx_from_savedmodel,
}
