"""The perf results' columns, each defined once: where its value comes from, how it is read,
how a point's trials combine into it, and its labels.

One :class:`Column` entry in ``DEFINED`` (and, for a new measuring tool, its collector in
:mod:`deploybench.collectors`) takes a metric everywhere: the perf CSV (``CSV_COLUMNS``, in the
entries' order, each averaged column's 95 % interval beside the others'), the trials CSV
(``TRIAL_COLUMNS``), the point's summary over its trials (``perf.summarize``), the report's
tables (``TABLE_LABELS``), ``deploybench summary``'s point lines (``SUMMARY_CELLS``) and the
charts' labels (:func:`chart_labels`). Every table here is a function of a columns tuple too, so
a test can extend it. A leaf module: it imports nothing of deploybench.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_args

# What a column holds: the run, the point measured, a measured value, or how the measurement
# went. Latency components add up to the whole request (the online breakdown stacks them);
# quantiles summarise it (the offline latency graph draws them); a metric is any other
# measured value (energy, GPU telemetry). An interval column holds the 95 % confidence
# half-width (over trials) of the column `of`; it is made from its column's `interval`.
Role = Literal[
    "run", "point", "throughput", "component", "quantile", "metric", "interval", "measurement"
]
LATENCY_ROLES: tuple[Role, ...] = ("component", "quantile")
INTERVAL_SUFFIX = "_ci95"
# A value's type: how its source's text is read, and how its trials combine.
Kind = Literal["float", "int", "bool", "str", "list"]  # list: a trial's own values, never in a CSV
# How a point's trials combine into its row:
#   key      the point's identity (its trials share it)
#   mean     the trials' mean (as_written); with `interval`, its 95 % half-width beside it
#   sum, min, max   over the trials; None when any trial has none
#   any, all        of the trials' flags
#   first    the first trial's value
#   union    the trials' distinct texts, in order, joined by "; " (empty ones left out)
#   pooled   computed by `pool` from the trials' rows together (a percentile over every
#            request of every trial, say)
#   count    how many trials
#   verdict  judged by perf.summarize from the trials as a whole (not one column's values)
#   None     not per trial: the job sets it for the scenario's every row (the run, the
#            transport), or a trials-only column
Aggregate = Literal[
    "key", "mean", "sum", "min", "max", "any", "all", "first", "union", "pooled", "count", "verdict"
]
# A column whose value is computed from the trial's other values, not read from a tool.
DERIVED = "derived"

# The precision a measured value is written with (trials' and points' CSVs alike): significant
# digits, not decimals, so that a small value (0.03 J per inference) keeps as many digits as a
# large one (a throughput of 30,000/s); far finer than any measurement resolves. Read back, a
# value lies within WRITTEN_REL (relative) of what was computed.
WRITTEN_DIGITS = 9
WRITTEN_REL = 0.5 * 10 ** (1 - WRITTEN_DIGITS)


def as_written(value: float) -> float:
    """``value`` to :data:`WRITTEN_DIGITS` significant digits, and no "-0"."""
    return float(f"{value:.{WRITTEN_DIGITS}g}") + 0.0


@dataclass(frozen=True)
class SummaryCell:
    """A column in ``deploybench summary``'s point lines: its heading, right-aligned in
    ``width`` characters; the value to 2 decimals, or with ``interval`` "x ± h (p %)"."""

    heading: str
    width: int
    interval: bool = False


@dataclass(frozen=True)
class Column:
    name: str  # ours, in the CSVs; latencies in ms
    role: Role
    # Which collector's output of a trial holds it (deploybench.collectors.COLLECTORS; DERIVED:
    # computed by `derive`); None: deploybench sets it (the run, the point, the measurement
    # loop's own records).
    source: str | None = None
    # Its name in the source's output: perf_analyzer's --verbose-csv heading, or one of the
    # values its stdout says (collectors.PERF_ANALYZER_STDOUT).
    key: str | None = None
    kind: Kind = "float"
    divisor: float = 1.0  # the source's unit over ours: perf_analyzer's µs to our ms, 1000
    derive: Callable[[Mapping[str, Any]], Any] | None = None  # DERIVED: the value of a trial
    # aggregate "pooled": the point's value from its trials' rows (in measurement order)
    pool: Callable[[Sequence[Mapping[str, Any]]], Any] | None = None
    aggregate: Aggregate | None = None
    interval: bool = False  # a mean with its 95 % half-width column (`<name>_ci95`)
    in_points: bool = True  # in the perf CSV (a row per point)
    in_trials: bool = True  # in the trials CSV (a row per trial)
    table_label: str | None = None  # the seed pages' table heading; None: not in the tables
    chart_label: str | None = None  # its name in the charts; None: not drawn by name
    summary: SummaryCell | None = None  # in `deploybench summary`'s point lines
    of: str | None = None  # an interval column: the column whose half-width it holds
    # A mean's uncertainty beyond its trials' spread, common to all of them: the trials' mean
    # of this column (a half-width) is added to the trials' half-width in quadrature (the
    # idle baseline's share in the energy above it).
    widened_by: str | None = None
    # Its key may be missing from the source's output (a flag not passed): the value is None,
    # not an error.
    optional: bool = False
    # Reads the source's text instead of `kind` and `divisor` (perf_analyzer's per-GPU cells:
    # gpu_cells); an empty text is None.
    parse: Callable[[str], Any] | None = None

    @property
    def perf_analyzer(self) -> str | None:
        """perf_analyzer's --verbose-csv heading of the column, if it is read from there."""
        return self.key if self.source == "perf_analyzer" else None


def measured_seconds(values: Mapping[str, Any], batch: int) -> float | None:
    """How long a measurement's merged windows lasted: its requests' inferences over its
    throughput (perf_analyzer reports both, not the duration)."""
    requests, throughput = values.get("measured_requests"), values["throughput"]
    if not requests or not throughput:
        return None
    return float(requests * batch / throughput)


def _trial_seconds(trial: Mapping[str, Any]) -> float | None:
    seconds = measured_seconds(trial, int(trial["batch"]))
    return None if seconds is None else round(seconds, 3)


# The tail percentile whose backing the pooled columns judge, and the confidence loadgen's
# early-stopping rule is run at (deploybench.tails: its SingleStream estimate, whose confidence
# assumes independent one-at-a-time queries, which concurrent and pooled requests are not).
TAIL_PERCENTILE = 0.99
TAIL_CONFIDENCE = 0.99
P99_ESTIMATE_LABEL = "p99 early-stopping estimate (ms)"


def _pooled_latencies(trials: Sequence[Mapping[str, Any]]) -> list[float] | None:
    """Every request's latency (ms) of the point's trials, sorted; None when a trial has no
    per-request record (a CSV row, a trial measured without the profile export)."""
    pooled: list[float] = []
    for trial in trials:
        latencies = trial.get("latencies_ms")
        if latencies is None:
            return None
        pooled.extend(latencies)
    return sorted(pooled)


def _p99_pooled(trials: Sequence[Mapping[str, Any]]) -> float | None:
    latencies = _pooled_latencies(trials)
    if not latencies:
        return None
    from .tails import percentile  # columns stays a leaf module at import

    return as_written(percentile(latencies, TAIL_PERCENTILE))


def _p99_bound(trials: Sequence[Mapping[str, Any]]) -> float | None:
    latencies = _pooled_latencies(trials)
    if latencies is None:
        return None
    from .tails import early_stopping_bound

    estimate = early_stopping_bound(latencies, TAIL_PERCENTILE, TAIL_CONFIDENCE).estimate_ms
    return None if estimate is None else as_written(estimate)


def _tail_note(trials: Sequence[Mapping[str, Any]]) -> str:
    latencies = _pooled_latencies(trials)
    if latencies is None:
        return "no per-request record"
    from .tails import early_stopping_bound, tail_note

    return tail_note(early_stopping_bound(latencies, TAIL_PERCENTILE, TAIL_CONFIDENCE))


# The slowdown NVML calls "sw power cap": the GPU's normal state at its power limit, reported
# but no reason to call a point unstable (deploybench.telemetry.SLOWDOWNS)
POWER_CAP_REASON = "sw power cap"


def slowdown_text(fractions: Mapping[str, float]) -> str:
    """Slowdowns and their fractions as the ``throttle_reasons`` column writes them, the
    reasons in order, those at 0 left out: "sw power cap 100 %; sw thermal slowdown 10 %"."""
    return "; ".join(
        f"{name} {fraction * 100:.3g} %" for name, fraction in fractions.items() if fraction > 0
    )


def slowdown_parts(text: Any) -> dict[str, float]:
    """The fractions a ``throttle_reasons`` text holds (:func:`slowdown_text`), by reason; a
    reason written without one (a CSV from before the fractions) as 1."""
    found: dict[str, float] = {}
    for part in str(text or "").split("; "):
        part = part.strip()
        if not part:
            continue
        match = re.fullmatch(r"(.+) ([0-9.e+-]+) %", part)
        if match:
            found[match.group(1)] = float(match.group(2)) / 100
        else:
            found[part] = 1.0
    return found


def _slowdowns_pooled(trials: Sequence[Mapping[str, Any]]) -> str:
    """A point's ``throttle_reasons``: each slowdown its trials saw, at the most of the
    trials' fractions."""
    found: dict[str, float] = {}
    for trial in trials:
        for name, fraction in slowdown_parts(trial.get("throttle_reasons")).items():
            found[name] = max(found.get(name, 0.0), fraction)
    return slowdown_text(found)


def _energy(
    name: str,
    aggregate: Aggregate | None,
    table: str | None = None,
    kind: Kind = "float",
    interval: bool = False,
    summary: SummaryCell | None = None,
    pool: Callable[[Sequence[Mapping[str, Any]]], Any] | None = None,
    widened_by: str | None = None,
    in_points: bool = True,
) -> Column:
    """A value of the trial's energy meter (NVML on a GPU, RAPL on a CPU: deploybench.meters)
    over perf_analyzer's measured windows; empty where the meter measured nothing (never 0)."""
    return Column(
        name,
        "metric",
        source="energy",
        key=name,
        kind=kind,
        aggregate=aggregate,
        interval=interval,
        table_label=table,
        summary=summary,
        pool=pool,
        widened_by=widened_by,
        in_points=in_points,
    )


def _perf(
    name: str,
    role: Role,
    heading: str,
    table: str,
    chart: str | None = None,
    summary: SummaryCell | None = None,
) -> Column:
    """A value of perf_analyzer's --verbose-csv row: throughput as it is, latencies from µs
    to ms; averaged over the point's trials, the throughput and the quantiles with their
    interval (the components have none: the breakdown's bar is the average latency's)."""
    return Column(
        name,
        role,
        source="perf_analyzer",
        key=heading,
        divisor=1.0 if role == "throughput" else 1000.0,
        aggregate="mean",
        interval=role in ("throughput", "quantile"),
        table_label=table,
        chart_label=chart,
        summary=summary,
    )


def gpu_cells(text: str) -> dict[str, float]:
    """perf_analyzer's per-GPU cell (``--collect-metrics``, ``--verbose-csv``): each GPU's value
    by UUID, from ``<uuid>:<value>;`` repeated (client r23.12, report_writer.cc); empty for an
    empty cell (a server without GPU metrics)."""
    values: dict[str, float] = {}
    for part in text.strip().split(";"):
        if part.strip():
            uuid, _, value = part.rpartition(":")
            if not uuid:
                raise ValueError(f"not a per-GPU cell <uuid>:<value>;: {text!r}")
            values[uuid.strip()] = float(value)
    return values


def _over_gpus(combine: Literal["mean", "sum"], scale: float) -> Callable[[str], float | None]:
    """A parser of a per-GPU cell into one value: the GPUs' mean or sum, times ``scale``; None
    where the cell names no GPU."""

    def parse(text: str) -> float | None:
        values = list(gpu_cells(text).values())
        if not values:
            return None
        total = sum(values) if combine == "sum" else sum(values) / len(values)
        return as_written(total * scale)

    return parse


def _triton_gpu(name: str, heading: str, parse: Callable[[str], Any], table: str) -> Column:
    """A value of Triton's GPU metrics as perf_analyzer collected them over its measured windows
    (``--collect-metrics``: deploybench.instruments.TritonGpuMetrics); empty on a server
    without GPU metrics (a CPU server), and ``triton_gpu_status`` says why."""
    return Column(
        name,
        "metric",
        source="triton_gpu_metrics",
        key=heading,
        aggregate="mean",
        table_label=table,
        optional=True,
        parse=parse,
    )


def _run(name: str) -> Column:  # the same on every row of a scenario: the job sets it
    return Column(name, "run", kind="str")


# The columns in the CSV's order, which the seed tables keep too; the latency components
# bottom of the stack first, as in the seed pages' tables. The interval columns are not listed:
# they stand together after the last column that has one, in their values' order.
# fmt: off
DEFINED: tuple[Column, ...] = (
    _run("model"),
    _run("gpu"),
    _run("format"),
    _run("precision"),
    _run("scenario"),
    Column("batch", "point", kind="int", aggregate="key", table_label="Batch"),
    Column("concurrency", "point", kind="int", aggregate="key", table_label="Concurrency"),
    # The trial's number (1, 2, ...), in the trials CSV only.
    Column("trial", "point", kind="int", in_points=False),
    # The job's attempt that measured the trial: 1, or 2, 3, ... where an attempt stopped
    # partway kept its finished trials and a later one measured the rest (deploybench.partial).
    Column("attempt", "point", kind="int", in_points=False),
    # name, role, perf_analyzer's heading, the seed table's heading, the chart's label
    _perf("throughput", "throughput", "Inferences/Second", "Inferences/Second",
          summary=SummaryCell("throughput infer/s ± 95 %", 28, interval=True)),
    _perf("client_send_ms", "component", "Client Send", "Client Send (ms)", "Client Send"),
    _perf("network_server_send_recv_ms", "component", "Network+Server Send/Recv",
          "Network+Server Send/Recv (ms)", "Network+Server Send/Recv"),
    _perf("server_queue_ms", "component", "Server Queue", "Server Queue (ms)", "Server Queue"),
    _perf("server_compute_input_ms", "component", "Server Compute Input",
          "Server Compute Input (ms)", "Server Compute Input"),
    _perf("server_compute_infer_ms", "component", "Server Compute Infer",
          "Server Compute Infer (ms)", "Server Compute Infer"),
    _perf("server_compute_output_ms", "component", "Server Compute Output",
          "Server Compute Output (ms)", "Server Compute Output"),
    _perf("client_recv_ms", "component", "Client Recv", "Client Recv (ms)", "Client Recv"),
    _perf("p50_latency_ms", "quantile", "p50 latency", "p50 latency (ms)", "p50"),
    _perf("p90_latency_ms", "quantile", "p90 latency", "p90 latency (ms)", "p90"),
    # The seed pages' latency graphs leave p95 out; their tables keep it.
    _perf("p95_latency_ms", "quantile", "p95 latency", "p95 latency (ms)"),
    _perf("p99_latency_ms", "quantile", "p99 latency", "p99 latency (ms)", "p99",
          summary=SummaryCell("p99 ms", 8)),
    _perf("avg_latency_ms", "quantile", "Avg latency", "avg latency (ms)", "avg"),
    # Every request of the trial's measured windows (perf_analyzer's --profile-export-file): the
    # pooled tail over all the point's trials and how much data backs it (deploybench.tails).
    Column("latencies_ms", "measurement", "profile_export", "latencies_ms", kind="list",
           in_points=False, in_trials=False),
    Column("tail_requests", "measurement", "profile_export", "requests", kind="int",
           aggregate="sum"),
    Column("p99_pooled_ms", "quantile", aggregate="pooled", pool=_p99_pooled, in_trials=False),
    # loadgen's SingleStream early-stopping estimate of the p99 over the pooled requests (the
    # name is older than the label: not a 99 % confidence bound where requests overlap)
    Column("p99_bound_ms", "quantile", aggregate="pooled", pool=_p99_bound, in_trials=False,
           table_label=P99_ESTIMATE_LABEL),
    Column("tail_note", "measurement", kind="str", aggregate="pooled", pool=_tail_note,
           in_trials=False),
    # Energy over the trial's measured windows, from the meter's counter at their two ends;
    # above idle: less the idle power (the server loaded, no load; read before and after the
    # sweep) over the same seconds, its interval widened by the idle's. The GPU's state over
    # the windows beside it.
    _energy("energy_per_inference_j", "mean", "Energy per inference (J)", interval=True,
            summary=SummaryCell("J/infer ± 95 %", 24, interval=True)),
    _energy("energy_above_idle_per_inference_j", "mean", "Energy above idle (J)",
            interval=True, widened_by="idle_ci95_per_inference_j"),
    # a trial's: the idle's 95 % half-width x the windows' seconds / their inferences
    _energy("idle_ci95_per_inference_j", None, in_points=False),
    _energy("power_mean_w", "mean", "Mean power (W)"),
    _energy("power_max_w", "max"),
    _energy("idle_power_w", "first"),
    _energy("idle_power_ci95_w", "first"),
    _energy("sm_clock_mhz", "mean"),
    _energy("mem_clock_mhz", "mean"),
    _energy("temperature_c", "max"),
    _energy("power_limit_w", "first"),
    _energy("gpu_util_pct", "mean"),
    _energy("memory_used_mib", "max"),
    # a trial in which a thermal or hardware slowdown held the clocks down for more than
    # energy.max_slowdown_fraction of the windows (power capping does not count); each
    # slowdown's fraction of the windows (a point's: the most of its trials'), the power cap's
    # and the largest slowdown's, and how they were measured (deploybench.telemetry.SLOWDOWNS)
    _energy("throttled", "any", "Throttled", kind="bool"),
    _energy("throttle_reasons", "pooled", kind="str", pool=_slowdowns_pooled),
    _energy("throttle_power_cap_fraction", "max"),
    _energy("throttle_slowdown_fraction", "max"),
    _energy("throttle_source", "union", kind="str"),
    # the meter ("nvml", "rapl") or "not measured: <why>"; a point: its trials' distinct ones
    _energy("energy_status", "union", kind="str"),
    # A second meter where the server has one: Triton's own nv_energy_consumption (its metrics
    # endpoint, DCGM's counter) over the same windows, so a GPU run shows whether two meters
    # agree; empty on a CPU server, and its status says why (deploybench.triton_metrics).
    Column("energy_per_inference_triton_j", "metric", "triton_metrics",
           "energy_per_inference_triton_j", aggregate="mean"),
    Column("triton_energy_status", "metric", "triton_metrics", "triton_energy_status",
           kind="str", aggregate="union"),
    # Triton's GPU utilisation, power and memory (its metrics endpoint, DCGM's readings), which
    # perf_analyzer collects over its measured windows beside NVML's: the GPUs' mean utilisation
    # (Triton's 0-1 as %), their summed mean power and their summed peak memory used.
    _triton_gpu("triton_gpu_util_pct", "Avg GPU Utilization", _over_gpus("mean", 100.0),
                "Triton GPU utilization (%)"),
    _triton_gpu("triton_gpu_power_w", "Avg GPU Power Usage", _over_gpus("sum", 1.0),
                "Triton GPU power (W)"),
    _triton_gpu("triton_gpu_memory_used_mib", "Max GPU Memory Usage",
                _over_gpus("sum", 1 / 2**20), "Triton GPU memory used (MiB)"),
    Column("triton_gpu_status", "metric", "triton_gpu_metrics", "status", kind="str",
           aggregate="union"),
    # (the 95 % half-widths of throughput and each quantile stand here; empty with one trial)
    Column("trials", "measurement", kind="int", aggregate="count", in_trials=False,
           table_label="Trials"),
    # Requests per measurement window (the fewest of the trials) and all trials' measured
    # requests (what perf_analyzer's stdout says its client completed); the shortest trial's
    # measured seconds; whether the duration cap cut the request count (a slow point,
    # measured on few requests).
    Column("request_count", "measurement", kind="int", aggregate="min"),
    Column("measured_requests", "measurement", "perf_analyzer", "Client request count",
           kind="int", aggregate="sum", table_label="Measured requests"),
    Column("measured_s", "measurement", DERIVED, derive=_trial_seconds, aggregate="min"),
    Column("duration_capped", "measurement", kind="bool", aggregate="any",
           table_label="Duration capped"),
    # A trial's: perf_analyzer called it stable. A point's: every trial stable by perf_analyzer,
    # the throughput interval within perf.max_ci_pct, and no thermal or hardware slowdown over
    # energy.max_slowdown_fraction of a trial (perf.unstable_reason).
    Column("stable", "measurement", kind="bool", aggregate="verdict", table_label="Stable"),
    Column("attempts", "measurement", kind="int", aggregate="sum"),
    # How perf_analyzer reached the server (deploybench.transport): http | grpc, and none |
    # system | cuda shared memory, as used (a CPU device measures a configured cuda as system;
    # the provenance's `config.transport` has the configured one and why).
    Column("protocol", "measurement", kind="str"),
    Column("shared_memory", "measurement", kind="str"),
    # Why `stable` is False (empty when it is True): "perf_analyzer did not settle (k of n
    # trials)", "interval ±x.x % > max_ci_pct y %", "GPU thermal or hardware slowdown (...) in
    # k of n trials", those that hold joined by "; " (perf.unstable_reason).
    # Last: a CSV written before it has every other column in the same place.
    Column("unstable_reason", "measurement", kind="str", aggregate="verdict", in_trials=False),
)
# fmt: on


def _interval_column(column: Column) -> Column:
    # Not a table column of its own: the report writes it beside its value ("12.3 ± 0.4").
    return Column(column.name + INTERVAL_SUFFIX, "interval", in_trials=False, of=column.name)


def check(columns: Sequence[Column]) -> None:
    """A clear error for a columns table that cannot work: a duplicate name, a value outside
    its choices, an interval on anything but a mean, a derived column without its rule."""
    names = [c.name for c in columns]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"columns defined twice: {duplicates}")
    for column in columns:
        for field, value, choices in (
            ("role", column.role, get_args(Role)),
            ("kind", column.kind, get_args(Kind)),
            ("aggregate", column.aggregate, (None, *get_args(Aggregate))),
        ):
            if value not in choices:
                raise ValueError(
                    f"column {column.name!r}: {field} {value!r}; valid choices: {choices}"
                )
        if column.interval and column.aggregate != "mean":
            raise ValueError(
                f"column {column.name!r}: an interval needs aggregate 'mean', "
                f"not {column.aggregate!r}"
            )
        if column.summary is not None and column.summary.interval and not column.interval:
            raise ValueError(
                f"column {column.name!r}: its summary cell shows an interval it has not"
            )
        if (column.source == DERIVED) != (column.derive is not None):
            raise ValueError(
                f"column {column.name!r}: source {DERIVED!r} and a `derive` rule go together"
            )
        if column.source not in (None, DERIVED) and not column.key:
            raise ValueError(
                f"column {column.name!r}: source {column.source!r} needs the `key` that "
                "names the value in its output"
            )
        if (column.aggregate == "pooled") != (column.pool is not None):
            raise ValueError(
                f"column {column.name!r}: aggregate 'pooled' and a `pool` rule go together"
            )
        if column.widened_by is not None and not column.interval:
            raise ValueError(f"column {column.name!r}: widened_by widens an interval it has not")
        if column.kind == "list" and (column.in_points or column.in_trials):
            raise ValueError(f"column {column.name!r}: a list is a trial's own, in no CSV")
        if not math.isfinite(column.divisor) or column.divisor == 0:
            raise ValueError(f"column {column.name!r}: divisor {column.divisor!r}")
        if column.parse is not None and column.divisor != 1.0:
            raise ValueError(f"column {column.name!r}: a `parse` rule sets the unit, not divisor")


def with_intervals(defined: Sequence[Column]) -> tuple[Column, ...]:
    """``defined`` with each interval column made, together after the last column that has
    one (so the CSV keeps the order it was first written in)."""
    check(defined)
    having = [i for i, c in enumerate(defined) if c.interval]
    if not having:
        return tuple(defined)
    at = having[-1] + 1
    made = tuple(_interval_column(c) for c in defined if c.interval)
    return (*defined[:at], *made, *defined[at:])


def csv_columns(columns: Iterable[Column]) -> list[str]:
    """The perf CSV's columns (a row per point), in order."""
    return [c.name for c in columns if c.in_points]


def trial_columns(columns: Iterable[Column]) -> list[str]:
    """The trials CSV's columns (a row per trial: the values as measured, no intervals, no
    point-level verdicts; a trial's `stable` is perf_analyzer's verdict on it), in order."""
    return [c.name for c in columns if c.in_trials]


def interval_columns(columns: Iterable[Column]) -> dict[str, str]:
    """Value column → its interval column."""
    return {c.of: c.name for c in columns if c.of is not None}


def averaged(columns: Iterable[Column]) -> list[str]:
    """The columns a point's row holds the trials' mean of, in order."""
    return [c.name for c in columns if c.aggregate == "mean"]


def table_labels(columns: Iterable[Column]) -> dict[str, str]:
    """Our column → the seed pages' table heading, in the tables' order."""
    return {c.name: c.table_label for c in columns if c.in_points and c.table_label is not None}


def summary_cells(columns: Iterable[Column]) -> dict[str, SummaryCell]:
    """Our column → its cell in ``deploybench summary``'s point lines, in order."""
    return {c.name: c.summary for c in columns if c.in_points and c.summary is not None}


def perf_analyzer_headings(columns: Iterable[Column], roles: Iterable[Role]) -> dict[str, str]:
    """perf_analyzer's heading → our column, for the columns of ``roles`` read from its CSV."""
    wanted = set(roles)
    return {
        c.perf_analyzer: c.name for c in columns if c.role in wanted and c.perf_analyzer is not None
    }


# Every column, the interval columns made: the tables below derive from it.
PERF_COLUMNS: tuple[Column, ...] = with_intervals(DEFINED)
CSV_COLUMNS: list[str] = csv_columns(PERF_COLUMNS)
TRIAL_COLUMNS: list[str] = trial_columns(PERF_COLUMNS)
INTERVAL_COLUMNS: dict[str, str] = interval_columns(PERF_COLUMNS)
MEASURED: list[str] = averaged(PERF_COLUMNS)  # averaged over trials
# perf_analyzer's heading → our column for the latencies (from µs to ms).
LATENCY_COLUMNS: dict[str, str] = perf_analyzer_headings(PERF_COLUMNS, LATENCY_ROLES)
TABLE_LABELS: dict[str, str] = table_labels(PERF_COLUMNS)
SUMMARY_CELLS: dict[str, SummaryCell] = summary_cells(PERF_COLUMNS)


def chart_labels(role: Role, columns: Iterable[Column] = PERF_COLUMNS) -> dict[str, str]:
    """Our column → its chart label, for the drawn columns of ``role``, in the CSV's order."""
    return {
        column.name: column.chart_label
        for column in columns
        if column.role == role and column.chart_label is not None
    }
