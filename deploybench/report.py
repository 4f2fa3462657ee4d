"""Per-model report pages in the form of the seed pages' Performance section.

For each run: a configuration table, its plots, the full result tables, its energy and its
provenance; then the runs against each other. Values measured over several trials show their
95 % interval in the same cell ("123.4 ± 5.6": deploybench.report_cells). Written as Markdown
and rendered to HTML beside it. The tables' columns and headings are the perf columns'
(``columns.TABLE_LABELS``, ``columns.INTERVAL_COLUMNS``). The page's other sections: our points
against the published ones (deploybench.report_published) and the serving-configuration search
(deploybench.report_search).
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from .columns import INTERVAL_COLUMNS, TABLE_LABELS
from .compare import (
    ENERGY,
    METRIC_HEADINGS,
    POINT,
    compare_frames,
    compared_columns,
    format_interval,
    not_measured,
)
from .planning.engines import describe as describe_engines
from .report_cells import as_float, integer_text, is_missing, is_number, is_true, markdown_table
from .stats import t_critical
from .unmeasured import NOT_MEASURED, STATUS_COLUMNS, measured_columns


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
    if (
        layout
    ):  # trt, onnx-trt: one engine per batch size or one shared (deploybench.planning.engines)
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
            f"{format_interval(as_float(v), as_float(h))} {TAIL_MARK}"
            if note and is_number(v)
            else v
            for v, h, note in zip(rows[TAIL_MARKED], half, notes, strict=True)
        ]
    parts = [markdown_table(rows, columns)]
    notes_below = [left_out, interval_note(frame), estimate_footnote(frame), tail_footnote(frame)]
    return "\n\n".join([*parts, *(n for n in notes_below if n)])


def interval_note(frame: pd.DataFrame) -> str | None:
    """What a cell's "± x" is, for the trials a point of this table has: the 95 % interval of
    the trials' mean (:func:`deploybench.stats.t_critical`); None where no point has trials."""
    if "trials" not in frame.columns:
        return None
    counts = sorted({int(n) for n in pd.to_numeric(frame["trials"], errors="coerce").dropna()})
    if not counts:
        return None
    if counts == [1]:
        return "One trial a point: no interval (±) to give."
    per = ", ".join(f"t = {t_critical(n - 1):.2f} for {n} trials" for n in counts if n > 1)
    return (
        "Each value is the mean of the point's trials ± the half-width of its 95 % confidence "
        f"interval, from the spread between the trials (Student's t: {per}); it is not the "
        "spread of single requests, and few trials make it wide. A point is stable when "
        "perf_analyzer settled in every trial and the throughput's interval is within the "
        "configuration's bound; unstable points are kept and marked."
    )


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
    return frame["tail_note"].map(lambda v: "" if is_missing(v) else str(v))


def tail_footnote(frame: pd.DataFrame) -> str | None:
    """What the "†" of a table's p99s means: each marked point and its tail_note."""
    notes = _notes(frame)
    if not notes.any():
        return None
    said = [
        f"batch {integer_text(row.get('batch'))} concurrency {integer_text(row.get('concurrency'))}: {note}"
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
    meters = list(
        dict.fromkeys(str(m) for m in _column(both, "energy_status") if not is_missing(m))
    )
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
            + ("" if is_missing(row.get("throttle_reasons")) else f" ({row['throttle_reasons']})")
            for scenario, frame in measured_rows.items()
            for row in frame.to_dict("records")
            if is_true(row.get("throttled"))
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
    return (
        f"batch {integer_text(row.get('batch'))} concurrency {integer_text(row.get('concurrency'))}"
    )


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
