"""Per-model report pages in the form of the seed pages' Performance section.

For each run: a configuration table, its plots, the full result tables and its provenance;
then a summary of our points against the published ones (ratio per point). Written as Markdown
and rendered to HTML beside it.
"""

from __future__ import annotations

import html
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pandas as pd

from .columns import TABLE_LABELS
from .config import ConfigError, reference_run

POINT = ["scenario", "batch", "concurrency"]


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


def ratios(measured: pd.DataFrame, published: pd.DataFrame) -> pd.DataFrame:
    """Measured over published throughput and p99 latency at every point both have."""
    columns = [*POINT, "throughput", "p99_latency_ms"]
    if measured.empty or published.empty:
        return pd.DataFrame(columns=[*POINT, "throughput_ratio", "p99_latency_ratio"])
    both = measured[columns].merge(
        published[columns], on=POINT, suffixes=("_measured", "_published")
    )
    both["throughput_ratio"] = both["throughput_measured"] / both["throughput_published"]
    both["p99_latency_ratio"] = both["p99_latency_ms_measured"] / both["p99_latency_ms_published"]
    return both.sort_values(POINT).reset_index(drop=True)


def markdown_table(frame: pd.DataFrame, columns: dict[str, str]) -> str:
    present = {k: v for k, v in columns.items() if k in frame.columns}
    lines = [
        "| " + " | ".join(present.values()) + " |",
        "|" + "---|" * len(present),
    ]
    for _, row in frame.iterrows():
        lines.append("| " + " | ".join(_cell(row[k]) for k in present) + " |")
    return "\n".join(lines)


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return "" if pd.isna(value) else f"{value:.4g}"
    return str(value)


def configuration_table(provenance: dict[str, Any]) -> str:
    """The seed pages' "Configuration" table, from a perf result's provenance."""
    config = provenance["config"]
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
        "Request count": config.get("measure", {}).get("request_count"),
        "Measurement interval (ms)": config.get("measure", {}).get("measurement_interval_ms"),
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
    for run_path, table in comparisons.items():
        parts.append(f"### {run_path}")
        if table.empty:
            parts.append("No published figures for this configuration.")
        else:
            parts.append(markdown_table(table, columns))
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
