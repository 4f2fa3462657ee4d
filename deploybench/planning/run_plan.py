"""One plan per run: everything the workflow decides about a run, decided once.

A ``{model}/{gpu}/{format}/{precision}`` run is resolved against the config
(:mod:`deploybench.planning.workflow_config`) and planned here: how its artifact is made (export, conversion and
the converter's settings), how it is served (backend, platform, accelerators), what is measured
(accuracy, the offline points and the online grid, the measurement settings), what identifies it
in results, and what its GPU jobs ask the executor for. Every choice is made while the DAG is
built, so a bad value fails naming the valid choices before any job runs; ``convert``,
``repository``, ``accuracy`` and ``perf`` only carry out the settings they are given.

Each step's job gets one spec (:meth:`RunPlan.spec`, :meth:`ExportPlan.spec`,
:meth:`ModelPlan.checkpoint_spec`): plain, JSON-able data holding only what that step reads, so
Snakemake's params trigger reruns exactly the steps whose settings changed (the online grid
reruns ``online`` only). A new dimension of a run is added here and in the job that uses it.

This module holds the run's plan (:class:`RunPlan`, :func:`plan_run`) and what is measured; each
concern it draws on has a module of its own: the spec types (:mod:`deploybench.planning.job_specs`), the
model and its exports (:mod:`deploybench.planning.export_plan`), the conversion
(:mod:`deploybench.planning.conversion_plan`), the serving (:mod:`deploybench.planning.serving_plan`), what the jobs
ask the cluster for (:mod:`deploybench.planning.resources`), and the plans made from run plans: the
search's (:mod:`deploybench.planning.config_search_plan`) and the preflight's (:mod:`deploybench.planning.preflight_plan`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..convert import FROM_CHECKPOINT
from ..errors import ConfigError
from ..transport import planned as planned_transport
from ..trt_version import check_run as check_tensorrt
from .conversion_plan import Conversion, conversion_of, engine_layout
from .engines import EngineLayout, batch_serving, batch_settings, batch_triton, convert_job
from .engines import model_name as batch_model_name
from .export_plan import ExportPlan, plan_export
from .job_specs import (
    AccuracySpec,
    ConvertSpec,
    PerfSpec,
    RepositorySpec,
    RunInfo,
    RunSpec,
    ServingSpec,
    frozen,
    plain,
)
from .resources import GpuRequest, gpu_request_of, max_runtime_of, runtime_minutes
from .schedule import (
    TimeLimit,
    check_time_limits,
    describe,
    pack_groups,
    part_key,
    part_slice,
    split_points,
)
from .serving_plan import container_free, server_environment, server_settings, serving
from .workflow_config import Run, online_grid, resolve

SCENARIOS = ("offline", "online")
RUN_STEPS = ("convert", "repository", "accuracy", *SCENARIOS)
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
    # scenarios are measured in parts (deploybench.planning.schedule), one job each, then merged.
    max_runtime: int | None
    parts: Mapping[str, int]  # scenario -> its measurement jobs (1 without max_runtime)
    # a job ("convert", "offline", or a part "online.1") -> its group job (None: alone)
    groups: Mapping[str, str | None]
    # engines built in the framework image and loaded in the triton image (trt, tf-trt): the
    # serving image and the TensorRT both record (trt_version.check_run); None: no such engine
    tensorrt: Mapping[str, str] | None = None
    # how its TensorRT engines are laid out over its batches (trt, onnx-trt; deploybench.planning.engines);
    # None: the run has none
    engines: EngineLayout | None = None
    # role (framework | triton) -> the image that runs its jobs (the newest that drives its GPU)
    containers: Mapping[str, str] = field(default_factory=lambda: frozen({}))
    # how its measurements read energy (energy_settings); {}: not at all
    energy: Mapping[str, Any] = field(default_factory=lambda: frozen({}))
    perf_input_data: str | None = None  # models.<m>.perf.input_data
    # models.<m>.perf.expected_rate and input_bytes, sized: what its measurement jobs' memory
    # is sized from where published rates do not say (deploybench.planning.measurement_memory)
    expected_rate: float | None = None
    input_bytes: int | None = None

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

    def check_time_limits(self, limits: Sequence[TimeLimit]) -> None:
        """Refuse the run if a submission asks for more than the smallest of ``limits`` (its
        partition's MaxTime, its QOS's MaxWall: schedule.cluster_time_limits) allows."""
        check_time_limits(self.path, self.gpu, limits, self.jobs(), self.groups, self.max_runtime)

    def group_of(self, job: str) -> str | None:
        """The group job ``job`` (a RUN_STEPS step or a part, ``online.1``) belongs to."""
        if job not in self.groups:
            raise ConfigError(
                f"{self.path} has no job {job!r}; valid choices: {', '.join(self.groups)}"
            )
        return self.groups[job]

    def batch_at(self, scenario: str, concurrency: int) -> int | None:
        """The batch the run measures ``scenario`` at ``concurrency`` with, where it measures
        one there (None: none or several). A published row that names no batch (the online
        tables of nnU-Net, ResNet-50 and FastPitch; DLE's runners sent batch 1) is this point."""
        batches = {
            int(p["batch"])
            for p in self.points.get(scenario, ())
            if int(p["concurrency"]) == int(concurrency)
        }
        return next(iter(batches)) if len(batches) == 1 else None

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
            "energy": plain(self.energy),
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
        expected_rate=run.settings["perf"].get("expected_rate"),
        input_bytes=run.settings["perf"].get("input_bytes"),
        energy=frozen(energy_settings(config, run)),
    )
    return replace(plan, groups=frozen(pack_groups(plan.jobs(), max_runtime, run.path)))


def offline_points(run: Run) -> list[dict[str, int]]:
    """Static batching: each configured batch size at concurrency 1."""
    return [
        {"batch": int(b), "concurrency": 1} for b in run.settings["perf"]["offline"]["batch_sizes"]
    ]


def online_points(run: Run) -> list[dict[str, int]]:
    """Dynamic batching over the concurrency sweep (workflow_config.online_grid: DLE's with ``auto``)."""
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


def energy_settings(config: Mapping[str, Any], run: Run) -> dict[str, Any]:
    """How the run's measurements read energy: its meter (the GPU entry's ``meter``, else
    ``energy.meter.<device>``; nvml, rapl or none) and the sampler's settings."""
    energy = config.get("energy") or {}
    meter = run.gpu_settings.get("meter") or (energy.get("meter") or {}).get(run.device, "none")
    return {
        "meter": meter,
        "sample_ms": int(energy.get("sample_ms", 100)),
        "settle_s": float(energy.get("settle_s", 10)),
        "idle_s": float(energy.get("idle_s", 10)),
        "idle_windows": int(energy.get("idle_windows", 5)),
        "max_slowdown_fraction": float(energy.get("max_slowdown_fraction", 0.05)),
        "nvml_library": str(energy.get("nvml_library", "libnvidia-ml.so.1")),
    }


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
