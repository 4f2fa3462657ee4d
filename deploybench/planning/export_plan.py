"""The plans a model's runs share: the model (its network and checkpoint) and each export of it
(format, precision, the image it is made in)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError
from ..gpus import image_chain
from ..models import CHECKPOINT_FILES, framework_of
from .job_specs import CheckpointSpec, ExportSpec, ModelIdentity, frozen, plain
from .resources import runtime_minutes
from .workflow_config import check_path

MODEL_STEPS = ("prepare_checkpoint", "export")
# What defines the network: the checkpoint job and every job that rebuilds the module read it.
IDENTITY_KEYS = ("module", "hparams", "checkpoint", "checkpoint_ema", "seed")


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
