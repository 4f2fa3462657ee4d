"""The serving-configuration search's section of a run's report page: what was searched, what
it chose and by how much it beats the baseline, its Pareto chart and the candidates' table
(search.csv and best/choice.json: deploybench.config_search).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import pandas as pd

from .compare import format_interval
from .errors import ResultsError
from .report import chart_image
from .report_cells import as_float, integer_text, is_missing, is_number, is_true, markdown_table

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
        if is_missing(budget)
        else f"with p99 latency within {budget:g} ms"
    )
    if not is_missing(floor):
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
    if is_missing(variant):
        return "No candidate met the budget and the floor: nothing was chosen."
    point = choice.get("point") or {}
    at = ", ".join(
        f"{key} {point[key]}" for key in ("concurrency", "batch") if not is_missing(point.get(key))
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
    ratio = as_float(gain.get("ratio"))
    if math.isnan(ratio):
        # search.py leaves it out when the baseline meets no constraint: nothing to compare.
        return "no gain (the baseline meets no constraint)"
    half = as_float(gain.get("ci95"))
    text = "x" + format_interval(ratio, half)
    if math.isnan(half):
        return text + " (no interval)"
    return text + (" (significant)" if gain.get("significant") else " (not significant)")


def _interval(value: Any) -> str:
    """A choice.json ``{"mean", "ci95"}`` as "x ± h"; "" when it has no mean."""
    if not isinstance(value, Mapping):
        return ""
    return format_interval(as_float(value.get("mean")), as_float(value.get("ci95")))


def _search_rows(candidates: pd.DataFrame) -> pd.DataFrame:
    """The candidates as the table shows them: the baseline and the choice labelled after their
    variant, integers without ".0" (a column with gaps reads as floats), empty cells for what a
    candidate lacks (no point within the budget, no threads on a GPU)."""
    rows = candidates.copy()
    labels = [
        ", ".join(role for role in ("baseline", "chosen") if is_true(row[role]))
        for _, row in rows.iterrows()
    ]
    rows["variant"] = [
        f"{variant} ({label})" if label else str(variant)
        for variant, label in zip(rows["variant"], labels, strict=True)
    ]
    for column in SEARCH_INTEGERS:
        if column in rows.columns:
            rows[column] = rows[column].map(integer_text)
    rows["preferred_batch_sizes"] = rows["preferred_batch_sizes"].map(
        lambda v: "" if is_missing(v) else integer_text(v) if is_number(v) else str(v)
    )
    for column in ("stable", "verdict"):
        if column in rows.columns:
            rows[column] = rows[column].map(lambda v: "" if is_missing(v) else str(v))
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
