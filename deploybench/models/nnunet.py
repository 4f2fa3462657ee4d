"""nnU-Net (Isensee et al., 2021) as deployed by DeepLearningExamples (DLE) on Triton.

The network is MONAI's ``DynUNet`` configured as DLE builds it: a 3-D U-Net whose levels each
hold two conv → instance norm → leaky ReLU layers, strided convolutions to go down, transposed
convolutions to go up, and a 1×1×1 output convolution; deep supervision off (inference). DLE's
first nnU-Net (April 2021, the one on the seed page) used its own ``models/unet.py`` with the
same computation under other parameter names; its later versions build this very ``DynUNet``.
``adapt_state_dict`` reads both layouts from DLE's PyTorch Lightning checkpoints
(``{"state_dict": {"model.<name>": tensor, ...}, "hyper_parameters": ...}``), trained with or
without deep supervision (its heads are dropped) and with channels-last weights (DLE's 3-D
recipe, ``--layout NDHWC``).

The Triton interface is DLE's (``triton/model.py``): one input ``INPUT__0`` float32
``[batch, 4, 128, 128, 128]`` (the four MRI modalities of MSD Task01 BrainTumour) and one output
``OUTPUT__0``, the arg-max over the classes (int64 ``[batch, 128, 128, 128]``), as DLE's
``NNUnet.forward`` returns it. ``output: logits`` serves the raw scores instead, for checks
that need a continuous output.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from ..checkpoint_io import lightning_network
from ..errors import ConfigError, DataError, InputNotFound
from ..tensors import TensorSpec
from .base import Batch, Quantities, TorchFamily, argmax_flip_fraction, check_hparams

Triple = tuple[int, int, int]

INPUT_NAME = "INPUT__0"
OUTPUT_NAME = "OUTPUT__0"
NORMS = ("instance", "batch")
OUTPUTS = ("labels", "logits")


def _triple(value: int | Sequence[int], what: str) -> Triple:
    """One level's kernel or stride: an int for all three axes, or one per axis."""
    if isinstance(value, int):
        return (value, value, value)
    items = tuple(int(v) for v in value)
    if len(items) != 3:
        raise ConfigError(f"{what}: expected an int or three ints per level, got {list(value)}")
    return (items[0], items[1], items[2])


@dataclass(frozen=True)
class NnUNetConfig:
    """Hyper-parameters of one nnU-Net variant. Defaults: DLE's 3-D model for MSD Task01
    (``get_unet_params`` on its 128³ patch and 1 mm spacing; filters ``min(2**(5+i), 320)``)."""

    in_channels: int = 4
    out_channels: int = 4  # background + edema, non-enhancing tumour, enhancing tumour
    kernels: tuple[Triple, ...] = ((3, 3, 3),) * 6
    strides: tuple[Triple, ...] = ((1, 1, 1),) + ((2, 2, 2),) * 5
    filters: tuple[int, ...] = (32, 64, 128, 256, 320, 320)
    norm_name: str = "instance"
    negative_slope: float = 0.01
    patch_size: Triple = (128, 128, 128)
    output: str = "labels"

    def __post_init__(self) -> None:
        # Normalise YAML lists (and ints per level) to tuples, then check the combination.
        assign = object.__setattr__  # the dataclass is frozen
        assign(self, "kernels", tuple(_triple(k, "kernels") for k in self.kernels))
        assign(self, "strides", tuple(_triple(s, "strides") for s in self.strides))
        assign(self, "filters", tuple(int(f) for f in self.filters))
        assign(self, "patch_size", _triple(self.patch_size, "patch_size"))
        self._validate()

    def _validate(self) -> None:
        levels = {len(self.kernels), len(self.strides), len(self.filters)}
        if len(levels) != 1:
            raise ConfigError(
                "kernels, strides and filters need one entry per level; got "
                f"{len(self.kernels)}, {len(self.strides)}, {len(self.filters)}"
            )
        if len(self.filters) < 2:
            raise ConfigError("nnU-Net needs at least two levels")
        if self.norm_name not in NORMS:
            raise ConfigError(f"norm_name {self.norm_name!r} is not one of {list(NORMS)}")
        if self.output not in OUTPUTS:
            raise ConfigError(f"output {self.output!r} is not one of {list(OUTPUTS)}")
        if self.out_channels < 2:
            raise ConfigError("out_channels counts the background too; it must be at least 2")
        total = np.prod(np.array(self.strides), axis=0)
        if any(p % int(t) for p, t in zip(self.patch_size, total, strict=True)):
            raise ConfigError(
                f"patch_size {list(self.patch_size)} is not divisible by the total stride "
                f"{total.tolist()}"
            )

    @classmethod
    def from_mapping(cls, values: dict[str, Any]) -> NnUNetConfig:
        check_hparams(cls, values, "nnU-Net")
        return cls(**values)

    @property
    def classes(self) -> list[int]:
        """The foreground classes the task metric scores."""
        return list(range(1, self.out_channels))


def build_dynunet(cfg: NnUNetConfig) -> nn.Module:
    """MONAI's DynUNet with DLE's arguments (``nnunet/nn_unet.py``), deep supervision off."""
    from monai.networks.nets import DynUNet  # imported here: MONAI is slow to import

    return DynUNet(
        spatial_dims=3,
        in_channels=cfg.in_channels,
        out_channels=cfg.out_channels,
        kernel_size=[list(k) for k in cfg.kernels],
        strides=[list(s) for s in cfg.strides],
        upsample_kernel_size=[list(s) for s in cfg.strides[1:]],
        filters=list(cfg.filters),
        norm_name=(cfg.norm_name.upper(), {"affine": True}),
        act_name=("leakyrelu", {"inplace": True, "negative_slope": cfg.negative_slope}),
        deep_supervision=False,
        trans_bias=True,
    )


class NnUNetServing(nn.Module):
    """DLE's Triton signature: the arg-max class per voxel (or, if asked, the raw scores)."""

    def __init__(self, model: nn.Module, labels: bool) -> None:
        super().__init__()
        self.model = model
        self.labels = labels

    def forward(self, image: Tensor) -> Tensor:
        scores = self.model(image)
        if self.labels:
            return torch.argmax(scores, 1)
        return scores


# DLE's April-2021 ``models/unet.py`` names → DynUNet's. Its blocks keep the norm inside each
# conv layer and its transposed/output convolutions are not wrapped in another ``conv``.
_DLE_2021_RENAMES = (
    (re.compile(r"^(.+)\.conv([12])\.norm\.(.+)$"), r"\1.norm\2.\3"),
    (re.compile(r"^(upsamples\.\d+)\.transp_conv\.(weight|bias)$"), r"\1.transp_conv.conv.\2"),
    (re.compile(r"^output_block\.conv\.(weight|bias)$"), r"output_block.conv.conv.\1"),
)
# Deep-supervision heads: training-only 1×1×1 output convolutions of the decoder levels below the top.
# DLE serves without them (its Triton model loads with ``strict=False`` and runs in eval mode,
# where the heads are unused), and so does this network. They appear as
# - ``deep_supervision_heads.<i>.*``: DLE's 2021 UNet and MONAI 0.8.0's DynUNet register them
#   always; MONAI 0.8.1+ (DLE 22.04+) with ``--deep_supervision`` (``deep_supr_num`` of them);
# - ``skip_layers(.next_layer)+.super_head.*``: with ``--deep_supervision`` MONAI's DynUNet also
#   registers each head inside its recursive ``skip_layers``, at the level it supervises (the
#   same tensors again: DLE's recipe saves ``skip_layers.next_layer.super_head.conv.conv.*`` and
#   ``skip_layers.next_layer.next_layer.super_head.conv.conv.*``).
# Dropped by name, so that any other unknown key still fails the shape/name check.
_DEEP_SUPERVISION = re.compile(
    r"^(deep_supervision_heads\.\d+|skip_layers(\.next_layer)*\.super_head)\."
)


def _dynunet_name(name: str) -> str:
    for pattern, replacement in _DLE_2021_RENAMES:
        if pattern.match(name):
            return pattern.sub(replacement, name)
    return name


def _alias_names(model: nn.Module) -> dict[str, str]:
    """State-dict name → the first name of the same tensor. DynUNet registers every block
    twice (in its level lists and again in the recursive ``skip_layers``)."""
    first: dict[int, str] = {}
    aliases = {}
    for name, tensor in model.state_dict(keep_vars=True).items():
        canonical = first.setdefault(id(tensor), name)
        if canonical != name:
            aliases[name] = canonical
    return aliases


class NnUNetFamily(TorchFamily):
    """The workflow's view of nnU-Net: build, checkpoints, serving module, data and Dice."""

    name = "nnU-Net"
    metric_name = "dice_mean"
    higher_is_better = True
    scriptable = True

    def __init__(self, hparams: dict[str, Any]) -> None:
        self.cfg = NnUNetConfig.from_mapping(hparams)
        self.inputs = [
            TensorSpec(INPUT_NAME, "float32", (self.cfg.in_channels, *self.cfg.patch_size))
        ]
        if self.cfg.output == "labels":
            self.outputs = [TensorSpec(OUTPUT_NAME, "int64", self.cfg.patch_size)]
        else:
            shape = (self.cfg.out_channels, *self.cfg.patch_size)
            self.outputs = [TensorSpec(OUTPUT_NAME, "float32", shape)]

    def build(self) -> nn.Module:
        return build_dynunet(self.cfg)

    def wrap(self, model: nn.Module) -> nn.Module:
        return NnUNetServing(model, labels=self.cfg.output == "labels")

    def adapt_state_dict(self, state: dict[str, Any]) -> dict[str, Any]:
        """DLE's names → this DynUNet's: drop the Lightning module's ``model.`` prefix (and its
        other members) if still there, drop the deep-supervision heads, rename April-2021
        ``UNet`` parameters and fill DynUNet's ``skip_layers`` aliases.

        Weights of DLE's channels-last recipe (``--layout NDHWC``: ``model.to(memory_format=
        torch.channels_last_3d)``) need nothing here: same names, logical shapes and values,
        only their strides differ, and the generic reader makes every tensor contiguous."""
        state = lightning_network(state)
        adapted = {_dynunet_name(k): v for k, v in state.items() if not _DEEP_SUPERVISION.match(k)}
        with torch.device("meta"):  # names only: no memory, no draw from the global RNG
            skeleton = self.build()
        for alias, canonical in _alias_names(skeleton).items():
            if canonical in adapted:
                adapted[alias] = adapted[canonical]
        return adapted

    def example_inputs(self, batch: int, seed: int) -> dict[str, np.ndarray]:
        """Deterministic MRI-like volumes as DLE's pre-processing leaves them: each channel
        standardised (mean 0, std 1) inside a head-shaped ellipsoid, zero outside."""
        rng = np.random.default_rng(seed)
        shape = (batch, self.cfg.in_channels, *self.cfg.patch_size)
        values = rng.standard_normal(shape, dtype=np.float32)
        values *= _ellipsoid_mask(self.cfg.patch_size)
        return {INPUT_NAME: values}

    def accuracy_quantities(
        self, reference: dict[str, np.ndarray], actual: dict[str, np.ndarray]
    ) -> Quantities:
        """The share of voxels whose label differs: of the served labels, or of the arg-max
        over the class scores (``output: logits``)."""
        ref, act = reference.get(OUTPUT_NAME), actual.get(OUTPUT_NAME)
        if ref is None or act is None or ref.shape != act.shape:
            return {}
        if self.cfg.output == "labels":
            share = float(np.mean(ref != act)) if ref.size else 0.0
        else:
            share = argmax_flip_fraction(ref, act, axis=1)
        return {OUTPUT_NAME: {"label_mismatch_fraction": share}}

    def dataset_batches(
        self, path: str | Path, batch_size: int, limit: int | None
    ) -> Iterator[Batch]:
        """DLE's pre-processed Task01 data (``<case>_x.npy`` float32 ``[C, D, H, W]`` images,
        ``<case>_y.npy`` uint8 ``[1, D, H, W]`` labels, as ``preprocess.py`` writes them): the
        validation cases of fold 2 (the seed's checkpoint), centre-cropped or zero-padded to
        ``patch_size`` as DLE's Triton data loader does. ``limit``: at most this many cases.
        Labels are int64 ``[batch, D, H, W]``."""
        cases = validation_cases(Path(path))
        if limit is not None:
            cases = cases[:limit]
        for start in range(0, len(cases), batch_size):
            chunk = cases[start : start + batch_size]
            images = np.stack([self._read_image(x) for x, _ in chunk])
            labels = np.stack([self._read_label(y) for _, y in chunk])
            yield {INPUT_NAME: images}, labels

    def _read_image(self, file: Path) -> np.ndarray:
        image = np.load(file, mmap_mode="r")
        if image.ndim != 4 or image.shape[0] != self.cfg.in_channels:
            raise DataError(
                f"{file}: expected an image [{self.cfg.in_channels}, D, H, W], got "
                f"{list(image.shape)}"
            )
        return _crop_or_pad(image, self.cfg.patch_size).astype(np.float32)

    def _read_label(self, file: Path) -> np.ndarray:
        label = np.load(file, mmap_mode="r")
        if label.ndim != 4 or label.shape[0] != 1:
            raise DataError(f"{file}: expected a label map [1, D, H, W], got {list(label.shape)}")
        return _crop_or_pad(label, self.cfg.patch_size)[0].astype(np.int64)

    def task_metric(
        self, outputs: list[dict[str, np.ndarray]], labels: list[Any]
    ) -> dict[str, float]:
        """Dice per foreground class averaged over cases, and their mean (DLE's
        ``triton/metrics.py``); served scores are reduced to classes by arg-max first."""
        predictions = [_as_labels(o[OUTPUT_NAME]) for o in outputs]
        scores = dice_scores(
            np.concatenate(predictions), np.concatenate(labels), self.cfg.classes
        ).mean(axis=0)
        per_class = {f"dice_{c}": float(s) for c, s in zip(self.cfg.classes, scores, strict=True)}
        return {self.metric_name: float(scores.mean()), **per_class}


def dice_scores(predicted: np.ndarray, truth: np.ndarray, classes: Sequence[int]) -> np.ndarray:
    """Dice ``2·TP / (2·TP + FP + FN)`` per case and class, shape ``[cases, classes]``, for
    label maps ``[cases, ...]``. A class absent from a case's truth scores 1 if the prediction
    has none of it either, else 0 (DLE's rule; its code tests presence of class ``c`` but scores
    class ``c + 1``, an off-by-one not reproduced here)."""
    if predicted.shape != truth.shape:
        raise ValueError(f"prediction shape {predicted.shape} != label shape {truth.shape}")
    cases = predicted.shape[0]
    pred = predicted.reshape(cases, -1)
    true = truth.reshape(cases, -1)
    scores = np.empty((cases, len(classes)), dtype=np.float64)
    for j, c in enumerate(classes):
        p, t = pred == c, true == c
        overlap = 2.0 * np.logical_and(p, t).sum(axis=1)
        total = p.sum(axis=1) + t.sum(axis=1)
        with np.errstate(invalid="ignore", divide="ignore"):
            dice = overlap / total
        # total == 0 only when the class is absent from both: a perfect (empty) answer.
        scores[:, j] = np.where(total == 0, 1.0, dice)
    return scores


def validation_cases(
    folder: Path, fold: int = 2, n_splits: int = 5, seed: int = 12345
) -> list[tuple[Path, Path]]:
    """``(image, label)`` files of DLE's validation fold: cases sorted by name and split as
    ``KFold(n_splits, shuffle=True, random_state=seed)`` (its ``triton/dataloader.py``). With
    fewer cases than folds (a tiny sample), every case."""
    images = sorted(folder.glob("*_x.npy"))
    if not images:
        raise InputNotFound(
            f"no pre-processed nnU-Net cases (*_x.npy) in {str(folder)!r}; expected DLE's "
            "preprocess.py output (e.g. <data>/01_3d)"
        )
    pairs = []
    for image in images:
        label = image.with_name(image.name[: -len("_x.npy")] + "_y.npy")
        if not label.is_file():
            raise InputNotFound(f"{image} has no label file {label.name}")
        pairs.append((image, label))
    if len(pairs) < n_splits:
        return pairs
    return [pairs[i] for i in kfold_validation_indices(len(pairs), fold, n_splits, seed)]


def kfold_validation_indices(n: int, fold: int, n_splits: int, seed: int) -> list[int]:
    """scikit-learn's shuffled ``KFold`` test indices of one fold, in ascending order:
    a ``RandomState(seed)`` shuffle, then folds of ``n // n_splits`` (the first ``n % n_splits``
    one larger)."""
    order = np.arange(n)
    np.random.RandomState(seed).shuffle(order)
    sizes = np.full(n_splits, n // n_splits)
    sizes[: n % n_splits] += 1
    start = int(sizes[:fold].sum())
    return sorted(int(i) for i in order[start : start + sizes[fold]])


def _crop_or_pad(volume: np.ndarray, size: Sequence[int]) -> np.ndarray:
    """Centre crop (or zero pad) the spatial axes of ``[C, D, H, W]`` to ``size``, like DALI's
    ``fn.crop(..., out_of_bounds_policy="pad")`` at the default centre anchor."""
    slices: list[slice] = [slice(None)]
    pads = [(0, 0)]
    for have, want in zip(volume.shape[1:], size, strict=True):
        start = (have - want) // 2  # negative: pad
        lo, hi = max(start, 0), min(start + want, have)
        slices.append(slice(lo, hi))
        pads.append((lo - start, want - (hi - start)))
    cropped = np.asarray(volume[tuple(slices)])
    return np.pad(cropped, pads) if any(p != (0, 0) for p in pads) else cropped


def _ellipsoid_mask(size: Sequence[int]) -> np.ndarray:
    """1 inside an axis-aligned ellipsoid filling ~80 % of each axis, else 0 (float32)."""
    axes = np.ogrid[tuple(slice(0, n) for n in size)]
    radius = sum(((a - (n - 1) / 2) / (0.4 * n)) ** 2 for a, n in zip(axes, size, strict=True))
    return np.asarray(radius <= 1.0, dtype=np.float32)


def _as_labels(output: np.ndarray) -> np.ndarray:
    """Served labels as they are; served scores ``[batch, classes, ...]`` by arg-max."""
    return output if np.issubdtype(output.dtype, np.integer) else output.argmax(axis=1)
