"""What a run's jobs ask the cluster for: the GPU request (SLURM executor plugin resources), the
site's account, QOS, reservation and extra options, and each step's time limit (``runtime``)."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError
from .workflow_config import deep_merge


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
