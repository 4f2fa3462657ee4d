"""``deploybench summary <run dir>``: what one run measured, in a few lines of plain text.

For a run directory (``results/<model>/<gpu>/<format>/<precision>``): the run, what measured it
(the GPUs nvidia-smi named, with their driver, else the CPU: its perf provenance), the accuracy
verdict (``accuracy.csv``, ``task.csv``), a row per measured point of each scenario whose CSV
exists (throughput ± the half-width of its 95 % interval, p99 latency, joules per inference ±
its interval, stable or why not; what measured the energy, or why nothing did, once per
scenario; a p99 backed by too few requests for an early-stopping estimate marked "†" and said
once below), then the paths of the run's CSVs, charts (``<run>/plots/``) and report pages
(``reports/<set>/<model>.html`` in the workdir) that exist, or how to make them.

Standard library only: it reads CSVs as text, so it answers at once. A scenario whose job was
stopped partway (no CSV, its trials kept: deploybench.partial) shows its finished points marked
PARTIAL; summarizing them imports NumPy.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .chart_names import RUN_CHARTS
from .columns import (
    INTERVAL_COLUMNS,
    PERF_COLUMNS,
    POWER_CAP_REASON,
    SUMMARY_CELLS,
    SummaryCell,
    slowdown_parts,
)
from .errors import ResultsError
from .partial import SUFFIX as PARTIAL_SUFFIX
from .progress import count

SCENARIOS = {
    "offline": "offline (static batching, concurrency 1)",
    "online": "online (dynamic batching over concurrency)",
}
RUN_FILES = ("accuracy.csv", "task.csv", *(f"{s}.csv" for s in SCENARIOS))
# what a scenario's job stopped partway keeps (deploybench.partial.partial_path)
PARTIAL_FILES = tuple(f"{s}{PARTIAL_SUFFIX}" for s in SCENARIOS)
RUN_FIELDS = ("model", "gpu", "format", "precision")
EXPECTED = (
    "a run directory, results/<model>/<gpu>/<format>/<precision> (e.g. results/tft/cpu/onnx/fp32), "
    "holding accuracy.csv, offline.csv or online.csv"
)
MAKE = ".venv/bin/snakemake --profile profiles/local"
# The energy meter's columns: a scenario none of whose points has one shows no cell of them,
# and says once why not (their energy_status) instead of a column of blanks.
ENERGY_COLUMNS = frozenset(c.name for c in PERF_COLUMNS if c.source == "energy")
ENERGY = "energy_per_inference_j"
NOT_MEASURED = "not measured"
# What each meter's counter measures (the energy_status of a measured point).
METERS = {
    "nvml": "GPU board energy (NVML's total energy counter)",
    "rapl": "CPU package energy (RAPL's energy counter)",
}
# The cell a point whose tail rests on too few requests (its tail_note) is marked in, and how.
TAIL_MARKED = "p99_latency_ms"
TAIL_MARK = "†"


def heading(cells: dict[str, SummaryCell]) -> str:
    """A point line's heading: batch, concurrency, ``cells``' headings, stable or why not."""
    return "  ".join(
        ["", f"{'batch':>5}", f"{'conc.':>5}"]
        + [
            f"{cell.heading:>{cell.width}}" + (" " if column == TAIL_MARKED else "")
            for column, cell in cells.items()
        ]
        + ["stable"]
    )


# A point's line: batch, concurrency, the columns with a summary cell (columns.SUMMARY_CELLS:
# throughput ± its interval, p99 latency, joules per inference ± its interval), stable or why.
HEADING = heading(SUMMARY_CELLS)


@dataclass(frozen=True)
class Run:
    """A run directory: where it is, the run it holds, and its workdir when it lies at
    ``<workdir>/results/<model>/<gpu>/<format>/<precision>`` (None elsewhere)."""

    path: Path
    name: str  # model/gpu/format/precision
    workdir: Path | None


def read_rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def find_run(path: Path) -> Run:
    """The run in ``path``; a :class:`ResultsError` naming the path and what is expected for
    anything else."""
    if not path.is_dir():
        what = "does not exist" if not path.exists() else "is not a directory"
        raise ResultsError(f"{path} {what}; expected {EXPECTED}")
    if not any((path / name).is_file() for name in RUN_FILES + PARTIAL_FILES):
        below = runs_below(path)
        hint = f"; runs below it: {', '.join(below)}" if below else ""
        raise ResultsError(
            f"{path} holds none of {', '.join(RUN_FILES)}: expected {EXPECTED}{hint}"
        )
    workdir = path.resolve().parents[4] if _in_results(path) else None
    return Run(path, run_name(path), workdir)


def runs_below(path: Path, most: int = 3) -> list[str]:
    """Up to ``most`` run directories under ``path`` (a workdir, its ``results/``, or a
    directory in between): ``results/<model>/<gpu>/<format>/<precision>`` with a run's CSV."""
    found = {
        shown(csv_path.parent)
        for depth in range(1, 6)  # results/ is at most five levels above a run's CSVs
        for csv_path in path.glob("*/" * depth + "*.csv")
        if csv_path.name in RUN_FILES and _in_results(csv_path.parent)
    }
    return sorted(found)[:most]


def _in_results(run: Path) -> bool:
    """Whether ``run`` lies at ``results/<model>/<gpu>/<format>/<precision>``."""
    parents = run.resolve().parents
    return len(parents) > 4 and parents[3].name == "results"


def run_name(path: Path) -> str:
    """``model/gpu/format/precision``: as the run's CSVs say, else the directory's last four
    names."""
    for name in RUN_FILES[2:]:
        csv_path = path / name
        if csv_path.is_file():
            rows = read_rows(csv_path)
            if rows and all(rows[0].get(f) for f in RUN_FIELDS):
                return "/".join(rows[0][f] for f in RUN_FIELDS)
    return "/".join(path.resolve().parts[-4:])


def shown(path: Path) -> str:
    """A path as the user may type it: relative to the current directory when under it."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def _number(text: str | None) -> float:
    try:
        return float(text) if text not in (None, "") else math.nan
    except ValueError:
        return math.nan


def measured_on(run: Path) -> str | None:
    """What measured the run, as its perf provenance recorded the host: each GPU as nvidia-smi
    named it ("NVIDIA H100 80GB HBM3, 580.159.04, 81559 MiB"), else the CPU; None before a
    measurement."""
    for scenario in SCENARIOS:
        path = run / f"{scenario}.provenance.json"
        if path.is_file():
            host = json.loads(path.read_text()).get("host") or {}
            if host.get("gpus"):
                return "; ".join(host["gpus"])
            return f"CPU {host.get('cpu', '?')} ({host.get('cpu_count', '?')} cores)"
    return None


def accuracy_lines(run: Path) -> list[str]:
    """The accuracy verdict (``accuracy.csv``) and the task metric (``task.csv``)."""
    path = run / "accuracy.csv"
    if not path.is_file():
        return ["accuracy: not measured (no accuracy.csv)"]
    rows = read_rows(path)
    failed = [r for r in rows if str(r.get("passed")).lower() != "true"]
    worst = max((_number(r.get("max_abs_err")) for r in rows), default=math.nan)
    batches = sorted({r.get("batch") or "?" for r in rows})
    if not rows:
        verdict = "accuracy.csv holds no rows"
    elif failed:
        names = ", ".join(str(r.get("output")) for r in failed)
        verdict = f"FAILED, {len(failed)} of {len(rows)} outputs outside tolerance: {names}"
    else:
        verdict = f"passed, {count(len(rows), 'output')} within tolerance"
        verdict += f" at batch {', '.join(batches)} (max abs err {worst:.2g})"
    lines = [f"accuracy: {verdict}"]
    task = run / "task.csv"
    for row in read_rows(task) if task.is_file() else []:
        value = row.get("value") or ""
        verdict = {"true": "passed", "false": "FAILED"}.get(str(row.get("passed")).lower(), "")
        said = f"{value} (threshold {row.get('threshold')}, {verdict})" if value else ""
        lines.append(f"task metric {row.get('metric')}: {said or row.get('note') or 'no value'}")
    return lines


def decimals(value: float) -> int:
    """Decimals that show ``value`` to at least 3 significant digits, at least one: 1234.5,
    12.3, 0.0123 (joules per inference are small numbers)."""
    if not math.isfinite(value) or value == 0 or abs(value) >= 10:
        return 1
    return min(8, 2 - math.floor(math.log10(abs(value))))


def interval_text(value: float, half: float) -> str:
    """``value ± half (pct %)``; the value alone without an interval (one trial)."""
    if math.isnan(value):
        return "?"
    places = decimals(value)
    if math.isnan(half):
        return f"{value:.{places}f} (no interval)"
    pct = f"{half / value * 100:.1f} %" if value else "?"
    return f"{value:.{places}f} ± {half:.{places}f} ({pct})"


def stable_text(row: dict[str, str]) -> str:
    """ "yes", or "no" and why (the ``unstable_reason`` column, when the CSV has it)."""
    stable = str(row.get("stable", "")).lower()
    if stable == "true":
        return "yes"
    if stable == "false":
        reason = row.get("unstable_reason") or ""
        return f"no: {reason}" if reason else "no"
    return "?"


def point_line(row: dict[str, str], cells: dict[str, SummaryCell] | None = None) -> str:
    """A point's line: its ``cells`` (None: every summary cell); an energy cell the point has
    no value of says "not measured", a p99 resting on too few requests is marked "†"."""
    texts = [f"{row.get('batch', '?'):>5}", f"{row.get('concurrency', '?'):>5}"]
    for column, cell in (SUMMARY_CELLS if cells is None else cells).items():
        value = _number(row.get(column))
        if column in ENERGY_COLUMNS and math.isnan(value):
            text = NOT_MEASURED
        elif cell.interval:
            text = interval_text(value, _number(row.get(INTERVAL_COLUMNS[column])))
        else:
            text = f"{value:.2f}"
        if column == TAIL_MARKED:
            # a place for the mark after the width: the numbers stay aligned, marked or not
            texts.append(f"{text:>{cell.width}}{TAIL_MARK if row.get('tail_note') else ' '}")
        else:
            texts.append(f"{text:>{cell.width}}")
    return "  ".join(["", *texts, stable_text(row)])


def shown_cells(rows: Sequence[dict[str, str]]) -> dict[str, SummaryCell]:
    """The summary cells of a scenario's points: the energy ones only where a point has one."""
    measured = any(not math.isnan(_number(r.get(ENERGY))) for r in rows)
    return {c: cell for c, cell in SUMMARY_CELLS.items() if measured or c not in ENERGY_COLUMNS}


def energy_line(rows: Sequence[dict[str, str]]) -> str | None:
    """What measured the scenario's energy and the idle power, or why nothing did; the points
    a thermal or hardware slowdown held down, and those held at the power limit. None without
    points."""
    if not rows:
        return None
    measured = [r for r in rows if not math.isnan(_number(r.get(ENERGY)))]
    parts = []
    meters = dict.fromkeys(str(r.get("energy_status") or "?") for r in measured)
    if measured:
        parts.append(", ".join(METERS.get(m, m) for m in meters))
        idle = sorted(
            {
                f"{v:.1f} W"
                if math.isnan(h := _number(r.get("idle_power_ci95_w")))
                else f"{v:.1f} ± {h:.1f} W"
                for r in measured
                if not math.isnan(v := _number(r.get("idle_power_w")))
            }
        )
        parts.append(f"idle {', '.join(idle)}" if idle else "idle power not measured")
        throttled = [r for r in measured if str(r.get("throttled")).lower() == "true"]
        if throttled:
            reasons = dict.fromkeys(
                why
                for r in throttled
                for why in slowdown_parts(r.get("throttle_reasons"))
                if why != POWER_CAP_REASON
            )
            said = f" ({', '.join(reasons)})" if reasons else ""
            parts.append(f"thermal or hardware slowdown at {count(len(throttled), 'point')}{said}")
        capped = [r for r in measured if _number(r.get("throttle_power_cap_fraction")) > 0]
        if capped:
            parts.append(f"power-capped at {count(len(capped), 'point')} (reported only)")
    lacking = [r for r in rows if math.isnan(_number(r.get(ENERGY)))]
    if lacking:
        reasons = dict.fromkeys(_not_measured(r) for r in lacking)
        some = "" if not measured else f"{count(len(lacking), 'point')} "
        parts.append(some + "; ".join(reasons))
    return "energy: " + "; ".join(parts)


# Triton's GPU metrics (perf_analyzer's --collect-metrics): column → how the line names it
GPU_METRICS = {
    "triton_gpu_util_pct": ("utilization", "%"),
    "triton_gpu_power_w": ("power", "W"),
    "triton_gpu_memory_used_mib": ("memory used", "MiB"),
}


def gpu_metrics_line(rows: Sequence[dict[str, str]]) -> str | None:
    """Triton's GPU metrics over the scenario's points, each the range of its points' values,
    or why none was measured (``triton_gpu_status``). None without points, or where the rows
    say nothing of them (a CSV from before the columns)."""
    if not rows or "triton_gpu_status" not in rows[0]:
        return None
    parts = []
    for column, (name, unit) in GPU_METRICS.items():
        values = [v for r in rows if not math.isnan(v := _number(r.get(column)))]
        if values:
            low, high = min(values), max(values)
            span = f"{low:.1f}" if low == high else f"{low:.1f}-{high:.1f}"
            parts.append(f"{name} {span} {unit}")
    statuses = "; ".join(dict.fromkeys(s for r in rows if (s := r.get("triton_gpu_status"))))
    if not parts:
        return f"Triton GPU metrics: {statuses}" if statuses else None
    return f"Triton GPU metrics: {', '.join(parts)} ({statuses})"


def _not_measured(row: dict[str, str]) -> str:
    """A row's ``energy_status`` as why it has no energy: "not measured: <why>"."""
    if "energy_status" not in row:
        return "not measured (the CSV predates energy measurement)"
    status = (row.get("energy_status") or "").strip()
    if not status:
        return "not measured (no energy_status recorded)"
    return status if status.startswith(NOT_MEASURED) else f"not measured ({status} gave no value)"


def tail_footnote(rows: Sequence[dict[str, str]]) -> str | None:
    """Once per scenario, what the "†" of its marked p99s means: each point's tail_note ("too
    few requests for an early-stopping p99 estimate: 120 of 662"), the words they share said
    once."""
    noted = [r for r in rows if r.get("tail_note")]
    if not noted:
        return None
    notes = [str(r["tail_note"]) for r in noted]
    heads = {n.rsplit(": ", 1)[0] for n in notes}
    where = [f"batch {r.get('batch', '?')} conc. {r.get('concurrency', '?')}" for r in noted]
    if len(heads) == 1 and all(": " in n for n in notes):
        details = [f"{n.rsplit(': ', 1)[1]} ({w})" for n, w in zip(notes, where, strict=True)]
        return f"{TAIL_MARK} {next(iter(heads))}: {', '.join(details)}"
    return f"{TAIL_MARK} " + "; ".join(f"{w}: {n}" for n, w in zip(notes, where, strict=True))


def partial_rows(run: Path, scenario: str) -> tuple[list[dict[str, str]], str] | None:
    """The finished points of a scenario whose job was stopped partway (its partial file:
    deploybench.partial), as its CSV's rows would read, and what the heading says of them;
    None when there is no such file."""
    from .partial import finished_rows, partial_path, planned_points, read

    path = partial_path(run / f"{scenario}.csv")
    if not path.is_file():
        return None
    kept = read(path)
    rows = [{k: "" if v is None else str(v) for k, v in r.items()} for r in finished_rows(kept)]
    note = (
        f"PARTIAL: {len(rows)} of {planned_points(kept)} points finished "
        f"({count(len(kept.trials), 'trial')} kept in {shown(path)}; the job was stopped: "
        "run it again to measure the rest)"
    )
    return rows, note


def scenario_lines(run: Path, scenario: str) -> list[str]:
    """A scenario's heading, a row per point, what measured its energy and Triton's GPU metrics
    (or why nothing did) and what its "†" means. Without its CSV: the finished points of a job stopped partway,
    marked PARTIAL, else nothing."""
    path = run / f"{scenario}.csv"
    partial = None
    if path.is_file():
        rows = read_rows(path)
    elif (partial := partial_rows(run, scenario)) is not None:
        rows = partial[0]
    else:
        return []
    trials = sorted({r.get("trials") or "?" for r in rows})
    plural = "" if trials == ["1"] else "s"  # several counts: "3/5 trials"
    each = f", {'/'.join(trials)} trial{plural} a point" if rows else ", no points"
    if partial is not None:
        each += f", {partial[1]}"
    cells = shown_cells(rows)
    return [
        f"{SCENARIOS[scenario]}{each}:",
        heading(cells),
        *(point_line(r, cells) for r in rows),
        *(
            line
            for line in (energy_line(rows), gpu_metrics_line(rows), tail_footnote(rows))
            if line
        ),
    ]


def chart_files(plots: Path) -> list[Path]:
    """The run's charts, one file each (its interactive HTML, else its SVG or PNG), in the
    order the run's charts are named, then any others."""
    if not plots.is_dir():
        return []
    stems = [*RUN_CHARTS, *sorted({p.stem for p in plots.iterdir()} - set(RUN_CHARTS))]
    found = []
    for stem in stems:
        for ext in ("html", "svg", "png"):
            if (plots / f"{stem}.{ext}").is_file():
                found.append(plots / f"{stem}.{ext}")
                break
    return found


def _make(target: str, workdir: Path | None) -> str:
    """The command that makes ``target`` of the workflow in ``workdir`` (None: here)."""
    if workdir is None or workdir == Path.cwd().resolve():
        return f"{MAKE} {target}"
    return f"{MAKE} --directory {shown(workdir)} {target}"


def file_lines(run: Run) -> list[str]:
    """The run's CSVs, charts and report pages that exist; how to make the missing charts."""
    lines = [
        f"csv     {shown(run.path / name)}" for name in RUN_FILES if (run.path / name).is_file()
    ]
    lines += [
        f"partial {shown(run.path / name)}" for name in PARTIAL_FILES if (run.path / name).is_file()
    ]
    charts = chart_files(run.path / "plots")
    lines += [f"chart   {shown(p)}" for p in charts]
    if not charts:
        target = f"results/{run.name}/plots/{RUN_CHARTS[0]}.html"
        if all((run.path / f"{s}.csv").is_file() for s in SCENARIOS):
            lines.append(f"charts  none yet; make them with: {_make(target, run.workdir)}")
        else:
            lines.append("charts  none yet (they need offline.csv and online.csv)")
    model, gpu = [*run.name.split("/"), ""][:2]
    pages = sorted(run.workdir.glob(f"reports/*/{model}.html")) if run.workdir else []
    lines += [f"report  {shown(p)}" for p in pages]
    if run.workdir is not None and not pages:
        # the shipped config's report set of the CPU runs is `cpu`; others are named there
        page = f"reports/{'cpu' if gpu == 'cpu' else '<set>'}/{model}.html"
        lines.append(
            f"report  none yet; make it with: {_make(page, run.workdir)} "
            f"(after every {model} run of the set)"
        )
    return lines


def summary(path: Path) -> str:
    """The summary of the run in ``path``, as printed."""
    run = find_run(path)
    parts: list[Sequence[str]] = [
        [
            f"run {run.name} ({shown(run.path)})",
            *([f"measured on {machine}"] if (machine := measured_on(run.path)) else []),
            *accuracy_lines(run.path),
        ],
        *(lines for s in SCENARIOS if (lines := scenario_lines(run.path, s))),
        file_lines(run),
    ]
    return "\n\n".join("\n".join(lines) for lines in parts)
