"""The perf results' columns, each defined once: our name, perf_analyzer's, and their labels.

perf writes the CSV in this order, the report heads its tables with the seed pages' labels and
the charts name the latency components and quantiles with theirs; all three derive their
tables from ``PERF_COLUMNS``. A leaf module: it imports nothing of deploybench.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# What a column holds: the run, the point measured, a measured value, or how the measurement
# went. Latency components add up to the whole request (the online breakdown stacks them);
# quantiles summarise it (the offline latency graph draws them).
# An interval column holds the 95 % confidence half-width (over trials) of the column `of`.
Role = Literal["run", "point", "throughput", "component", "quantile", "interval", "measurement"]
LATENCY_ROLES: tuple[Role, ...] = ("component", "quantile")
INTERVAL_SUFFIX = "_ci95"


@dataclass(frozen=True)
class Column:
    name: str  # ours, in the CSV; latencies in ms
    role: Role
    perf_analyzer: str | None = None  # its --verbose-csv heading (latencies in µs there)
    table_label: str | None = None  # the seed pages' table heading; None: not in the tables
    chart_label: str | None = None  # its name in the charts; None: not drawn by name
    of: str | None = None  # an interval column: the column whose half-width it holds


def _interval(of: str) -> Column:
    # Not a table column of its own: the report writes it beside its value ("12.3 ± 0.4").
    return Column(of + INTERVAL_SUFFIX, "interval", of=of)


# The CSV's columns in its order, which the seed tables keep too; the latency components
# bottom of the stack first, as in the seed pages' tables.
# fmt: off
PERF_COLUMNS: tuple[Column, ...] = (
    Column("model", "run"),
    Column("gpu", "run"),
    Column("format", "run"),
    Column("precision", "run"),
    Column("scenario", "point"),
    Column("batch", "point", table_label="Batch"),
    Column("concurrency", "point", table_label="Concurrency"),
    Column("throughput", "throughput", "Inferences/Second", "Inferences/Second"),
    # name, role, perf_analyzer's heading, the seed table's heading, the chart's label
    Column("client_send_ms", "component", "Client Send", "Client Send (ms)", "Client Send"),
    Column("network_server_send_recv_ms", "component", "Network+Server Send/Recv",
           "Network+Server Send/Recv (ms)", "Network+Server Send/Recv"),
    Column("server_queue_ms", "component", "Server Queue", "Server Queue (ms)", "Server Queue"),
    Column("server_compute_input_ms", "component", "Server Compute Input",
           "Server Compute Input (ms)", "Server Compute Input"),
    Column("server_compute_infer_ms", "component", "Server Compute Infer",
           "Server Compute Infer (ms)", "Server Compute Infer"),
    Column("server_compute_output_ms", "component", "Server Compute Output",
           "Server Compute Output (ms)", "Server Compute Output"),
    Column("client_recv_ms", "component", "Client Recv", "Client Recv (ms)", "Client Recv"),
    Column("p50_latency_ms", "quantile", "p50 latency", "p50 latency (ms)", "p50"),
    Column("p90_latency_ms", "quantile", "p90 latency", "p90 latency (ms)", "p90"),
    # The seed pages' latency graphs leave p95 out; their tables keep it.
    Column("p95_latency_ms", "quantile", "p95 latency", "p95 latency (ms)"),
    Column("p99_latency_ms", "quantile", "p99 latency", "p99 latency (ms)", "p99"),
    Column("avg_latency_ms", "quantile", "Avg latency", "avg latency (ms)", "avg"),
    # The 95 % confidence half-widths of throughput and each quantile over the point's trials
    # (the columns above hold the trials' mean); empty with one trial.
    _interval("throughput"),
    _interval("p50_latency_ms"),
    _interval("p90_latency_ms"),
    _interval("p95_latency_ms"),
    _interval("p99_latency_ms"),
    _interval("avg_latency_ms"),
    Column("trials", "measurement", table_label="Trials"),
    # Requests per measurement window (the fewest of the trials) and all trials' measured
    # requests; the shortest trial's measured seconds; whether the duration cap cut the
    # request count (a slow point, measured on few requests).
    Column("request_count", "measurement"),
    Column("measured_requests", "measurement", table_label="Measured requests"),
    Column("measured_s", "measurement"),
    Column("duration_capped", "measurement", table_label="Duration capped"),
    # Every trial stable by perf_analyzer and the throughput interval within perf.max_ci_pct.
    Column("stable", "measurement", table_label="Stable"),
    Column("attempts", "measurement"),
    # How perf_analyzer reached the server (deploybench.transport): http | grpc, and none |
    # system | cuda shared memory, as used (a CPU device measures a configured cuda as system;
    # the provenance's `config.transport` has the configured one and why).
    Column("protocol", "measurement"),
    Column("shared_memory", "measurement"),
    # Why `stable` is False (empty when it is True): "perf_analyzer did not settle (k of n
    # trials)", "interval ±x.x % > max_ci_pct y %", or both joined by "; " (perf.unstable_reason).
    # Last: a CSV written before it has every other column in the same place.
    Column("unstable_reason", "measurement"),
)
# fmt: on

CSV_COLUMNS: list[str] = [column.name for column in PERF_COLUMNS]
# Value column → its interval column (throughput and the latency quantiles).
INTERVAL_COLUMNS: dict[str, str] = {
    column.of: column.name for column in PERF_COLUMNS if column.of is not None
}
# The sidecar `<scenario>.trials.csv`: one row per trial, the measured values as perf_analyzer
# reported them (no intervals, no point-level verdicts), in the measurement order.
TRIAL_COLUMNS: list[str] = [
    *(c.name for c in PERF_COLUMNS if c.role in ("run", "point")),
    "trial",
    *(c.name for c in PERF_COLUMNS if c.role in ("throughput", *LATENCY_ROLES)),
    "request_count",
    "measured_requests",
    "measured_s",
    "duration_capped",
    "stable",  # perf_analyzer's verdict on this trial
    "attempts",
    "protocol",
    "shared_memory",
]


def _perf_analyzer_columns(roles: tuple[Role, ...]) -> dict[str, str]:
    return {
        column.perf_analyzer: column.name
        for column in PERF_COLUMNS
        if column.role in roles and column.perf_analyzer is not None
    }


# perf_analyzer's heading → our column: throughput taken as it is, latencies from µs to ms.
THROUGHPUT_COLUMNS: dict[str, str] = _perf_analyzer_columns(("throughput",))
LATENCY_COLUMNS: dict[str, str] = _perf_analyzer_columns(LATENCY_ROLES)
# Our column → the seed pages' table heading, in the tables' order.
TABLE_LABELS: dict[str, str] = {
    column.name: column.table_label for column in PERF_COLUMNS if column.table_label is not None
}


def chart_labels(role: Role) -> dict[str, str]:
    """Our column → its chart label, for the drawn columns of ``role``, in the CSV's order."""
    return {
        column.name: column.chart_label
        for column in PERF_COLUMNS
        if column.role == role and column.chart_label is not None
    }
