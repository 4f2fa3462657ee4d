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
# The compared values, and whether more is better (throughput) or worse (latency).
METRICS: dict[str, bool] = {"throughput": True, "p99_latency_ms": False}
METRIC_LABELS = {"throughput": "throughput", "p99_latency_ms": "p99 latency"}
METRIC_HEADINGS = {"throughput": "Throughput", "p99_latency_ms": "p99 latency"}

REGRESSION = "regression"
SLOWER = "slower"
FASTER = "faster"
NO_CHANGE = "no significant change"
NO_INTERVAL = "no interval"
# A point's verdict is its worst metric's (a faster throughput does not hide a slower p99).
VERDICTS = (REGRESSION, SLOWER, FASTER, NO_CHANGE, NO_INTERVAL)


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
    return Interval(_number(row[column]), half if n > 1 else math.nan, n)


def _number(value: Any) -> float:
    if value is None or isinstance(value, bool):
        return math.nan
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def verdict(moved: Change, higher_is_better: bool, threshold_pct: float | None = None) -> str:
    """``moved`` in words: faster or slower when significant; a regression when also worse
    than ``threshold_pct`` % (None: never a regression)."""
    if math.isnan(moved.ratio):
        return NO_INTERVAL
    if not moved.significant:
        return NO_INTERVAL if math.isnan(moved.ratio_half_width) else NO_CHANGE
    # (significant with a NaN ratio half-width: B measured 0, a loss to report all the same)
    better = moved.ratio > 1 if higher_is_better else moved.ratio < 1
    if better:
        return FASTER
    if threshold_pct is not None:
        limit = threshold_pct / 100
        worse = 1 - moved.ratio if higher_is_better else moved.ratio - 1
        if worse > limit:
            return REGRESSION
    return SLOWER


def point_verdict(verdicts: Mapping[str, str]) -> str:
    """One point's verdict from its metrics' (the worst), naming the metrics it comes from
    when the others differ: "regression (p99 latency)"."""
    worst = min(verdicts.values(), key=VERDICTS.index)
    which = [METRIC_LABELS.get(m, m) for m, v in verdicts.items() if v == worst]
    return worst if len(which) == len(verdicts) else f"{worst} ({', '.join(which)})"


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
                verdicts[metric] = verdict(moved, higher_is_better, threshold_pct)
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
        worst = self.points["verdict"].str.split(" (", n=1, regex=False).str[0]
        return {v: int((worst == v).sum()) for v in VERDICTS}

    def summary(self) -> str:
        """One line: points compared and their verdicts ("no regression" when none: the word
        appears otherwise only where there is one)."""
        counts = self.counts()
        found = counts.pop(REGRESSION)
        counted = ", ".join(f"{n} {v}" for v, n in counts.items() if n)
        worse = f"{found} regression(s)" if found else "no regression"
        return (
            f"{len(self.points)} point(s) of {self.points['run'].nunique()} run(s) compared, "
            f"B against A: {worse} (a significant change worse than {self.threshold_pct:g} %)"
            + (f"; {counted}." if counted else ".")
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
    missing = [c for c in ("batch", "concurrency", *METRICS) if c not in frame.columns]
    if missing:
        raise CompareError(f"{path} is not a perf CSV: it has no column {', '.join(missing)}")
    return frame


def _is_run(path: str | Path) -> bool:
    return any((Path(path) / f"{s}.csv").is_file() for s in SCENARIOS)
