"""ResNet-50 v1.5 (TensorFlow/Keras) as deployed by DeepLearningExamples' TF ConvNets.

A Keras re-implementation of the network DLE's ``Classification/ConvNets`` trains and deploys on
Triton (``model/resnet.py``): v1.5 bottlenecks (the stride of a down-sampling block sits on its
3×3 convolution, not on the first 1×1 as in the original v1 and in ``keras.applications``),
bias-free convolutions each followed by batch norm (ε 1e-5, momentum 0.9), "SAME" padding
everywhere, a projection shortcut wherever the width changes, global mean pooling and a 1001-way
dense layer. Initialisation is DLE's (variance scaling ×2, fan-out, truncated normal), with
batch-norm statistics measured on example inputs (see ``ResNet50Family.init_state``).

The Triton interface is DLE's SavedModel signature: one input ``input`` of raw RGB pixels
(float32, NHWC ``[224, 224, 3]``, 0…255; the per-channel mean/std normalisation is part of the
graph, as in DLE) and two outputs, ``classes`` (int32 arg-max) and ``probabilities`` (float32
soft-max over 1001 classes). ``classes`` is ``[1]`` per image, not DLE's scalar: Triton
describes a per-image scalar as ``dims: [1]`` plus a reshape, which the configs here do not
write, so the network itself gives it that dimension.

Class ids are DLE's: its TFRecord reader subtracts one from the 1-based ImageNet label, so class
``k`` is the ``k``-th synset in sorted WNID order (0…999) and the 1001st output is never a target.

Checkpoints are DLE's own: the TF1 estimator checkpoint ``main.py --model_dir`` writes (and
``triton/convert_model.py --model-dir`` reads), with every variable under DLE's name (see
``dle_variable``), NHWC- or NCHW-trained alike (TF keeps kernels HWIO in both), fp32 or AMP.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import DataError, InputNotFound
from ..tensors import TensorSpec
from .base import Batch, KerasFamily, Quantities, check_hparams, check_weights

# DLE's utils/data_utils.py: per-channel RGB mean and std of ImageNet, in pixel units.
CHANNEL_MEANS = (123.68, 116.28, 103.53)
CHANNEL_STDS = (58.395, 57.120, 57.385)
# DLE's eval pre-processing: shorter side to 256, central 224 crop (scaled with image_size).
RESIZE_MIN_AT_224 = 256
# DLE's stem convolution is 64 wide whatever the stage widths (model/resnet.py: n_channels=64).
STEM_WIDTH = 64
BN_EPSILON = 1e-5
BN_MOMENTUM = 0.9
# Images whose activations set the batch-norm statistics of a seeded initialisation.
CALIBRATION_BATCH = 8
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")
LABEL_FILES = ("val.txt", "labels.txt")

# DLE's TF1 variable names: model/resnet.py builds under the scope "resnet50"; each
# conv2d_block is a scope holding tf.layers' "conv2d" and tf.contrib.layers.batch_norm's
# "BatchNorm"; the classifier is tf.layers' "dense" in the scope "output".
DLE_SCOPE = "resnet50"
_DLE_BLOCK_LAYER = re.compile(r"stage(\d+)_block(\d+)_(1|2|3|shortcut)")
# Training state a DLE checkpoint holds beside the network: the estimator's step and the
# dynamic loss scale of automatic mixed precision (TF's DynamicLossScale) by their last name
# part, and the Momentum optimiser's slot of each trainable variable (``<variable>/Momentum``).
DLE_TRAINING_STATE = ("global_step", "current_loss_scale", "good_steps")
DLE_OPTIMIZER_SLOT = "Momentum"


@dataclass(frozen=True)
class ResNet50Config:
    """Hyper-parameters; the defaults are DLE's ``resnet50`` (``rn50_model.py``, ``resnet.py``)."""

    image_size: int = 224
    num_classes: int = 1001
    # Bottleneck blocks per stage and the bottleneck width of the first stage (doubled per stage).
    blocks: tuple[int, ...] = (3, 4, 6, 3)
    width: int = 64
    expansion: int = 4

    @classmethod
    def from_mapping(cls, values: dict[str, Any]) -> ResNet50Config:
        check_hparams(cls, values, "ResNet-50")
        plain = {k: tuple(v) if isinstance(v, list) else v for k, v in values.items()}
        return cls(**plain)  # type: ignore[arg-type]


def _conv_init() -> Any:
    import keras

    # DLE: variance_scaling_initializer(scale=2.0, distribution="truncated_normal", mode=fan_out)
    return keras.initializers.VarianceScaling(
        scale=2.0, mode="fan_out", distribution="truncated_normal"
    )


def _conv_bn(x: Any, filters: int, kernel: int, stride: int, name: str, relu: bool) -> Any:
    """Convolution (no bias: batch norm follows), batch norm, optional ReLU; DLE's conv2d_block."""
    from keras import layers

    x = layers.Conv2D(
        filters,
        kernel,
        strides=stride,
        padding="same",
        use_bias=False,
        kernel_initializer=_conv_init(),
        name=f"{name}_conv",
    )(x)
    x = layers.BatchNormalization(epsilon=BN_EPSILON, momentum=BN_MOMENTUM, name=f"{name}_bn")(x)
    return layers.ReLU(name=f"{name}_relu")(x) if relu else x


def _bottleneck(x: Any, width: int, expansion: int, stride: int, name: str) -> Any:
    """v1.5 bottleneck: 1×1 → 3×3 (carries the stride) → 1×1, plus the shortcut."""
    from keras import layers

    depth = width * expansion
    if x.shape[-1] != depth:
        shortcut = _conv_bn(x, depth, 1, stride, f"{name}_shortcut", relu=False)
    elif stride != 1:
        # DLE sub-samples an identity shortcut with a 1×1 average pool (unused by ResNet-50).
        shortcut = layers.AveragePooling2D(1, strides=stride, name=f"{name}_shortcut_pool")(x)
    else:
        shortcut = x
    y = _conv_bn(x, width, 1, 1, f"{name}_1", relu=True)
    y = _conv_bn(y, width, 3, stride, f"{name}_2", relu=True)
    y = _conv_bn(y, depth, 1, 1, f"{name}_3", relu=False)
    y = layers.Add(name=f"{name}_add")([shortcut, y])
    return layers.ReLU(name=f"{name}_out")(y)


def build_resnet50(cfg: ResNet50Config) -> Any:
    """The serving network: raw pixels in, ``[classes, probabilities]`` out.

    Every layer is named explicitly, so two builds give identical variable paths (the keys of
    the workflow's checkpoint).
    """
    import keras
    import tensorflow as tf
    from keras import layers

    pixels = keras.Input((cfg.image_size, cfg.image_size, 3), dtype="float32", name="input")
    mean = np.array(CHANNEL_MEANS, dtype=np.float32)
    std = np.array(CHANNEL_STDS, dtype=np.float32)
    x = layers.Rescaling(1.0 / std, offset=-mean / std, name="normalize")(pixels)
    x = _conv_bn(x, STEM_WIDTH, 7, 2, "stem", relu=True)
    x = layers.MaxPooling2D(3, strides=2, padding="same", name="stem_pool")(x)
    for stage, count in enumerate(cfg.blocks):
        for block in range(count):
            stride = 2 if block == 0 and stage > 0 else 1
            x = _bottleneck(
                x, cfg.width * 2**stage, cfg.expansion, stride, f"stage{stage}_block{block}"
            )
    x = layers.GlobalAveragePooling2D(name="spatial_mean")(x)
    logits = layers.Dense(
        cfg.num_classes,
        kernel_initializer=_conv_init(),
        bias_initializer="zeros",
        name="logits",
    )(x)
    probabilities = layers.Softmax(name="probabilities")(logits)
    # tf.argmax, not keras.ops.argmax: Keras' version goes through a Bitcast (for -0.0) that
    # tf2onnx passes on and no ONNX opset defines.
    classes = layers.Lambda(
        lambda t: tf.expand_dims(tf.argmax(t, axis=-1, output_type=tf.int32), -1),
        output_shape=(1,),
        name="classes",
    )(logits)
    return keras.Model(pixels, [classes, probabilities], name="resnet50_v1_5")


def dle_variable(path: str) -> str:
    """The name DLE's TF1 code gives the variable this module keeps at Keras path ``path``.

    ``stem_conv/kernel`` → ``resnet50/conv2d/conv2d/kernel``; ``stage{s}_block{b}_{i}_bn/gamma``
    → ``resnet50/btlnck_block_{s}_{b}/bottleneck_{i}/BatchNorm/gamma`` (``_shortcut_`` →
    ``…/shortcut/conv2d/…``); ``logits/kernel`` → ``resnet50/output/dense/kernel``.
    """
    layer, _, variable = path.rpartition("/")
    if layer == "logits":
        return f"{DLE_SCOPE}/output/dense/{variable}"
    unit, _, kind = layer.rpartition("_")
    block = _DLE_BLOCK_LAYER.fullmatch(unit)
    if unit == "stem":
        scope = "conv2d"
    elif block is not None:
        stage, index, part = block.groups()
        inner = "shortcut/conv2d" if part == "shortcut" else f"bottleneck_{part}"
        scope = f"btlnck_block_{stage}_{index}/{inner}"
    else:
        raise ValueError(f"Keras weight {path!r} has no counterpart in DLE's ResNet-50")
    if kind == "conv" and variable == "kernel":
        return f"{DLE_SCOPE}/{scope}/conv2d/kernel"
    if kind == "bn":
        return f"{DLE_SCOPE}/{scope}/BatchNorm/{variable}"
    raise ValueError(f"Keras weight {path!r} has no counterpart in DLE's ResNet-50")


def is_dle_training_state(name: str) -> bool:
    """Whether DLE checkpoint variable ``name`` is training state, not part of the network."""
    owner, _, leaf = name.rpartition("/")
    return leaf in DLE_TRAINING_STATE or (bool(owner) and leaf == DLE_OPTIMIZER_SLOT)


class ResNet50Family(KerasFamily):
    """The workflow's view of DLE's TF ResNet-50 v1.5: signature, build, data set, top-1."""

    name = "ResNet-50"
    metric_name = "top1"
    higher_is_better = True

    def __init__(self, hparams: dict[str, Any]) -> None:
        self.cfg = ResNet50Config.from_mapping(hparams)
        size = self.cfg.image_size
        self.inputs = [TensorSpec("input", "float32", (size, size, 3))]
        # Alphabetical order: tf2onnx writes a SavedModel's outputs sorted by name.
        self.outputs = [
            TensorSpec("classes", "int32", (1,)),
            TensorSpec("probabilities", "float32", (self.cfg.num_classes,)),
        ]

    def build(self) -> Any:
        return build_resnet50(self.cfg)

    def init_state(self, seed: int) -> dict[str, Any]:
        """DLE's seeded initialisation, with batch-norm statistics measured on example inputs.

        With DLE's initial statistics (mean 0, variance 1) the untrained network's activations
        grow block after block and the soft-max saturates: every image gets the same class at
        probability 1.0, and an export check comparing outputs would pass for almost any
        artifact. Statistics measured on inputs, as a trained network's are, keep the outputs
        informative (at full size: top probability ~0.05, classes differ between images).
        """
        import keras

        keras.utils.set_random_seed(seed)
        model = self.build()
        calibrate_batch_norm(model, self.example_inputs(CALIBRATION_BATCH, seed)["input"])
        return {"model": {w.path: np.asarray(w.numpy()) for w in model.weights}}

    def read_checkpoint(self, path: str | Path, *, ema: bool = False) -> dict[str, Any]:
        """DLE's TF1 checkpoint (a ``--model_dir`` directory, a ``model.ckpt-N`` prefix or its
        ``.index``) as Keras weights: training state dropped (``is_dle_training_state``), every
        other variable renamed by ``dle_variable``. A checkpoint of another architecture fails
        naming its missing, unexpected and mis-shaped variables in DLE's names."""
        variables = super().read_checkpoint(path, ema=ema)["model"]
        weights = {dle_variable(w.path): w for w in self.build().weights}
        network = {n: v for n, v in variables.items() if not is_dle_training_state(n)}
        check_weights(self, weights, network)
        return {
            "model": {
                weights[n].path: np.asarray(v, dtype=weights[n].dtype) for n, v in network.items()
            }
        }

    def example_inputs(self, batch: int, seed: int) -> dict[str, np.ndarray]:
        """Random pixels in 0…255, the range DLE's data loader feeds."""
        rng = np.random.default_rng(seed)
        shape = (batch, *self.inputs[0].shape)
        return {"input": rng.uniform(0.0, 255.0, size=shape).astype(np.float32)}

    def accuracy_quantities(
        self, reference: dict[str, np.ndarray], actual: dict[str, np.ndarray]
    ) -> Quantities:
        """The share of images whose class (``classes``, the arg-max) differs."""
        ref, act = reference.get("classes"), actual.get("classes")
        if ref is None or act is None or ref.shape != act.shape:
            return {}
        return {"classes": {"class_flip_fraction": float(np.mean(ref != act)) if ref.size else 0.0}}

    def dataset_batches(
        self, path: str | Path, batch_size: int, limit: int | None
    ) -> Iterator[Batch]:
        """ImageNet validation images as pixels and 0-based class ids (see ``read_imagenet``),
        at most ``limit`` images (DLE's accuracy check used 256)."""
        images: list[np.ndarray] = []
        labels: list[int] = []
        for count, (pixels, label) in enumerate(read_imagenet(path, self.cfg.image_size)):
            if limit is not None and count >= limit:
                break
            images.append(pixels)
            labels.append(label)
            if len(images) == batch_size:
                yield _batch(images, labels)
                images, labels = [], []
        if images:
            yield _batch(images, labels)

    def task_metric(
        self, outputs: list[dict[str, np.ndarray]], labels: list[Any]
    ) -> dict[str, float]:
        return top_k_accuracy(outputs, labels)


def calibrate_batch_norm(model: Any, pixels: np.ndarray) -> None:
    """Set every batch norm's moving statistics to those of its input on ``pixels``.

    One forward pass in training mode with momentum 0: each layer normalises by the batch's
    statistics and stores them as its moving ones, so inference reproduces that pass.
    """
    from keras import layers

    norms = [layer for layer in model.layers if isinstance(layer, layers.BatchNormalization)]
    for layer in norms:
        layer.momentum = 0.0
    model(pixels, training=True)
    for layer in norms:
        layer.momentum = BN_MOMENTUM


def _batch(images: list[np.ndarray], labels: list[int]) -> Batch:
    return {"input": np.stack(images)}, np.asarray(labels, dtype=np.int64)


def top_k_accuracy(outputs: list[dict[str, np.ndarray]], labels: list[Any]) -> dict[str, float]:
    """Top-1 from ``classes`` (DLE's ``triton/metrics.py``: ``classes == label``), and top-5
    from ``probabilities`` when the outputs hold them. Labels are DLE's 0-based class ids."""
    truth = np.concatenate([np.asarray(y).reshape(-1) for y in labels])
    predicted = np.concatenate([np.asarray(o["classes"]).reshape(-1) for o in outputs])
    if predicted.shape != truth.shape:
        raise ValueError(f"{predicted.size} predictions for {truth.size} labels")
    if truth.size == 0:
        raise ValueError("no labelled images to score")
    metrics = {"top1": float(np.mean(predicted == truth))}
    if all("probabilities" in o for o in outputs):
        probabilities = np.concatenate([o["probabilities"] for o in outputs])
        top5 = np.argsort(-probabilities, axis=1, kind="stable")[:, :5]
        metrics["top5"] = float(np.mean((top5 == truth[:, None]).any(axis=1)))
    return metrics


def read_imagenet(path: str | Path, image_size: int) -> Iterator[tuple[np.ndarray, int]]:
    """``(pixels, class id)`` for each validation image under ``path``, in a stable order.

    Three layouts, checked in this order:

    - a label file ``val.txt`` or ``labels.txt`` with lines ``<image file> <class id>`` (paths
      relative to ``path``);
    - TFRecord files ``validation-*`` (DLE's ImageNet TFRecords, 1-based labels: one is
      subtracted, as DLE's reader does);
    - one folder per class id holding its images (what DLE's ``triton/process_dataset.py``
      writes, and its Triton data loader reads).

    Class ids are 0-based, sorted-WNID order. Images are RGB; one that is not already
    ``image_size`` square gets DLE's eval pre-processing (aspect-preserving bilinear resize of
    the shorter side to 256·size/224, central crop).
    """
    root = Path(path)
    if not root.is_dir():
        raise InputNotFound(f"ImageNet validation folder {str(root)!r} not found")
    label_file = next((root / n for n in LABEL_FILES if (root / n).is_file()), None)
    records = sorted(root.glob("validation-*"))
    if label_file is not None:
        items: Iterator[tuple[bytes, int]] = _listed_images(root, label_file)
    elif records:
        items = _tfrecord_images(records)
    else:
        items = _class_folder_images(root)
    found = False
    for encoded, label in items:
        found = True
        yield _preprocess(encoded, image_size), label
    if not found:
        raise DataError(
            f"no images under {root}: expected {' or '.join(LABEL_FILES)}, validation-* "
            "TFRecords, or one folder per class id"
        )


def _listed_images(root: Path, label_file: Path) -> Iterator[tuple[bytes, int]]:
    for number, line in enumerate(label_file.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        parts = line.rsplit(maxsplit=1)
        if len(parts) != 2 or not parts[1].lstrip("-").isdigit():
            raise DataError(f"{label_file}:{number}: expected '<image file> <class id>'")
        yield (root / parts[0]).read_bytes(), int(parts[1])


def _class_folder_images(root: Path) -> Iterator[tuple[bytes, int]]:
    folders = sorted((d for d in root.iterdir() if d.is_dir() and d.name.isdigit()), key=_id)
    for folder in folders:
        for image in sorted(folder.rglob("*")):
            if image.suffix.lower() in IMAGE_SUFFIXES:
                yield image.read_bytes(), int(folder.name)


def _id(folder: Path) -> int:
    return int(folder.name)


def _tfrecord_images(records: list[Path]) -> Iterator[tuple[bytes, int]]:
    import tensorflow as tf

    features = {
        "image/encoded": tf.io.FixedLenFeature([], tf.string),
        "image/class/label": tf.io.FixedLenFeature([], tf.int64),
    }
    for record in tf.data.TFRecordDataset([str(r) for r in records]):
        example = tf.io.parse_single_example(record, features)
        yield example["image/encoded"].numpy(), int(example["image/class/label"]) - 1


def _preprocess(encoded: bytes, image_size: int) -> np.ndarray:
    import tensorflow as tf

    image = tf.io.decode_image(encoded, channels=3, expand_animations=False)
    height, width = int(image.shape[0]), int(image.shape[1])
    if (height, width) != (image_size, image_size):
        resize_min = RESIZE_MIN_AT_224 * image_size / 224
        scale = resize_min / min(height, width)
        new_height, new_width = int(height * scale), int(width * scale)
        image = tf.image.resize(image, [new_height, new_width], method="bilinear")
        top, left = (new_height - image_size) // 2, (new_width - image_size) // 2
        image = image[top : top + image_size, left : left + image_size]
    return np.asarray(image, dtype=np.float32)
