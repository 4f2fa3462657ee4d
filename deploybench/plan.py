"""One plan per run: everything the workflow decides about a run, decided once.

A ``{model}/{gpu}/{format}/{precision}`` run is resolved against the config
(:mod:`deploybench.config`) and planned here: how its artifact is made (export, conversion and
the converter's settings), how it is served (backend, platform, accelerators), what is measured
(accuracy, the offline points and the online grid, the measurement settings), what identifies it
in results, and what its GPU jobs ask the executor for. Every choice is made while the DAG is
built, so a bad value fails naming the valid choices before any job runs; ``convert``,
``repository``, ``accuracy`` and ``perf`` only carry out the settings they are given.

Each step's job gets one spec (:meth:`RunPlan.spec`, :meth:`ExportPlan.spec`,
:meth:`ModelPlan.checkpoint_spec`): plain, JSON-able data holding only what that step reads, so
Snakemake's params trigger reruns exactly the steps whose settings changed (the online grid
reruns ``online`` only). A new dimension of a run is added here and in the job that uses it.
"""

from __future__ import annotations

import math
import re
import types
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

if TYPE_CHECKING:  # 3.11; these annotations are never evaluated (jobs run Python 3.10 too)
    from typing_extensions import NotRequired

from .backends import PLATFORMS
from .config import (
    Run,
    all_runs,
    check_path,
    containers_on,
    deep_merge,
    online_grid,
    resolve,
)
from .convert import (
    CONVERTERS,
    FP16_IO,
    FROM_CHECKPOINT,
    SERVED_TYPES,
    Profile,
    tensorrt_command,
)
from .engines import (
    ACCELERATOR_WORKSPACE,
    EngineLayout,
    batch_serving,
    batch_settings,
    batch_triton,
    convert_job,
    converter_settings,
    plan_layout,
)
from .engines import SHARED as SHARED_ENGINES
from .engines import model_name as batch_model_name
from .errors import ConfigError
from .gpus import check_gpu_runs_image, image_chain
from .io import MIB
from .models import CHECKPOINT_FILES, framework_of
from .preflight import PreflightSpec
from .schedule import (
    check_fits,
    check_partition_fits,
    describe,
    pack_groups,
    part_key,
    part_slice,
    split_points,
)
from .search import (
    SearchSettings,
    Variant,
    baseline_of,
    parse_variant,
    search_settings,
    settings_spec,
)
from .transport import planned as planned_transport
from .trt_version import check_run as check_tensorrt

SCENARIOS = ("offline", "online")
RUN_STEPS = ("convert", "repository", "accuracy", *SCENARIOS)
MODEL_STEPS = ("prepare_checkpoint", "export")
# What defines the network: the checkpoint job and every job that rebuilds the module read it.
IDENTITY_KEYS = ("module", "hparams", "checkpoint", "checkpoint_ema", "seed")
# `models.<m>.perf` values that say how each point is measured (perf.MeasureSettings).
MEASURE_KEYS = (
    "measurement_mode",
    "request_count",
    "measurement_interval_ms",
    "max_retries",
    "retry_request_step",
    "warmup_factor",
    "timeout_s",
    "trials",
    "max_ci_pct",
    "min_duration_ms",
    "max_duration_ms",
    "max_windows",  # optional: absent leaves perf_analyzer's default (and existing specs) as is
)
# Which converter's settings (`models.<m>.convert.<name>`) size a backend's TensorRT accelerator.
ACCELERATOR_SETTINGS = {"onnxruntime": "tensorrt", "tensorflow": "tf-trt"}
# Per converter: settings that have a default (anything else under `convert.<converter>` in the
# config is required or optional as the schema says). TensorRT's batch defaults come from Triton.
CONVERSION_DEFAULTS: dict[str, dict[str, Any]] = {
    "tensorrt": {"min_batch": 1, "shapes": {}},
    "tf-trt": {"minimum_segment_size": 3, "maximum_cached_engines": 1},
    "onnx-fp16": {"op_block_list": []},
    "torchscript-fp16": {},
}
CONVERSION_REQUIRED = {"tensorrt": ("workspace_mb",), "tf-trt": ("workspace_mb",)}


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
    # beside the repository (deploybench.repository.tensorrt_engine_build); a per-batch
    # engine's (deploybench.engines.batch_serving) also has min_batch
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
    # engines: per_batch (deploybench.engines): the models beside the run's own, one per offline
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
    # a serving-configuration search's candidate (deploybench.search.Variant.name)
    variant: NotRequired[str]
    # a run with TensorRT engines (trt, onnx-trt): their layout, shared | per_batch, and the
    # batches with an engine of their own (per_batch; deploybench.engines)
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
    # the run's serving-configuration search (`search_targets`): csv, choice, chart; or None
    search: dict[str, str] | None
    # a GPU run's images' preflight reports on its GPU (deploybench.report.publication_gate)
    preflight: NotRequired[list[str]]


class ReportSpec(TypedDict):
    model: str
    runs: list[ReportRun]
    stems: dict[str, str]  # scenario -> comparison chart stem
    options: dict[str, Any]


class SearchSpec(TypedDict):
    """What the search's jobs (the quick walk's steps, the choice) read: the run, the baseline
    and the settings (deploybench.search.settings_spec)."""

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


# ---------------------------------------------------------------------------- model and export


@dataclass(frozen=True)
class ModelPlan:
    """What every run of a model shares, before any gpu sizing: the network and its checkpoint."""

    name: str
    identity: Mapping[str, Any]  # IDENTITY_KEYS
    checkpoint_file: str  # the workflow's checkpoint: checkpoint.pt | checkpoint.npz
    configured_checkpoint: str | None  # the DLE checkpoint it reads (None: seeded init)
    export: Mapping[str, Any]  # models.<m>.export
    mem_mb: int  # what its framework jobs (checkpoint, export, convert) declare
    containers: Mapping[str, str]  # role (framework | triton) -> image name
    runtime: Mapping[str, int]  # MODEL_STEPS -> time limit on a cluster (minutes)

    def identity_spec(self) -> ModelIdentity:
        identity: ModelIdentity = plain(self.identity)
        return identity

    def checkpoint_spec(self) -> CheckpointSpec:
        return {"model": self.identity_spec()}


def plan_model(config: dict[str, Any], model: str) -> ModelPlan:
    """A model's plan; an unknown model or a configured checkpoint that is missing fails here."""
    models = config["models"]
    if model not in models:
        raise ConfigError(f"unknown model {model!r}; valid choices: {', '.join(sorted(models))}")
    settings = models[model]
    check_path(f"models.{model}.checkpoint", settings.get("checkpoint"))
    return ModelPlan(
        name=model,
        identity=frozen({k: settings.get(k) for k in IDENTITY_KEYS}),
        checkpoint_file=CHECKPOINT_FILES[framework_of(settings["module"])],
        configured_checkpoint=settings.get("checkpoint") or None,
        export=frozen(settings["export"]),
        mem_mb=int(settings["export"]["mem_mb"]),
        containers=frozen(settings["containers"]),
        runtime=frozen({step: runtime_minutes(config, settings, step) for step in MODEL_STEPS}),
    )


@dataclass(frozen=True)
class ExportPlan:
    """One export of a model: device-independent, shared by every run served from it."""

    model: ModelPlan
    format: str  # onnx | ts-trace | ts-script | tf-savedmodel
    precision: str
    artifact: str  # the file (or SavedModel directory) it writes
    source: str | None  # the export format it is made from (`export.sources`), if any
    # the framework image it is made in when not the model's own (`containers.framework`): a
    # GPU those images cannot drive has its exports made in the images that run it
    image: str | None = None

    @property
    def image_key(self) -> str | None:
        """The image in the export's path (``export@<image>``); None: the model's own image."""
        if self.image is None or self.image == self.model.containers["framework"]:
            return None
        return self.image

    def spec(self) -> ExportSpec:
        return {
            "model": self.model.identity_spec(),
            "export_format": self.format,
            "precision": self.precision,
            "opset": int(self.model.export["onnx_opset"]),
            # an fp16 export is checked against the fp32 framework at fp16's tolerance
            "tolerance": plain(
                self.model.export["fp16_tolerance" if self.precision == "fp16" else "tolerance"]
            ),
            "check_batch": int(self.model.export["check_batch"]),
        }


def plan_export(
    config: dict[str, Any],
    model: str,
    export_format: str,
    precision: str,
    image: str | None = None,
) -> ExportPlan:
    """The export ``export_format`` at ``precision`` of ``model``, made in framework image
    ``image`` (None: the model's own)."""
    formats = config["formats"]
    if export_format not in formats:
        raise ConfigError(
            f"unknown export format {export_format!r}; valid choices: {', '.join(sorted(formats))}"
        )
    model_plan = plan_model(config, model)
    source = model_plan.export.get("sources", {}).get(export_format)
    images = image_chain(config, model_plan.containers["framework"])
    if image is not None and image not in images:
        raise ConfigError(
            f"model {model!r} is not exported in image {image!r}; valid choices: "
            f"{', '.join(images)}"
        )
    return ExportPlan(
        model=model_plan,
        format=export_format,
        precision=precision,
        # every export format is also a served format of the same name (onnx, tf-savedmodel, ...)
        artifact=str(formats[export_format]["artifact"]),
        source=None if source is None else str(source),
        image=image,
    )


# ---------------------------------------------------------------------------- run


@dataclass(frozen=True)
class Conversion:
    """How the export becomes the served artifact (made on the GPU it runs on)."""

    converter: str  # CONVERTERS
    settings: Mapping[str, Any]  # the converter's settings, defaults filled in and checked


@dataclass(frozen=True)
class GpuRequest:
    """What a job that runs on the run's device (convert, accuracy, offline, online) asks the
    executor for: one whole GPU on a GPU device (SLURM never hands it to a second job), in the
    partition, node feature and GPU model of `gpus.<gpu>.slurm`, with the account, QOS,
    reservation and extra options of the site (`slurm:`) or the GPU's own; no GPU on a CPU
    device. None leaves a value to the cluster's
    default. Field names are the SLURM executor plugin's resources (profiles/slurm): `gpu` and
    `gpu_model` become `--gpus=<model>:1`, `gres` `--gres` (the plugin takes one or the other),
    `slurm_account` -A, `qos` --qos, `slurm_extra` is appended as it is."""

    gpu: int
    gpu_model: str | None
    gres: str | None
    slurm_partition: str | None
    constraint: str | None
    slurm_account: str | None
    qos: str | None
    slurm_extra: str | None


@dataclass(frozen=True)
class RunPlan:
    """Everything the workflow does for one ``{model}/{gpu}/{format}/{precision}`` run."""

    model: str
    gpu: str
    format: str
    precision: str
    device: str  # cpu | gpu
    export: ExportPlan  # what it is made from
    artifact: str  # the served file's name (model.onnx, model.plan, model.savedmodel, ...)
    conversion: Conversion | None  # None: the export is served as it is
    serving: Mapping[str, Any]  # ServingSpec
    # A native backend serves the ONNX export's inputs (exporters drop unused inputs; a
    # TensorRT plan takes those of the ONNX it was built from); the python backend takes every
    # input of the model and its runtime picks its own.
    serves_export_inputs: bool
    accelerator: str  # the format's backend accelerator (none | tensorrt), as published
    triton: Mapping[str, Any]  # models.<m>.triton, sized
    accuracy: Mapping[str, Any]  # models.<m>.accuracy, sized, at the precision's tolerance
    points: Mapping[str, tuple[Mapping[str, int], ...]]  # scenario -> its (batch, concurrency)
    measure: Mapping[str, Any]  # MEASURE_KEYS
    transport: Mapping[str, Mapping[str, Any]]  # scenario -> deploybench.transport.planned
    server: Mapping[str, Any]  # the workflow's `server` settings, for this run (server_settings)
    info: Mapping[str, Any]  # RunInfo
    gpu_request: GpuRequest
    # RUN_STEPS -> time limit on a cluster (minutes); a scenario's: one of its measurement jobs
    runtime: Mapping[str, int]
    # The partition's MaxTime (`gpus.<gpu>.slurm.max_runtime`); None: no limit. With one, the
    # scenarios are measured in parts (deploybench.schedule), one job each, then merged.
    max_runtime: int | None
    parts: Mapping[str, int]  # scenario -> its measurement jobs (1 without max_runtime)
    # a job ("convert", "offline", or a part "online.1") -> its group job (None: alone)
    groups: Mapping[str, str | None]
    # engines built in the framework image and loaded in the triton image (trt, tf-trt): the
    # serving image and the TensorRT both record (trt_version.check_run); None: no such engine
    tensorrt: Mapping[str, str] | None = None
    # how its TensorRT engines are laid out over its batches (trt, onnx-trt; deploybench.engines);
    # None: the run has none
    engines: EngineLayout | None = None
    # role (framework | triton) -> the image that runs its jobs (the newest that drives its GPU)
    containers: Mapping[str, str] = field(default_factory=lambda: frozen({}))
    perf_input_data: str | None = None  # models.<m>.perf.input_data

    @property
    def path(self) -> str:
        return f"{self.model}/{self.gpu}/{self.format}/{self.precision}"

    @property
    def measured_in_parts(self) -> bool:
        return self.max_runtime is not None

    def jobs(self) -> list[tuple[str, int]]:
        """The run's jobs on a cluster and their time limits (minutes), in order."""
        steps = [s for s in RUN_STEPS[:3] if s != "convert" or self.conversion is not None]
        jobs = [(step, self.runtime[step]) for step in steps]
        # engines: per_batch of a trt run: a conversion per batch, after the shared one
        jobs[1:1] = [(convert_job(b), self.runtime["convert"]) for b in self.converted_batches]
        for scenario in SCENARIOS:
            if not self.measured_in_parts:
                jobs.append((scenario, self.runtime[scenario]))
                continue
            jobs += [
                (part_key(scenario, k), self.runtime[scenario]) for k in range(self.parts[scenario])
            ]
        return jobs

    def submissions(self) -> list[str]:
        """The run's jobs on a cluster and the --time each asks for, as they are submitted."""
        return describe(self.path, self.jobs(), self.groups, self.max_runtime)

    def check_fits_partition(self, partition: str, limit: int) -> None:
        """Refuse the run if a submission asks for more than ``limit`` minutes, ``partition``'s
        MaxTime (schedule.check_partition_fits)."""
        check_partition_fits(
            self.path, self.gpu, partition, limit, self.jobs(), self.groups, self.max_runtime
        )

    def group_of(self, job: str) -> str | None:
        """The group job ``job`` (a RUN_STEPS step or a part, ``online.1``) belongs to."""
        if job not in self.groups:
            raise ConfigError(
                f"{self.path} has no job {job!r}; valid choices: {', '.join(self.groups)}"
            )
        return self.groups[job]

    def part_points(self, scenario: str, part: int) -> tuple[Mapping[str, int], ...]:
        """The points that part ``part`` of ``scenario`` measures."""
        _check_step(scenario, SCENARIOS)
        if not 0 <= part < self.parts[scenario]:
            raise ConfigError(
                f"{self.path}: {scenario} has parts 0 to {self.parts[scenario] - 1}, not {part}"
            )
        points = self.points[scenario]
        return tuple(points[part_slice(len(points), self.parts[scenario], part)])

    @property
    def converts_from_checkpoint(self) -> bool:
        """The conversion starts from the checkpoint's framework module, not the export."""
        return self.conversion is not None and self.conversion.converter in FROM_CHECKPOINT

    @property
    def batch_engines(self) -> tuple[int, ...]:
        """The batches with an engine (and a model) of their own (engines: per_batch)."""
        return self.engines.batches if self.engines is not None else ()

    @property
    def converted_batches(self) -> tuple[int, ...]:
        """The batches whose engine a convert job of its own makes (per_batch trt runs)."""
        return self.batch_engines if self.engines is not None and self.engines.converted else ()

    def batch_models(self) -> dict[str, str]:
        """Batch (as text) -> the model serving its own engine (engines: per_batch)."""
        return {str(b): batch_model_name(self.model, b) for b in self.batch_engines}

    def convert_spec(self, batch: int | None = None) -> ConvertSpec:
        """The conversion of the run's artifact, or (``batch``, engines: per_batch) of the engine
        of that batch: its profile min = opt = max = ``batch``."""
        if self.conversion is None:
            raise ConfigError(
                f"{self.path} serves its {self.export.format} export as it is: it has no "
                "conversion to make"
            )
        settings = plain(self.conversion.settings)
        if batch is not None:
            if not self.converted_batches:
                raise ConfigError(
                    f"{self.path}: its engine is shared by every batch (models.{self.model}"
                    ".convert.tensorrt.engines: shared): it has no conversion per batch"
                )
            self.engines.check_batch(batch, self.path)  # type: ignore[union-attr]
            settings = batch_settings(settings, batch)
        return {
            "model": self.export.model.identity_spec(),
            "converter": self.conversion.converter,
            "precision": self.precision,
            "settings": settings,
            "export_format": self.export.format,
            "device": self.device,
        }

    def repository_spec(self) -> RepositorySpec:
        spec: RepositorySpec = {
            "model": self.export.model.identity_spec(),
            "model_name": self.model,
            "serving": plain(self.serving),
            "triton": plain(self.triton),
            "device": self.device,
            "artifact_name": self.artifact,
        }
        if self.tensorrt is not None:
            spec["tensorrt"] = plain(self.tensorrt)
        if self.batch_engines:
            spec["batch_models"] = [
                {
                    "name": batch_model_name(self.model, b),
                    "batch": b,
                    "triton": batch_triton(plain(self.triton), b),
                    "serving": batch_serving(plain(self.serving), b),
                }
                for b in self.batch_engines
            ]
        return spec

    def accuracy_spec(self) -> AccuracySpec:
        spec: AccuracySpec = {
            "model": self.export.model.identity_spec(),
            "model_name": self.model,
            "accuracy": plain(self.accuracy),
            "server": plain(self.server),
            "run": plain(self.info),
        }
        if self.batch_engines:
            spec["batch_models"] = self.batch_models()
        return spec

    def perf_spec(self, scenario: str, part: int | None = None) -> PerfSpec:
        """The measurement of ``scenario``, or of its part ``part`` (measured in parts)."""
        _check_step(scenario, SCENARIOS)
        points = self.points[scenario] if part is None else self.part_points(scenario, part)
        spec: PerfSpec = {
            "scenario": scenario,
            "model": self.export.model.identity_spec(),
            "model_name": self.model,
            "points": plain(points),
            "measure": plain(self.measure),
            "server": plain(self.server),
            "run": plain(self.info),
            "transport": plain(self.transport[scenario]),
        }
        dataset_path = (self.accuracy.get("task") or {}).get("path")
        if dataset_path:  # absent otherwise: the spec of a config without one is unchanged
            spec["dataset_path"] = dataset_path
        if self.perf_input_data:  # DLE's own perf input files (absent: the family's)
            spec["input_data"] = self.perf_input_data
        if scenario == "offline" and self.batch_engines:  # each batch on its own engine
            spec["batch_models"] = self.batch_models()
        return spec

    def spec(self, step: str) -> RunSpec:
        """The spec of ``step``'s job (one of RUN_STEPS): only what that job reads."""
        _check_step(step, RUN_STEPS)
        if step == "convert":
            return self.convert_spec()
        if step == "repository":
            return self.repository_spec()
        if step == "accuracy":
            return self.accuracy_spec()
        return self.perf_spec(step)


def _check_step(step: str, valid: tuple[str, ...]) -> None:
    if step not in valid:
        raise ConfigError(f"unknown step {step!r}; valid choices: {', '.join(valid)}")


def plan_run(config: dict[str, Any], model: str, gpu: str, fmt: str, precision: str) -> RunPlan:
    """Resolve and plan one run; a combination or setting the workflow cannot honour fails here
    (a :class:`ConfigError` naming the value and the valid choices)."""
    # its images: the newest that drive its GPU (resolve fails when none does)
    run = resolve(config, model, gpu, fmt, precision)
    how = serving(run)
    conversion = conversion_of(run)
    # engines built in one image and loaded in the other: both must ship one TensorRT
    tensorrt = check_tensorrt(
        config, run.path, conversion.converter if conversion else None, run.settings["containers"]
    )
    points = {"offline": offline_points(run), "online": online_points(run)}
    engines = engine_layout(run, conversion, how)
    batches = engines.batches if engines else ()
    trials = int(run.settings["perf"]["trials"])
    max_runtime = max_runtime_of(run.gpu_settings)
    runtime = {step: runtime_minutes(config, run.settings, step) for step in RUN_STEPS[:3]}
    parts: dict[str, int] = {}
    for scenario in SCENARIOS:

        def limit(points_in_job: int, scenario: str = scenario) -> int:
            return runtime_minutes(config, run.settings, scenario, points_in_job * trials)

        parts[scenario], per_job = split_points(
            len(points[scenario]), limit, max_runtime, scenario, run.path
        )
        runtime[scenario] = limit(per_job)
    plan = RunPlan(
        model=model,
        gpu=gpu,
        format=fmt,
        precision=precision,
        device=run.device,
        # made in the run's framework image (a V100's exports in its own: torch 2.5 loads no
        # TorchScript torch 2.6 saved, TF 2.16 no SavedModel of 2.17's ops)
        export=plan_export(
            config,
            model,
            run.export_format,
            run.export_precision,
            image=None
            if container_free(run.gpu_settings)
            else run.settings["containers"]["framework"],
        ),
        artifact=str(run.format_settings["artifact"]),
        conversion=conversion,
        serving=frozen(how),
        serves_export_inputs=how["backend"] != "python" and run.export_format == "onnx",
        accelerator=str(run.format_settings.get("accelerator", "none")),
        triton=frozen(run.settings["triton"]),
        accuracy=frozen(run.settings["accuracy"]),
        points=frozen(points),
        measure=frozen(measure_settings(run)),
        transport=frozen(transports(run)),
        # per_batch onnx-trt: the servers build each model's engine while they load
        server=frozen(
            server_settings(config["server"], how, 1 + len(batches)) | server_environment(run, how)
        ),
        info=frozen(run_info(run, how) | (engines.info() if engines else {})),
        gpu_request=gpu_request_of(run.gpu_settings, config.get("slurm") or {}),
        runtime=frozen(runtime),
        max_runtime=max_runtime,
        parts=frozen(parts),
        groups=frozen({}),
        tensorrt=None if tensorrt is None else frozen(tensorrt),
        engines=engines,
        containers=frozen(run.settings["containers"]),
        perf_input_data=run.settings["perf"].get("input_data"),
    )
    return replace(plan, groups=frozen(pack_groups(plan.jobs(), max_runtime, run.path)))


# ---------------------------------------------------------------------------- search


@dataclass(frozen=True)
class SearchPlan:
    """A run's serving-configuration search (`models.<m>.search`, sized): its settings, its
    baseline (the run's own `triton` settings) and the online sweep every candidate is measured
    over. A candidate is the run served another way: the same artifact, its own repository and
    online measurement (:meth:`variant_plan`)."""

    run: RunPlan
    settings: SearchSettings
    baseline: Variant
    sweep: tuple[Mapping[str, int], ...]  # the candidates' online points
    candidate_runtime: Mapping[str, int]  # repository, online -> minutes on a cluster
    max_engine_batch: int | None  # a TensorRT / TF-TRT engine's max batch (None: any)

    def variant(self, name: str) -> Variant:
        """The candidate a variant name spells, if this run can serve it."""
        variant = parse_variant(name, self.run.device)
        if self.max_engine_batch is not None and variant.max_batch_size > self.max_engine_batch:
            converter = self.run.conversion.converter if self.run.conversion else "?"
            raise ConfigError(
                f"{self.run.path}: variant {name!r} batches up to {variant.max_batch_size}, more "
                f"than the run's engine takes ({self.max_engine_batch}, models.{self.run.model}"
                f".convert.{converter}.max_batch): a search serves the run's one artifact"
            )
        return variant

    def variant_plan(self, name: str) -> RunPlan:
        """The run served as variant ``name``: its Triton settings, online over the sweep."""
        variant = self.variant(name)
        triton = {**plain(self.run.triton), **variant.triton()}
        info = {
            **plain(self.run.info),
            "variant": variant.name,
            "max_batch_size": variant.max_batch_size,
            "model_instances": variant.model_instances,
        }
        # a candidate is measured online only: on the run's shared engine, no per-batch ones
        engines = self.run.engines
        if engines is not None and engines.per_batch:
            engines = replace(engines, layout=SHARED_ENGINES, batches=())
            info = {k: v for k, v in info.items() if k != "engine_batches"} | engines.info()
        return replace(
            self.run,
            triton=frozen(triton),
            points=frozen({"offline": (), "online": plain(self.sweep)}),
            info=frozen(info),
            runtime=frozen({**self.run.runtime, **self.candidate_runtime}),
            engines=engines,
        )

    def grid(self) -> list[Variant]:
        """The grid's candidates (baseline first); more than max_candidates fails."""
        variants = self.settings.grid(self.baseline)
        if len(variants) > self.settings.max_candidates:
            raise ConfigError(
                f"{self.run.path}: the search grid has {len(variants)} candidates, more than "
                f"search.max_candidates ({self.settings.max_candidates}); drop axis values, "
                "raise the cap, or use strategy quick"
            )
        return variants

    def spec(self) -> SearchSpec:
        grid = self.settings.strategy == "grid"
        return {
            "run": plain(self.run.info),
            "baseline": self.baseline.name,
            "settings": settings_spec(self.settings),
            "candidates": [v.name for v in self.grid()] if grid else [],
        }


def plan_search(
    config: dict[str, Any], model: str, gpu: str, fmt: str, precision: str
) -> SearchPlan:
    """The search of one run; its settings are checked here (an axis the device lacks, a
    baseline Triton could not serve, a grid over the cap)."""
    run_plan = plan_run(config, model, gpu, fmt, precision)
    run = resolve(config, model, gpu, fmt, precision)
    search = run.settings["search"]
    baseline = baseline_of(run_plan.triton, run_plan.device)
    settings = search_settings(search, baseline, run_plan.device, f"models.{model}.search")
    online = search.get("online")
    sweep = (
        tuple({"batch": int(online["batch"]), "concurrency": int(c)} for c in online["concurrency"])
        if online
        else tuple(plain(run_plan.points["online"]))
    )
    conversion = run_plan.conversion
    engine_batch = (
        int(conversion.settings["max_batch"])
        if conversion is not None and "max_batch" in conversion.settings
        else None
    )
    trials = int(run.settings["perf"]["trials"])
    plan = SearchPlan(
        run=run_plan,
        settings=settings,
        baseline=baseline,
        sweep=frozen(sweep),
        candidate_runtime=frozen(
            {
                "repository": runtime_minutes(config, run.settings, "repository"),
                "online": runtime_minutes(config, run.settings, "online", len(sweep) * trials),
            }
        ),
        max_engine_batch=engine_batch,
    )
    for step, minutes in plan.candidate_runtime.items():  # a candidate's jobs are not split
        check_fits(f"search_{step}", minutes, run_plan.max_runtime, f"{run.path} search")
    for top, _ in settings.axes.get("max_batch_size", ()):  # within the engine's batch
        plan.variant(baseline.with_value("max_batch_size", (top, (top,))).name)
    if settings.strategy == "grid":
        plan.grid()
    return plan


# ---------------------------------------------------------------------------- decisions


def conversion_of(run: Run) -> Conversion | None:
    """The converter that makes the run's artifact and its settings; None to serve the export."""
    converter = run.converter
    if converter is None:
        return None
    return Conversion(converter, frozen(_conversion_settings(run, converter)))


def engine_layout(run: Run, conversion: Conversion | None, how: ServingSpec) -> EngineLayout | None:
    """How the run's TensorRT engines are laid out over its batches
    (`models.<m>.convert.tensorrt.engines`; deploybench.engines): a run converted by trtexec
    (trt) or whose ONNX Runtime builds the engine while the model loads (onnx-trt); None for the
    others, which have no such engine."""
    converted = conversion is not None and conversion.converter == "tensorrt"
    if not converted and "engine_build" not in how:
        return None
    return plan_layout(
        (run.settings.get("convert") or {}).get("tensorrt") or {},
        f"models.{run.model}.convert.tensorrt",
        offline_batches=[int(b) for b in run.settings["perf"]["offline"]["batch_sizes"]],
        max_batch_size=int(run.settings["triton"]["max_batch_size"]),
        converted=converted,
    )


def conversion_settings(run: Run) -> dict[str, Any]:
    """The run's converter settings with defaults filled in, checked; {} if it has none."""
    conversion = conversion_of(run)
    return {} if conversion is None else plain(conversion.settings)


def _conversion_settings(run: Run, converter: str) -> dict[str, Any]:
    if converter not in CONVERTERS:
        raise ConfigError(
            f"unknown converter {converter!r} for {run.path}; valid choices: {', '.join(CONVERTERS)}"
        )
    where = f"models.{run.model}.convert.{converter}"
    given = (run.settings.get("convert") or {}).get(converter) or {}
    missing = [k for k in CONVERSION_REQUIRED.get(converter, ()) if k not in given]
    if missing:
        raise ConfigError(
            f"{where}.{missing[0]} is not set; format {run.format!r} at {run.precision} is made "
            f"by converter {converter!r}, which needs {', '.join(CONVERSION_REQUIRED[converter])}"
        )
    settings = {**CONVERSION_DEFAULTS[converter], **given}
    if converter == "tensorrt":  # the engine layout and the accelerator's workspace: not trtexec's
        settings = converter_settings(settings)
    max_served = int(run.settings["triton"]["max_batch_size"])
    if converter in ("tensorrt", "tf-trt"):
        settings.setdefault("max_batch", max_served)
    if converter == "tensorrt":
        settings.setdefault("opt_batch", settings["max_batch"])
        _check_batches(settings, max_served, where)
    if converter == "tf-trt" and int(settings["max_batch"]) < max_served:
        raise ConfigError(
            f"{where}.max_batch {settings['max_batch']} is below triton.max_batch_size "
            f"{max_served}: the engines would not take the batches Triton sends"
        )
    return settings


def _check_batches(settings: dict[str, Any], max_served: int, where: str) -> None:
    lo, opt, hi = (int(settings[k]) for k in ("min_batch", "opt_batch", "max_batch"))
    if not 1 <= lo <= opt <= hi:
        raise ConfigError(
            f"{where}: the batch profile must have 1 <= min_batch <= opt_batch <= max_batch; "
            f"got min_batch {lo}, opt_batch {opt}, max_batch {hi}"
        )
    # Triton sends any batch from 1 to max_batch_size: the engine must take all of them.
    if lo > 1 or hi < max_served:
        raise ConfigError(
            f"{where}: the profile's batches {lo}..{hi} do not cover the batches 1.."
            f"{max_served} Triton sends (triton.max_batch_size)"
        )


def container_free(gpu_settings: Mapping[str, Any]) -> bool:
    """Whether a `gpus.<gpu>` entry's runs are served without containers (`serving: python`):
    the python backend of this venv's tritonserver, every job native, even under --sdm
    apptainer."""
    return gpu_settings.get("serving", "native") == "python"


def serving(run: Run) -> ServingSpec:
    """How the run is served: Triton backend, and the runtime inside it on CPU or, with
    `gpus.<gpu>.serving: python`, on the GPU (KIND_GPU instances; deploybench/triton_model.py)."""
    if run.device == "cpu" or container_free(run.gpu_settings):
        runtime = run.format_settings.get("cpu_runtime")
        if not runtime:
            where = "a CPU device" if run.device == "cpu" else "served by the python backend"
            raise ConfigError(
                f"format {run.format!r} has no CPU runtime (formats.{run.format}.cpu_runtime): "
                f"it cannot run on gpu {run.gpu!r}, {where}"
            )
        # the converter's served types (fp16 TorchScript's float16 I/O), as a native config's:
        # on a CPU too, so that its fp16 run sends what a GPU's does
        types = served_types(run)
        python: ServingSpec = {"backend": "python", "runtime": str(runtime)}
        if types:
            python["tensor_types"] = dict(types)
        if run.device != "cpu":
            python["entry"] = run.gpu
        return python
    backend = str(run.format_settings["backend"])
    if backend not in PLATFORMS:
        raise ConfigError(
            f"formats.{run.format}.backend: unknown backend {backend!r}; valid choices: "
            f"{', '.join(sorted(PLATFORMS))}"
        )
    accelerator = str(run.format_settings.get("accelerator", "none"))
    how: ServingSpec = {
        "backend": backend,
        "runtime": backend if accelerator == "none" else f"{backend}+{accelerator}",
        "platform": PLATFORMS[backend],
        # the format's (an older TensorRT's int32), then the converter's (fp16 TorchScript)
        "tensor_types": {**(run.format_settings.get("tensor_types") or {}), **served_types(run)},
        # Triton's CUDA graphs are recognised by the TensorRT backend only.
        "cuda_graphs": backend == "tensorrt" and bool(run.settings["triton"].get("cuda_graphs")),
        "gpu_accelerators": [tensorrt_accelerator(run, backend)]
        if accelerator == "tensorrt"
        else [],
    }
    if accelerator == "tensorrt" and backend == "onnxruntime":
        how["engine_build"] = onnxruntime_engine_build(run)
    return how


def onnxruntime_engine_build(run: Run) -> dict[str, Any]:
    """What ONNX Runtime's TensorRT engine is built for while the model loads: opt_batch (if
    set) and the dynamic dimensions' shapes of `models.<m>.convert.tensorrt`. Its batches are
    1..triton.max_batch_size of the repository that serves it (a search candidate's own)."""
    section = (run.settings.get("convert") or {}).get(ACCELERATOR_SETTINGS["onnxruntime"]) or {}
    build: dict[str, Any] = {"shapes": dict(section.get("shapes") or {})}
    if "opt_batch" in section:
        build["opt_batch"] = int(section["opt_batch"])
    return build


# `server` settings that only some runs' jobs read (server_settings).
ENGINE_BUILD_TIMEOUT = "engine_build_timeout_s"


# PyTorch reads it once, as its fp32 matmul precision's default: HIGH (TF32) when set (ATen
# Context.h: `float32_matmul_precision = c10::utils::check_env("TORCH_ALLOW_TF32_CUBLAS_
# OVERRIDE") == true ? HIGH : HIGHEST`), in libtorch under Triton's PyTorch backend too.
TF32_MATMUL_ENV = {"TORCH_ALLOW_TF32_CUBLAS_OVERRIDE": "1"}


def served_types(run: Run) -> dict[str, str]:
    """The tensor types the run's artifact serves in place of the model's: its converter's
    (fp16 TorchScript's float16 I/O), or an fp16 export's (the halved module exported: float16
    I/O, which a TensorRT engine built from it keeps)."""
    if run.export_precision == "fp16":
        return dict(FP16_IO)
    return dict(
        SERVED_TYPES.get(str((run.format_settings.get("convert") or {}).get(run.precision)), {})
    )


def server_environment(run: Run, how: ServingSpec) -> dict[str, Any]:
    """``{"environment": ...}`` for a run whose server runs fp32 matmuls in TF32 as the model's
    published era did (``models.<m>.tf32_matmul``: PyTorch 1.7 to 1.11 allowed TF32 in cuBLAS
    by default, 1.12 and later do not): fp32 TorchScript in Triton's PyTorch backend on a GPU.
    Nothing for any other run (its spec stays as it was)."""
    tf32 = bool(run.settings.get("tf32_matmul")) and run.device == "gpu"
    if not (tf32 and how["backend"] == "pytorch" and run.precision == "fp32"):
        return {}
    return {"environment": dict(TF32_MATMUL_ENV)}


def server_settings(server: Mapping[str, Any], how: ServingSpec, builds: int = 1) -> dict[str, Any]:
    """The run's `server` settings. A run whose engine is built while its model loads
    (``engine_build``: onnx-trt) waits ``engine_build_timeout_s`` more for the server to be
    ready (times ``builds``, the engines its models build: one per model with engines:
    per_batch), and its clients wait as long as one build for an answer; the others' settings
    are the workflow's as they were (so their jobs' specs, and results, stay)."""
    settings = {k: v for k, v in server.items() if k != ENGINE_BUILD_TIMEOUT}
    if "engine_build" in how:
        build_s = float(server[ENGINE_BUILD_TIMEOUT])
        settings["startup_timeout_s"] = float(server["startup_timeout_s"]) + build_s * builds
        settings["client_timeout_s"] = build_s
    return settings


def tensorrt_accelerator(run: Run, backend: str) -> dict[str, Any]:
    """The backend's TensorRT execution accelerator at the run's precision; its workspace from
    the model's TensorRT (ONNX Runtime: accelerator_workspace_mb, else workspace_mb) or TF-TRT
    (TensorFlow) conversion settings, if set."""
    if backend not in ACCELERATOR_SETTINGS:
        raise ConfigError(
            f"format {run.format!r}: backend {backend!r} has no TensorRT accelerator; valid "
            f"choices: {', '.join(sorted(ACCELERATOR_SETTINGS))}"
        )
    if run.precision not in ("fp32", "fp16"):
        raise ConfigError(
            f"{run.path}: the TensorRT accelerator runs fp32 or fp16, not {run.precision!r}"
        )
    parameters = {"precision_mode": run.precision.upper()}
    section = (run.settings.get("convert") or {}).get(ACCELERATOR_SETTINGS[backend]) or {}
    workspace = section.get(ACCELERATOR_WORKSPACE, section.get("workspace_mb"))
    if workspace is not None:
        parameters["max_workspace_size_bytes"] = str(int(workspace) * MIB)
    return {"name": "tensorrt", "parameters": parameters}


def offline_points(run: Run) -> list[dict[str, int]]:
    """Static batching: each configured batch size at concurrency 1."""
    return [
        {"batch": int(b), "concurrency": 1} for b in run.settings["perf"]["offline"]["batch_sizes"]
    ]


def online_points(run: Run) -> list[dict[str, int]]:
    """Dynamic batching over the concurrency sweep (config.online_grid: DLE's with ``auto``)."""
    batch, concurrency = online_grid(run)
    return [{"batch": batch, "concurrency": c} for c in concurrency]


def measure_settings(run: Run) -> dict[str, Any]:
    perf = run.settings["perf"]
    if perf["min_duration_ms"] > perf["max_duration_ms"]:
        raise ConfigError(
            f"{run.path}: perf.min_duration_ms ({perf['min_duration_ms']}) exceeds "
            f"perf.max_duration_ms ({perf['max_duration_ms']}); a trial cannot last both"
        )
    return {key: perf[key] for key in MEASURE_KEYS if key in perf}


def transports(run: Run) -> dict[str, dict[str, Any]]:
    """Scenario -> how perf_analyzer reaches the server: `perf.<scenario>.transport`, with CUDA
    shared memory measured as system on a CPU device (deploybench.transport.planned)."""
    return {
        scenario: planned_transport(
            run.settings["perf"][scenario]["transport"], run.device, f"{run.path} {scenario}"
        )
        for scenario in SCENARIOS
    }


def run_info(run: Run, how: ServingSpec) -> RunInfo:
    """What identifies the run in its results and provenance (``how``: its serving)."""
    triton = run.settings["triton"]
    return {
        "path": run.path,
        "model": run.model,
        "gpu": run.gpu,
        "gpu_name": run.gpu_settings["name"],
        "format": run.format,
        "precision": run.precision,
        "device": run.device,
        "backend": how["backend"],
        "runtime": how["runtime"],
        "dataset": run.settings.get("dataset"),
        "max_batch_size": triton["max_batch_size"],
        "model_instances": triton["model_instances"],
    }


def max_runtime_of(gpu_settings: Mapping[str, Any]) -> int | None:
    """A `gpus.<gpu>` entry's partition time limit (minutes), None for none."""
    return (gpu_settings.get("slurm") or {}).get("max_runtime")


def gpus_measured_in_parts(config: dict[str, Any]) -> list[str]:
    """The GPUs whose partition caps a job's time: their runs measure in parts."""
    return sorted(
        name for name, settings in config["gpus"].items() if max_runtime_of(settings) is not None
    )


# A site's settings of a job (`slurm:`, and a GPU's own in `gpus.<gpu>.slurm`).
SITE_KEYS = ("account", "qos", "reservation", "slurm_extra")


def site_settings(site: Mapping[str, Any], gpu_slurm: Mapping[str, Any]) -> dict[str, Any]:
    """The site's settings with a GPU's own (those it sets) in their place."""
    return {
        key: gpu_slurm[key] if gpu_slurm.get(key) is not None else site.get(key)
        for key in SITE_KEYS
    }


def site_request(settings: Mapping[str, Any]) -> dict[str, str | None]:
    """`settings` (SITE_KEYS) as the SLURM executor plugin's resources: `slurm_account` (-A),
    `qos` (--qos), `slurm_extra` (appended as it is). The plugin has no per-job reservation, so
    it goes with the extra options."""
    reservation = settings.get("reservation")
    extra = " ".join(
        option
        for option in (
            f"--reservation={reservation}" if reservation else None,
            settings.get("slurm_extra"),
        )
        if option
    )
    return {
        "slurm_account": settings.get("account"),
        "qos": settings.get("qos"),
        "slurm_extra": extra or None,
    }


def gpu_request_of(gpu_settings: Mapping[str, Any], site: Mapping[str, Any]) -> GpuRequest:
    """What a job on this `gpus.<gpu>` entry's device asks for, with the site's settings
    (`site`: the config's `slurm:`) where the GPU sets none of its own."""
    on_gpu = gpu_settings["device"] == "gpu"
    slurm = gpu_settings.get("slurm") or {}
    gres = slurm.get("gres") if on_gpu else None
    return GpuRequest(
        # a GRES request names the GPU itself: no `gpu` as well
        gpu=1 if on_gpu and not gres else 0,
        # a GPU model names what to allocate: nothing on a CPU device
        gpu_model=slurm.get("gpu_model") if on_gpu and not gres else None,
        gres=gres,
        slurm_partition=slurm.get("partition"),
        constraint=slurm.get("constraint"),
        **site_request(site_settings(site, slurm)),
    )


def check_slurm_extra(config: Mapping[str, Any], forbidden: Mapping[str, str]) -> None:
    """Every `slurm_extra` of the config against the options the SLURM executor plugin sets
    itself (``forbidden``: its own table, pattern -> option name): a clash fails now, not at
    the first submission."""
    places = {"slurm": config.get("slurm") or {}}
    places |= {f"gpus.{g}.slurm": s.get("slurm") or {} for g, s in config["gpus"].items()}
    for where, settings in places.items():
        extra = settings.get("slurm_extra") or ""
        for pattern, option in forbidden.items():
            if re.search(pattern, extra):
                raise ConfigError(
                    f"{where}.slurm_extra {extra!r} sets the {option}, which the SLURM executor "
                    f"plugin sets itself: use {where}'s own setting or the rule's resources"
                )


def runtime_minutes(
    config: dict[str, Any], settings: Mapping[str, Any], step: str, points: int = 0
) -> int:
    """The time limit of ``step``'s job on a cluster (`runtime`, minutes; sbatch --time): the
    step's minutes plus ``points`` measurements' minutes (points x trials), times the margin;
    `runtime` in the model's (sized) settings overrides the workflow's."""
    table = deep_merge(dict(config["runtime"]), dict(settings.get("runtime") or {}))
    steps = table["steps"]
    if step not in steps:
        raise ConfigError(f"runtime.steps has no {step!r}; it names: {', '.join(sorted(steps))}")
    minutes = float(steps[step]) + points * float(table["per_point"])
    return math.ceil(minutes * float(table["margin"]))


# ---------------------------------------------------------------------------- preflight


def plan_preflight(
    config: dict[str, Any],
    gpu: str,
    image: str,
    role_modules: Mapping[str, Sequence[str]] | None = None,
) -> PreflightSpec:
    """The preflight job of ``image`` on ``gpu``: what the runs on that GPU need of the image
    (the Triton backends its runs serve with, the TensorRT converter's trtexec flags, the
    converters whose TensorRT engines it builds or loads, the frameworks whose CUDA must work,
    the modules the jobs of its roles import: ``role_modules``, deploybench.job_imports), where
    it runs, and the image's release facts."""
    gpus = config["gpus"]
    if gpu not in gpus:
        raise ConfigError(f"unknown gpu {gpu!r}; valid choices: {', '.join(sorted(gpus))}")
    check_gpu_runs_image(config, gpu, image)
    on_gpu = [path.split("/") for path in all_runs(config) if path.split("/")[1] == gpu]
    # each model's images there (the newest that drive the GPU), once per model
    containers = {model: containers_on(config, model, gpu) for model, *_ in on_gpu}
    used: dict[str, set[str]] = {}  # image -> the roles (framework | triton) it plays there
    for model_containers in containers.values():
        for container_role, name in model_containers.items():
            used.setdefault(name, set()).add(container_role)
    if image not in used:
        raise ConfigError(
            f"no run on gpu {gpu!r} uses image {image!r}; valid choices: "
            f"{', '.join(sorted(used)) or 'none'}"
        )
    runs = [
        plan_run(config, *fields) for fields in on_gpu if image in containers[fields[0]].values()
    ]
    roles = used[image]
    role = "triton" if "triton" in roles else "framework"
    # the frameworks whose CUDA this image's jobs use: not the Triton image's TensorFlow, whose
    # accuracy reference runs on the CPU (CPU_REFERENCE_FRAMEWORKS)
    frameworks: set[str] = set()
    for r in runs:
        if r.containers.get(role) != image:
            continue
        framework = framework_of(config["models"][r.model]["module"])
        if not (role == "triton" and framework in CPU_REFERENCE_FRAMEWORKS):
            frameworks.add(FRAMEWORK_MODULES[framework])
    backends = sorted({str(r.serving["backend"]) for r in runs}) if role == "triton" else []
    converts_with_tensorrt = "framework" in roles and any(
        r.conversion is not None and r.conversion.converter == "tensorrt" for r in runs
    )
    # the converters whose engines this image builds (framework) or loads (triton) here
    engines = sorted(
        {
            r.conversion.converter
            for r in runs
            if r.tensorrt is not None
            and r.conversion is not None
            and r.containers.get(role) == image
        }
    )
    settings = gpus[gpu]
    image_settings = config["images"][image]
    return {
        "gpu": gpu,
        "gpu_name": str(settings["name"]),
        "device": str(settings["device"]),
        "image": image,
        "role": role,
        "modules": sorted({m for r in roles for m in (role_modules or {}).get(r, ())}),
        "release": plain(image_settings.get("release")),
        "frameworks": sorted(frameworks),
        "backends": backends,
        "trtexec_flags": tensorrt_flags() if converts_with_tensorrt else [],
        "tensorrt_engines": engines,
        "slurm": plain(settings.get("slurm") or {}),
        "server": plain(config["server"]),
    }


# The module whose CUDA a framework's jobs use.
FRAMEWORK_MODULES = {"pytorch": "torch", "tensorflow": "tensorflow"}
# Frameworks whose accuracy reference runs on the CPU in the Triton image, whatever the run's
# device (models/base.py KerasFamily.framework_outputs says why).
CPU_REFERENCE_FRAMEWORKS = ("tensorflow",)


def tensorrt_flags() -> list[str]:
    """The trtexec options the convert step passes (current TensorRT), by name."""
    one: Profile = {"x": {"min": (1,), "opt": (1,), "max": (1,)}}
    cmd = tensorrt_command(
        onnx=Path("x.onnx"), plan=Path("x.plan"), precision="fp16", profile=one, workspace_mb=1
    )
    return [arg.split("=", 1)[0] for arg in cmd[1:]]
