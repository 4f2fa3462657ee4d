"""Per-model report pages in the form of the seed pages' Performance section.

For each run: a configuration table, its plots, the full result tables and its provenance;
then a summary of our points against the published ones (ratio per point) and of the runs
against each other. Values measured over several trials show their 95 % interval in the same
cell ("123.4 ± 5.6"). Written as Markdown and rendered to HTML beside it. The tables' columns
and headings are the perf columns' (``columns.TABLE_LABELS``, ``columns.INTERVAL_COLUMNS``).

Over 600 lines: one page's sections, which share its table and interval formatting.
"""

from __future__ import annotations

import html
import json
import math
import numbers
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from .chart_names import RunChart
from .columns import INTERVAL_COLUMNS, TABLE_LABELS
from .compare import (
    ENERGY,
    METRIC_HEADINGS,
    POINT,
    compare_frames,
    compared_columns,
    format_interval,
    measured,
    not_measured,
)
from .config import ConfigError, published_ran, reference_format, reference_model, reference_run
from .engines import describe as describe_engines
from .errors import ResultsError
from .stats import ratio_to
from .unmeasured import NOT_MEASURED, STATUS_COLUMNS, measured_columns


def published_rows(config: dict[str, Any], published: pd.DataFrame, run_path: str) -> pd.DataFrame:
    """The published rows that the run ``model/gpu/format/precision`` reproduces."""

    def reproduces(row: pd.Series) -> bool:
        try:
            return reference_run(config, row.to_dict()).path == run_path
        except ConfigError:
            return False

    # A published row resolves with its own gpu and precision (or the one that ran, where
    # models.<m>.published_ran says its label is not what ran): only those can match, and
    # resolving (a deep copy of the settings) all thousand rows per run is needless work.
    _, gpu, _, precision = run_path.split("/")
    labels = {precision} | set(_relabelled(config, run_path))
    candidates = published[(published["gpu"] == gpu) & published["precision"].isin(labels)]
    if candidates.empty:
        return candidates
    return with_measured_batches(config, candidates[candidates.apply(reproduces, axis=1)], run_path)


def with_measured_batches(
    config: dict[str, Any], rows: pd.DataFrame, run_path: str
) -> pd.DataFrame:
    """``rows`` (published rows of the run ``run_path``) with the batch the run measures each
    at where the seed page gives none (``RunPlan.batch_at``: the online tables of nnU-Net,
    ResNet-50 and FastPitch name only the concurrency), so that every such row joins the point
    that reproduces it (ratios, charts)."""
    missing = rows["batch"].isna() if "batch" in rows else pd.Series(False, index=rows.index)
    if not missing.any():
        return rows
    from .plan import plan_run  # (the plan reads the config's models: only when needed)

    plan = plan_run(config, *run_path.split("/"))
    filled = rows.copy()
    for index in rows.index[missing]:
        batch = plan.batch_at(str(rows.at[index, "scenario"]), int(rows.at[index, "concurrency"]))
        if batch is not None:
            filled.at[index, "batch"] = batch
    return filled


def _relabelled(config: dict[str, Any], run_path: str) -> dict[str, dict[str, str]]:
    """The published precision labels of the run's format that ran as the run's precision
    (``models.<m>.published_ran``): label → its entry."""
    model, _, fmt, precision = run_path.split("/")
    if model not in config["models"]:
        return {}
    labels = published_ran(config, model).get(fmt, {})
    return {label: e for label, e in labels.items() if e["precision"] == precision}


# The run's charts of its points and the published ones, per scenario.
PUBLISHED_CHARTS = {"offline": RunChart.PUBLISHED_OFFLINE, "online": RunChart.PUBLISHED_ONLINE}


def reference_rows(config: dict[str, Any], published: pd.DataFrame, run_path: str) -> pd.DataFrame:
    """For a run nothing was published for (:func:`published_rows` is empty: a CPU run, or a
    format or precision the seed page did not publish on that GPU), the published rows to show
    beside it for reference: the seed page's rows of the run's model and format, on the GPUs
    and in the precisions they were measured in; where its format has none, the rows of the
    model's other formats. Empty where the run has published rows of its own, or the model
    none at all. Rows whose model or format no entry here reproduces are never chosen."""
    if not published_rows(config, published, run_path).empty:
        return published.iloc[:0]
    model, _, fmt, _ = run_path.split("/")
    entries = _reproducing_entries(config, published)
    of_model = published[entries["model"] == model]
    of_format = of_model[entries.loc[of_model.index, "format"] == fmt]
    return of_format if not of_format.empty else of_model


def _reproducing_entries(config: dict[str, Any], published: pd.DataFrame) -> pd.DataFrame:
    """Per published row, the model and format entries that reproduce it (as
    :func:`deploybench.config.reference_run` resolves them; None where none does), on the
    rows' index."""
    keys = ["model", "dataset", "format", "accelerator"]
    rows = published.reindex(columns=keys).astype(object)
    rows = rows.where(rows.notna() & (rows != ""), None)  # no data set, no accelerator: None
    found: dict[tuple[Any, ...], tuple[str | None, str | None]] = {}

    def entry(find: Callable[..., str], *args: Any) -> str | None:
        try:
            return find(config, *args)
        except ConfigError:
            return None

    # a handful of distinct keys among a thousand rows: each resolved once
    for key in rows.itertuples(index=False, name=None):
        if key not in found:
            model, dataset, fmt, accelerator = key
            found[key] = (
                entry(reference_model, str(model), dataset),
                entry(reference_format, str(fmt), str(accelerator or "none")),
            )
    return pd.DataFrame(
        [found[key] for key in rows.itertuples(index=False, name=None)],
        index=published.index,
        columns=["model", "format"],
        dtype=object,
    )


def no_published_reason(config: dict[str, Any], run_path: str) -> str | None:
    """Why nothing can have been published for a run, where its device says it: a CPU run, or
    a GPU entry served by the python backend (`serving: python`: never the published
    configuration, whose GPU rows name other entries and so never match it)."""
    gpu = run_path.split("/")[1]
    settings = config["gpus"].get(gpu, {})
    if settings.get("device") == "cpu":
        return "the seed pages measured GPUs only"
    if settings.get("serving") == "python":
        return "served by the python backend, not the published configuration"
    return None


def reference_note(config: dict[str, Any], published: pd.DataFrame, run_path: str) -> str | None:
    """What a run's page says where nothing was published for it: which published rows its
    published charts show beside it instead (:func:`reference_rows`), and why no ratio."""
    if not published_rows(config, published, run_path).empty:
        return None
    reason = no_published_reason(config, run_path)
    why = f" ({reason})" if reason else ""
    rows = reference_rows(config, published, run_path)
    if rows.empty:
        return f"Nothing was published for {run_path}{why}, nor for its model."
    model, _, fmt, _ = run_path.split("/")
    formats = sorted(rows["format"].astype(str).unique())
    gpus = ", ".join(sorted(rows["gpu"].astype(str).unique()))
    instead = "" if fmt in formats else f" (it published no {fmt})"
    scenarios = [s for s in PUBLISHED_CHARTS if (rows["scenario"] == s).any()]
    charts = " and ".join(PUBLISHED_CHARTS[s] for s in scenarios)
    return (
        f"Nothing was published for {run_path}{why}. Its chart{'s' if len(scenarios) > 1 else ''} "
        f"{charts} show{'' if len(scenarios) > 1 else 's'} the seed page's {model} "
        f"{', '.join(formats)} rows{instead} on {gpus} in a panel of their own beside it, for "
        "reference only: another device or configuration, so no ratio."
    )


def publication_gate(
    config: dict[str, Any], run: Mapping[str, Any], provenance: dict[str, Any]
) -> tuple[list[str], list[str]]:
    """Why a run's rows are not set beside the published ones (none: they are), and the
    preflights that passed for it. A GPU run needs its images' preflight on its GPU to have
    passed (``run["preflight"]``: the reports; a failed preflight writes none); a model whose
    work depends on its weights or input (``models.<m>.published_needs``) needs the trained
    checkpoint and DLE's own perf input (``perf.input_data``), as its provenance records them,
    each the file the published rows used: its sha256 the pinned one (``checkpoint_sha256``:
    ``config.checkpoint_source``, the page's copy of the checkpoint's record;
    ``input_sha256``: ``config.inputs.raw_sha256``, the bytes sent). Not pinned (null) blocks
    too: any other file would pass."""
    blockers, passed = [], []
    for path in run.get("preflight") or []:
        report = read_json(path) if Path(path).is_file() else None
        if report is None or not report.get("ok"):
            blockers.append(f"the preflight {path} has not passed (`snakemake preflight`)")
        else:
            passed.append(f"{report['image']} on {report['gpu']} ({report.get('created')})")
    model = run["path"].split("/")[0]
    needs = (config["models"].get(model) or {}).get("published_needs") or {}
    measured = provenance.get("config") or {}
    setting = f"models.{model}.published_needs"
    if "checkpoint" in needs:
        blockers += _checkpoint_blockers(needs, measured, setting)
    if "input_data" in needs:
        blockers += _input_blockers(needs, measured, setting)
    return blockers, passed


def _checkpoint_blockers(
    needs: Mapping[str, Any], measured: Mapping[str, Any], setting: str
) -> list[str]:
    """Why a run's weights are not the published ones: seeded, not pinned, or another file."""
    if not measured.get("checkpoint"):
        return [f"its weights are seeded, not trained ({needs['checkpoint']})"]
    source = measured.get("checkpoint_source") or {}
    file, digest = source.get("file") or measured["checkpoint"], source.get("sha256")
    pinned = needs.get("checkpoint_sha256")
    if not pinned:
        recorded = f"sha256 {digest}" if digest else "sha256 not recorded"
        why = (
            f"its checkpoint is not pinned: {file} ({recorded}) is not known to be the one the "
            f"published rows used (set {setting}.checkpoint_sha256 to the sha256 of NGC's file)"
        )
    elif not digest:
        why = (
            f"its checkpoint {file} has no sha256 recorded (prepared before the workflow "
            f"recorded it: rerun prepare_checkpoint), so it is not known to be the pinned "
            f"{pinned} ({setting}.checkpoint_sha256)"
        )
    elif digest != pinned:
        why = (
            f"its checkpoint {file} has sha256 {digest}, not the pinned {pinned} "
            f"({setting}.checkpoint_sha256)"
        )
    else:
        return []
    return [why]


def _input_blockers(
    needs: Mapping[str, Any], measured: Mapping[str, Any], setting: str
) -> list[str]:
    """Why a run's perf input is not DLE's: not pinned, or other bytes than the pinned ones
    (``config.inputs.raw_sha256``: the example's values as DLE's raw files hold them, whether
    read from DLE's files, ``perf.input_data``, or made here)."""
    inputs = measured.get("inputs") or {}
    where = inputs.get("files") or inputs.get("source", "not recorded")
    pins = needs.get("input_sha256") or {}
    if not pins:
        why = (
            f"its perf input is not pinned: {where} is not known to be DLE's (set "
            f"{setting}.input_sha256 to its files' sha256, by input name)"
        )
        return [why]
    recorded = inputs.get("raw_sha256") or {}
    blockers = []
    for name, pinned in sorted(pins.items()):
        digest = recorded.get(name)
        if not digest:
            blockers.append(
                f"its perf input {name} ({where}) has no sha256 recorded (measured before the "
                f"workflow recorded it), so it is not known to be the pinned {pinned} "
                f"({setting}.input_sha256.{name})"
            )
        elif digest != pinned:
            blockers.append(
                f"its perf input is not DLE's: {name} ({where}) has sha256 {digest}, not the "
                f"pinned {pinned} ({setting}.input_sha256.{name}: {needs['input_data']})"
            )
    return blockers


def published_notes(config: dict[str, Any], published: pd.DataFrame, run_path: str) -> list[str]:
    """What a run's comparison with the published figures must say where the published label
    is not what was run (``models.<m>.published_ran``): for the run compared with rows labelled
    otherwise, their label and why; for the run of the label, that those rows are compared with
    another run. Nothing where no such published row exists for the run's gpu."""
    model, gpu, fmt, precision = run_path.split("/")
    if model not in config["models"]:
        return []
    notes = []
    matched = published_rows(config, published, run_path)
    for label, entry in _relabelled(config, run_path).items():
        if (matched["precision"] == label).any():
            notes.append(
                f"Compared with the published rows labelled {fmt} {label}, which ran "
                f"{precision}: {entry['note'].rstrip('.')}."
            )
    labelled = published_ran(config, model).get(fmt, {}).get(precision)
    if labelled is not None:
        ran = f"{model}/{gpu}/{fmt}/{labelled['precision']}"
        if (published_rows(config, published, ran)["precision"] == precision).any():
            notes.append(
                f"Not compared with the published rows labelled {fmt} {precision}, which ran "
                f"{labelled['precision']}: {labelled['note'].rstrip('.')}. They are compared with "
                f"{ran}" + ("; this run has no published figures." if matched.empty else ".")
            )
    return notes


# Measured over published: our value's column → the ratio's (its half-width: ``_ci95`` added).
RATIOS = {"throughput": "throughput_ratio", "p99_latency_ms": "p99_latency_ratio"}


def ratios(
    measured_rows: pd.DataFrame,
    published: pd.DataFrame,
    measure: Mapping[str, Any] | None = None,
) -> pd.DataFrame:
    """Measured over published throughput and p99 latency at every point both have, each
    ratio with its 95 % half-width (the measured interval over the exact published figure;
    NaN with one trial), and how many requests each side's p99 comes from
    (:func:`p99_requests`; ``measure``: the run's MEASURE_KEYS, None: not known)."""
    columns = [*POINT, "throughput_measured", "throughput_ci95", "throughput_published"]
    columns += [c for r in RATIOS.values() for c in (r, r + "_ci95")]
    columns += list(P99_REQUESTS)
    if measured_rows.empty or published.empty:
        return pd.DataFrame(columns=columns)
    values = list(RATIOS)
    # An older CSV lacks the interval columns (and `trials`): NaN, so no interval.
    intervals = [INTERVAL_COLUMNS[v] for v in values]
    ours = measured_rows.reindex(
        columns=[*POINT, *values, "trials", "measured_requests", *intervals]
    )
    both = ours.merge(published[[*POINT, *values]], on=POINT, suffixes=("_measured", "_published"))
    for value, ratio in RATIOS.items():
        pairs = [
            ratio_to(measured(_unsuffixed(row, "_measured"), value), row[value + "_published"])
            for row in both.to_dict("records")
        ]
        both[ratio] = [r for r, _ in pairs]
        both[ratio + "_ci95"] = [h for _, h in pairs]
    samples = [p99_requests(row, measure) for row in both.to_dict("records")]
    for i, column in enumerate(P99_REQUESTS):
        both[column] = [s[i] for s in samples]
    return both.drop(columns="measured_requests").sort_values(POINT).reset_index(drop=True)


# How many requests the p99 of each side comes from: ours, and the published one's as DLE's
# runner measured it (P99_SAMPLE_NOTE says how).
P99_REQUESTS = {
    "p99_requests": "p99 from (requests)",
    "p99_requests_published": "Published p99 from (requests)",
}
P99_SAMPLE_NOTE = (
    "*p99 from (requests)*: the requests of one trial's measured windows, which perf_analyzer's "
    "p99 is taken over (the point's p99 is the mean of its trials'); the published one's, as "
    "DLE's runner measured it: its windows without this project's duration floor "
    "(count_windows: `request_count` requests a window; time windows: the published rate over "
    "`measurement_interval_ms`), perf_analyzer's last {windows} windows. A p99 from many more "
    "requests is a steadier estimate of the same tail, not a different one."
)


def p99_requests(row: Mapping[str, Any], measure: Mapping[str, Any] | None) -> tuple[float, float]:
    """(ours, the published one's): the requests one trial's p99 was taken over
    (``measured_requests`` is every trial's: over ``trials``), and those DLE's runner's
    windows held at the published point (``measure``: the run's settings without the duration
    floor, which are DLE's: :data:`P99_SAMPLE_NOTE`). NaN where not known."""
    from .perf import WINDOWS, MeasureSettings

    nan = float("nan")
    requests, trials = _float(row.get("measured_requests")), _float(row.get("trials"))
    ours = requests / trials if trials > 0 else nan  # (NaN where either is missing)
    if measure is None:
        return ours, nan
    settings = MeasureSettings(**measure)
    if not settings.time_windows:
        return ours, float(settings.request_count * WINDOWS)
    rate = _float(row.get("throughput_published"))
    if math.isnan(rate):
        return ours, nan
    per_second = rate / int(row["batch"])
    return ours, float(math.ceil(per_second * settings.measurement_interval_ms / 1000) * WINDOWS)


def _unsuffixed(row: Mapping[str, Any], suffix: str) -> dict[str, Any]:
    return {k.removesuffix(suffix): v for k, v in row.items()}


def markdown_table(
    frame: pd.DataFrame,
    columns: Mapping[str, str],
    intervals: Mapping[str, str] = INTERVAL_COLUMNS,
) -> str:
    """``frame``'s ``columns`` (column → heading) as a Markdown table; a column with an
    interval column in ``intervals`` (value → half-width) shows both in its cells: "x ± h"."""
    present = {k: v for k, v in columns.items() if k in frame.columns}
    lines = [
        "| " + " | ".join(present.values()) + " |",
        "|" + "---|" * len(present),
    ]
    for _, row in frame.iterrows():
        cells = []
        for k in present:
            half = intervals.get(k)
            if half in frame.columns and _is_number(row[k]):
                cells.append(format_interval(float(row[k]), _float(row[half])))
            else:
                cells.append(_cell(row[k]))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _float(value: Any) -> float:
    return float(value) if _is_number(value) else float("nan")


def _cell(value: Any) -> str:
    if isinstance(value, float):
        if pd.isna(value):
            return ""
        # a count (requests) in full, not as 1.5e+04
        return str(int(value)) if value.is_integer() and abs(value) >= 1e4 else f"{value:.4g}"
    return str(value)


def trt_engines_text(engines: Mapping[str, Any]) -> str:
    """A TF-TRT conversion's engines, e.g. "3 TRTEngineOp nodes, 3 with an engine (3 engines)"."""
    ops, built = engines.get("trt_engine_ops"), engines.get("ops_with_engine")
    text = f"{ops} TRTEngineOp nodes, {built} with an engine ({engines.get('engines')} engines)"
    if "tf_ops" in engines:  # recorded since the conversion counts them
        types = ", ".join(f"{op} {n}" for op, n in (engines.get("tf_op_types") or {}).items())
        text += f"; {engines['tf_ops']} ops left to TensorFlow" + (f" ({types})" if types else "")
    if "trt_ops" in engines:  # the compute the engines took, recorded since it is counted
        text += f", {engines['trt_ops']} in the engines"
    return text


def transport_text(frame: pd.DataFrame) -> str | None:
    """How perf_analyzer reached Triton in a scenario, from its CSV rows (``protocol``,
    ``shared_memory``; absent in a CSV written before them)."""
    if frame.empty or "protocol" not in frame or "shared_memory" not in frame:
        return None
    protocol, shared = str(frame["protocol"].iloc[0]), str(frame["shared_memory"].iloc[0])
    names = {"http": "HTTP", "grpc": "gRPC"}
    memory = "no shared memory" if shared == "none" else f"{shared} shared memory"
    return f"{names.get(protocol, protocol)}, {memory}"


def configuration_table(
    provenance: dict[str, Any], transports: Mapping[str, str | None] | None = None
) -> str:
    """The seed pages' "Configuration" table, from a perf result's provenance; ``transports``:
    scenario → how perf_analyzer reached Triton (:func:`transport_text`)."""
    config = provenance["config"]
    measure = config.get("measure", {})
    rows = {
        "GPU": config.get("gpu_name"),
        "Backend": config.get("backend"),
        "Runtime": config.get("runtime"),
        "Accelerator": config.get("accelerator") or "none",
        "Precision": config.get("precision"),
        "Model format": config.get("format"),
        "Max batch size": config.get("max_batch_size"),
        "Number of model instances": config.get("model_instances"),
        "Dataset": config.get("dataset"),
        "Measurement mode": measure.get("measurement_mode"),
        "Request count": measure.get("request_count"),
        "Measurement interval (ms)": measure.get("measurement_interval_ms"),
        "Trials per point": measure.get("trials"),
        "Trial duration, floor to cap (ms)": (
            f"{measure['min_duration_ms']} to {measure['max_duration_ms']}"
            if "min_duration_ms" in measure
            else None
        ),
        "Stable: throughput interval within (%)": measure.get("max_ci_pct"),
    }
    engines = (provenance.get("conversion") or {}).get("trt_engines")
    if engines:  # TF-TRT: what of the model TensorRT runs (deploybench.convert.trt_engine_counts)
        rows["TF-TRT engines"] = trt_engines_text(engines)
    layout = describe_engines(config)
    if layout:  # trt, onnx-trt: one engine per batch size or one shared (deploybench.engines)
        rows["TensorRT engines"] = layout
    for scenario, text in (transports or {}).items():
        if text:  # as DLE's runner for the model (deploybench.transport)
            rows[f"Transport, {scenario}"] = text
    fallback = (config.get("transport") or {}).get("fallback")
    if fallback:  # CUDA shared memory on a CPU device: the row differs from DLE's
        rows["Transport differs"] = fallback
    lines = ["| Parameter | Value |", "|---|---|"]
    lines += [f"| {k} | {'' if v is None else v} |" for k, v in rows.items()]
    return "\n".join(lines)


def provenance_summary(provenance: dict[str, Any]) -> str:
    software = provenance.get("software", {})
    container = provenance.get("container", {})
    host = provenance.get("host", {})
    git = provenance.get("git", {})
    gpus = ", ".join(host.get("gpus") or []) or "none"
    digest = f" (sha256 `{container['sha256'][:16]}…`)" if container.get("sha256") else ""
    server = (provenance.get("tritonserver") or {}).get("version")
    items = [
        f"created {provenance.get('created')}",
        f"host `{host.get('hostname')}` ({host.get('cpu')}, {host.get('cpu_count')} CPUs, GPUs: {gpus})",
        f"container: {container.get('image') or container.get('runtime')}{digest}",
        f"tritonserver {server}, perf_analyzer {provenance.get('perf_analyzer')}",
        "software: " + ", ".join(f"{k} {v}" for k, v in software.items() if v),
        f"git {git.get('commit')}" + (" (dirty)" if git.get("dirty") else ""),
    ]
    return "\n".join(f"- {item}" for item in items)


def chart_image(png: str, alt: str | None = None) -> str:
    """A chart on a page: its PNG (``alt``: its stem), linked to the interactive HTML page
    beside it (``plots.save`` writes both; the HTML carries its own JavaScript)."""
    path = Path(png)
    return f"[![{alt or path.stem}]({png})]({path.with_suffix('.html').as_posix()})"


def chart_or_why(png: str, not_drawn: Mapping[str, str]) -> str:
    """A chart on a page (:func:`chart_image`), or where it had nothing to draw (its name in
    ``not_drawn``: ``plots.not_drawn``) the sentence that says why, in its place."""
    name = Path(png).stem
    if name in not_drawn:
        return f"*{name}: not drawn:* {not_drawn[name]}."
    return chart_image(png)


# The meters' columns (their status says why one is empty: energy_status, triton_energy_status):
# a point without a value says "not measured" in their cells.
METERED = frozenset(STATUS_COLUMNS)
# The columns a results table shows whatever they hold: the point, its throughput and trials,
# and the p99 estimate (where it is empty, the "†" note under the table says why, point by point).
ALWAYS_SHOWN = (*POINT, "throughput", "p99_bound_ms", "trials", "stable")
# The p99 a point's tail_note (too few requests for an estimate) is marked in, and the mark.
TAIL_MARKED = "p99_latency_ms"
TAIL_MARK = "†"
# What each meter's counter measures (a measured point's energy_status).
METERS = {
    "nvml": "the GPU's board energy (NVML's total energy counter, nvmlDeviceGetTotalEnergyConsumption)",
    "rapl": "the CPU's package energy (RAPL's energy counter, intel-rapl package domains)",
}


def results_table(frame: pd.DataFrame) -> str:
    """A scenario's points as the seed pages' table (``columns.TABLE_LABELS``), each value with
    its 95 % interval. A column no point measured is left out, and a line under the table says
    which and why (:func:`deploybench.unmeasured.measured_columns`: on the CPU default, the
    energy columns); in a column some point measured, the energy cell of a point without a value
    says "not measured". A p99 whose tail rests on too few requests (its ``tail_note``) is
    marked "†", said under the table, after what the p99 early-stopping estimate is and which
    of its assumptions the table's points break (:func:`estimate_footnote`)."""
    columns, left_out = measured_columns(frame, TABLE_LABELS, keep=ALWAYS_SHOWN)
    rows = frame.copy()
    for column in METERED & set(columns):
        rows[column] = rows[column].astype(object).where(rows[column].notna(), NOT_MEASURED)
    notes = _notes(rows)
    if TAIL_MARKED in rows.columns and notes.any():
        half = rows.get(INTERVAL_COLUMNS[TAIL_MARKED], pd.Series(math.nan, index=rows.index))
        rows[TAIL_MARKED] = [
            f"{format_interval(_float(v), _float(h))} {TAIL_MARK}" if note and _is_number(v) else v
            for v, h, note in zip(rows[TAIL_MARKED], half, notes, strict=True)
        ]
    parts = [markdown_table(rows, columns)]
    notes_below = [left_out, estimate_footnote(frame), tail_footnote(frame)]
    return "\n\n".join([*parts, *(n for n in notes_below if n)])


# The pooled p99's early-stopping estimate (deploybench.tails.early_stopping_bound).
ESTIMATED = "p99_bound_ms"


def _largest(frame: pd.DataFrame, column: str) -> int:
    """The largest whole number in ``column`` (1 where it has none)."""
    if column not in frame.columns:
        return 1
    numbers = pd.to_numeric(frame[column], errors="coerce").dropna()
    return int(numbers.max()) if len(numbers) else 1


def estimate_footnote(frame: pd.DataFrame) -> str | None:
    """What the p99 early-stopping estimate is and, for this table's points, whether the
    assumption behind its confidence holds (independent queries, one at a time); None where
    the table has no estimate."""
    if ESTIMATED not in frame.columns:
        return None
    if not pd.to_numeric(frame[ESTIMATED], errors="coerce").notna().any():
        return None
    concurrency, trials = _largest(frame, "concurrency"), _largest(frame, "trials")
    text = (
        f"{TABLE_LABELS[ESTIMATED]}: MLPerf loadgen's SingleStream early-stopping estimate "
        "of the p99 at 99 % confidence (mlcommons/inference loadgen/early_stopping.cc, "
        "results.cc) over the requests of a point's trials pooled. That confidence assumes "
        "independent queries issued one at a time"
    )
    why = []
    if concurrency > 1:
        why.append(
            f"run at concurrency up to {concurrency} (requests overlap and queue behind each other)"
        )
    if trials > 1:
        why.append(f"pool up to {trials} trials")
    if not why:
        return text + "; here requests are one at a time, their independence assumed."
    return (
        f"{text}; these points {' and '.join(why)}, so it is that rule's estimate, not a "
        "99 % confidence bound."
    )


def _notes(frame: pd.DataFrame) -> pd.Series:
    """Each row's tail_note, "" where it has none (an empty CSV cell, a CSV without it)."""
    if "tail_note" not in frame.columns:
        return pd.Series("", index=frame.index, dtype=object)
    return frame["tail_note"].map(lambda v: "" if _missing(v) else str(v))


def tail_footnote(frame: pd.DataFrame) -> str | None:
    """What the "†" of a table's p99s means: each marked point and its tail_note."""
    notes = _notes(frame)
    if not notes.any():
        return None
    said = [
        f"batch {_integer(row.get('batch'))} concurrency {_integer(row.get('concurrency'))}: {note}"
        for row, note in zip(frame.to_dict("records"), notes, strict=True)
        if note
    ]
    return (
        f"{TAIL_MARK} p99 from fewer requests than loadgen's early-stopping estimate needs "
        f"(its column, {TABLE_LABELS[ESTIMATED]}, is empty there): " + "; ".join(said) + "."
    )


def energy_note(
    offline: pd.DataFrame, online: pd.DataFrame, provenance: Mapping[str, Any] | None = None
) -> str:
    """What the run's energy columns hold: which meter's counter measured them (NVML's board
    energy, RAPL's package energy) and the idle power, or why nothing did; the points a thermal
    or hardware slowdown held down (also unstable: ``unstable_reason`` says so), and those held
    at the power limit (reported only)."""
    scenarios = {"offline": offline, "online": online}
    measured_rows = {s: _with_energy(f) for s, f in scenarios.items()}
    both = pd.concat(measured_rows.values(), ignore_index=True)
    meters = list(dict.fromkeys(str(m) for m in _column(both, "energy_status") if not _missing(m)))
    sentences = []
    if meters:
        which = " and ".join(METERS.get(m, m) for m in meters)
        sentences.append(
            f"Energy per inference is {which}, differenced over each trial's measured windows "
            "and divided by the inferences they completed (the trials' mean ± 95 %); above "
            "idle: less the idle power over the same seconds."
        )
        idle = _idle(both)
        limit = _watts(both, "power_limit_w", "{:.0f} W")
        said = (
            f"Idle power {idle} (the server loaded, no load; the above-idle intervals carry "
            "its uncertainty)"
            if idle
            else "Idle power not measured"
        )
        sentences.append(said + (f"; power limit {limit}." if limit else "."))
        facts = ((provenance or {}).get("energy") or {}).get("meter_facts") or {}
        named = [str(facts[k]) for k in ("name", "uuid", "driver") if facts.get(k)]
        if named:
            sentences.append(f"Meter: {', '.join(named)}.")
        throttled = [
            f"{scenario} {_point_name(row)}"
            + ("" if _missing(row.get("throttle_reasons")) else f" ({row['throttle_reasons']})")
            for scenario, frame in measured_rows.items()
            for row in frame.to_dict("records")
            if _true(row.get("throttled"))
        ]
        if throttled:
            sentences.append(
                f"A thermal or hardware slowdown, so unstable: {'; '.join(throttled)}."
            )
        elif "throttled" in both.columns and both["throttled"].notna().any():
            sentences.append("No thermal or hardware slowdown.")
        capped = [
            f"{scenario} {_point_name(row)} ({fraction * 100:.3g} % of the windows)"
            for scenario, frame in measured_rows.items()
            for row in frame.to_dict("records")
            if (fraction := _fraction(row.get("throttle_power_cap_fraction"))) > 0
        ]
        if capped:
            sentences.append(
                "Held at the power limit (sw power cap; reported, not a reason to call a point "
                f"unstable): {'; '.join(capped)}."
            )
    for scenario, frame in scenarios.items():
        reasons = not_measured(frame)
        if reasons:
            some = "" if measured_rows[scenario].empty else ", some points"
            sentences.append(f"{scenario.capitalize()}{some}: energy {'; '.join(reasons)}.")
    return " ".join(sentences) or "No points: no energy."


def _with_energy(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows of ``frame`` that hold an energy per inference."""
    if ENERGY not in frame.columns:
        return frame.iloc[:0]
    return frame[pd.to_numeric(frame[ENERGY], errors="coerce").notna()]


def _column(frame: pd.DataFrame, column: str) -> pd.Series:
    return frame[column] if column in frame.columns else pd.Series(dtype=object)


def _watts(frame: pd.DataFrame, column: str, form: str) -> str:
    """The distinct values of a watts column, formatted, joined; "" when it has none."""
    values = pd.to_numeric(_column(frame, column), errors="coerce").dropna()
    return ", ".join(sorted({form.format(v) for v in values}))


def _idle(frame: pd.DataFrame) -> str:
    """The distinct idle powers of the rows, each with its 95 % half-width where it has one."""
    said = set()
    for row in frame.to_dict("records"):
        power = pd.to_numeric(row.get("idle_power_w"), errors="coerce")
        if pd.isna(power):
            continue
        half = pd.to_numeric(row.get("idle_power_ci95_w"), errors="coerce")
        said.add(f"{power:.1f} W" if pd.isna(half) else f"{power:.1f} ± {half:.1f} W")
    return ", ".join(sorted(said))


def _fraction(value: Any) -> float:
    number = pd.to_numeric(value, errors="coerce")
    return 0.0 if pd.isna(number) else float(number)


def _point_name(row: Mapping[str, Any]) -> str:
    return f"batch {_integer(row.get('batch'))} concurrency {_integer(row.get('concurrency'))}"


def run_section(
    run_path: str,
    offline: pd.DataFrame,
    online: pd.DataFrame,
    provenance: dict[str, Any],
    plots: Iterable[str],
    not_drawn: Mapping[str, str] | None = None,
) -> str:
    """One run's part of the page: its configuration, its charts (``plots``: their PNGs; a
    chart in ``not_drawn``, name → why, had nothing to draw: the sentence in its place), its
    tables, energy and provenance."""
    parts = [
        f"## {run_path}",
        "### Configuration",
        configuration_table(
            provenance, {"offline": transport_text(offline), "online": transport_text(online)}
        ),
        "### Plots",
        *[chart_or_why(p, not_drawn or {}) for p in plots],
        "### Offline: static batching, concurrency 1",
        results_table(offline),
        "### Online: dynamic batching over concurrency",
        results_table(online),
        "### Energy",
        energy_note(offline, online, provenance),
        "### Provenance",
        provenance_summary(provenance),
    ]
    return "\n\n".join(parts)


def summary_section(
    comparisons: dict[str, pd.DataFrame], notes: Mapping[str, Sequence[str]] | None = None
) -> str:
    """Measured vs published, ratio per point, for every run; ``notes`` (run → lines, from
    :func:`published_notes`) stand under the run's heading, beside its table."""
    parts = ["## Measured vs published"]
    columns = {
        "scenario": "Scenario",
        "batch": "Batch",
        "concurrency": "Concurrency",
        "throughput_measured": "Measured inferences/s",
        "throughput_published": "Published inferences/s",
        "throughput_ratio": "Throughput ratio",
        "p99_latency_ratio": "p99 latency ratio",
        **P99_REQUESTS,
    }
    intervals = {"throughput_measured": "throughput_ci95"}
    intervals |= {ratio: ratio + "_ci95" for ratio in RATIOS.values()}
    for run_path, table in comparisons.items():
        parts.append(f"### {run_path}")
        parts += [f"*Note:* {note}" for note in (notes or {}).get(run_path, ())]
        if table.empty:
            parts.append("No published figures for this configuration.")
        else:
            parts.append(markdown_table(table, columns, intervals))
    if any(not table.empty for table in comparisons.values()):
        from .perf import WINDOWS

        parts.append(P99_SAMPLE_NOTE.format(windows=WINDOWS))
    return "\n\n".join(parts)


def between_runs(frames: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """Each run's points against the first listed run that measured the same point (scenario,
    batch, concurrency): :func:`deploybench.compare.compare_frames`, with ``run`` and
    ``against`` in front."""
    order = list(frames)
    parts = []
    for i, run in enumerate(order[1:], start=1):
        remaining = frames[run]
        for earlier in order[:i]:
            if remaining.empty:  # every point compared already
                break
            compared = compare_frames(frames[earlier], remaining, POINT)
            if not compared.empty:
                parts.append(compared.assign(run=run, against=earlier))
            # A point is compared once, against the first run that has it.
            done = set(compared[POINT].itertuples(index=False))
            keep = [p not in done for p in remaining[POINT].itertuples(index=False)]
            remaining = remaining.loc[pd.Series(keep, index=remaining.index, dtype=bool)]
    columns = ["run", "against", *compared_columns(POINT)]
    if not parts:
        return pd.DataFrame(columns=columns)
    return pd.concat(parts, ignore_index=True).reindex(columns=columns)


def between_runs_section(frames: Mapping[str, pd.DataFrame]) -> str:
    """The runs of a page against each other, point by point."""
    parts = ["## Between runs"]
    if len(frames) < 2:
        parts.append("One run on this page: nothing to compare.")
        return "\n\n".join(parts)
    table = between_runs(frames)
    if table.empty:
        parts.append("No point was measured by two runs.")
        return "\n\n".join(parts)
    parts.append(
        "Each run against the first listed run that measured the same point: the ratio of "
        "their means ± its 95 % half-width, and whether the difference lies outside the two "
        "intervals combined (faster, slower; *no interval*: one trial or an older CSV)."
    )
    columns = {"run": "Run", "against": "Against", **{p: p.capitalize() for p in POINT}}
    for metric, label in METRIC_HEADINGS.items():
        columns[f"{metric}_ratio"] = f"{label} ratio"
        columns[f"{metric}_verdict"] = f"{label} change"
    intervals = {f"{m}_ratio": f"{m}_ratio_ci95" for m in METRIC_HEADINGS}
    parts.append(markdown_table(table, columns, intervals))
    return "\n\n".join(parts)


def render_html(markdown: str, title: str) -> str:
    from markdown_it import MarkdownIt

    body = MarkdownIt("commonmark").enable("table").render(markdown)
    return (
        "<!DOCTYPE html>\n<html><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title>"
        "<style>body{font-family:sans-serif;max-width:72em;margin:auto}"
        "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:2px 6px}"
        "img{max-width:100%}</style></head><body>\n"
        f"{body}</body></html>\n"
    )


def read_json(path: str | Path) -> dict[str, Any]:
    return dict(json.loads(Path(path).read_text()))


# --- the serving-configuration search ---------------------------------------------------------

# A search's candidates table (search.csv): column → heading, in the report's order. The
# settings and the point are integers; the measured values carry their ``_ci95`` intervals.
SEARCH_COLUMNS = {
    "variant": "Variant",
    "model_instances": "Instances",
    "max_batch_size": "Max batch",
    "preferred_batch_sizes": "Preferred batch sizes",
    "max_queue_delay_us": "Queue delay (µs)",
    "intra_op_threads": "Threads",
    "concurrency": "Best point (concurrency)",
    "throughput": "Inferences/Second",
    "p99_latency_ms": "p99 latency (ms)",
    "energy_per_inference_j": "Energy per inference (J)",
    "stable": "Stable",
    "verdict": "Verdict",
    "gain": "Gain over baseline (x)",
}
SEARCH_INTERVALS = {
    c: c + "_ci95" for c in ("throughput", "p99_latency_ms", "energy_per_inference_j", "gain")
}
SEARCH_INTEGERS = (
    "model_instances",
    "max_batch_size",
    "max_queue_delay_us",
    "intra_op_threads",
    "concurrency",
)
# What the section cannot do without; the rest (intervals, threads, stable) may be missing.
SEARCH_NEEDED = [
    c for c in SEARCH_COLUMNS if c not in ("intra_op_threads", "stable", "energy_per_inference_j")
]
SEARCH_NEEDED += ["baseline", "chosen"]
CHOICE_NEEDED = ("variant", "baseline", "strategy", "candidates")


def search_section(
    run_path: str,
    candidates: pd.DataFrame,
    choice: Mapping[str, Any],
    chart: str | None,
    nested: bool = False,
) -> str:
    """The serving-configuration search of one run: what was searched, what it chose and by how
    much it beats the baseline, its chart and the candidates' table.

    ``candidates``: search.csv; ``choice``: best/choice.json; ``chart``: the Pareto chart's
    image path relative to the page (None: no image). The section's heading is "## Search:
    <run>", or with ``nested`` "### Serving-configuration search" (under the run's own heading).
    """
    missing = [c for c in SEARCH_NEEDED if c not in candidates.columns]
    if missing:
        raise ResultsError(
            f"search candidates lack columns {missing}; have {sorted(map(str, candidates.columns))}"
        )
    lacking = [k for k in CHOICE_NEEDED if k not in choice]
    if lacking:
        raise ResultsError(f"search choice lacks keys {lacking}; has {sorted(choice)}")
    heading = "### Serving-configuration search" if nested else f"## Search: {run_path}"
    parts = [heading, _searched(choice) + " " + _chosen(choice)]
    if chart is not None:
        parts.append(chart_image(chart, "search pareto"))
    parts.append(
        "Each candidate at its best point: the most throughput within the budget (the least "
        "energy per inference under the energy objective; empty when none was); its gain is "
        "that over the baseline's (throughput, or inferences per joule), ± its 95 % half-width."
    )
    parts.append(markdown_table(_search_rows(candidates), SEARCH_COLUMNS, SEARCH_INTERVALS))
    return "\n\n".join(parts)


def _searched(choice: Mapping[str, Any]) -> str:
    """What the search looked for: "Searched 6 serving configurations (grid strategy) for the most
    throughput with p99 latency within 50 ms and at least 100 inferences/s."."""
    budget, floor = choice.get("latency_budget_ms"), choice.get("min_throughput")
    within = (
        "with no p99 latency budget"
        if _missing(budget)
        else f"with p99 latency within {budget:g} ms"
    )
    if not _missing(floor):
        within += f" and at least {floor:g} inferences/s"
    n = choice["candidates"]
    goal = (
        "the least energy per inference"
        if choice.get("objective") == "energy"
        else "the most throughput"
    )
    return (
        f"Searched {n} serving configuration{'s' if n != 1 else ''} ({choice['strategy']} "
        f"strategy) for {goal} {within}."
    )


def _chosen(choice: Mapping[str, Any]) -> str:
    """The choice, its point, its measured values and its gain over the baseline."""
    variant, baseline = choice["variant"], choice["baseline"]
    if _missing(variant):
        return "No candidate met the budget and the floor: nothing was chosen."
    point = choice.get("point") or {}
    at = ", ".join(
        f"{key} {point[key]}" for key in ("concurrency", "batch") if not _missing(point.get(key))
    )
    text = f"Chosen: `{variant}`" + (f" at {at}" if at else "")
    measured_values = [
        f"{_interval(choice.get(key))}{unit}"
        for key, unit in (
            ("throughput", " inferences/s"),
            ("p99_latency_ms", " ms p99"),
            ("energy_per_inference_j", " J/inference"),
        )
        if _interval(choice.get(key))
    ]
    if measured_values:
        text += " (" + ", ".join(measured_values) + ")"
    if variant == baseline:
        return text + ": the baseline itself."
    text += f"; over the baseline `{baseline}`: " + _gain(choice.get("gain") or {})
    return text + "."


def _gain(gain: Mapping[str, Any]) -> str:
    """The gain as "x1.23 ± 0.05 (significant)", "(not significant)" or "(no interval)";
    none without a ratio."""
    ratio = _float(gain.get("ratio"))
    if math.isnan(ratio):
        # search.py leaves it out when the baseline meets no constraint: nothing to compare.
        return "no gain (the baseline meets no constraint)"
    half = _float(gain.get("ci95"))
    text = "x" + format_interval(ratio, half)
    if math.isnan(half):
        return text + " (no interval)"
    return text + (" (significant)" if gain.get("significant") else " (not significant)")


def _interval(value: Any) -> str:
    """A choice.json ``{"mean", "ci95"}`` as "x ± h"; "" when it has no mean."""
    if not isinstance(value, Mapping):
        return ""
    return format_interval(_float(value.get("mean")), _float(value.get("ci95")))


def _search_rows(candidates: pd.DataFrame) -> pd.DataFrame:
    """The candidates as the table shows them: the baseline and the choice labelled after their
    variant, integers without ".0" (a column with gaps reads as floats), empty cells for what a
    candidate lacks (no point within the budget, no threads on a GPU)."""
    rows = candidates.copy()
    labels = [
        ", ".join(role for role in ("baseline", "chosen") if _true(row[role]))
        for _, row in rows.iterrows()
    ]
    rows["variant"] = [
        f"{variant} ({label})" if label else str(variant)
        for variant, label in zip(rows["variant"], labels, strict=True)
    ]
    for column in SEARCH_INTEGERS:
        if column in rows.columns:
            rows[column] = rows[column].map(_integer)
    rows["preferred_batch_sizes"] = rows["preferred_batch_sizes"].map(
        lambda v: "" if _missing(v) else _integer(v) if _is_number(v) else str(v)
    )
    for column in ("stable", "verdict"):
        if column in rows.columns:
            rows[column] = rows[column].map(lambda v: "" if _missing(v) else str(v))
    # Stability is the best point's: none without one (whatever the CSV says).
    if "stable" in rows.columns:
        rows.loc[pd.to_numeric(rows["throughput"], errors="coerce").isna(), "stable"] = ""
    # A GPU run has no CPU threads setting: no column of empty cells.
    if "intra_op_threads" in rows.columns and (rows["intra_op_threads"] == "").all():
        rows = rows.drop(columns="intra_op_threads")
    for value, interval in SEARCH_INTERVALS.items():
        rows[value] = pd.to_numeric(rows.get(value, float("nan")), errors="coerce")
        rows[interval] = pd.to_numeric(rows.get(interval, float("nan")), errors="coerce")
    # Energy not measured (or a search.csv from before it): no column of empty cells.
    if rows["energy_per_inference_j"].isna().all():
        rows = rows.drop(columns=["energy_per_inference_j", "energy_per_inference_j_ci95"])
    return rows


def _integer(value: Any) -> str:
    """``4``, ``4.0`` or ``"4"`` as "4"; a missing value as ""; anything else as it is."""
    if _missing(value):
        return ""
    number = pd.to_numeric(value, errors="coerce")
    if _is_number(number) and float(number).is_integer():
        return str(int(number))
    return str(value)


def _missing(value: Any) -> bool:
    """None, NaN or a blank string (an empty CSV cell)."""
    if isinstance(value, str):
        return not value.strip()
    return value is None or (_is_number(value) and math.isnan(float(value)))


def _true(value: Any) -> bool:
    """A flag from a CSV: a bool, or "True" when its column also has gaps."""
    if isinstance(value, str):
        return value.strip().lower() == "true"
    return not _missing(value) and bool(value)
