"""Run an exported artifact in-process with its runtime (onnxruntime, TorchScript or TensorFlow).

Self-contained on purpose (numpy plus the runtime): the workflow uses it to check exports and
measure in-process throughput, and the model repository ships a copy beside the python
backend's ``model.py``, so the served path and the checked path run the same code.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

RUNTIMES = ("onnxruntime", "torchscript", "tensorflow")


class Runner:
    """Callable: feeds by input name → outputs in the artifact's output order."""

    input_names: list[str]  # the inputs the artifact consumes, a subset of the served ones
    output_names: list[str]

    def __call__(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:  # pragma: no cover
        raise NotImplementedError


class OnnxRuntimeRunner(Runner):
    def __init__(self, path: Path, threads: int) -> None:
        import onnxruntime as ort  # imported here: only this runtime needs it

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads  # 0: onnxruntime picks (one per core)
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        # ONNX export drops inputs the graph does not use; feed only what it declares.
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.output_names = [o.name for o in self.session.get_outputs()]

    def __call__(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        result: list[np.ndarray] = self.session.run(
            self.output_names, {n: feeds[n] for n in self.input_names}
        )
        return result


class TorchScriptRunner(Runner):
    def __init__(
        self, path: Path, threads: int, input_names: Sequence[str], output_names: Sequence[str]
    ) -> None:
        import torch  # imported here: only this runtime needs it

        if threads:
            torch.set_num_threads(threads)
        self.torch = torch
        self.module = torch.jit.load(str(path), map_location="cpu").eval()
        self.input_names = list(input_names)  # positional, in the served order
        self.output_names = list(output_names)

    def __call__(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        torch = self.torch
        with torch.inference_mode():
            out: Any = self.module(*(torch.from_numpy(feeds[n]) for n in self.input_names))
        outs = out if isinstance(out, (tuple, list)) else (out,)
        return [o.numpy() for o in outs]


class TensorFlowRunner(Runner):
    """A SavedModel's ``serving_default`` signature: named inputs in, a dict of outputs out."""

    def __init__(
        self, path: Path, threads: int, input_names: Sequence[str], output_names: Sequence[str]
    ) -> None:
        import tensorflow as tf  # imported here: only this runtime needs it

        _set_tensorflow_threads(tf, threads)
        self.tf = tf
        self.model = tf.saved_model.load(str(path))
        self.signature = self.model.signatures["serving_default"]
        declared = self.signature.structured_input_signature[1]
        self.input_names = [n for n in input_names if n in declared]
        missing = sorted(set(declared) - set(self.input_names))
        if missing:
            raise ValueError(f"{path}: the serving signature needs inputs {missing} not served")
        self.output_names = list(output_names)
        unknown = sorted(set(self.output_names) - set(self.signature.structured_outputs))
        if unknown:
            raise ValueError(f"{path}: the serving signature has no outputs {unknown}")

    def __call__(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        tf = self.tf
        out = self.signature(**{n: tf.constant(feeds[n]) for n in self.input_names})
        return [out[n].numpy() for n in self.output_names]


def _set_tensorflow_threads(tf: Any, threads: int) -> None:
    """Thread pools as for onnxruntime: ``threads`` per op (0: TF picks), ops one at a time.

    TensorFlow fixes its pools when its runtime starts; in a process where it already runs
    (a test, an export check) the call is refused and the existing pools are kept.
    """
    try:
        if threads > 0:
            tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(1)
    except RuntimeError:
        pass


def threads_per_instance(configured: int, instances: int) -> int:
    """Runtime threads for one of a model's ``instances``: ``configured``, or (0) this process's
    cores shared out among the instances. Each runtime's own default takes every core, so two
    instances would run twice as many threads as cores and slow each other down."""
    if configured > 0:
        return configured
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, (cores or 1) // max(1, instances))


def load_runner(
    runtime: str,
    path: str | Path,
    *,
    input_names: Sequence[str],
    output_names: Sequence[str],
    threads: int = 0,
) -> Runner:
    if runtime == "onnxruntime":
        return OnnxRuntimeRunner(Path(path), threads)
    if runtime == "torchscript":
        return TorchScriptRunner(Path(path), threads, input_names, output_names)
    if runtime == "tensorflow":
        return TensorFlowRunner(Path(path), threads, input_names, output_names)
    raise ValueError(f"unknown runtime {runtime!r}; valid choices: {', '.join(RUNTIMES)}")
