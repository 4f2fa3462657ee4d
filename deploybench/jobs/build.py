"""The jobs that make a run's artifacts: the checkpoint, the export, the conversion and
the Triton model repository."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import progress
from .. import provenance as sidecar
from ..gpus import FRAMEWORK_DEVICE
from ..io import write_json
from ..models import load_family

if TYPE_CHECKING:
    from ..planning.job_specs import (
        CheckpointSpec,
        ConvertSpec,
        ExportSpec,
        RepositorySpec,
    )

log = logging.getLogger("deploybench")


def make_checkpoint(spec: CheckpointSpec, *, checkpoint: str, provenance: str) -> None:
    # torch: imported by the jobs that need it
    from ..checkpoint import prepare_model_checkpoint, source_digest

    model = spec["model"]
    family = load_family(model["module"], model["hparams"])
    origin = prepare_model_checkpoint(family, model, checkpoint)
    log.info("checkpoint %s from %s", checkpoint, origin)
    # source: the configured file and its sha256 (the report's publication gate compares it)
    source = source_digest(model.get("checkpoint"))
    write_json(provenance, sidecar.collect(checkpoint, dict(model), origin=origin, source=source))


# What an export says it does, per export format (a progress line).
EXPORT_PHASES = {
    "ts-trace": "tracing {model} ({format})",
    "ts-script": "scripting {model} ({format})",
    "onnx": "exporting {model} to ONNX",
    "tf-savedmodel": "saving {model} as a SavedModel",
}


def _model_of(path: str, fallback: str) -> str:
    """The model a workflow file belongs to (``results/<model>/...``), for progress lines."""
    parts = Path(path).parts
    return parts[parts.index("results") + 1] if "results" in parts[:-1] else fallback or "model"


def export(
    spec: ExportSpec, *, checkpoint: str, source: list[str], artifact: str, provenance: str
) -> None:
    """``source``: the export this one is made from, if the model makes it from another one."""
    from ..checkpoint import read_workflow_checkpoint
    from ..export import export_spec

    model = spec["model"]
    made_from = source[0] if source else None
    family = load_family(model["module"], model["hparams"])
    started = time.monotonic()
    what = EXPORT_PHASES.get(spec["export_format"], "exporting {model} ({format})")
    progress.say(
        "export: %s%s → %s …",
        what.format(model=_model_of(artifact, family.name), format=spec["export_format"]),
        f" from {made_from}" if made_from else "",
        artifact,
    )
    checkpoint_state = read_workflow_checkpoint(family, checkpoint)
    report = export_spec(family, checkpoint_state, spec, artifact, source=made_from)
    log.info("exported %s; runtime check: %s", artifact, report)
    progress.say(
        "export: %s done in %s, within tolerance in %s",
        artifact,
        progress.format_duration(time.monotonic() - started),
        report.get("runtime"),
    )
    config = {
        "model": model,
        "export_format": spec["export_format"],
        "precision": spec["precision"],
        "opset": spec["opset"],
        "source": made_from,
    }
    write_json(provenance, sidecar.collect(artifact, config, verification=report))


def convert(spec: ConvertSpec, *, source: str, artifact: str, provenance: str) -> None:
    """``source``: the export, or the checkpoint for a converter that starts from the framework
    module (convert.FROM_CHECKPOINT)."""
    from ..checkpoint import read_workflow_checkpoint
    from ..convert import convert as run_converter

    model = spec["model"]
    family = load_family(model["module"], model["hparams"])
    started = time.monotonic()
    progress.say(
        "convert: %s of %s (%s) → %s …",
        spec["converter"],
        _model_of(artifact, family.name),
        spec["precision"],
        artifact,
    )
    record = run_converter(
        spec["converter"],
        source=Path(source),
        out=Path(artifact),
        precision=spec["precision"],
        settings=spec["settings"],
        inputs=family.inputs,
        example_inputs=lambda batch: family.example_inputs(batch, seed=0),
        export_format=spec["export_format"],
        framework_module=lambda: family.serving_module(
            read_workflow_checkpoint(family, Path(source))
        ),
        device=FRAMEWORK_DEVICE[spec["device"]],
    )
    log.info("converted %s: %s", artifact, record)
    progress.say(
        "convert: %s done in %s",
        artifact,
        progress.format_duration(time.monotonic() - started),
    )
    write_json(provenance, sidecar.collect(artifact, {"model": model}, conversion=record))


def repository(
    spec: RepositorySpec,
    *,
    artifact: str,
    artifact_provenance: str,
    signature: list[str],
    repository: str,
    batch_artifacts: list[str] | tuple[str, ...] = (),
    batch_provenances: list[str] | tuple[str, ...] = (),
) -> None:
    """``signature``: the ONNX file whose graph inputs are the ones served (native backends on
    an ONNX export), if any. With engines: per_batch (``spec['batch_models']``) the repository
    also serves a model per batch: of ``batch_artifacts`` (trt: an engine each, in the specs'
    order), else of ``artifact`` (onnx-trt: each with its own profile and engine cache)."""
    from ..convert import artifact_inputs
    from ..model_repository import (
        batch_engine_cache,
        build_repository,
        engine_cache_dir,
        model_config,
        reset_engine_cache,
    )
    from ..triton_config import to_pbtxt

    batch_models = spec.get("batch_models") or []
    if batch_artifacts and len(batch_artifacts) != len(batch_models):
        raise ValueError(
            f"{repository}: {len(batch_artifacts)} per-batch artifacts for the models "
            f"{[m['name'] for m in batch_models]}"
        )
    served = [
        (artifact, artifact_provenance),
        *zip(batch_artifacts, batch_provenances, strict=True),
    ]
    for path, path_provenance in served:
        sidecar.verify(path, path_provenance)
        if "tensorrt" in spec:  # engines inside: only the TensorRT that built them loads them
            from ..trt_version import check_engine

            built = check_engine(path, path_provenance, spec["tensorrt"])
            log.info("%s: built by TensorRT %s, as %s serves it", path, built, spec["tensorrt"])
    model = spec["model"]
    family = load_family(model["module"], model["hparams"])
    inputs = artifact_inputs(family.inputs, Path(signature[0])) if signature else family.inputs
    engine_cache = engine_cache_dir(Path(repository))
    builds_engine = spec["serving"].get("engine_build") is not None

    def configured(name: str, how: Any, triton: Any, cache: Path | None) -> Any:
        """The config of one model of the repository (engines: per_batch makes several)."""
        return model_config(
            name=name,
            serving=dict(how),
            triton=triton,
            device=spec["device"],
            inputs=inputs,
            outputs=family.outputs,
            artifact_name=spec["artifact_name"],
            engine_cache=cache if builds_engine else None,
        )

    config = configured(spec["model_name"], spec["serving"], spec["triton"], engine_cache)
    more = [
        (
            configured(
                entry["name"],
                entry["serving"],
                entry["triton"],
                batch_engine_cache(engine_cache, entry["name"]),
            ),
            Path(batch_artifacts[k] if batch_artifacts else artifact),
        )
        for k, entry in enumerate(batch_models)
    ]
    build_repository(config, Path(artifact), spec["artifact_name"], Path(repository), more)
    if builds_engine:  # the servers of this repository build the engine anew, once
        reset_engine_cache(engine_cache)
    for written in [config, *(c for c, _ in more)]:
        log.info("model repository %s, %s:\n%s", repository, written.name, to_pbtxt(written))
