"""The preflight job of one image on one GPU: what the runs on that GPU need of the image
(:mod:`deploybench.preflight` checks it where they run)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..convert import Profile, tensorrt_command
from ..errors import ConfigError
from ..gpus import check_gpu_runs_image
from ..models import framework_of
from ..preflight.spec import PreflightSpec
from .job_specs import plain
from .run_plan import RunPlan, plan_run
from .workflow_config import all_runs, containers_on


def plan_preflight(
    config: dict[str, Any],
    gpu: str,
    image: str,
    role_modules: Mapping[str, Sequence[str]] | None = None,
    runs: Sequence[str] | None = None,
    plan: Callable[[str, str, str, str], RunPlan] | None = None,
) -> PreflightSpec:
    """The preflight job of ``image`` on ``gpu``: what the runs on that GPU need of the image
    (the Triton backends its runs serve with, the TensorRT converter's trtexec flags, the
    converters whose TensorRT engines it builds or loads, the frameworks whose CUDA must work,
    the modules the jobs of its roles import: ``role_modules``, deploybench.job_imports), where
    it runs, and the image's release facts. ``runs`` (every run the config allows:
    workflow_config.all_runs, or those of them on ``gpu``) and ``plan`` (a run's plan:
    run_plan.plan_run) come from the caller where it holds them already (rules/common.smk
    resolves each once per DAG, so a DAG of many preflight jobs plans each run once, not once
    per job)."""
    gpus = config["gpus"]
    if gpu not in gpus:
        raise ConfigError(f"unknown gpu {gpu!r}; valid choices: {', '.join(sorted(gpus))}")
    check_gpu_runs_image(config, gpu, image)
    if plan is None:
        plan = functools.partial(plan_run, config)
    every = all_runs(config) if runs is None else runs
    on_gpu = [path.split("/") for path in every if path.split("/")[1] == gpu]
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
    plans = [plan(*fields) for fields in on_gpu if image in containers[fields[0]].values()]
    roles = used[image]
    role = "triton" if "triton" in roles else "framework"
    # the frameworks whose CUDA this image's jobs use: not the Triton image's TensorFlow, whose
    # accuracy reference runs on the CPU (CPU_REFERENCE_FRAMEWORKS)
    frameworks: set[str] = set()
    for r in plans:
        if r.containers.get(role) != image:
            continue
        framework = framework_of(config["models"][r.model]["module"])
        if not (role == "triton" and framework in CPU_REFERENCE_FRAMEWORKS):
            frameworks.add(FRAMEWORK_MODULES[framework])
    backends = sorted({str(r.serving["backend"]) for r in plans}) if role == "triton" else []
    converts_with_tensorrt = "framework" in roles and any(
        r.conversion is not None and r.conversion.converter == "tensorrt" for r in plans
    )
    # the converters whose engines this image builds (framework) or loads (triton) here
    engines = sorted(
        {
            r.conversion.converter
            for r in plans
            if r.tensorrt is not None
            and r.conversion is not None
            and r.containers.get(role) == image
        }
    )
    # the networks built in this image: by the framework jobs, or by the accuracy job's
    # framework reference (the Triton image)
    models = {
        r.model: {"module": config["models"][r.model]["module"],
                  "hparams": plain(config["models"][r.model].get("hparams") or {})}
        for r in plans
        if r.containers.get(role) == image
    }  # fmt: skip
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
        "models": dict(sorted(models.items())),
        "slurm": plain(settings.get("slurm") or {}),
        # how the measurement jobs here read energy (the same for every run on this GPU)
        "energy": plain(plans[0].energy) if role == "triton" and plans else {},
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
