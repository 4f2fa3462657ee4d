"""Per-model report pages in the form of the seed pages' Performance section.

For each run: a configuration table, its plots, the full result tables and its provenance;
then a summary of our points against the published ones (ratio per point) and of the runs
against each other. Values measured over several trials show their 95 % interval in the same
cell ("123.4 ± 5.6"). Written as Markdown and rendered to HTML beside it.
"""

from __future__ import annotations

import html
import json
import numbers
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from .columns import INTERVAL_COLUMNS, TABLE_LABELS
from .compare import (
    METRIC_HEADINGS,
    POINT,
    compare_frames,
    compared_columns,
    format_interval,
    measured,
)
from .config import ConfigError, reference_run
from .stats import ratio_to


def published_rows(config: dict[str, Any], published: pd.DataFrame, run_path: str) -> pd.DataFrame:
    """The published rows that the run ``model/gpu/format/precision`` reproduces."""

    def reproduces(row: pd.Series) -> bool:
        try:
            return reference_run(config, row.to_dict()).path == run_path
        except ConfigError:
            return False

    # A published row resolves with its own gpu and precision: only those can match, and
    # resolving (a deep copy of the settings) all thousand rows per run is needless work.
    _, gpu, _, precision = run_path.split("/")
    candidates = published[(published["gpu"] == gpu) & (published["precision"] == precision)]
    if candidates.empty:
        return candidates
    return candidates[candidates.apply(reproduces, axis=1)]


# Measured over published: our value's column → the ratio's (its half-width: ``_ci95`` added).
RATIOS = {"throughput": "throughput_ratio", "p99_latency_ms": "p99_latency_ratio"}


def ratios(measured_rows: pd.DataFrame, published: pd.DataFrame) -> pd.DataFrame:
    """Measured over published throughput and p99 latency at every point both have, each
    ratio with its 95 % half-width (the measured interval over the exact published figure;
    NaN with one trial)."""
    columns = [*POINT, "throughput_measured", "throughput_ci95", "throughput_published"]
    columns += [c for r in RATIOS.values() for c in (r, r + "_ci95")]
    if measured_rows.empty or published.empty:
        return pd.DataFrame(columns=columns)
    values = list(RATIOS)
    # An older CSV lacks the interval columns (and `trials`): NaN, so no interval.
    intervals = [INTERVAL_COLUMNS[v] for v in values]
    ours = measured_rows.reindex(columns=[*POINT, *values, "trials", *intervals])
    both = ours.merge(published[[*POINT, *values]], on=POINT, suffixes=("_measured", "_published"))
    for value, ratio in RATIOS.items():
        pairs = [
            ratio_to(measured(_unsuffixed(row, "_measured"), value), row[value + "_published"])
            for row in both.to_dict("records")
        ]
        both[ratio] = [r for r, _ in pairs]
        both[ratio + "_ci95"] = [h for _, h in pairs]
    return both.sort_values(POINT).reset_index(drop=True)


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
        return "" if pd.isna(value) else f"{value:.4g}"
    return str(value)


def configuration_table(provenance: dict[str, Any]) -> str:
    """The seed pages' "Configuration" table, from a perf result's provenance."""
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


def run_section(
    run_path: str,
    offline: pd.DataFrame,
    online: pd.DataFrame,
    provenance: dict[str, Any],
    plots: Iterable[str],
) -> str:
    parts = [
        f"## {run_path}",
        "### Configuration",
        configuration_table(provenance),
        "### Plots",
        *[f"![{Path(p).stem}]({p})" for p in plots],
        "### Offline: static batching, concurrency 1",
        markdown_table(offline, TABLE_LABELS),
        "### Online: dynamic batching over concurrency",
        markdown_table(online, TABLE_LABELS),
        "### Provenance",
        provenance_summary(provenance),
    ]
    return "\n\n".join(parts)


def summary_section(comparisons: dict[str, pd.DataFrame]) -> str:
    """Measured vs published, ratio per point, for every run."""
    parts = ["## Measured vs published"]
    columns = {
        "scenario": "Scenario",
        "batch": "Batch",
        "concurrency": "Concurrency",
        "throughput_measured": "Measured inferences/s",
        "throughput_published": "Published inferences/s",
        "throughput_ratio": "Throughput ratio",
        "p99_latency_ratio": "p99 latency ratio",
    }
    intervals = {"throughput_measured": "throughput_ci95"}
    intervals |= {ratio: ratio + "_ci95" for ratio in RATIOS.values()}
    for run_path, table in comparisons.items():
        parts.append(f"### {run_path}")
        if table.empty:
            parts.append("No published figures for this configuration.")
        else:
            parts.append(markdown_table(table, columns, intervals))
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
            compared = compare_frames(frames[earlier], remaining, POINT)
            if not compared.empty:
                parts.append(compared.assign(run=run, against=earlier))
            # A point is compared once, against the first run that has it.
            done = set(compared[POINT].itertuples(index=False))
            remaining = remaining[[p not in done for p in remaining[POINT].itertuples(index=False)]]
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
