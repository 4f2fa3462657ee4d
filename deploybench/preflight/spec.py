"""What a preflight job is given and what each check reports: the spec
(:func:`deploybench.planning.preflight_plan.plan_preflight` makes it), a check's result and status, the
checks' names in order, and the fixes several checks share."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypedDict

if TYPE_CHECKING:  # 3.11; these annotations are never evaluated (jobs run Python 3.10 too)
    from typing_extensions import NotRequired

from ..errors import ConfigError
from ..trt_version import ENGINE_CONVERTERS

CHECKS = (
    "image",
    "gpu_visible",
    "framework_cuda",
    "driver",
    "tritonserver",
    "tritonserver_gpu",
    "backends",
    "perf_analyzer",
    "trtexec",
    "tensorrt_version",
    "deploybench_imports",
    "model_networks",
    "energy",
)
PASS, FAIL, SKIP = "pass", "fail", "skip"
# Passes, with a limit the runs may meet: the checks after it decide (the driver's
# minor-version compatibility: a framework's kernel, trtexec's build).
WARN = "warn"

DEVICES = ("gpu", "cpu")
ROLES = ("framework", "triton")
FRAMEWORKS = ("torch", "tensorflow")
BACKENDS = ("python", "onnxruntime", "pytorch", "tensorrt", "tensorflow")


class PreflightSpec(TypedDict):
    """One preflight job (``preflight_plan.plan_preflight``): the GPU, the image, and what the
    runs on that GPU need of the image."""

    gpu: str  # config key of the GPU
    gpu_name: str  # gpus.<g>.name
    device: str  # gpus.<g>.device: gpu | cpu
    image: str  # config key of the image
    role: str  # framework | triton
    modules: list[str]  # what the jobs of the rules declaring this image import (job_imports)
    release: dict[str, Any] | None  # images.<image>.release (python, cuda, driver, ships)
    frameworks: list[str]  # python modules whose CUDA visibility to check
    backends: list[str]  # Triton backends the runs serve with (triton role)
    trtexec_flags: list[str]  # trtexec options the convert step passes (framework role)
    # converters (tensorrt | tf-trt) whose TensorRT engines the runs build in this image
    # (framework role) or load in it (triton role): release.tensorrt must be what it ships
    tensorrt_engines: list[str]
    # the models whose jobs build their network in this image: name -> {module, hparams}
    models: dict[str, dict[str, Any]]
    slurm: dict[str, Any]  # gpus.<g>.slurm, for the fixes
    # how the runs on this GPU read energy (run_plan.energy_settings: meter, nvml_library, ...)
    energy: NotRequired[dict[str, Any]]
    server: dict[str, Any]  # config `server`: startup_timeout_s, shutdown_timeout_s


@dataclass
class Check:
    name: str
    status: str  # pass | warn | fail | skip
    detail: str
    fix: str = ""  # what to change (failures)
    facts: dict[str, Any] = field(default_factory=dict)  # what was found (versions, GPUs)

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": self.status,
            "detail": self.detail,
            "fix": self.fix,
            "facts": self.facts,
        }


def check_spec(spec: Mapping[str, Any]) -> None:
    """A spec the checks can act on: each choice among the valid ones."""
    singles: tuple[tuple[str, str, tuple[str, ...]], ...] = (
        ("device", spec["device"], DEVICES),
        ("role", spec["role"], ROLES),
    )
    for key, value, choices in singles:
        if value not in choices:
            raise ConfigError(
                f"preflight of {spec['gpu']}/{spec['image']}: {key} {value!r}; valid choices: "
                f"{', '.join(choices)}"
            )
    lists: tuple[tuple[str, list[str], tuple[str, ...]], ...] = (
        ("frameworks", spec["frameworks"], FRAMEWORKS),
        ("backends", spec["backends"], BACKENDS),
        ("tensorrt_engines", spec.get("tensorrt_engines", []), ENGINE_CONVERTERS),
    )
    for key, values, choices in lists:
        unknown = [v for v in values if v not in choices]
        if unknown:
            raise ConfigError(
                f"preflight of {spec['gpu']}/{spec['image']}: {key} {unknown}; valid choices: "
                f"{', '.join(choices)}"
            )


def _mapping(values: Mapping[str, Any]) -> str:
    """A config mapping as YAML's flow style writes it: ``partition: gpu, gpu_model: a30``."""
    return ", ".join(f"{k}: {'null' if v is None else v}" for k, v in values.items())


def gpu_fix(spec: PreflightSpec) -> str:
    return (
        f"run the job on a node with an {spec['gpu_name']} and pass the GPU into the container: "
        f"set gpus.{spec['gpu']}.slurm (now {_mapping(spec['slurm'])}) to the partition and "
        "GPU type (GRES) of those nodes (`sinfo -o '%P %G %f'` lists them), and keep "
        "Apptainer's --nv (apptainer-args in profiles/slurm)"
    )
