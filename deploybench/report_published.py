"""Our points beside the published ones: the seed page's rows a run reproduces (or, where it
reproduces none, those shown beside it for reference), whether its rows may be set beside them
(publication_gate), what the comparison must note where the published label is not what ran,
and the ratios per point with the page's "Measured vs published" section.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from .chart_names import RunChart
from .columns import INTERVAL_COLUMNS
from .compare import POINT, measured
from .planning.workflow_config import (
    ConfigError,
    published_ran,
    reference_format,
    reference_model,
    reference_run,
)
from .report import read_json
from .report_cells import as_float, markdown_table
from .stats import ratio_to


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
    from .planning.run_plan import (
        plan_run,  # (the plan reads the config's models: only when needed)
    )

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
    :func:`deploybench.planning.workflow_config.reference_run` resolves them; None where none does), on the
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
    requests, trials = as_float(row.get("measured_requests")), as_float(row.get("trials"))
    ours = requests / trials if trials > 0 else nan  # (NaN where either is missing)
    if measure is None:
        return ours, nan
    settings = MeasureSettings(**measure)
    if not settings.time_windows:
        return ours, float(settings.request_count * WINDOWS)
    rate = as_float(row.get("throughput_published"))
    if math.isnan(rate):
        return ours, nan
    per_second = rate / int(row["batch"])
    return ours, float(math.ceil(per_second * settings.measurement_interval_ms / 1000) * WINDOWS)


def _unsuffixed(row: Mapping[str, Any], suffix: str) -> dict[str, Any]:
    return {k.removesuffix(suffix): v for k, v in row.items()}


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
