"""How a run's export becomes its served artifact: the converter and its settings (defaults filled
in, checked against what Triton sends), and how its TensorRT engines are laid out over its
batches."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..convert import CONVERTERS
from ..errors import ConfigError
from .engines import EngineLayout, converter_settings, plan_layout
from .job_specs import ServingSpec, frozen, plain
from .workflow_config import Run

# Per converter: settings that have a default (anything else under `convert.<converter>` in the
# config is required or optional as the schema says). TensorRT's batch defaults come from Triton.
CONVERSION_DEFAULTS: dict[str, dict[str, Any]] = {
    "tensorrt": {"min_batch": 1, "shapes": {}},
    "tf-trt": {"minimum_segment_size": 3, "maximum_cached_engines": 1},
    "onnx-fp16": {"op_block_list": []},
    "torchscript-fp16": {},
}
CONVERSION_REQUIRED = {"tensorrt": ("workspace_mb",), "tf-trt": ("workspace_mb",)}


@dataclass(frozen=True)
class Conversion:
    """How the export becomes the served artifact (made on the GPU it runs on)."""

    converter: str  # CONVERTERS
    settings: Mapping[str, Any]  # the converter's settings, defaults filled in and checked


def conversion_of(run: Run) -> Conversion | None:
    """The converter that makes the run's artifact and its settings; None to serve the export."""
    converter = run.converter
    if converter is None:
        return None
    return Conversion(converter, frozen(_conversion_settings(run, converter)))


def engine_layout(run: Run, conversion: Conversion | None, how: ServingSpec) -> EngineLayout | None:
    """How the run's TensorRT engines are laid out over its batches
    (`models.<m>.convert.tensorrt.engines`; deploybench.planning.engines): a run converted by trtexec
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
