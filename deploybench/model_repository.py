"""Triton model repository: ``<repo>/<model>/config.pbtxt`` and version ``1/``.

On a GPU the artifact is served by Triton's native backend for its format (``platform``
``tensorrt_plan``, ``onnxruntime_onnx``, ``pytorch_libtorch`` or ``tensorflow_savedmodel``),
``KIND_GPU`` instances, optionally with the backend's TensorRT execution accelerator (ONNX Runtime,
TensorFlow) and CUDA graphs (TensorRT). On the embedded CPU default it is served by the python
backend running the artifact with onnxruntime / TorchScript in-process (pytriton's tritonserver
ships no other backend); the config's parameters say so, and so does every result's provenance.
A GPU entry with ``serving: python`` is served the same way with ``KIND_GPU`` instances, the
runtime on the instance's GPU (deploybench/triton_model.py), its tensors typed as served.
The config is Triton's own ``ModelConfig`` protobuf, written as text (``triton_config``). How a
run is served (backend, platform, accelerators) is decided by
:func:`deploybench.planning.serving_plan.serving`; this module writes what it is given.

ONNX Runtime's TensorRT accelerator (onnx-trt) builds its engine inside the server, not in a
convert step: the config gives it one optimisation profile over the batches Triton sends, an
engine cache beside the repository (:func:`engine_cache_dir`, kept across the server starts of a
run and emptied when the repository is rebuilt) and a ``model_warmup`` sample at the largest
batch, so the engine is built (or read from the cache) while the model loads and every
measurement starts on it (:func:`tensorrt_engine_build`). With ``engines: per_batch``
(deploybench.planning.engines) the repository also holds one model per offline batch size, each with its
engine (trt) or its own profile and cache folder (onnx-trt, :func:`batch_engine_cache`).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from tritonclient.grpc import model_config_pb2

from .convert import shape_arg, tensorrt_profile
from .gpu_identity import SERVER_GPUS
from .tensors import TensorSpec
from .triton_config import build_model_config, read_config, to_pbtxt, warmup_sample

log = logging.getLogger(__name__)

PACKAGE_DIR = Path(__file__).parent
# Beside the repository (results/<run>/repository -> results/<run>/trt_engine_cache).
ENGINE_CACHE = "trt_engine_cache"
ENGINE_CACHE_PATH = "trt_engine_cache_path"
ENGINE_CACHE_LOCK = ".build.lock"
WARMUP_NAME = "engine build at max batch"


def model_config(
    *,
    name: str,
    serving: dict[str, Any],
    triton: dict[str, Any],
    device: str,
    inputs: list[TensorSpec],
    outputs: list[TensorSpec],
    artifact_name: str,
    engine_cache: Path | None = None,
) -> model_config_pb2.ModelConfig:
    """The model's ``config.pbtxt``, as Triton's ``ModelConfig`` message, from the run's Triton
    settings and how it is served.

    ``inputs`` are those the artifact takes (a native backend rejects a config naming an input
    its model lacks); a native backend serves its tensor types (``serving['tensor_types']``).
    ``engine_cache``: the absolute directory a serving that builds its engine at load
    (``serving['engine_build']``, onnx-trt) caches it in; required for one.
    """
    if serving["backend"] == "python":
        # on a GPU (`gpus.<g>.serving: python`): the artifact's served types (fp16 TorchScript's
        # float16), as the native config declares them, and the entry its errors name
        served_types: dict[str, str] = serving.get("tensor_types") or {}
        inputs = [_retyped(s, served_types) for s in inputs]
        outputs = [_retyped(s, served_types) for s in outputs]
        served: dict[str, Any] = {
            "backend": serving["backend"],
            "parameters": {
                "runtime": serving["runtime"],
                "artifact": artifact_name,
                "intra_op_threads": str(triton.get("intra_op_threads", 0)),
                **({"entry": str(serving["entry"])} if serving.get("entry") else {}),
            },
        }
    else:
        types: dict[str, str] = serving.get("tensor_types") or {}
        inputs = [_retyped(s, types) for s in inputs]
        outputs = [_retyped(s, types) for s in outputs]
        served = {
            "platform": serving["platform"],
            "cuda_graphs": bool(serving.get("cuda_graphs")),
            "gpu_accelerators": list(serving.get("gpu_accelerators") or []),
        }
        if serving.get("engine_build") is not None:
            if engine_cache is None:
                raise ValueError(
                    f"model {name!r} builds its TensorRT engine while it loads: give the "
                    "repository's engine cache (engine_cache_dir)"
                )
            accelerators, warmup = tensorrt_engine_build(
                served["gpu_accelerators"],
                serving["engine_build"],
                inputs,
                int(triton["max_batch_size"]),
                engine_cache,
            )
            served |= {"gpu_accelerators": accelerators, "warmup": warmup}
    return build_model_config(
        name=name,
        max_batch_size=int(triton["max_batch_size"]),
        inputs=inputs,
        outputs=outputs,
        instance_count=int(triton["model_instances"]),
        instance_kind="KIND_CPU" if device == "cpu" else "KIND_GPU",
        # on a GPU: the run's GPU, which its energy meter reads (gpu_identity.SERVER_GPUS)
        gpus=() if device == "cpu" else SERVER_GPUS,
        preferred_batch_sizes=[int(b) for b in triton["preferred_batch_sizes"]],
        max_queue_delay_us=int(triton["max_queue_delay_us"]),
        **served,
    )


def tensorrt_engine_build(
    accelerators: list[dict[str, Any]],
    build: dict[str, Any],
    inputs: list[TensorSpec],
    max_batch_size: int,
    engine_cache: Path,
) -> tuple[list[dict[str, Any]], list[model_config_pb2.ModelWarmup]]:
    """ONNX Runtime's TensorRT accelerator with its engine built while the model loads, and the
    warm-up that makes the load wait for it.

    Parameter names are those the backend passes on (onnxruntime_backend r25.01
    src/onnxruntime.cc, ``gpu_execution_accelerator`` "tensorrt"; README's table):
    ``trt_engine_cache_enable``/``trt_engine_cache_path`` keep the built engine (and its
    ``.profile``) on disk, so a later server start reads it instead of building again;
    ``trt_profile_{min,opt,max}_shapes`` ("name:1x384,...", as trtexec's) give one explicit
    optimisation profile. With them ORT builds the engine when the session is created, i.e. while
    the model loads (tensorrt_execution_provider.cc: "Build TRT engine (if needed) and load TRT
    engine if ... All the dynamic shape inputs have associated explicit profiles"). Without them
    ORT profiles the shapes it sees: the first request builds an engine for exactly its shape,
    and each request outside the range seen so far rebuilds it with a wider one
    (TensorRT-ExecutionProvider.md, ORT_TENSORRT_ENGINE_CACHE_ENABLE), so batches 1, 8, 16 in
    turn would build three engines inside the measurement. One profile over every batch Triton
    sends (1..max_batch_size, opt ``build['opt_batch']``) is one build; a warm-up sample at the
    largest batch then runs it once before the model is ready (an engine that cannot run fails
    the load, not a measurement), as the published rows measure a built engine. Triton sends
    the sample as max_batch_size requests of one in one execute (core
    src/backend_model_instance.cc, GenerateWarmupData and WarmUp), which the ONNX Runtime
    backend runs as one batch (src/onnxruntime.cc ProcessRequests: total_batch_size).
    ``build['min_batch']`` (an engine of one batch, deploybench.planning.engines.batch_serving: min = opt
    = max = max_batch_size) raises the profile's smallest batch.
    """
    settings = {
        "min_batch": min(int(build.get("min_batch") or 1), max_batch_size),
        "opt_batch": min(int(build.get("opt_batch") or max_batch_size), max_batch_size),
        "max_batch": max_batch_size,
        "shapes": dict(build.get("shapes") or {}),
    }
    profile = tensorrt_profile(inputs, settings)
    engine = {
        "trt_engine_cache_enable": "true",
        ENGINE_CACHE_PATH: str(engine_cache),
        **{f"trt_profile_{key}_shapes": shape_arg(profile, key) for key in ("min", "opt", "max")},
    }
    names = [a["name"] for a in accelerators]
    if "tensorrt" not in names:
        raise ValueError(f"an engine build needs the tensorrt accelerator; got {names}")
    with_engine = [
        {**a, "parameters": {**a.get("parameters", {}), **engine}} if a["name"] == "tensorrt" else a
        for a in accelerators
    ]
    largest = [TensorSpec(s.name, s.dtype, profile[s.name]["max"][1:]) for s in inputs]
    return with_engine, [warmup_sample(WARMUP_NAME, max_batch_size, largest)]


def engine_cache_dir(repository: Path) -> Path:
    """Where a repository's models cache their TensorRT engines: beside it, absolute (the server
    runs in another container and directory than the job that writes the config; the results
    tree is mounted at the same path in both)."""
    return Path(repository).resolve().parent / ENGINE_CACHE


def batch_engine_cache(engine_cache: Path, model: str) -> Path:
    """The engine cache of a per-batch model: a folder of its own in the run's. ONNX Runtime
    names a cached engine after the model file's name and its graph, not its folder
    (onnxruntime tensorrt_execution_provider_utils.h TRTGenerateId: "Use the model's file name
    instead of the entire path"), so per-batch models of one model.onnx in one folder would
    take each other's engines, built for another batch."""
    return Path(engine_cache) / model


def reset_engine_cache(path: Path) -> None:
    """An empty engine cache at ``path``: what it held was built from the artifact the
    repository served before, and ORT would take it for this one (it names an engine after the
    model's path and graph, not its weights; TensorRT-ExecutionProvider.md: "clean up any old
    engine and profile cache files ... if ... Model changes")."""
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)


def engine_caches(repository: Path) -> list[Path]:
    """The engine caches the repository's configs name (``trt_engine_cache_path``)."""
    found = set()
    for config_file in sorted(Path(repository).glob("*/config.pbtxt")):
        config = read_config(config_file)
        for accelerator in config.optimization.execution_accelerators.gpu_execution_accelerator:
            if ENGINE_CACHE_PATH in accelerator.parameters:
                found.add(Path(accelerator.parameters[ENGINE_CACHE_PATH]))
    return sorted(found)


@contextlib.contextmanager
def engine_build_lock(repository: Path) -> Iterator[list[Path]]:
    """Hold the repository's engine caches (made if missing) while a server loads it.

    The accuracy, offline and online jobs of a run share its cache and may start at once (on two
    GPUs of a node, or two nodes on the shared results tree): the first builds and writes the
    engine, the others wait and read it, instead of building it again each and reading a file
    the first is still writing. An ``flock``: the kernel frees it when its job dies (NFS
    emulates it with POSIX locks)."""
    caches = engine_caches(repository)
    with contextlib.ExitStack() as stack:
        for cache in caches:
            cache.mkdir(parents=True, exist_ok=True)
            lock = stack.enter_context((cache / ENGINE_CACHE_LOCK).open("a"))
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                log.info("another server is building the engine in %s; waiting for it", cache)
                fcntl.flock(lock, fcntl.LOCK_EX)
        yield caches


def _retyped(spec: TensorSpec, types: dict[str, str]) -> TensorSpec:
    return TensorSpec(spec.name, types.get(spec.dtype, spec.dtype), spec.shape)


def build_repository(
    config: model_config_pb2.ModelConfig,
    artifact: Path,
    artifact_name: str,
    out: Path,
    more: Sequence[tuple[model_config_pb2.ModelConfig, Path]] = (),
) -> None:
    """Write the repository to ``out`` whole: built in a temporary folder, then renamed.
    ``more``: further models of the repository and their artifacts (engines: per_batch)."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        for model, served in [(config, Path(artifact)), *more]:
            _write_model(staging, model, served, artifact_name)
        if out.exists():
            shutil.rmtree(out)
        staging.rename(out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _write_model(
    repository: Path, config: model_config_pb2.ModelConfig, artifact: Path, artifact_name: str
) -> None:
    """``<repository>/<model>/config.pbtxt`` and its version ``1/`` holding the artifact."""
    model_dir = repository / config.name
    version = model_dir / "1"
    version.mkdir(parents=True)
    (model_dir / "config.pbtxt").write_text(to_pbtxt(config))
    if artifact.is_dir():  # a SavedModel
        shutil.copytree(artifact, version / artifact_name)
    else:
        shutil.copy2(artifact, version / artifact_name)
    if config.backend == "python":
        shutil.copy2(PACKAGE_DIR / "triton_model.py", version / "model.py")
        shutil.copy2(PACKAGE_DIR / "runtime.py", version / "runtime.py")
