"""Two measurements of the same points, compared within their 95 % intervals.

A perf CSV row holds each value as the mean over the point's trials with its 95 % half-width
(``<column>_ci95``) and the number of trials; :func:`measured` rebuilds the
:class:`~deploybench.stats.Interval` from them and :func:`compare_frames` sets two tables of
points side by side: the ratio B/A with its half-width and whether the difference lies outside
the two intervals combined (:func:`deploybench.stats.change`). ``deploybench compare A B``
(:mod:`deploybench.cli`) runs it over two result trees; the report's between-runs section over
the runs of one page.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from .columns import INTERVAL_COLUMNS
from .errors import DeploybenchError
from .stats import Change, Interval, change

SCENARIOS = ("offline", "online")
POINT = ["scenario", "batch", "concurrency"]
RUN = ["model", "gpu", "format", "precision"]
# The energy meter's joules per inference: empty where nothing measured it (energy_status
# says why), absent from a CSV written before energy was measured.
ENERGY = "energy_per_inference_j"
ENERGY_STATUS = "energy_status"
# The compared values, and whether more is better (throughput) or worse (latency, energy).
METRICS: dict[str, bool] = {"throughput": True, "p99_latency_ms": False, ENERGY: False}
METRIC_LABELS = {
    "throughput": "throughput",
    "p99_latency_ms": "p99 latency",
    ENERGY: "energy per inference",
}
METRIC_HEADINGS = {
    "throughput": "Throughput",
    "p99_latency_ms": "p99 latency",
    ENERGY: "Energy per inference",
}
METRIC_UNITS = {"throughput": "inferences/s", "p99_latency_ms": "ms", ENERGY: "J"}
PREDATES_ENERGY = "not measured: the CSV has no energy columns (written before energy was measured)"
# Metrics a point may lack on a side (nothing measured it): "not measured", never a regression.
OPTIONAL_METRICS = frozenset({ENERGY})

REGRESSION = "regression"
SLOWER = "slower"
FASTER = "faster"
NO_CHANGE = "no significant change"
NO_INTERVAL = "no interval"
NOT_MEASURED = "not measured"
# A point's verdict is its worst metric's (a faster throughput does not hide a slower p99);
# a metric not measured on a side leaves it to the others'.
VERDICTS = (REGRESSION, SLOWER, FASTER, NO_CHANGE, NO_INTERVAL, NOT_MEASURED)
# Energy's words for slower and faster: more or fewer joules per inference.
WORDS = {ENERGY: {SLOWER: "more energy", FASTER: "less energy"}}


class CompareError(DeploybenchError, ValueError):
    """Two result trees that cannot be compared: a path that is not there, no perf results,
    no run or point in common."""


def measured(row: Mapping[str, Any], column: str) -> Interval:
    """``column``'s interval as a perf CSV row stores it: the trials' mean, its ``_ci95``
    half-width and ``trials``. A row without them (one trial, or a CSV from before repeated
    trials) has no interval: NaN half-width, never significant."""
    half = _number(row.get(INTERVAL_COLUMNS.get(column, column + "_ci95")))
    trials = _number(row.get("trials"))
    n = 1 if math.isnan(trials) else int(trials)
    return Interval(_number(row.get(column)), half if n > 1 else math.nan, n)


def has_energy(frame: pd.DataFrame) -> bool:
    """Whether any row of ``frame`` holds an energy per inference."""
    if ENERGY not in frame.columns:
        return False
    return bool(pd.to_numeric(frame[ENERGY], errors="coerce").notna().any())


def not_measured(frame: pd.DataFrame) -> list[str]:
    """Why the rows of ``frame`` without an energy per inference have none: their distinct
    ``energy_status`` ("not measured: <why>"), in order; empty where every row has one. A CSV
    written before energy was measured has neither column: it says so."""
    if ENERGY not in frame.columns:
        return [PREDATES_ENERGY] if not frame.empty else []
    lacking = frame[pd.to_numeric(frame[ENERGY], errors="coerce").isna()]
    if lacking.empty:
        return []
    statuses = lacking.get(ENERGY_STATUS, pd.Series("", index=lacking.index))
    reasons = [_reason(value) for value in statuses]
    return list(dict.fromkeys(reasons))


def _reason(status: Any) -> str:
    """A row's ``energy_status`` as why it has no energy per inference."""
    text = "" if status is None or (isinstance(status, float) and math.isnan(status)) else status
    text = str(text).strip()
    if not text:
        return "not measured: no energy_status recorded"
    if text.startswith(NOT_MEASURED):
        return text
    return f"not measured: {text} recorded no energy for it"  # a meter, but no value


def _number(value: Any) -> float:
    if value is None or isinstance(value, bool):
        return math.nan
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def verdict(
    moved: Change,
    higher_is_better: bool,
    threshold_pct: float | None = None,
    metric: str | None = None,
) -> str:
    """``moved`` in words: faster or slower when significant (``metric``'s own words for them
    where it has some: :data:`WORDS`); a regression when also worse than ``threshold_pct`` %
    (None: never a regression)."""
    words = WORDS.get(metric or "", {})
    if math.isnan(moved.ratio):
        return NO_INTERVAL
    if not moved.significant:
        return NO_INTERVAL if math.isnan(moved.ratio_half_width) else NO_CHANGE
    # (significant with a NaN ratio half-width: B measured 0, a loss to report all the same)
    better = moved.ratio > 1 if higher_is_better else moved.ratio < 1
    if better:
        return words.get(FASTER, FASTER)
    if threshold_pct is not None:
        limit = threshold_pct / 100
        worse = 1 - moved.ratio if higher_is_better else moved.ratio - 1
        if worse > limit:
            return REGRESSION
    return words.get(SLOWER, SLOWER)


def category(word: str) -> str:
    """The verdict (:data:`VERDICTS`) a metric's verdict word stands for: "more energy" is
    energy's "slower"; a point's verdict by its first word(s), "slower (p99 latency)"."""
    word = word.split(" (", 1)[0]
    for words in WORDS.values():
        for meaning, said in words.items():
            if word == said:
                return meaning
    return word


def point_verdict(verdicts: Mapping[str, str]) -> str:
    """One point's verdict from its metrics' (the worst), naming the metrics it comes from
    when the others differ: "regression (p99 latency)". A metric not measured on a side
    (energy without a meter) is left out: it neither hides nor names the others' verdicts."""
    measured_ = {m: v for m, v in verdicts.items() if v != NOT_MEASURED} or dict(verdicts)
    worst = min((category(v) for v in measured_.values()), key=VERDICTS.index)
    said: dict[str, list[str]] = {}  # the worst's words (slower, more energy) → their metrics
    for metric, word in measured_.items():
        if category(word) == worst:
            said.setdefault(word, []).append(METRIC_LABELS.get(metric, metric))
    if len(said) == 1 and len(next(iter(said.values()))) == len(measured_):
        return next(iter(said))
    return ", ".join(f"{word} ({', '.join(which)})" for word, which in said.items())


def compare_frames(
    before: pd.DataFrame,
    after: pd.DataFrame,
    on: Sequence[str] = tuple(POINT),
    threshold_pct: float | None = None,
) -> pd.DataFrame:
    """The points of ``after`` that ``before`` has too (joined on ``on``), each metric's A and
    B values with their half-widths, the ratio B/A ± its half-width, its verdict, and the
    point's ``verdict``. Values: ``<metric>_a``, ``<metric>_a_ci95``, ``<metric>_b``, ...,
    ``<metric>_ratio``, ``<metric>_ratio_ci95``, ``<metric>_significant``,
    ``<metric>_verdict``; ``trials_a``, ``trials_b``."""
    keys = list(on)
    rows: list[dict[str, Any]] = []
    if not before.empty and not after.empty:
        # Every other column suffixed (merge's suffixes only mark the columns both have, and an
        # old CSV lacks the interval columns).
        both = _suffixed(before, keys, "a").merge(_suffixed(after, keys, "b"), on=keys)
        for record in both.to_dict("records"):
            side = {s: _side(record, s) for s in ("a", "b")}
            row: dict[str, Any] = {k: record[k] for k in keys}
            verdicts = {}
            for metric, higher_is_better in METRICS.items():
                a, b = measured(side["a"], metric), measured(side["b"], metric)
                moved = change(a, b)
                if metric in OPTIONAL_METRICS and (math.isnan(a.mean) or math.isnan(b.mean)):
                    verdicts[metric] = NOT_MEASURED  # no meter on a side: nothing to compare
                else:
                    verdicts[metric] = verdict(moved, higher_is_better, threshold_pct, metric)
                row |= {
                    f"{metric}_a": a.mean,
                    f"{metric}_a_ci95": a.half_width,
                    f"{metric}_b": b.mean,
                    f"{metric}_b_ci95": b.half_width,
                    f"{metric}_ratio": moved.ratio,
                    f"{metric}_ratio_ci95": moved.ratio_half_width,
                    f"{metric}_significant": moved.significant,
                    f"{metric}_verdict": verdicts[metric],
                }
            row["trials_a"] = measured(side["a"], "throughput").n
            row["trials_b"] = measured(side["b"], "throughput").n
            row["verdict"] = point_verdict(verdicts)
            rows.append(row)
    return pd.DataFrame(rows, columns=compared_columns(keys))


def _suffixed(frame: pd.DataFrame, keys: list[str], suffix: str) -> pd.DataFrame:
    return frame.rename(columns={c: f"{c}_{suffix}" for c in frame.columns if c not in keys})


def _side(record: Mapping[str, Any], suffix: str) -> dict[str, Any]:
    """One side's columns of a merged row, without their suffix."""
    end = "_" + suffix
    return {k[: -len(end)]: v for k, v in record.items() if k.endswith(end)}


def compared_columns(on: Sequence[str] = tuple(POINT)) -> list[str]:
    """The columns of :func:`compare_frames`' table, in order."""
    parts = ("a", "a_ci95", "b", "b_ci95", "ratio", "ratio_ci95", "significant", "verdict")
    values = [f"{metric}_{part}" for metric in METRICS for part in parts]
    return [*on, *values, "trials_a", "trials_b", "verdict"]


def format_interval(value: float, half_width: float) -> str:
    """``value ± half_width`` with the half-width to two significant digits and the value to
    the same decimal place ("123.5 ± 5.6"); the value alone without an interval."""
    if math.isnan(value):
        return ""
    if math.isnan(half_width):
        return f"{value:.4g}"
    if half_width == 0:
        return f"{value:.4g} ± 0"
    decimals = min(6, max(0, 1 - math.floor(math.log10(abs(half_width)))))
    return f"{value:.{decimals}f} ± {half_width:.{decimals}f}"


# --- two result trees -----------------------------------------------------------------------


def find_runs(path: str | Path, label: str = "") -> dict[str, Path]:
    """The runs under ``path`` by name (``model/gpu/format/precision``): a tree holding
    ``<model>/<gpu>/<format>/<precision>/{offline,online}.csv`` (a workdir's ``results/``, or
    the workdir itself), or one run's directory. ``label`` names the side in errors."""
    root = Path(path)
    side = f"{label}: " if label else ""
    if not root.exists():
        raise CompareError(f"{side}{root} does not exist")
    if not root.is_dir():
        raise CompareError(f"{side}{root} is not a directory (a result tree or a run directory)")
    if any((root / f"{s}.csv").is_file() for s in SCENARIOS):
        return {_run_name(root): root}
    runs = _runs_below(root)
    if not runs and (root / "results").is_dir():
        runs = _runs_below(root / "results")
    return runs


def _runs_below(base: Path) -> dict[str, Path]:
    found = {
        "/".join(csv.parent.relative_to(base).parts): csv.parent
        for scenario in SCENARIOS
        for csv in base.glob(f"*/*/*/*/{scenario}.csv")
    }
    return dict(sorted(found.items()))


def _run_name(directory: Path) -> str:
    """A run directory's name as its CSVs record it (else its last four path parts)."""
    for scenario in SCENARIOS:
        csv = directory / f"{scenario}.csv"
        if csv.is_file():
            head = read_perf_csv(csv)
            if not head.empty and set(RUN) <= set(head.columns):
                return "/".join(str(head.iloc[0][c]) for c in RUN)
    return "/".join(directory.resolve().parts[-4:])


@dataclass(frozen=True)
class Comparison:
    """B against A at every run and point both hold (``points``: one row each, columns of
    :func:`compare_frames` after ``run``), and what could not be compared (``notes``)."""

    a: Path
    b: Path
    threshold_pct: float
    points: pd.DataFrame
    notes: tuple[str, ...] = field(default=())

    @property
    def regressions(self) -> pd.DataFrame:
        return self.points[self.points["verdict"].str.startswith(REGRESSION)]

    def counts(self) -> dict[str, int]:
        """Points per verdict (the worst metric's), in the order of :data:`VERDICTS`."""
        worst = self.points["verdict"].map(category)
        return {v: int((worst == v).sum()) for v in VERDICTS}

    def energy_counts(self) -> dict[str, int]:
        """Points per verdict of their energy per inference ("more energy", "not measured",
        ...), in the order of :data:`VERDICTS`."""
        said = self.points.get(f"{ENERGY}_verdict", pd.Series(dtype=object)).dropna()
        words = {v: WORDS[ENERGY].get(v, v) for v in VERDICTS}
        return {words[v]: int((said.map(category) == v).sum()) for v in VERDICTS}

    def summary(self) -> str:
        """One line: points compared and their verdicts ("no regression" when none: the word
        appears otherwise only where there is one), and how their energy per inference moved."""
        counts = self.counts()
        found = counts.pop(REGRESSION)
        counted = ", ".join(f"{n} {v}" for v, n in counts.items() if n)
        worse = f"{found} regression(s)" if found else "no regression"
        energy = ", ".join(f"{n} {v}" for v, n in self.energy_counts().items() if n)
        return (
            f"{len(self.points)} point(s) of {self.points['run'].nunique()} run(s) compared, "
            f"B against A: {worse} (a significant change worse than {self.threshold_pct:g} %)"
            + (f"; {counted}" if counted else "")
            + (f"; {METRIC_LABELS[ENERGY]}: {energy}." if energy else ".")
        )


def compare_trees(a: str | Path, b: str | Path, threshold_pct: float) -> Comparison:
    """B against A at every (run, scenario, batch, concurrency) both hold. Two single run
    directories are compared whatever their names; otherwise runs pair by name."""
    if not threshold_pct >= 0:
        raise CompareError(f"threshold must be a percentage >= 0, not {threshold_pct}")
    runs_a, runs_b = find_runs(a, "A"), find_runs(b, "B")
    for label, path, runs in (("A", a, runs_a), ("B", b, runs_b)):
        if not runs:
            raise CompareError(
                f"{label} ({path}) holds no perf results: expected a run directory with "
                "offline.csv/online.csv, or a tree of <model>/<gpu>/<format>/<precision>/ "
                "run directories (a workdir's results/)"
            )
    pairs: list[tuple[str, Path, Path]]
    notes: list[str] = []
    if _is_run(a) and _is_run(b):
        (name_a, dir_a), (name_b, dir_b) = *runs_a.items(), *runs_b.items()
        pairs = [(name_a if name_a == name_b else f"{name_a} → {name_b}", dir_a, dir_b)]
    else:
        common = [name for name in runs_a if name in runs_b]
        if not common:
            raise CompareError(
                f"no runs in common: A ({a}) holds {', '.join(runs_a)}; "
                f"B ({b}) holds {', '.join(runs_b)}"
            )
        pairs = [(name, runs_a[name], runs_b[name]) for name in common]
        notes += [
            f"{label} only: {', '.join(only)} (not compared)"
            for label, only in (
                ("A", [r for r in runs_a if r not in runs_b]),
                ("B", [r for r in runs_b if r not in runs_a]),
            )
            if only
        ]
    without_interval: dict[str, list[str]] = {"A": [], "B": []}
    # side → why its CSVs' points have no energy per inference → those CSVs
    without_energy: dict[str, dict[str, list[str]]] = {"A": {}, "B": {}}
    tables = []
    for name, dir_a, dir_b in pairs:
        for scenario in SCENARIOS:
            csv_a, csv_b = dir_a / f"{scenario}.csv", dir_b / f"{scenario}.csv"
            if not (csv_a.is_file() and csv_b.is_file()):
                if csv_a.is_file() or csv_b.is_file():
                    side = "A" if csv_a.is_file() else "B"
                    notes.append(f"{name} {scenario}: only {side} has {scenario}.csv")
                continue
            frames = {}
            for label, csv in (("A", csv_a), ("B", csv_b)):
                frame = read_perf_csv(csv)
                if "throughput_ci95" not in frame.columns:
                    without_interval[label].append(str(csv))
                for reason in not_measured(frame):
                    without_energy[label].setdefault(reason, []).append(str(csv))
                frames[label] = frame.assign(scenario=scenario)
            table = compare_frames(frames["A"], frames["B"], POINT, threshold_pct)
            unmatched = len(frames["A"]) + len(frames["B"]) - 2 * len(table)
            if unmatched:
                notes.append(f"{name} {scenario}: {unmatched} point(s) measured on one side only")
            tables.append(table.assign(run=name))
    for label, files in without_interval.items():
        if files:
            notes.append(
                f"{label}: {len(files)} CSV(s) without _ci95 columns (written before repeated "
                f"trials): their points have no interval and are never significant: "
                + ", ".join(files)
            )
    for label, reasons in without_energy.items():
        notes += [
            f"{label}: {METRIC_LABELS[ENERGY]} {reason} ({', '.join(files)}): "
            "not compared there (its verdict: not measured)"
            for reason, files in reasons.items()
        ]
    points = pd.concat(tables, ignore_index=True) if tables else pd.DataFrame()
    if points.empty:
        raise CompareError(f"no points in common between A ({a}) and B ({b}): " + "; ".join(notes))
    points = points[["run", *(c for c in points.columns if c != "run")]]
    return Comparison(Path(a), Path(b), threshold_pct, points, tuple(notes))


def read_perf_csv(path: Path) -> pd.DataFrame:
    """A perf CSV with the columns a comparison needs (a clear error for anything else)."""
    try:
        frame = pd.read_csv(path)
    except (pd.errors.EmptyDataError, pd.errors.ParserError, UnicodeDecodeError) as error:
        raise CompareError(f"{path} is not a perf CSV: {error}") from error
    needed = [m for m in METRICS if m not in OPTIONAL_METRICS]  # an older CSV lacks energy
    missing = [c for c in ("batch", "concurrency", *needed) if c not in frame.columns]
    if missing:
        raise CompareError(f"{path} is not a perf CSV: it has no column {', '.join(missing)}")
    return frame


def _is_run(path: str | Path) -> bool:
    return any((Path(path) / f"{s}.csv").is_file() for s in SCENARIOS)
