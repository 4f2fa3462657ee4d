"""What every model family shares, per framework.

A family is the workflow's view of one model: its Triton signature (``inputs``/``outputs``),
how to build it, its checkpoint, deterministic example inputs, and (for the task metric of its
seed page) a data-set reader and the metric. Per-model code lives in one module per model;
these bases hold what is the same for every model of a framework.

Checkpoints inside the workflow are ``{"model": <weights>}`` written by ``deploybench.checkpoint``;
source checkpoints are read by ``deploybench.checkpoint_io``, which knows nothing of families.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..checkpoint_io import read_state_dict
from ..errors import CheckpointError, ConfigError, InputNotFound
from ..tensors import TensorSpec

if TYPE_CHECKING:
    from torch import nn


def check_hparams(config_class: type, values: dict[str, Any], name: str) -> None:
    """Reject hyper-parameters the model's config dataclass does not know, naming the valid ones."""
    known = {f.name for f in dataclasses.fields(config_class)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ConfigError(f"unknown {name} hyper-parameters {unknown}; valid: {sorted(known)}")


# A batch from a data set: feeds by input name, and the labels the task metric needs.
Batch = tuple[dict[str, np.ndarray], Any]
# Model-specific accuracy quantities: output name -> quantity name -> value.
Quantities = dict[str, dict[str, float]]


def argmax_flip_fraction(reference: np.ndarray, actual: np.ndarray, axis: int = -1) -> float:
    """The share of arg-maxes over ``axis`` that differ between two score arrays of one shape."""
    ref = np.argmax(np.asarray(reference), axis=axis)
    act = np.argmax(np.asarray(actual), axis=axis)
    return float(np.mean(ref != act)) if ref.size else 0.0


class Family(abc.ABC):
    """Framework-independent part: signature, example inputs, data set and task metric.

    Abstract: a model class missing a method every model needs (``@abstractmethod``) cannot be
    instantiated; the optional ones (data-set reader, task metric) say so when called."""

    framework: str
    name: str = ""  # how messages name the model, e.g. "TFT"
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    # The task metric of the seed page: its name and whether higher is better.
    metric_name: str = ""
    higher_is_better: bool = True
    # Weights whose infinities are the model's own (fnmatch patterns of state-dict names, e.g. a
    # causal attention mask's -inf); any other non-finite weight refuses the checkpoint.
    infinite_by_design: tuple[str, ...] = ()

    @abc.abstractmethod
    def example_inputs(self, batch: int, seed: int) -> dict[str, np.ndarray]:
        """Deterministic inputs of ``batch`` examples by input name, from ``seed``."""

    def perf_inputs(self, seed: int, dataset: str | Path | None = None) -> dict[str, np.ndarray]:
        """The one example (batch 1) perf_analyzer sends, as the seed page's perf data was made;
        ``dataset``: the task's data set (``accuracy.task.path``) or None, for a family whose
        DLE perf data came from it. By default the seeded example inputs."""
        return self.example_inputs(1, seed)

    def perf_input_source(self, seed: int, dataset: str | Path | None = None) -> str:
        """What :meth:`perf_inputs` sends, in words (each run's provenance says it)."""
        return f"seeded example inputs (seed {seed})"

    # Per framework (TorchFamily, KerasFamily): weights, the serving model, its outputs.
    @abc.abstractmethod
    def init_state(self, seed: int) -> dict[str, Any]:
        """A seeded-random initialisation as a workflow checkpoint (``{"model": weights}``)."""

    @abc.abstractmethod
    def read_checkpoint(self, path: str | Path, *, ema: bool = False) -> dict[str, Any]:
        """A source checkpoint (as DLE's training code writes it) as a workflow checkpoint;
        ``ema``: its exponential-moving-average copy of the weights."""

    @abc.abstractmethod
    def serving_module(self, checkpoint: dict[str, Any]) -> Any:
        """The model Triton serves, with the checkpoint's weights."""

    @abc.abstractmethod
    def framework_outputs(
        self, module: Any, feeds: dict[str, np.ndarray], device: str = "cpu"
    ) -> dict[str, np.ndarray]:
        """The framework's outputs for ``feeds`` by output name: the reference for every check,
        computed on ``device`` (``cuda`` for a run served on a GPU, as DLE's
        ``run_inference_on_fw.py`` did: the GPU's float32 kernels, e.g. cuDNN's TF32
        convolutions, round unlike the CPU's)."""

    def accuracy_quantities(
        self, reference: dict[str, np.ndarray], actual: dict[str, np.ndarray]
    ) -> Quantities:
        """What the model's outputs mean beyond element errors, ``actual`` against ``reference``
        (the framework's outputs for the same feeds), by output name: e.g. the share of
        samples whose arg-max moved. Reported beside max abs/rel errors
        (:func:`deploybench.accuracy.measure`); none by default."""
        return {}

    def dataset_batches(
        self, path: str | Path, batch_size: int, limit: int | None
    ) -> Iterator[Batch]:
        """Batches of the task's data set at ``path`` (the layout DLE's data preparation writes),
        at most ``limit`` examples (images, questions, cases, series windows) in all."""
        raise NotImplementedError(f"{type(self).__name__} has no data-set reader")

    def task_metric(
        self, outputs: list[dict[str, np.ndarray]], labels: list[Any]
    ) -> dict[str, float]:
        """The seed page's quality metric over served (or framework) outputs and their labels;
        the first key is ``metric_name``."""
        raise NotImplementedError(f"{type(self).__name__} has no task metric")


class TorchFamily(Family):
    """A PyTorch model: a state dict checkpoint, a serving ``nn.Module``."""

    framework = "pytorch"
    # Whether the serving module can be compiled with ``torch.jit.script`` (format ts-script).
    scriptable = False

    @abc.abstractmethod
    def build(self) -> nn.Module:
        """A freshly initialised network (uses torch's global RNG)."""

    def wrap(self, model: nn.Module) -> nn.Module:
        """The module Triton serves: ``forward(*inputs in order) -> outputs in order``."""
        return model

    def adapt_state_dict(self, state: dict[str, Any]) -> dict[str, Any]:
        """A source checkpoint's state dict in this module's names (e.g. strip DDP prefixes)."""
        return state

    def init_state(self, seed: int) -> dict[str, Any]:
        import torch

        torch.manual_seed(seed)
        return {"model": self.build().state_dict()}

    def read_checkpoint(self, path: str | Path, *, ema: bool = False) -> dict[str, Any]:
        state = read_state_dict(path, ema=ema, model=self.name or type(self).__name__)
        return {"model": self.adapt_state_dict(state)}

    def serving_module(self, checkpoint: dict[str, Any]) -> nn.Module:
        model = self.build()
        check_weights(self, model.state_dict(), checkpoint["model"])
        model.load_state_dict(checkpoint["model"], strict=True)
        return self.wrap(model).eval()

    def framework_outputs(
        self, module: nn.Module, feeds: dict[str, np.ndarray], device: str = "cpu"
    ) -> dict[str, np.ndarray]:
        """The framework's outputs for ``feeds`` by output name on ``device`` (see Family)."""
        import torch

        module = module.to(device)
        with torch.no_grad():
            out = module(*(torch.from_numpy(feeds[s.name]).to(device) for s in self.inputs))
        outs = out if isinstance(out, (tuple, list)) else (out,)
        return {s.name: t.cpu().numpy() for s, t in zip(self.outputs, outs, strict=True)}


class KerasFamily(Family):
    """A TensorFlow/Keras model: weights by variable path, a Keras serving model."""

    framework = "tensorflow"

    @abc.abstractmethod
    def build(self) -> Any:
        """A freshly initialised ``keras.Model`` (seeded by ``keras.utils.set_random_seed``)."""

    def init_state(self, seed: int) -> dict[str, Any]:
        import keras

        keras.utils.set_random_seed(seed)
        model = self.build()
        return {"model": {w.path: np.asarray(w.numpy()) for w in model.weights}}

    def read_checkpoint(self, path: str | Path, *, ema: bool = False) -> dict[str, Any]:
        """Every variable of a TensorFlow checkpoint (as ``tf.compat.v1.train.Saver`` and so
        TF1's estimators write it) under its name there, as arrays; the family maps the names.

        ``path``: a checkpoint directory (the checkpoint its ``checkpoint`` state file names,
        as an estimator restores ``model_dir``; else its only ``*.index``), a ``model.ckpt-N``
        prefix, or that prefix's ``.index`` file (an existing path, as the config needs).
        TensorFlow 2's reader reads TF1's format: no TF1 needed.
        """
        import tensorflow as tf

        name = self.name or type(self).__name__
        if ema:
            raise CheckpointError(
                f"checkpoint_ema is set, but {name}'s TensorFlow checkpoints hold no EMA copy "
                "of the weights; set checkpoint_ema: false"
            )
        given = Path(path)
        if given.is_dir():
            prefix = tf.train.latest_checkpoint(str(given))
            indexes = sorted(given.glob("*.index"))
            if prefix is None and len(indexes) == 1:
                prefix = str(indexes[0].with_suffix(""))
            if prefix is None:
                found = ", ".join(i.name for i in indexes) or "none"
                raise InputNotFound(
                    f"{given}: no TensorFlow checkpoint its 'checkpoint' state file names, and "
                    f"not exactly one *.index (found: {found}); set the path to the "
                    "model.ckpt-N.index of the one to read"
                )
        elif given.suffix == ".index" and given.is_file():
            prefix = str(given.with_suffix(""))
        elif Path(f"{given}.index").is_file():
            prefix = str(given)
        else:
            raise InputNotFound(
                f"TensorFlow checkpoint {str(path)!r} not found (expected a checkpoint "
                "directory, a model.ckpt-N prefix, or its model.ckpt-N.index file)"
            )
        try:
            reader = tf.train.load_checkpoint(prefix)
            names = sorted(reader.get_variable_to_shape_map())
            return {"model": {n: np.asarray(reader.get_tensor(n)) for n in names}}
        except tf.errors.OpError as err:
            raise CheckpointError(
                f"{prefix}: not a readable TensorFlow checkpoint ({type(err).__name__}: "
                f"{err.message})"
            ) from err

    def serving_module(self, checkpoint: dict[str, Any]) -> Any:
        model = self.build()
        weights = checkpoint["model"]
        check_weights(self, {w.path: w for w in model.weights}, weights)
        for w in model.weights:
            w.assign(weights[w.path])
        return model

    def framework_outputs(
        self, module: Any, feeds: dict[str, np.ndarray], device: str = "cpu"
    ) -> dict[str, np.ndarray]:
        # On the CPU, whatever ``device``: the accuracy job runs in the Triton image, whose
        # TensorFlow is PyPI's 2.17.0, built for cuDNN 8.9 (its METADATA: `nvidia-cudnn-cu12
        # ==8.9.7.29; extra == 'and-cuda'`) while the image has cuDNN 9, so it sees no GPU
        # there. A fidelity check needs no GPU; DLE computed its reference on the GPU
        # (preflight_plan.CPU_REFERENCE_FRAMEWORKS).
        import tensorflow as tf

        with tf.device("/CPU:0"):
            out = module(
                [feeds[s.name] for s in self.inputs]
                if len(self.inputs) > 1
                else feeds[self.inputs[0].name],
                training=False,
            )
        outs = out if isinstance(out, (tuple, list)) else (out,)
        return {s.name: np.asarray(t) for s, t in zip(self.outputs, outs, strict=True)}


def check_weights(
    family: Family, expected: dict[str, Any], given: dict[str, Any], *, shapes: bool = True
) -> None:
    """A short, clear error when a checkpoint does not fit the configured network."""
    missing = sorted(set(expected) - set(given))
    unexpected = sorted(set(given) - set(expected))
    mismatched = [
        f"{k} {tuple(given[k].shape)} vs {tuple(expected[k].shape)}"
        for k in sorted(set(expected) & set(given))
        if shapes and tuple(given[k].shape) != tuple(expected[k].shape)
    ]
    problems = [
        f"{label} ({len(items)}): {', '.join(items[:3])}{' …' if len(items) > 3 else ''}"
        for label, items in (
            ("missing", missing),
            ("unexpected", unexpected),
            ("shape checkpoint vs configured", mismatched),
        )
        if items
    ]
    if problems:
        name = family.name or type(family).__name__
        raise CheckpointError(
            f"checkpoint does not fit the configured {name} hyper-parameters: "
            + "; ".join(problems)
        )
