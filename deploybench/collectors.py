"""Collectors: each turns one trial's output of a measuring tool into the values of the columns
sourced from it (:class:`deploybench.columns.Column`'s ``source`` and ``key``).

A trial's outputs are a mapping source → that tool's output (perf_analyzer's: its
``--verbose-csv`` file and its stdout, :class:`PerfAnalyzerOutput`). :func:`collect_trial` runs
each source's collector over the columns it sources; :func:`derived_values` then computes the
derived columns from the whole trial. Beside perf_analyzer: its per-request export
(``profile_export``: :mod:`deploybench.tails`), the energy meter (``energy``: NVML or RAPL
read by :mod:`deploybench.telemetry`'s sampler), Triton's own energy counter
(``triton_metrics``: :mod:`deploybench.triton_metrics`) and Triton's GPU metrics as
perf_analyzer's ``--collect-metrics`` writes them (``triton_gpu_metrics``). Each output is an
instrument's (:mod:`deploybench.instruments`). A new tool is an instrument, a function here
registered with ``@collector("<source>")``, and a :class:`Column` entry per value.
"""

from __future__ import annotations

import csv
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from .columns import DERIVED, PERF_COLUMNS, Column, as_written, slowdown_text
from .errors import PerfError

if TYPE_CHECKING:
    from .tails import MeasuredWindow
    from .telemetry import WindowTelemetry

PERF_ANALYZER = "perf_analyzer"


class Collector(Protocol):
    def __call__(self, output: Any, columns: Sequence[Column], /) -> dict[str, Any]:
        """``{column name: value}`` for ``columns`` (those sourced from this collector), from
        its ``output`` of one trial."""
        ...


COLLECTORS: dict[str, Collector] = {}
CollectorT = TypeVar("CollectorT", bound=Collector)


def collector(source: str) -> Callable[[CollectorT], CollectorT]:
    """Register the decorated function as the collector of ``source``."""

    def register(function: CollectorT) -> CollectorT:
        if source in COLLECTORS or source == DERIVED:
            raise ValueError(f"a collector of {source!r} is registered already")
        COLLECTORS[source] = function
        return function

    return register


def read_value(column: Column, text: str) -> Any:
    """A source's text as ``column``'s value: its kind, in our unit (or as its ``parse`` rule
    reads it; an empty text: None)."""
    if column.parse is not None:
        return column.parse(text) if text.strip() else None
    if column.kind == "str":
        return text
    if column.kind == "bool":
        return text.strip().lower() in ("true", "1", "yes")
    if column.kind == "int":
        return int(text)
    value = float(text)
    return value / column.divisor if column.divisor != 1.0 else value


def check_sources(columns: Iterable[Column]) -> None:
    """A clear error for a column whose source has no collector."""
    for column in columns:
        if column.source not in (None, DERIVED, *COLLECTORS):
            raise ValueError(
                f"column {column.name!r}: no collector of source {column.source!r}; "
                f"registered: {sorted(COLLECTORS)} (or {DERIVED!r})"
            )


def collect_trial(
    outputs: Mapping[str, Any], columns: Sequence[Column] = PERF_COLUMNS
) -> dict[str, Any]:
    """One trial's values of every column sourced from a tool in ``outputs`` (source → its
    output), in the columns' order."""
    unknown = sorted(set(outputs) - set(COLLECTORS))
    if unknown:
        raise ValueError(f"no collector of {unknown}; registered: {sorted(COLLECTORS)}")
    check_sources(columns)
    values: dict[str, Any] = {}
    for source, output in outputs.items():
        values |= COLLECTORS[source](output, [c for c in columns if c.source == source])
    return {c.name: values[c.name] for c in columns if c.name in values}


def derived_values(
    trial: Mapping[str, Any], columns: Sequence[Column] = PERF_COLUMNS
) -> dict[str, Any]:
    """The derived columns' values of a trial, from its other values (in the columns' order:
    a derived column may use one defined before it)."""
    values = dict(trial)
    derived = {}
    for column in columns:
        if column.derive is not None:
            derived[column.name] = values[column.name] = column.derive(values)
    return derived


# --- perf_analyzer ----------------------------------------------------------------------------


@dataclass(frozen=True)
class PerfAnalyzerOutput:
    """One perf_analyzer measurement: its ``-f ... --verbose-csv`` file and its stdout."""

    csv_path: Path
    stdout: str


# The values perf_analyzer's stdout says and its CSV lacks: key → the pattern whose group 1
# holds it. "Client request count": the requests its client completed in the merged windows.
PERF_ANALYZER_STDOUT: dict[str, re.Pattern[str]] = {
    "Client request count": re.compile(r"Client:\s*\n\s*Request count:\s*(\d+)"),
}


def perf_analyzer_row(csv_path: Path) -> dict[str, str]:
    """perf_analyzer's ``-f`` CSV's one row, heading → text."""
    with csv_path.open() as f:
        rows = list(csv.DictReader(f))
    if len(rows) != 1:
        raise PerfError(f"{csv_path}: expected one measurement row, found {len(rows)}")
    return rows[0]


def _cell(raw: Mapping[str, str], column: Column, csv_path: Path, elsewhere: str = "") -> Any:
    """``column``'s value in perf_analyzer's row ``raw``: None where an optional column's
    heading is missing (its flag not passed), a clear error where another's is."""
    key = str(column.key)
    if key in raw:
        return read_value(column, raw[key] or "")
    if column.optional:
        return None
    raise PerfError(
        f"{csv_path}: perf_analyzer wrote no {key!r} (column {column.name!r}); "
        f"its CSV has {list(raw)}{elsewhere}"
    )


@collector(PERF_ANALYZER)
def perf_analyzer(output: PerfAnalyzerOutput, columns: Sequence[Column]) -> dict[str, Any]:
    """perf_analyzer's one-row CSV (a column's ``key``: its heading) and its stdout (a key of
    ``PERF_ANALYZER_STDOUT``; None where it does not say it)."""
    raw = perf_analyzer_row(output.csv_path)
    values: dict[str, Any] = {}
    for column in columns:
        key = str(column.key)
        if key in PERF_ANALYZER_STDOUT:
            match = PERF_ANALYZER_STDOUT[key].search(output.stdout)
            values[column.name] = read_value(column, match.group(1)) if match else None
        else:
            elsewhere = f", its stdout {sorted(PERF_ANALYZER_STDOUT)}"
            values[column.name] = _cell(raw, column, output.csv_path, elsewhere)
    return values


# --- perf_analyzer's per-request export -------------------------------------------------------

PROFILE_EXPORT = "profile_export"


@collector(PROFILE_EXPORT)
def profile_export(output: MeasuredWindow | None, columns: Sequence[Column]) -> dict[str, Any]:
    """The trial's measured windows as perf_analyzer's ``--profile-export-file`` records them
    (:func:`deploybench.tails.read_profile_export`): a column's ``key`` names an attribute
    (``latencies_ms``: every request's latency, sorted; ``requests``: how many). None: no
    export was asked for (its tensors would cost too much): no value."""
    if output is None:
        return dict.fromkeys((c.name for c in columns), None)
    values = {}
    for column in columns:
        value = getattr(output, str(column.key))
        values[column.name] = list(value) if column.kind == "list" else value
    return values


# --- the energy meter ---------------------------------------------------------------------------

ENERGY = "energy"


@dataclass(frozen=True)
class EnergyOutput:
    """A trial's energy: the meter's telemetry over perf_analyzer's measured windows (None: not
    measured, ``status`` says why), the inferences those windows completed, and the idle power
    the job measured before its first trial with its 95 % half-width (None: not measured).
    ``max_slowdown_fraction``: the share of the windows a thermal or hardware slowdown may
    take before the trial counts as throttled (telemetry.SLOWDOWNS)."""

    status: str  # the meter ("nvml", "rapl") or "not measured: <why>"
    telemetry: WindowTelemetry | None
    inferences: int
    idle_power_w: float | None = None
    power_limit_w: float | None = None
    idle_ci95_w: float | None = None
    max_slowdown_fraction: float = 0.05


# the energy columns the idle baseline sets (idle_values)
IDLE_KEYS = (
    "idle_power_w",
    "idle_power_ci95_w",
    "energy_above_idle_per_inference_j",
    "idle_ci95_per_inference_j",
)


def idle_values(
    energy_per_inference_j: float | None,
    seconds_per_inference: float | None,
    idle_power_w: float | None,
    idle_ci95_w: float | None,
) -> dict[str, Any]:
    """The idle baseline's columns of a trial: the idle power and its half-width, the energy
    above it per inference, (E - P_idle t) / n = E/n - P_idle t/n, and how far the idle's
    half-width moves that figure, its half-width x t/n (None: not measured, or no interval)."""
    known = energy_per_inference_j is not None and seconds_per_inference is not None
    above = share = None
    if known and idle_power_w is not None:
        assert energy_per_inference_j is not None and seconds_per_inference is not None
        above = energy_per_inference_j - idle_power_w * seconds_per_inference
        if idle_ci95_w is not None and not math.isnan(idle_ci95_w):
            share = idle_ci95_w * seconds_per_inference
    values = {
        "idle_power_w": idle_power_w,
        "idle_power_ci95_w": None
        if idle_ci95_w is None or math.isnan(idle_ci95_w) or idle_power_w is None
        else idle_ci95_w,
        "energy_above_idle_per_inference_j": above,
        "idle_ci95_per_inference_j": share,
    }
    return {k: None if v is None else as_written(v) for k, v in values.items()}


def with_idle(
    row: Mapping[str, Any], idle_power_w: float | None, idle_ci95_w: float | None
) -> dict[str, Any]:
    """A trial's row with the idle baseline's columns set anew from ``idle_power_w`` (± its
    ``idle_ci95_w``): the baseline known only once the sweep is over (before and after it).
    A row with no energy keeps its empty columns; t/n is the row's energy per inference over
    its mean power."""
    energy, power = row.get("energy_per_inference_j"), row.get("power_mean_w")
    if energy is None or power is None or not float(power) > 0:
        return dict(row)
    per_inference = float(energy) / float(power)
    return {**row, **idle_values(float(energy), per_inference, idle_power_w, idle_ci95_w)}


def energy_values(output: EnergyOutput) -> dict[str, Any]:
    """Every energy column's value (by key) of one trial; None for what was not measured."""
    from .telemetry import POWER_CAP, SLOWDOWNS  # ctypes and threads: only where measured

    window = output.telemetry
    values: dict[str, Any] = {"energy_status": output.status}
    if window is None or output.inferences <= 0:
        return values | {"throttled": None, "throttle_reasons": "", "throttle_source": ""}
    measured = {
        "energy_per_inference_j": window.energy_j / output.inferences,
        "power_mean_w": window.power_mean_w,
        "power_max_w": window.power_max_w,
        "sm_clock_mhz": window.sm_clock_mhz,
        "mem_clock_mhz": window.mem_clock_mhz,
        "temperature_c": window.temperature_c,
        "power_limit_w": output.power_limit_w,
        "gpu_util_pct": window.gpu_util_pct,
        "memory_used_mib": window.memory_used_mib,
    }
    fractions = window.slowdowns
    unstable = [fractions[s.name] for s in SLOWDOWNS if s.unstable and s.name in fractions]
    slowdown = max(unstable) if unstable else None
    power_cap = fractions.get(POWER_CAP)
    return (
        values
        | {k: None if v is None else as_written(v) for k, v in measured.items()}
        | idle_values(
            window.energy_j / output.inferences,
            window.seconds / output.inferences,
            output.idle_power_w,
            output.idle_ci95_w,
        )
        | {
            "throttle_power_cap_fraction": None if power_cap is None else as_written(power_cap),
            "throttle_slowdown_fraction": None if slowdown is None else as_written(slowdown),
            "throttled": None if slowdown is None else slowdown > output.max_slowdown_fraction,
            "throttle_reasons": slowdown_text(fractions),
            "throttle_source": "; ".join(dict.fromkeys(window.slowdown_sources.values())),
        }
    )


@collector(ENERGY)
def energy(output: EnergyOutput, columns: Sequence[Column]) -> dict[str, Any]:
    """The energy columns of a trial (:func:`energy_values`; a column's ``key`` names one)."""
    values = energy_values(output)
    return {c.name: values.get(str(c.key)) for c in columns}


# --- a second meter: Triton's nv_energy_consumption ------------------------------------------

TRITON_METRICS = "triton_metrics"


@dataclass(frozen=True)
class TritonMetricsOutput:
    """A trial's energy by Triton's own counter (deploybench.triton_metrics.trial_energy) over
    the same windows as the energy meter's, and the inferences they completed; None: not
    measured, ``status`` says why."""

    status: str
    energy_j: float | None
    inferences: int


@collector(TRITON_METRICS)
def triton_metrics(output: TritonMetricsOutput, columns: Sequence[Column]) -> dict[str, Any]:
    """Joules per inference by Triton's counter and its status (a column's ``key`` names one)."""
    per_inference = None
    if output.energy_j is not None and output.inferences > 0:
        per_inference = as_written(output.energy_j / output.inferences)
    values = {
        "energy_per_inference_triton_j": per_inference,
        "triton_energy_status": output.status,
    }
    return {c.name: values.get(str(c.key)) for c in columns}


# --- Triton's GPU metrics, as perf_analyzer collects them -------------------------------------

TRITON_GPU_METRICS = "triton_gpu_metrics"


@dataclass(frozen=True)
class GpuMetricsOutput:
    """A trial's Triton GPU metrics: perf_analyzer's CSV, whose ``--collect-metrics`` cells hold
    them (None: no CSV), and how they were read ("triton ... via perf_analyzer" or "not
    measured: <why>": deploybench.instruments.TritonGpuMetrics)."""

    status: str
    csv_path: Path | None


NO_GPU_VALUE = "not measured: perf_analyzer's --collect-metrics cells held no GPU value"


@collector(TRITON_GPU_METRICS)
def triton_gpu_metrics(output: GpuMetricsOutput, columns: Sequence[Column]) -> dict[str, Any]:
    """The per-GPU cells perf_analyzer wrote (a column's ``key``: its heading, read by its
    ``parse`` rule) and the status (``key`` "status"): "not measured: <why>" where no cell held
    a value, though the server has GPU metrics (a run perf_analyzer merged no reading of)."""
    raw = perf_analyzer_row(output.csv_path) if output.csv_path is not None else {}
    values: dict[str, Any] = {}
    for column in columns:
        if column.key != "status":
            values[column.name] = _cell(raw, column, output.csv_path or Path("-"))
    status = output.status
    if not status.startswith("not measured") and all(v is None for v in values.values()):
        status = NO_GPU_VALUE
    values |= {c.name: status for c in columns if c.key == "status"}
    return values


check_sources(PERF_COLUMNS)
