"""Resolve what one ``{model}/{gpu}/{format}/{precision}`` run means, from the workflow config.

Every per-model difference is data in ``config/config.yaml``; this module merges a model's
settings with the sizing of the gpu it runs on, checks the combination, and derives the values
the rules need (export, conversion, Triton and perf settings). Errors name the bad value and the
valid choices, so that Snakemake reports them when it builds the DAG.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ..errors import ConfigError
from ..gpus import images_for_gpu


def _choose(kind: str, value: str, valid: list[str] | dict[str, Any], context: str = "") -> None:
    if value not in valid:
        where = f" {context}" if context else ""
        raise ConfigError(
            f"unknown {kind} {value!r}{where}; valid choices: {', '.join(sorted(valid))}"
        )


# libyaml's loader where PyYAML has it: the schema is read at every start of the workflow
_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_yaml(path: str | Path) -> Any:
    with open(path) as f:
        return yaml.load(f, Loader=_SAFE_LOADER)


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """``base`` updated recursively by ``override`` (lists and scalars replace), as new data:
    neither is modified, nor shares anything mutable with the result."""
    merged = _copied(base)
    _merge_into(merged, override)
    return merged


def _merge_into(merged: dict[str, Any], override: dict[str, Any]) -> None:
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            _merge_into(merged[key], value)
        else:
            merged[key] = _copied(value)


_SCALARS = (str, int, float, bool, type(None))


def _copied(value: Any) -> Any:
    """A deep copy of config data: plain dicts, lists and scalars copied directly, anything
    else by copy.deepcopy (which is several times slower on config data: a DAG merges each
    run's settings)."""
    kind = type(value)
    if kind is dict:
        return {k: _copied(v) for k, v in value.items()}
    if kind is list:
        return [_copied(v) for v in value]
    if kind in _SCALARS:
        return value
    return copy.deepcopy(value)


# Converters that change an artifact's precision only (deploybench.convert): a run whose export
# is already at its precision (`export.fp16_exports`) serves the export as it is.
PRECISION_CONVERTERS = frozenset({"onnx-fp16", "torchscript-fp16"})


@dataclass(frozen=True)
class Run:
    """One resolved ``{model}/{gpu}/{format}/{precision}`` combination."""

    model: str
    gpu: str
    format: str
    precision: str
    settings: dict[str, Any]  # the model's settings merged with the gpu's sizing
    gpu_settings: dict[str, Any]
    format_settings: dict[str, Any]

    @property
    def device(self) -> str:
        return str(self.gpu_settings["device"])

    @property
    def export_format(self) -> str:
        return str(self.format_settings["export"])

    @property
    def export_precision(self) -> str:
        """The export's precision: fp16 for an fp16 run of an export format in
        ``export.fp16_exports`` (the module halved, then exported, as DLE's runner did with
        ``export_precision: fp16``), else ``export.precision``."""
        export = self.settings["export"]
        if self.precision == "fp16" and self.export_format in export.get("fp16_exports", ()):
            return "fp16"
        return str(export["precision"])

    @property
    def converter(self) -> str | None:
        """The converter that makes this artifact from the export, or None to serve the export."""
        conv = self.format_settings.get("convert", {}).get(self.precision)
        if conv in PRECISION_CONVERTERS and self.export_precision == self.precision:
            return None  # the export is already at the run's precision
        if conv is None and self.precision != self.export_precision:
            raise ConfigError(
                f"format {self.format!r} has no converter to {self.precision!r} "
                f"from the {self.export_precision!r} export"
            )
        return conv

    @property
    def path(self) -> str:
        return f"{self.model}/{self.gpu}/{self.format}/{self.precision}"


def check_sizings(config: dict[str, Any], schema: dict[str, Any]) -> None:
    """Validate every model's settings as merged with every sizing, against the model schema.

    The config file itself is validated by Snakemake; sizing overrides only become settings once
    merged, so a wrong type there is caught here, named by its key.
    """
    import jsonschema

    model_schema = {"$ref": "#/$defs/model", "$defs": schema["$defs"]}
    validator = jsonschema.Draft202012Validator(model_schema)
    for sizing, overrides in config["sizings"].items():
        for model, override in (overrides or {}).items():
            if model not in config["models"]:
                raise ConfigError(
                    f"sizings.{sizing}: unknown model {model!r}; valid choices: "
                    f"{', '.join(sorted(config['models']))}"
                )
            merged = deep_merge(config["models"][model], override)
            for error in validator.iter_errors(merged):
                key = ".".join(str(p) for p in error.absolute_path)
                raise ConfigError(f"sizings.{sizing}.{model}.{key}: {error.message}")


def model_names(config: dict[str, Any]) -> list[str]:
    return sorted(config["models"])


def model_settings(config: dict[str, Any], model: str, gpu: str) -> dict[str, Any]:
    """A model's settings with the overrides of ``gpu``'s sizing applied."""
    _choose("model", model, config["models"])
    _choose("gpu", gpu, config["gpus"])
    sizing = config["gpus"][gpu]["sizing"]
    _choose("sizing", sizing, config["sizings"], f"(of gpu {gpu!r})")
    overrides = (config["sizings"][sizing] or {}).get(model, {})
    settings = deep_merge(config["models"][model], overrides)
    # the newest images that drive this GPU (a V100 gets the Volta-capable ones)
    settings["containers"] = images_for_gpu(config, gpu, settings["containers"])
    return settings


def containers_on(config: dict[str, Any], model: str, gpu: str) -> dict[str, str]:
    """Role (framework | triton) → the image that runs ``model``'s jobs on ``gpu``."""
    return images_for_gpu(config, gpu, config["models"][model]["containers"])


def resolve(config: dict[str, Any], model: str, gpu: str, fmt: str, precision: str) -> Run:
    """Check a combination against the config and resolve its settings."""
    return _resolve(config, model_settings(config, model, gpu), model, gpu, fmt, precision)


def _resolve(
    config: dict[str, Any], settings: dict[str, Any], model: str, gpu: str, fmt: str, precision: str
) -> Run:
    """:func:`resolve` with ``model_settings(config, model, gpu)`` given: ``settings`` is the
    run's own, only its top level (and its accuracy, copied) set here."""
    _choose("format", fmt, config["formats"])
    gpu_settings = config["gpus"][gpu]
    model_formats = settings["formats"]
    if fmt not in model_formats:
        raise ConfigError(
            f"format {fmt!r} is not configured for model {model!r}; "
            f"valid choices: {', '.join(sorted(model_formats))}"
        )
    if fmt not in gpu_settings["formats"]:
        raise ConfigError(
            f"format {fmt!r} does not run on gpu {gpu!r}; "
            f"valid choices: {', '.join(sorted(gpu_settings['formats']))}"
        )
    valid_precisions = sorted(set(model_formats[fmt]) & set(gpu_settings["precisions"]))
    if precision not in valid_precisions:
        raise ConfigError(
            f"precision {precision!r} is not available for {model}/{gpu}/{fmt}; "
            f"valid choices: {', '.join(valid_precisions) or 'none'}"
        )
    # fp16 artifacts are checked against the fp32 framework at their own tolerances
    accuracy = settings["accuracy"]
    settings["accuracy"] = accuracy | {
        "tolerance": accuracy.get("precision_tolerance", {}).get(precision, accuracy["tolerance"])
    }
    run = Run(model, gpu, fmt, precision, settings, gpu_settings, config["formats"][fmt])
    run.converter  # noqa: B018 - raises if the precision cannot be made
    check_sizes(run)
    check_task(run)
    check_path(f"models.{model}.perf.input_data", settings["perf"].get("input_data"))
    return run


def check_path(key: str, value: str | None) -> None:
    """A configured file or directory must exist when the DAG is built, not fail in a job."""
    if value and not Path(value).exists():
        raise ConfigError(f"{key}: {value!r} does not exist; set it to an existing path or null")


def check_task(run: Run) -> None:
    """A task metric needs trained weights: of a seeded-random network it would mean nothing."""
    task = run.settings["accuracy"].get("task") or {}
    check_path(f"models.{run.model}.accuracy.task.path", task.get("path"))
    if task.get("path") and not run.settings.get("checkpoint"):
        raise ConfigError(
            f"models.{run.model}.accuracy.task.path is set but models.{run.model}.checkpoint is "
            "null: configure the trained checkpoint the task metric is meant to measure"
        )


def check_sizes(run: Run) -> None:
    triton = run.settings["triton"]
    max_batch = int(triton["max_batch_size"])
    where = f"for {run.path}"
    for b in triton["preferred_batch_sizes"]:
        if b > max_batch:
            raise ConfigError(
                f"preferred batch size {b} exceeds max_batch_size {max_batch} {where}"
            )
    for b in run.settings["perf"]["offline"]["batch_sizes"]:
        if b > max_batch:
            raise ConfigError(f"offline batch size {b} exceeds max_batch_size {max_batch} {where}")
    batch, _ = online_grid(run)
    if batch > max_batch:
        raise ConfigError(f"online batch {batch} exceeds max_batch_size {max_batch} {where}")


def online_grid(run: Run) -> tuple[int, list[int]]:
    """The online sweep: batch size per request and the concurrency values.

    ``auto`` is DLE's grid: ``max_total = 2 * max(batch_sizes) * triton_instances *
    model_instances``, concurrency ``step..min(256, max_total)`` by ``step = max_conc // 32``,
    batch ``max(1, max_total // 256)``.
    """
    perf, triton = run.settings["perf"], run.settings["triton"]
    online = perf["online"]
    max_total = (
        2
        * max(perf["offline"]["batch_sizes"])
        * int(online["triton_instances"])
        * int(triton["model_instances"])
    )
    batch = max(1, max_total // 256) if online["batch"] == "auto" else int(online["batch"])
    if online["concurrency"] == "auto":
        max_concurrency = min(256, max_total)
        step = max(1, max_concurrency // 32)
        concurrency = list(range(step, max_concurrency + 1, step))
    else:
        concurrency = [int(c) for c in online["concurrency"]]
    return batch, concurrency


def all_runs(config: dict[str, Any]) -> list[str]:
    """Every combination the config allows, as ``model/gpu/format/precision``."""
    runs = []
    for model in model_names(config):
        for gpu in sorted(config["gpus"]):
            try:
                settings = model_settings(config, model, gpu)  # merged once for its runs
            except ConfigError:
                continue
            for fmt in sorted(config["models"][model]["formats"]):
                for precision in sorted(config["gpus"][gpu]["precisions"]):
                    try:
                        run = _resolve(config, dict(settings), model, gpu, fmt, precision)
                    except ConfigError:
                        continue
                    runs.append(run.path)
    return runs


def in_report_set(config: dict[str, Any], report_set: str, runs: Iterable[str]) -> list[str]:
    """The ``runs`` (``model/gpu/format/precision``) report set ``report_set`` shows: those on
    its GPUs, in its precisions (every precision where it names none)."""
    settings = config["report"]["sets"][report_set]
    precisions = settings.get("precisions")
    return [
        r
        for r in runs
        if r.split("/")[1] in settings["gpus"]
        and (precisions is None or r.split("/")[3] in precisions)
    ]


def reference_model(config: dict[str, Any], model: str, dataset: str | None) -> str:
    """The model entry that reproduces the published ``model`` (on ``dataset``)."""
    for name, settings in config["models"].items():
        ref = settings.get("reference", {"model": name})
        ref_dataset = ref.get("dataset", settings.get("dataset"))
        if ref["model"] == model and (dataset is None or ref_dataset == dataset):
            return str(name)
    raise ConfigError(f"no model entry reproduces published model {model!r} on {dataset!r}")


def reference_format(config: dict[str, Any], fmt: str, accelerator: str) -> str:
    """The format entry for a published format and backend accelerator."""
    for name, settings in config["formats"].items():
        ref = settings.get("reference", {"format": name})
        accelerators = ref.get("accelerators")
        if ref["format"] == fmt and (accelerators is None or accelerator in accelerators):
            return str(name)
    raise ConfigError(f"no format entry serves published format {fmt!r} with {accelerator!r}")


def published_ran(config: dict[str, Any], model: str) -> dict[str, dict[str, dict[str, str]]]:
    """``models.<model>.published_ran``: where the published label is not what was run, format
    → labelled precision → ``{"precision": what ran, "note": ...}`` (empty: every label holds).
    E.g. TFT's published ts-trace "fp16" rows served the fp32 export (docs/config-reference.md says why)."""
    return dict(config["models"][model].get("published_ran") or {})


def check_published_ran(config: dict[str, Any]) -> None:
    """Each ``published_ran`` entry names a format of its model and precisions configured for
    it, and says something other than its label (the schema checks the shape)."""
    for model in model_names(config):
        formats = config["models"][model]["formats"]
        for fmt, labels in published_ran(config, model).items():
            key = f"models.{model}.published_ran.{fmt}"
            _choose("format", fmt, formats, f"in {key}")
            for label, entry in labels.items():
                for precision in (label, entry["precision"]):
                    _choose(
                        "precision", precision, formats[fmt], f"in {key} (models.{model}.formats)"
                    )
                if entry["precision"] == label:
                    raise ConfigError(f"{key}.{label}: ran the precision it is labelled; remove it")


def reference_run(config: dict[str, Any], row: dict[str, Any]) -> Run:
    """The run that reproduces one published result row (model, dataset, gpu, format, ...):
    of the row's precision, or of the one that ran where ``published_ran`` says its label is
    not what was run."""
    dataset = row.get("dataset")
    # pandas reads an empty cell as NaN, csv as "": either way, no data set is named
    named = dataset if isinstance(dataset, str) and dataset else None
    model = reference_model(config, str(row["model"]), named)
    fmt = reference_format(config, str(row["format"]), str(row.get("accelerator") or "none"))
    label = str(row["precision"])
    ran = published_ran(config, model).get(fmt, {}).get(label)
    return resolve(config, model, str(row["gpu"]), fmt, ran["precision"] if ran else label)
