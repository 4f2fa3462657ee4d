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


try:  # the package's one hierarchy; the copy served beside model.py is a module of its own
    from .errors import DeploybenchError as _Error
except ImportError:

    class _Error(Exception):  # type: ignore[no-redef]
        """The base of this module's errors where deploybench's is not importable."""


class CudaMissing(_Error, RuntimeError):
    """A GPU instance (KIND_GPU) whose runtime cannot reach CUDA: names what is missing."""


def instance_device(kind: str, device_id: str | int) -> str:
    """The device of one Triton model instance, from the python backend's ``initialize`` args
    ``model_instance_kind`` ("GPU", "CPU", ...) and ``model_instance_device_id``: ``cuda:<id>``
    for a GPU instance, ``cpu`` otherwise."""
    return f"cuda:{int(device_id)}" if str(kind).upper() in ("GPU", "KIND_GPU") else "cpu"


def _device_index(device: str) -> int:
    return int(device.partition(":")[2] or 0)


class OnnxRuntimeRunner(Runner):
    def __init__(self, path: Path, threads: int, device: str = "cpu", entry: str = "") -> None:
        import onnxruntime as ort  # imported here: only this runtime needs it

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads  # 0: onnxruntime picks (one per core)
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        providers: list[Any] = ["CPUExecutionProvider"]
        if device != "cpu":
            available = ort.get_available_providers()
            if "CUDAExecutionProvider" not in available:
                raise CudaMissing(
                    f"{_on(entry)}a GPU instance ({device}) runs ONNX Runtime's "
                    f"CUDAExecutionProvider, which this onnxruntime lacks (it has "
                    f"{', '.join(available)}): install onnxruntime-gpu in place of onnxruntime"
                )
            providers = [("CUDAExecutionProvider", {"device_id": _device_index(device)})]
        self.session = ort.InferenceSession(str(path), options, providers=providers)
        # ONNX export drops inputs the graph does not use; feed only what it declares.
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.output_names = [o.name for o in self.session.get_outputs()]

    def __call__(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        result: list[np.ndarray] = self.session.run(
            self.output_names, {n: feeds[n] for n in self.input_names}
        )
        return result


class TorchScriptRunner(Runner):
    """A TorchScript module on ``device`` (``cpu`` or ``cuda:<id>``): loaded there, each feed
    moved there, each output brought back to the host as numpy."""

    def __init__(
        self,
        path: Path,
        threads: int,
        input_names: Sequence[str],
        output_names: Sequence[str],
        device: str = "cpu",
        entry: str = "",
    ) -> None:
        import torch  # imported here: only this runtime needs it

        if device != "cpu" and not torch.cuda.is_available():
            raise CudaMissing(
                f"{_on(entry)}a GPU instance ({device}) runs TorchScript on CUDA, but this "
                f"torch {torch.__version__} sees no CUDA device (torch.cuda.is_available() is "
                "false: a CPU-only torch wheel, no NVIDIA driver, or CUDA_VISIBLE_DEVICES hides "
                "the GPU)"
            )
        if threads:
            torch.set_num_threads(threads)
        self.torch = torch
        self.device = device
        self.module = torch.jit.load(str(path), map_location=device).eval()
        self.input_names = list(input_names)  # positional, in the served order
        self.output_names = list(output_names)

    def __call__(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        torch = self.torch
        with torch.inference_mode():
            out: Any = self.module(
                *(torch.from_numpy(feeds[n]).to(self.device) for n in self.input_names)
            )
        outs = out if isinstance(out, (tuple, list)) else (out,)
        return [o.cpu().numpy() for o in outs]


def _on(entry: str) -> str:
    return f"gpus.{entry} (serving: python): " if entry else ""


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
    device: str = "cpu",
    entry: str = "",
) -> Runner:
    """The artifact's runner on ``device`` (``cpu``, or ``cuda:<id>``: TorchScript and ONNX
    Runtime only); ``entry``: the `gpus` entry that serves it, named in its errors."""
    if runtime == "onnxruntime":
        return OnnxRuntimeRunner(Path(path), threads, device, entry)
    if runtime == "torchscript":
        return TorchScriptRunner(Path(path), threads, input_names, output_names, device, entry)
    if device != "cpu" and runtime in RUNTIMES:
        raise ValueError(f"runtime {runtime!r} runs on the CPU only here, not on {device!r}")
    if runtime == "tensorflow":
        return TensorFlowRunner(Path(path), threads, input_names, output_names)
    raise ValueError(f"unknown runtime {runtime!r}; valid choices: {', '.join(RUNTIMES)}")
