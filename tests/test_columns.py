"""The metric seam: one Column entry (and, for a new tool, its collector) takes a value into the
trials CSV, the point's row with its interval, the report's tables, the summary and a chart.

No server, no perf_analyzer: a trial is perf_analyzer's --verbose-csv row and stdout as it
writes them, beside a fake tool's output."""

from __future__ import annotations

import csv
import math
from typing import Any

import pandas as pd
import pytest

from deploybench import chart_kit, collectors, perf, plots, summary
from deploybench.chart_kit import prepare, series_chart
from deploybench.chart_names import RunChart
from deploybench.collectors import PerfAnalyzerOutput, collect_trial, derived_values
from deploybench.columns import (
    CSV_COLUMNS,
    DEFINED,
    INTERVAL_COLUMNS,
    PERF_COLUMNS,
    Column,
    SummaryCell,
    check,
    csv_columns,
    interval_columns,
    summary_cells,
    table_labels,
    trial_columns,
    with_intervals,
)
from deploybench.errors import PerfError
from deploybench.io import write_csv
from deploybench.report_cells import markdown_table

# perf_analyzer 2.41's --verbose-csv heading and one row (latencies in µs); "response wait"
# is one of its columns we do not read yet.
PA_CSV = (
    "Concurrency,Inferences/Second,Client Send,Network+Server Send/Recv,Server Queue,"
    "Server Compute Input,Server Compute Infer,Server Compute Output,Client Recv,p50 latency,"
    "p90 latency,p95 latency,p99 latency,Avg latency,request/response,response wait\n"
    "1,{throughput},15,809,82,51,30133,331,4,31128,36176,37249,40799,31427,19,{wait}\n"
)
STDOUT = "Client: \n    Request count: {requests}\n"
FAKE = "fake_meter"  # a tool measuring beside perf_analyzer (NVML, say)

# The new columns: one of perf_analyzer's headings, and two of the fake tool's values.
RESPONSE_WAIT = Column(
    "response_wait_ms",
    "metric",
    source="perf_analyzer",
    key="response wait",
    divisor=1000.0,
    aggregate="mean",
    interval=True,
    table_label="Response wait (ms)",
)
ENERGY = Column(
    "meter_joules",
    "metric",
    source=FAKE,
    key="joules",
    aggregate="mean",
    interval=True,
    table_label="Meter joules (J)",
    chart_label="Energy",
    summary=SummaryCell("meter J ± 95 %", 24, interval=True),
)
SAMPLES = Column("meter_samples", "metric", source=FAKE, key="samples", kind="int", aggregate="sum")


def extended() -> tuple[Column, ...]:
    """The shipped columns with the new ones after the latencies."""
    at = [c.name for c in DEFINED].index("avg_latency_ms") + 1
    return with_intervals((*DEFINED[:at], RESPONSE_WAIT, ENERGY, SAMPLES, *DEFINED[at:]))


@pytest.fixture
def fake_meter(monkeypatch):
    """The fake tool's collector, registered for this test only."""
    monkeypatch.setattr(collectors, "COLLECTORS", dict(collectors.COLLECTORS))

    @collectors.collector(FAKE)
    def meter(output: dict[str, str], columns: list[Column]) -> dict[str, Any]:
        return {c.name: collectors.read_value(c, output[str(c.key)]) for c in columns}

    return meter


def trial(tmp_path, columns, n: int, throughput: float, joules: float) -> dict[str, Any]:
    """Trial ``n`` of batch 2 as perf.measure_point makes it: the tools' values, the
    measurement loop's records, the derived columns."""
    result = tmp_path / f"trial{n}.csv"
    result.write_text(PA_CSV.format(throughput=throughput, wait=31379 + 1000 * n))
    outputs = {
        "perf_analyzer": PerfAnalyzerOutput(result, STDOUT.format(requests=600)),
        FAKE: {"joules": str(joules), "samples": "40"},
    }
    row = {"batch": 2, "concurrency": 1, **collect_trial(outputs, columns)}
    row |= {"request_count": 100, "duration_capped": False, "stable": True, "attempts": 1}
    return row | derived_values(row, columns) | {"trial": n}


def test_a_new_column_reaches_every_output(tmp_path, fake_meter, monkeypatch):
    columns = extended()
    trials = [
        trial(tmp_path, columns, n, throughput, joules)
        for n, throughput, joules in ((1, 200.0, 12.0), (2, 202.0, 12.5), (3, 204.0, 13.0))
    ]
    # read and converted: µs → ms, the fake tool's text as numbers; derived from them
    assert trials[0]["response_wait_ms"] == pytest.approx(32.379)
    assert trials[0]["meter_joules"] == 12.0 and trials[0]["meter_samples"] == 40
    assert trials[0]["measured_s"] == round(600 * 2 / 200.0, 3)

    # the trials CSV: the new values as measured, no intervals
    path = tmp_path / "offline.trials.csv"
    write_csv(path, trials, trial_columns(columns))
    with path.open() as f:
        written = list(csv.DictReader(f))
    assert [r["meter_joules"] for r in written] == ["12.0", "12.5", "13.0"]
    assert "meter_joules_ci95" not in written[0]

    # the point's row: the mean with its 95 % interval, the sum, in the CSV's order
    [point] = perf.summarize(trials, max_ci_pct=5, columns=columns)
    assert point["meter_joules"] == 12.5
    # 12.0, 12.5, 13.0: s = 0.5 → 4.3027 * 0.5 / sqrt(3)
    assert point["meter_joules_ci95"] == pytest.approx(1.24207, abs=1e-5)
    assert point["response_wait_ms"] == pytest.approx(33.379)
    assert point["meter_samples"] == 120 and point["measured_requests"] == 1800
    assert point["stable"] is True and point["trials"] == 3
    order = csv_columns(columns)
    assert list(point) == [c for c in order if c in point]
    # the new intervals join the others' block; every shipped column keeps its order
    assert [c for c in order if c in CSV_COLUMNS] == CSV_COLUMNS
    block = order.index("avg_latency_ms_ci95")
    assert order[block + 1 : block + 3] == [
        "response_wait_ms_ci95",
        "meter_joules_ci95",
    ]
    assert order[-1] == "unstable_reason"

    # the report's tables: its heading, the value ± its half-width in one cell
    row = {"model": "tft", "gpu": "cpu", "format": "onnx", "precision": "fp32"} | point
    frame = pd.DataFrame([row | {"scenario": "offline"}])
    table = markdown_table(frame, table_labels(columns), interval_columns(columns))
    heading, _, cells = table.splitlines()
    assert "Meter joules (J)" in heading and "Response wait (ms)" in heading
    assert "| 12.5 ± 1.2 |" in cells

    # `deploybench summary`'s point line (a row as read from the CSV: text)
    monkeypatch.setattr(summary, "SUMMARY_CELLS", summary_cells(columns))
    monkeypatch.setattr(summary, "INTERVAL_COLUMNS", interval_columns(columns))
    line = summary.point_line({k: "" if v is None else str(v) for k, v in point.items()})
    assert "12.5 ± 1.2 (9.9 %)" in line

    # a chart of it, registered beside its function in place of a run chart's (its interval
    # drawn as an error bar: the charts' table of intervals, as the shipped columns make it)
    monkeypatch.setattr(chart_kit, "INTERVAL_COLUMNS", interval_columns(columns))
    monkeypatch.setattr(plots, "RUN_CHART_DRAWERS", dict(plots.RUN_CHART_DRAWERS))
    del plots.RUN_CHART_DRAWERS[RunChart.OFFLINE_THROUGHPUT]
    with pytest.raises(RuntimeError, match="without a function drawing them.*offline_throughput"):
        plots.check_run_charts()

    @plots.run_chart(RunChart.OFFLINE_THROUGHPUT, "offline")
    def energy(rows: pd.DataFrame):
        data = prepare(rows, "offline", ["batch", ENERGY.name])
        return series_chart(
            data, ("batch", "Batch"), (ENERGY.name, str(ENERGY.chart_label)), "Energy", "batch"
        )

    plots.check_run_charts()
    with pytest.raises(ValueError, match="has a function drawing it already"):
        plots.run_chart(RunChart.OFFLINE_THROUGHPUT, "offline")(energy)
    inputs = plots.ChartInputs(
        offline=frame, online=frame.iloc[:0], published=frame.iloc[:0], reference=frame.iloc[:0]
    )
    spec = plots.RUN_CHART_DRAWERS[RunChart.OFFLINE_THROUGHPUT](inputs).to_dict()
    [data] = spec["datasets"].values()
    assert data[0][ENERGY.name] == 12.5
    assert data[0]["meter_joules_ci95"] == pytest.approx(1.24207, abs=1e-5)
    assert any("yError" in layer.get("encoding", {}) for layer in spec["layer"])


def test_every_run_chart_has_one_function():
    assert set(plots.RUN_CHART_DRAWERS) == set(RunChart)
    with pytest.raises(ValueError, match="unknown run chart 'energy'; valid: \\['offline_"):
        plots.run_chart("energy")


def test_the_shipped_tables_derive_from_the_columns():
    assert [c.name for c in PERF_COLUMNS if c.in_points] == CSV_COLUMNS
    assert INTERVAL_COLUMNS == {c: c + "_ci95" for c in perf.MEASURED if c + "_ci95" in CSV_COLUMNS}
    assert perf.MEASURED == [c.name for c in PERF_COLUMNS if c.aggregate == "mean"]
    # a trial's row holds what its trials CSV writes, less the job's run columns
    assert "trial" in trial_columns(PERF_COLUMNS) and "trial" not in CSV_COLUMNS


@pytest.mark.parametrize(
    ("column", "message"),
    [
        (Column("x", "metric", aggregate="median"), "aggregate 'median'; valid choices"),  # type: ignore[arg-type]
        (Column("x", "metric", aggregate="sum", interval=True), "an interval needs aggregate"),
        (Column("x", "metric", source="derived"), "go together"),
        (Column("x", "metric", source="nvml"), "needs the `key`"),
        (Column("x", "gauge", aggregate="mean"), "role 'gauge'; valid choices"),  # type: ignore[arg-type]
        (Column("batch", "point"), "defined twice: \\['batch'\\]"),
    ],
)
def test_a_column_that_cannot_work_is_a_clear_error(column, message):
    with pytest.raises(ValueError, match=message):
        check((*DEFINED, column))


def test_a_source_without_collector_or_output_is_a_clear_error(tmp_path):
    columns = (*PERF_COLUMNS, Column("gpu_power_w", "metric", source="nvml", key="power"))
    with pytest.raises(ValueError, match="no collector of source 'nvml'; registered: \\["):
        collect_trial({}, columns)
    with pytest.raises(ValueError, match="no collector of \\['nvml'\\]"):
        collect_trial({"nvml": []})
    result = tmp_path / "pa.csv"
    result.write_text(PA_CSV.format(throughput=1, wait=1))
    missing = (*PERF_COLUMNS, Column("y", "metric", source="perf_analyzer", key="Server Wait"))
    with pytest.raises(PerfError, match="perf_analyzer wrote no 'Server Wait' \\(column 'y'\\)"):
        collect_trial({"perf_analyzer": PerfAnalyzerOutput(result, "")}, missing)


@pytest.mark.parametrize(
    ("how", "kind", "values", "expected"),
    [
        ("first", "str", ["a", "b"], "a"),
        ("max", "float", ["1.5", 2.0], 2.0),
        ("min", "int", [3, None], None),
        ("all", "bool", [True, False], False),
        ("any", "bool", [None, True], True),
        ("count", "int", [1, 1, 1], 3),
    ],
)
def test_the_aggregations(how, kind, values, expected):
    assert perf.aggregate(Column("x", "metric", kind=kind, aggregate=how), values) == expected


def test_one_trial_of_a_new_mean_has_no_interval(tmp_path, fake_meter):
    columns = extended()
    [point] = perf.summarize([trial(tmp_path, columns, 1, 200.0, 9.0)], 5, columns)
    assert point["meter_joules"] == 9.0
    assert point["meter_joules_ci95"] is None
    assert not math.isnan(point["response_wait_ms"])
