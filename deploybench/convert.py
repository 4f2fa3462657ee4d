"""Conversions from an export to the served artifact.

Over 600 lines on purpose: the three GPU conversion paths share their checks and NeedsGPU stop.

``tensorrt`` (ONNX -> TensorRT plan with ``trtexec``), ``torchscript-fp16`` (TorchScript on CUDA
in half precision) and ``tf-trt`` (SavedModel -> TF-TRT SavedModel) need a GPU: TensorRT engines
are built for the GPU they run on, so converted artifacts are keyed on ``{gpu}``. On a machine
without one they stop with :class:`NeedsGPU` before doing anything, naming what they would have
run. ``onnx-fp16`` (float16 weights and compute, float32 inputs and outputs) needs no GPU.

Every setting is data (``models.<m>.convert.<converter>`` in the config, resolved and checked by
:func:`deploybench.planning.conversion_plan.conversion_settings` while the DAG is built) and reaches
:func:`convert` as it is; the command lines and converter parameters are built by pure functions
so they can be checked without a GPU.
"""

from __future__ import annotations

import logging
import os
import shutil
import struct
import subprocess
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from .errors import ConfigError, ConversionError, NeedsGPU
from .io import MIB, atomic_path
from .provenance import package_versions
from .tensors import ONNX_TO_NUMPY, TensorSpec
from .trt_version import major_minor, parse_banner, tf_trt_loaded_version

log = logging.getLogger(__name__)

CONVERTERS = ("tensorrt", "onnx-fp16", "torchscript-fp16", "tf-trt")
# TensorRT builds engines for the GPU it runs on; fp16 TorchScript is made on the run's device
# (a CPU run's half-precision module runs on the CPU: only a GPU run's needs CUDA).
NEEDS_GPU = frozenset({"tensorrt", "tf-trt"})

# A TensorRT optimisation profile: per input, the full (batch-first) min/opt/max shapes.
Profile = dict[str, dict[str, tuple[int, ...]]]
PROFILE_KEYS = ("min", "opt", "max")


def gpu_visible() -> bool:
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return False
    return shutil.which("nvidia-smi") is not None and Path("/dev/nvidiactl").exists()


# ---------------------------------------------------------------------------- TensorRT profile


def tensorrt_profile(inputs: list[TensorSpec], settings: Mapping[str, Any]) -> Profile:
    """min/opt/max shapes of every input: the batch from the settings, the other dimensions from
    the signature, with any dynamic one (-1) taken from ``settings['shapes'][name]``."""
    shapes = settings.get("shapes") or {}
    names = [s.name for s in inputs]
    unknown = sorted(set(shapes) - set(names))
    if unknown:
        raise ConfigError(
            f"convert.tensorrt.shapes names unknown input(s) {unknown}; valid choices: "
            f"{', '.join(names)}"
        )
    batches = {k: int(settings[f"{k}_batch"]) for k in PROFILE_KEYS}
    profile: Profile = {}
    for spec in inputs:
        given = shapes.get(spec.name)
        dims = {}
        for key in PROFILE_KEYS:
            shape = tuple(int(d) for d in given[key]) if given else spec.shape
            if len(shape) != len(spec.shape) or any(
                fixed != -1 and fixed != d for fixed, d in zip(spec.shape, shape, strict=True)
            ):
                raise ConfigError(
                    f"convert.tensorrt.shapes.{spec.name}.{key} {list(shape)} does not fit the "
                    f"input's shape {list(spec.shape)} (batch excluded; -1 is dynamic)"
                )
            if any(d < 1 for d in shape):
                raise ConfigError(
                    f"input {spec.name!r} has dynamic dimensions {list(spec.shape)}: set "
                    f"convert.tensorrt.shapes.{spec.name}.{{min,opt,max}} (batch excluded)"
                )
            dims[key] = (batches[key], *shape)
        if not all(a <= b for a, b in zip(dims["min"], dims["opt"], strict=True)) or not all(
            a <= b for a, b in zip(dims["opt"], dims["max"], strict=True)
        ):
            raise ConfigError(f"convert.tensorrt.shapes.{spec.name}: need min <= opt <= max")
        profile[spec.name] = dims
    return profile


# ---------------------------------------------------------------------------- TensorRT


def shape_arg(profile: Profile, key: str) -> str:
    return ",".join(f"{name}:{'x'.join(str(d) for d in s[key])}" for name, s in profile.items())


def tensorrt_command(
    *,
    onnx: Path,
    plan: Path,
    precision: str,
    profile: Profile,
    workspace_mb: int,
    trt_version: tuple[int, int] | None = None,
) -> list[str]:
    """``trtexec`` building an engine with one optimisation profile.

    ``trt_version`` picks the flags of older TensorRT (the seed pages' containers ship 7.2 to
    8.5): ``--memPoolSize`` and ``--skipInference`` replaced ``--workspace`` and ``--buildOnly``
    in 8.4; TensorRT 7 needs ``--explicitBatch`` for ONNX. None: a current TensorRT.
    """
    if precision not in ("fp32", "fp16"):
        raise ConfigError(f"TensorRT precision {precision!r}; valid choices: fp16, fp32")
    modern = trt_version is None or trt_version >= (8, 4)
    cmd = [
        "trtexec",
        f"--onnx={onnx}",
        f"--saveEngine={plan}",
        f"--minShapes={shape_arg(profile, 'min')}",
        f"--optShapes={shape_arg(profile, 'opt')}",
        f"--maxShapes={shape_arg(profile, 'max')}",
    ]
    if modern:
        cmd += [f"--memPoolSize=workspace:{workspace_mb}M", "--skipInference"]
    else:
        cmd += [f"--workspace={workspace_mb}", "--buildOnly"]
        if trt_version is not None and trt_version < (8, 0):
            cmd.append("--explicitBatch")
    if precision == "fp16":
        cmd.append("--fp16")
    return cmd


def trtexec_release() -> str | None:
    """The full TensorRT version of the ``trtexec`` on PATH (its ``--help`` banner)."""
    out = subprocess.run(["trtexec", "--help"], capture_output=True, text=True, check=False)
    return parse_banner(out.stdout + out.stderr)


def trtexec_version() -> tuple[int, int] | None:
    release = trtexec_release()
    return None if release is None else major_minor(release)


# ---------------------------------------------------------------------------- ONNX


def onnx_inputs(path: Path) -> list[tuple[str, str, tuple[int, ...]]]:
    """The graph inputs an ONNX file really takes (name, dtype, shape without the batch; -1 for a
    dynamic dimension). Exporters drop inputs the graph does not use (TFT keeps 3 of 8)."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    weights = {i.name for i in model.graph.initializer}
    found = []
    for value in model.graph.input:
        if value.name in weights:
            continue
        tensor = value.type.tensor_type
        dims = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in tensor.shape.dim)
        found.append(
            (value.name, ONNX_TO_NUMPY.get(tensor.elem_type, str(tensor.elem_type)), dims[1:])
        )
    return found


def artifact_inputs(family_inputs: list[TensorSpec], onnx: Path) -> list[TensorSpec]:
    """The family's input specs the ONNX graph takes, in the family's order; a graph input the
    family does not declare, or one of another type or rank, is an error."""
    declared = {s.name: s for s in family_inputs}
    graph = onnx_inputs(onnx)
    for name, dtype, shape in graph:
        spec = declared.get(name)
        if spec is None:
            raise ValueError(
                f"{onnx} takes input {name!r}, which the model does not declare "
                f"({', '.join(declared)})"
            )
        if dtype != spec.dtype or len(shape) != len(spec.shape):
            raise ValueError(
                f"{onnx}: input {name!r} is {dtype}{list(shape)}, the model declares "
                f"{spec.dtype}{list(spec.shape)}"
            )
    taken = {name for name, _, _ in graph}
    return [s for s in family_inputs if s.name in taken]


# float16's largest finite value; onnxconverter-common clips weights beyond its own
# max_finite_val (1e4 by default: float16.convert_np_to_float16) to that value, with a bare
# warning that names no tensor.
FLOAT16_MAX = 65504.0
# The tensor types an fp16 TorchScript artifact serves in place of the model's (its float
# inputs and outputs are float16; see torchscript_fp16).
FP16_IO = {"float32": "float16"}


def fp16_feeds(feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``feeds`` as a halved module's artifact takes them (:data:`FP16_IO`: floats as float16)."""
    return {k: v.astype(FP16_IO.get(str(v.dtype), v.dtype)) for k, v in feeds.items()}


# Converters that make their artifact from the checkpoint's framework module, not the export.
FROM_CHECKPOINT = frozenset({"torchscript-fp16"})
# The tensor types each converter's artifact serves in place of the model's.
SERVED_TYPES: dict[str, dict[str, str]] = {"torchscript-fp16": FP16_IO}
ONNX_FP16_CLIP = 1e4


def out_of_range(named: Mapping[str, np.ndarray], limit: float) -> dict[str, tuple[int, float]]:
    """The tensors holding finite values beyond ``±limit``, each with how many and the largest
    magnitude: what a cast to float16 makes infinite (limit 65504) or the converter clips."""
    found = {}
    for name, array in named.items():
        values = np.asarray(array)
        if not np.issubdtype(values.dtype, np.floating):
            continue
        beyond = np.isfinite(values) & (np.abs(values) > limit)
        if beyond.any():
            found[name] = (int(beyond.sum()), float(np.abs(values[beyond]).max()))
    return found


def describe_out_of_range(found: Mapping[str, tuple[int, float]]) -> list[str]:
    return [f"{name} ({count} values, max |x| {peak:.4g})" for name, (count, peak) in found.items()]


def onnx_fp16(source: Path, out: Path, *, op_block_list: list[str] | None = None) -> list[str]:
    """float16 weights and compute with float32 graph inputs and outputs, so the served
    signature, the clients and the accuracy reference stay those of the fp32 export. Returns the
    weights the converter clipped to ±1e4 (named in the log and the conversion's record)."""
    import onnx
    from onnx import numpy_helper
    from onnxconverter_common import float16

    model = onnx.load(str(source))
    weights = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    clipped = out_of_range(weights, ONNX_FP16_CLIP)
    for name, (count, peak) in clipped.items():
        beyond = ", beyond float16's range" if peak > FLOAT16_MAX else ""
        log.warning(
            "onnx-fp16 clips %d values of weight %s to ±%g (max |x| %.4g%s)",
            count, name, ONNX_FP16_CLIP, peak, beyond,
        )  # fmt: skip
    kwargs: dict[str, Any] = {"keep_io_types": True}
    if op_block_list:
        # The converter's own block list (ops with no fp16 kernels) plus the configured ones.
        kwargs["op_block_list"] = sorted(set(float16.DEFAULT_OP_BLOCK_LIST) | set(op_block_list))
    converted = float16.convert_float_to_float16(model, **kwargs)
    with atomic_path(out) as tmp:
        onnx.save(converted, str(tmp))
    return describe_out_of_range(clipped)


# ---------------------------------------------------------------------------- TorchScript


def torchscript_fp16(
    module: Any,
    out: Path,
    example_inputs: dict[str, np.ndarray],
    *,
    script: bool,
    device: str = "cuda",
) -> None:
    """TorchScript in half precision as DLE made it: the framework module moved to ``device``
    and halved (``model.half()``), then traced with the example inputs (their float tensors in
    float16) or scripted. Every float tensor of the served signature is float16, as DLE's
    triton/model.py exports sent and returned (BERT, FastPitch, nnU-Net: ``--precision fp16``
    calls ``model.half()`` before ``torch.jit.trace``/``script``; nnU-Net's dataloader sends
    float16 images); integer tensors keep their type.

    Made from the module, not from the fp32 TorchScript file: halving a traced graph keeps the
    float32 constants the trace baked in, and its float/half operands then fail to run.
    ``module`` itself is moved and halved (a copy would double BERT-large's memory)."""
    import torch

    overflow = describe_out_of_range(
        out_of_range(
            {
                name: tensor.detach().cpu().numpy()
                for name, tensor in [*module.named_parameters(), *module.named_buffers()]
            },
            FLOAT16_MAX,
        )
    )
    if overflow:
        raise ConversionError(
            f"{len(overflow)} weight tensor(s) hold values beyond float16's ±65504, which fp16 "
            f"makes infinite: {', '.join(overflow)}"
        )
    half = module.to(device).half().eval()
    feeds = tuple(torch.from_numpy(a).to(device) for a in fp16_feeds(example_inputs).values())
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        made = torch.jit.script(half) if script else torch.jit.trace(half, feeds, check_trace=False)
        made(*feeds)  # runs in half precision on the device, or fails here
    with atomic_path(out) as tmp:
        torch.jit.save(made, str(tmp))


# ---------------------------------------------------------------------------- TF-TRT


def tf_trt_parameters(precision: str, settings: Mapping[str, Any]) -> dict[str, Any]:
    """Keyword arguments of ``tf.experimental.tensorrt.Converter`` (TrtGraphConverterV2).

    Explicit batch with one dynamic-shape profile (``use_dynamic_shape``, strategy ``Range``):
    TensorRT 10 (the 25.xx images) has no implicit batch ("Implicit batch support is removed in
    TensorRT 10.0", TensorRT C++ API, Deprecated List), and the converter does not choose for
    itself: ``use_dynamic_shape=None`` "is equivalent to False", which converts with
    ``use_implicit_batch=not self._use_dynamic_shape`` (tensorflow
    python/compiler/tensorrt/trt_convert.py, TrtGraphConverterV2.__init__ and _run_conversion;
    the same in TF 2.17 and 2.21). ``Range``: one profile from the smallest to the largest
    shape that build() is given."""
    if precision not in ("fp32", "fp16"):
        raise ConfigError(f"TF-TRT precision {precision!r}; valid choices: fp16, fp32")
    return {
        "precision_mode": precision.upper(),
        "max_workspace_size_bytes": int(settings["workspace_mb"]) * MIB,
        "minimum_segment_size": int(settings["minimum_segment_size"]),
        "maximum_cached_engines": int(settings["maximum_cached_engines"]),
        "use_dynamic_shape": True,
        "dynamic_shape_profile_strategy": "Range",
    }


def tf_trt(
    source: Path,
    out: Path,
    parameters: dict[str, Any],
    build_inputs: list[dict[str, np.ndarray]],
    max_tf_op_fraction: float | None = None,
) -> dict[str, Any]:
    """Convert the SavedModel with TF-TRT and build its engines; returns what it built
    (:func:`trt_engine_counts`).

    ``build_inputs``: feeds at the smallest and the largest batch Triton sends. In explicit-batch
    mode build() first runs them all to collect the shapes (the ``Range`` profile spans them),
    then builds each engine once for that profile (trt_convert.py, TrtGraphConverterV2.build);
    save() writes each TRTEngineOp's built engines to ``assets/trt-serialized-engine.<op>``
    (TrtGraphConverterV2.save). TF-TRT leaves in TensorFlow whatever it cannot convert, so a
    conversion that replaced nothing, or built no engine, would still be served and reported
    as tf-trt: that fails here (:class:`ConversionError`) and writes no artifact; so does one
    that left more than ``max_tf_op_fraction`` of the compute in TensorFlow
    (:func:`check_tf_op_fraction`; None: not checked)."""
    import tensorflow as tf

    converter = tf.experimental.tensorrt.Converter(input_saved_model_dir=str(source), **parameters)
    converter.convert()

    def batches() -> Any:
        for feeds in build_inputs:
            yield {name: tf.constant(value) for name, value in feeds.items()}

    converter.build(input_fn=batches)
    with atomic_path(out) as tmp:
        tmp.unlink()  # TF writes the SavedModel directory itself
        converter.save(str(tmp))
        counts = trt_engine_counts(tmp)
        check_trt_engines(counts, parameters, out)
        check_tf_op_fraction(counts, max_tf_op_fraction, out)
    log.info("TF-TRT %s: %s", out, counts)
    return counts


TRT_ENGINE_OP = "TRTEngineOp"
# save(): one file per TRTEngineOp (its name's last component), a TFRecord of its engines.
TRT_ENGINE_ASSET = "trt-serialized-engine."


def trt_engine_counts(saved_model: Path) -> dict[str, Any]:
    """TF-TRT's engines in a SavedModel: ``trt_engine_ops``, its TRTEngineOp nodes (in the
    meta graphs and their function libraries, where a saved signature's body lives; one op may
    appear in several functions: counted once, by name); ``ops_with_engine``, those with a
    built engine saved with them; ``engines``, how many (one per profile or shape cached).

    An op's engines are the records of its ``assets/trt-serialized-engine.<op>`` file: save()
    writes one record per built engine and none for one that failed to build (tensorflow
    compiler/tf2tensorrt/ops/trt_engine_resource_ops.cc, SerializeTRTResource). A static engine
    (TF1's is_dynamic_op=False) is the op's ``serialized_segment`` instead.

    The serving signature's compute ops: ``tf_ops`` (by type, ``tf_op_types``) TensorFlow runs
    itself (:func:`tf_ops_outside_engines`), ``trt_ops`` the engines took (the compute nodes of
    their ``segment_func``, the native copy of what each engine runs)."""
    from tensorflow.core.protobuf import saved_model_pb2

    saved = saved_model_pb2.SavedModel()
    saved.ParseFromString((Path(saved_model) / "saved_model.pb").read_bytes())
    static: dict[str, bool] = {}
    segments: set[str] = set()
    functions: dict[str, Any] = {}
    for meta in saved.meta_graphs:
        graph = meta.graph_def
        functions |= {f.signature.name: f for f in graph.library.function}
        nodes = [*graph.node, *(n for f in graph.library.function for n in f.node_def)]
        for node in nodes:
            if node.op != TRT_ENGINE_OP:
                continue
            name = node.name.split("/")[-1]
            built = node.attr["static_engine"].b and bool(node.attr["serialized_segment"].s)
            static[name] = static.get(name, False) or built
            segments.add(node.attr["segment_func"].func.name)
    assets = Path(saved_model) / "assets"
    engines = {
        name: int(is_static) + _tfrecord_count(assets / (TRT_ENGINE_ASSET + name))
        for name, is_static in static.items()
    }
    outside = tf_ops_outside_engines(saved)
    return {
        "trt_engine_ops": len(engines),
        "ops_with_engine": sum(1 for n in engines.values() if n > 0),
        "engines": sum(engines.values()),
        # what the serving signature still runs in TensorFlow (DLE's TF1 static engines took
        # the whole network; TF2's dynamic conversion may leave ops out)
        "tf_ops": sum(outside.values()),
        "tf_op_types": dict(sorted(outside.items())),
        "trt_ops": sum(
            1
            for segment in segments
            if segment in functions
            for node in functions[segment].node_def
            if node.op not in PLUMBING_OPS
        ),
    }


# Nodes that move or name tensors rather than compute: not counted as work left to TensorFlow.
PLUMBING_OPS = frozenset(
    {"Placeholder", "Const", "Identity", "IdentityN", "NoOp", "ReadVariableOp", "VarHandleOp",
     "StatefulPartitionedCall", "PartitionedCall", TRT_ENGINE_OP}
)  # fmt: skip


def tf_ops_outside_engines(saved: Any, signature: str = "serving_default") -> dict[str, int]:
    """Op type → how many of the serving signature's compute nodes TensorFlow runs itself: the
    nodes of the functions its outputs call, and of those they call (``f`` attributes), without
    plumbing (:data:`PLUMBING_OPS`) or the TRTEngineOps; their native segments (the fallback
    copies of what an engine runs, ``segment_func``) are not called and not counted."""
    meta = saved.meta_graphs[0]
    functions = {f.signature.name: f for f in meta.graph_def.library.function}
    signatures = meta.signature_def
    if not signatures:
        return {}
    outputs = (
        signatures[signature] if signature in signatures else next(iter(signatures.values()))
    ).outputs
    wanted = {t.name.split(":")[0] for t in outputs.values()}
    queue = [
        n.attr["f"].func.name for n in meta.graph_def.node if n.name in wanted and "f" in n.attr
    ]
    seen: set[str] = set()
    counts: dict[str, int] = {}
    while queue:
        name = queue.pop()
        if name in seen or name not in functions:
            continue
        seen.add(name)
        for node in functions[name].node_def:
            if "f" in node.attr:
                queue.append(node.attr["f"].func.name)
            if node.op not in PLUMBING_OPS:
                counts[node.op] = counts.get(node.op, 0) + 1
    return counts


def _tfrecord_count(path: Path) -> int:
    """Records in a TFRecord file (0 if there is none): each a little-endian uint64 length, its
    masked CRC (4 bytes), the data and the data's CRC (4 bytes)."""
    if not path.is_file():
        return 0
    data = path.read_bytes()
    count = offset = 0
    while offset + 12 <= len(data):
        (length,) = struct.unpack_from("<Q", data, offset)
        offset += 12 + length + 4
        if offset > len(data):
            raise ConversionError(f"{path}: truncated TFRecord (record {count + 1})")
        count += 1
    return count


def check_trt_engines(counts: Mapping[str, int], parameters: Mapping[str, Any], out: Path) -> None:
    """Fail a TF-TRT conversion that would serve plain TensorFlow as tf-trt."""
    if counts["trt_engine_ops"] == 0:
        raise ConversionError(
            f"{out}: TF-TRT replaced no subgraph with a {TRT_ENGINE_OP}: the model would run as "
            "plain TensorFlow. Likely causes: no segment of at least minimum_segment_size "
            f"({parameters.get('minimum_segment_size')}) ops that TensorRT converts at "
            f"{parameters.get('precision_mode')} (the convert log's TF-TRT lines name the ops it "
            "left out; lower models.<m>.convert.tf-trt.minimum_segment_size), or a TensorFlow "
            "built without TensorRT (tf.experimental.tensorrt needs the NGC TensorFlow image)"
        )
    if counts["ops_with_engine"] == 0:
        raise ConversionError(
            f"{out}: TF-TRT made {counts['trt_engine_ops']} {TRT_ENGINE_OP} node(s) but built no "
            "engine for any (each would fall back to TensorFlow or build at serving time): "
            "TensorRT failed to build them; see the convert log for TensorRT's errors (workspace "
            "too small: models.<m>.convert.tf-trt.workspace_mb; an unsupported layer or precision)"
        )


TF_OP_FRACTION_KEY = "models.<m>.convert.tf-trt.max_tf_op_fraction"


def check_tf_op_fraction(counts: Mapping[str, Any], limit: float | None, out: Path) -> None:
    """Fail a TF-TRT conversion that left more than ``limit`` of the serving signature's compute
    ops (``tf_ops`` + ``trt_ops``) in TensorFlow, naming the op types left; None: not checked."""
    left, inside = int(counts.get("tf_ops", 0)), int(counts.get("trt_ops", 0))
    total = left + inside
    if limit is None or total == 0 or left / total <= limit:
        return
    types = counts.get("tf_op_types") or {}
    named = ", ".join(f"{op} {n}" for op, n in sorted(types.items(), key=lambda kv: -kv[1]))
    raise ConversionError(
        f"{out}: TF-TRT left {left} of the serving signature's {total} compute ops in "
        f"TensorFlow ({left / total:.0%}; {inside} in its TRTEngineOps), more than "
        f"{TF_OP_FRACTION_KEY} {limit}: {named or 'no op types recorded'}. The convert log's "
        "TF-TRT lines say why each was left out (an op TensorRT does not convert at this "
        "precision; a segment under minimum_segment_size); to serve it anyway raise "
        f"{TF_OP_FRACTION_KEY}"
    )


# ---------------------------------------------------------------------------- dispatch


def _run_to(out: Path, write: Callable[[Path], Any]) -> None:
    with atomic_path(out) as tmp:
        write(tmp)


def tool_versions(converter: str) -> dict[str, str | None]:
    """Versions of what a converter runs with (for the provenance sidecar)."""
    names = {
        "tensorrt": ("tensorrt", "onnx"),
        "onnx-fp16": ("onnxconverter-common", "onnx"),
        "torchscript-fp16": ("torch",),
        "tf-trt": ("tensorflow", "tensorflow-cpu", "tensorrt"),
    }[converter]
    return package_versions(names)


def convert(
    converter: str,
    *,
    source: Path,
    out: Path,
    precision: str,
    settings: Mapping[str, Any],
    inputs: list[TensorSpec],
    example_inputs: Callable[[int], dict[str, np.ndarray]],
    export_format: str = "",
    framework_module: Callable[[], Any] | None = None,
    device: str = "cuda",
) -> dict[str, Any]:
    """Run the conversion; returns what it did (converter, parameters or command, versions).

    ``inputs`` is the model's signature, ``example_inputs(batch)`` deterministic feeds of it.
    ``source`` is the export, or for a converter in FROM_CHECKPOINT the checkpoint, whose
    serving module ``framework_module()`` returns (``export_format``: ts-trace or ts-script).
    ``device`` (``cuda`` or ``cpu``): where fp16 TorchScript is made and checked, the run's.
    GPU-only converters check for a GPU after working out what they would run.
    """
    if converter not in CONVERTERS:
        raise ConfigError(
            f"unknown converter {converter!r}; valid choices: {', '.join(CONVERTERS)}"
        )
    record: dict[str, Any] = {
        "converter": converter,
        "precision": precision,
        "settings": dict(settings),
    }
    job: Callable[[], None]
    if converter == "tensorrt":
        profile = tensorrt_profile(artifact_inputs(inputs, source), settings)
        release = trtexec_release() if shutil.which("trtexec") else None
        version = None if release is None else major_minor(release)

        def trtexec(plan: Path) -> list[str]:
            return tensorrt_command(
                onnx=source,
                plan=plan,
                precision=precision,
                profile=profile,
                workspace_mb=int(settings["workspace_mb"]),
                trt_version=version,
            )

        record["profile"] = {n: {k: list(v) for k, v in s.items()} for n, s in profile.items()}
        record["command"] = trtexec(out)
        record["trtexec"] = f"TensorRT {version[0]}.{version[1]}" if version else None
        # the full version that builds the plan: the repository step serves it only with that
        # TensorRT (deploybench.trt_version.check_engine); None: trtexec printed no banner
        record["tensorrt"] = release
        job = lambda: _run_to(out, lambda tmp: subprocess.run(trtexec(tmp), check=True))
    elif converter == "onnx-fp16":
        blocked = list(settings.get("op_block_list") or [])
        record["parameters"] = {"keep_io_types": True, "op_block_list": blocked}

        def job() -> None:
            record["clipped_weights"] = onnx_fp16(source, out, op_block_list=blocked)

    elif converter == "torchscript-fp16":
        if framework_module is None or export_format not in ("ts-trace", "ts-script"):
            raise ConfigError(
                f"torchscript-fp16 is made from the framework module (model.half(), then traced "
                f"or scripted): give it the module and a TorchScript export format, not "
                f"{export_format!r}"
            )
        script = export_format == "ts-script"
        record["parameters"] = {
            "device": device,
            "made_by": f"model.half() then torch.jit.{'script' if script else 'trace'}",
            "io": SERVED_TYPES[converter],
            "compute": "float16",
        }
        module_of = framework_module
        job = lambda: torchscript_fp16(
            module_of(), out, example_inputs(1), script=script, device=device
        )
    else:  # tf-trt
        parameters = tf_trt_parameters(precision, settings)
        # the profile spans the batches Triton sends: 1 to max_batch
        build_batches = sorted({1, int(settings["max_batch"])})
        record["parameters"] = {**parameters, "build_batches": build_batches}

        def job() -> None:
            feeds = [example_inputs(b) for b in build_batches]
            # TRTEngineOp nodes and built engines: the artifact's provenance and the report
            record["trt_engines"] = tf_trt(
                source, out, parameters, feeds, settings.get("max_tf_op_fraction")
            )

    needs_gpu = converter in NEEDS_GPU or (converter == "torchscript-fp16" and device != "cpu")
    if needs_gpu and not gpu_visible():
        what = " ".join(record["command"]) if "command" in record else record.get("parameters")
        raise NeedsGPU(
            f"conversion {converter!r} to {precision} needs a GPU node (no GPU is visible here); "
            f"submit it to the cluster with `--profile profiles/slurm`. It would run: {what}"
        )
    job()
    if converter == "tf-trt":  # the TensorRT that built the SavedModel's engines
        record["tensorrt"] = tf_trt_loaded_version()
    record["versions"] = tool_versions(converter)
    return record
