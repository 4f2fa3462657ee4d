"""What each step's job receives: the spec types of the plans' ``spec`` methods, and the frozen
values the plans hold them in.

A spec is plain, JSON-able data (dicts, lists, scalars) holding only what its step reads
(:mod:`deploybench.planning.run_plan` makes them); a job reads its spec and nothing else of the config.
"""

from __future__ import annotations

import types
from typing import TYPE_CHECKING, Any, TypedDict

if TYPE_CHECKING:  # 3.11; these annotations are never evaluated (jobs run Python 3.10 too)
    from typing_extensions import NotRequired


# ---------------------------------------------------------------------------- job specs
# What each step's job receives (`params: spec=` of its rule): plain dicts and lists.


class ModelIdentity(TypedDict):
    module: str
    hparams: dict[str, Any]
    checkpoint: str | None
    checkpoint_ema: bool | None
    seed: int


class CheckpointSpec(TypedDict):
    model: ModelIdentity


class ExportSpec(TypedDict):
    model: ModelIdentity
    export_format: str
    precision: str
    opset: int
    tolerance: dict[str, dict[str, float]]
    check_batch: int


class ConvertSpec(TypedDict):
    model: ModelIdentity
    converter: str
    precision: str
    settings: dict[str, Any]  # the converter's settings, defaults filled in
    export_format: str  # what the converter makes (torchscript-fp16: ts-trace or ts-script)
    device: str  # the run's (cpu | gpu): where fp16 TorchScript is made


class ServingSpec(TypedDict):
    """How Triton serves the artifact. On CPU: the python backend and the runtime it runs the
    artifact with; on a GPU: the native backend, its platform and options."""

    backend: str
    runtime: str
    platform: NotRequired[str]
    # TensorRT before 10 has no INT64 bindings: the plan takes int32 where the model has int64.
    tensor_types: NotRequired[dict[str, str]]
    cuda_graphs: NotRequired[bool]
    # gpu_execution_accelerator entries: name and string parameters, in priority order
    gpu_accelerators: NotRequired[list[dict[str, Any]]]
    # onnx-trt: ONNX Runtime builds the TensorRT engine while the model loads (one profile over
    # Triton's batches; opt_batch and dynamic `shapes` from models.<m>.convert.tensorrt), cached
    # beside the repository (deploybench.model_repository.tensorrt_engine_build); a per-batch
    # engine's (deploybench.planning.engines.batch_serving) also has min_batch
    engine_build: NotRequired[dict[str, Any]]
    # the python backend on a GPU (`gpus.<g>.serving: python`): the entry, named in its errors
    entry: NotRequired[str]


class RepositorySpec(TypedDict):
    model: ModelIdentity
    model_name: str
    serving: ServingSpec
    triton: dict[str, Any]
    device: str
    artifact_name: str
    # An artifact holding TensorRT engines (trt, tf-trt): the serving image, its TensorRT and
    # the image that built them; the step refuses one built by another (trt_version.check_run)
    tensorrt: NotRequired[dict[str, str]]
    # engines: per_batch (deploybench.planning.engines): the models beside the run's own, one per offline
    # batch size, in order: {"name", "batch", "triton", "serving"}; their artifacts (trt) are
    # the rule's batch_artifacts, in the same order
    batch_models: NotRequired[list[dict[str, Any]]]


class RunInfo(TypedDict):
    """What identifies a run in its results and provenance."""

    path: str
    model: str
    gpu: str
    gpu_name: str
    format: str
    precision: str
    device: str
    backend: str
    runtime: str
    dataset: str | None
    max_batch_size: int
    model_instances: int
    # a serving-configuration search's candidate (deploybench.config_search.Variant.name)
    variant: NotRequired[str]
    # a run with TensorRT engines (trt, onnx-trt): their layout, shared | per_batch, and the
    # batches with an engine of their own (per_batch; deploybench.planning.engines)
    engines: NotRequired[str]
    engine_batches: NotRequired[list[int]]


class AccuracySpec(TypedDict):
    model: ModelIdentity
    model_name: str
    accuracy: dict[str, Any]
    server: dict[str, Any]
    run: RunInfo
    # engines: per_batch: batch (as text) -> the model serving its engine, each checked at it
    batch_models: NotRequired[dict[str, str]]


class PerfSpec(TypedDict):
    scenario: str
    model: ModelIdentity
    model_name: str
    points: list[dict[str, int]]  # {"batch", "concurrency"}, measured in this order
    measure: dict[str, Any]  # MEASURE_KEYS
    server: dict[str, Any]
    run: RunInfo
    # how perf_analyzer reaches the server: protocol and shared memory used, the configured
    # ones and why they differ (deploybench.transport.planned)
    transport: dict[str, Any]
    # how its trials read energy (run_plan.energy_settings): meter, sample_ms, settle_s, idle_s,
    # idle_windows, max_slowdown_fraction, nvml_library
    energy: dict[str, Any]
    # the task's data set (accuracy.task.path), where one is configured: a family may draw its
    # perf data from it, as DLE did (Family.perf_inputs)
    dataset_path: NotRequired[str]
    # perf.input_data: DLE's perf input, raw files named after the inputs
    input_data: NotRequired[str]
    # offline with engines: per_batch: batch (as text) -> the model its points are measured on
    batch_models: NotRequired[dict[str, str]]


class PlotsSpec(TypedDict):
    run_path: str
    stems: dict[str, str]  # chart name -> file stem
    options: dict[str, Any]


class ReportRun(TypedDict):
    path: str
    offline: str
    online: str
    provenance: str
    plots: list[str]
    accelerator: str
    # the served artifact's provenance, if a conversion made it (its record: TF-TRT's engines)
    conversion: NotRequired[str | None]
    # the checkpoint's provenance (its source file's sha256), for a model whose rows are
    # compared only with the published weights (models.<m>.published_needs.checkpoint)
    checkpoint: NotRequired[str | None]
    # the run's serving-configuration search (`search_targets`): csv, choice, chart; or None
    search: dict[str, str] | None
    # a GPU run's images' preflight reports on its GPU (deploybench.report_published.publication_gate)
    preflight: NotRequired[list[str]]


class ReportSpec(TypedDict):
    model: str
    runs: list[ReportRun]
    stems: dict[str, str]  # scenario -> comparison chart stem
    options: dict[str, Any]


class SearchSpec(TypedDict):
    """What the search's jobs (the quick walk's steps, the choice) read: the run, the baseline
    and the settings (deploybench.config_search.settings_spec)."""

    run: RunInfo
    baseline: str
    settings: dict[str, Any]
    # grid: every candidate, baseline first; quick: the walk's (the steps decide)
    candidates: list[str]


RunSpec = ConvertSpec | RepositorySpec | AccuracySpec | PerfSpec


# ---------------------------------------------------------------------------- frozen values


# Concrete types, not the Mapping ABC: an ABC check costs more than the copy, and every job of a
# full-matrix DAG asks for its spec.
_MAPPINGS = (dict, types.MappingProxyType)
_SEQUENCES = (list, tuple)


def frozen(value: Any) -> Any:
    """``value`` (config data: dicts, lists, scalars) with every dict read-only and every list a
    tuple: a plan is cached and shared by every job of the DAG, so nothing that reads it may
    change it."""
    if isinstance(value, _MAPPINGS):
        return types.MappingProxyType({k: frozen(v) for k, v in value.items()})
    if isinstance(value, _SEQUENCES):
        return tuple(frozen(v) for v in value)
    return value


def plain(value: Any) -> Any:
    """A frozen value as new plain dicts and lists: what a job spec is (JSON-able, picklable)."""
    if isinstance(value, _MAPPINGS):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, _SEQUENCES):
        return [plain(v) for v in value]
    return value
