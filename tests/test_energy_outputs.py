"""Energy per inference and tail backing in the outputs (issue 39): `deploybench compare`'s
energy verdicts, `deploybench summary`'s cells and lines, the energy_throughput run chart and the
report's run tables and Energy note, all over synthetic perf rows. Fast: no server, no meter."""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import vl_convert as vlc

from deploybench import plots, report, summary
from deploybench.chart_names import RUN_CHARTS, RunChart
from deploybench.columns import CSV_COLUMNS, TABLE_LABELS
from deploybench.compare import (
    ENERGY,
    NO_CHANGE,
    NOT_MEASURED,
    REGRESSION,
    compare_frames,
    compare_trees,
    not_measured,
    point_verdict,
)
from deploybench.unmeasured import NO_STATUS, STATUS_COLUMNS, measured_columns

RUN = "resnet50/h100/trt/fp16"
NO_NVML = "not measured: NVML: libnvidia-ml.so.1 not found"
FEW = "too few requests for an early-stopping p99 estimate: 120 of 662"


def row(scenario: str, x: int, throughput: float = 100.0, **more: Any) -> dict[str, Any]:
    """A perf CSV row of ``scenario`` at batch (offline) or concurrency (online) ``x``:
    3 trials, throughput ± 2 %, p99 10 ms ± 0.2, energy 0.5 J ± 0.01 measured by NVML."""
    values: dict[str, Any] = dict.fromkeys(CSV_COLUMNS)
    model, gpu, fmt, precision = RUN.split("/")
    values |= {
        "model": model,
        "gpu": gpu,
        "format": fmt,
        "precision": precision,
        "scenario": scenario,
        "batch": x if scenario == "offline" else 1,
        "concurrency": 1 if scenario == "offline" else x,
        "throughput": throughput * x,
        "throughput_ci95": throughput * x * 0.02,
        "p99_latency_ms": 10.0,
        "p99_latency_ms_ci95": 0.2,
        "trials": 3,
        "stable": True,
        "unstable_reason": "",
        ENERGY: 0.5,
        f"{ENERGY}_ci95": 0.01,
        "energy_above_idle_per_inference_j": 0.3,
        "energy_above_idle_per_inference_j_ci95": 0.01,
        "power_mean_w": 250.0,
        "idle_power_w": 62.5,
        "idle_power_ci95_w": 0.4,
        "power_limit_w": 700.0,
        "throttled": False,
        "throttle_reasons": "",
        "throttle_power_cap_fraction": 0.0,
        "throttle_slowdown_fraction": 0.0,
        "throttle_source": "violation counters",
        "energy_status": "nvml",
        "tail_requests": 5000,
        "p99_bound_ms": 10.4,
        "tail_note": "",
    }
    return values | more


def unmeasured(values: dict[str, Any], status: str = NO_NVML) -> dict[str, Any]:
    """``values`` as a run without a meter writes it: energy columns empty, the status why."""
    empty = [c for c in CSV_COLUMNS if c.startswith(("energy_", "power_", "idle_", "throttle_"))]
    return values | dict.fromkeys(empty) | {"throttled": None, "energy_status": status}


SLOWED = {
    "throttled": True,
    "throttle_reasons": "sw power cap 100 %; sw thermal slowdown 12 %",
    "throttle_power_cap_fraction": 1.0,
    "throttle_slowdown_fraction": 0.12,
}


def frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=CSV_COLUMNS)


def write_run(root: Path, rows: dict[str, list[dict[str, Any]]], drop: list[str] = ()) -> Path:
    run = root / RUN
    run.mkdir(parents=True, exist_ok=True)
    for scenario, points in rows.items():
        frame(points).drop(columns=list(drop)).to_csv(run / f"{scenario}.csv", index=False)
    return run


# ------------------------------------------------------------------------------------ compare


def test_more_energy_beyond_the_threshold_is_a_regression_lower_is_better():
    a = frame([row("offline", 1)])
    more = frame([row("offline", 1, **{ENERGY: 0.75})])
    [moved] = compare_frames(a, more, threshold_pct=10).to_dict("records")
    assert moved[f"{ENERGY}_verdict"] == REGRESSION
    assert moved[f"{ENERGY}_ratio"] == pytest.approx(1.5)
    assert moved["verdict"] == "regression (energy per inference)"
    # within the threshold: more energy, not a regression; fewer joules: less energy
    slightly_more = frame([row("offline", 1, **{ENERGY: 0.55})])
    [slight] = compare_frames(a, slightly_more, threshold_pct=25).to_dict("records")
    assert slight[f"{ENERGY}_verdict"] == "more energy"
    assert slight["verdict"] == "more energy (energy per inference)"
    [less] = compare_frames(more, a).to_dict("records")
    assert less[f"{ENERGY}_verdict"] == "less energy"
    # within the combined intervals: no significant change, as for throughput
    [same] = compare_frames(a, frame([row("offline", 1, **{ENERGY: 0.51})])).to_dict("records")
    assert same[f"{ENERGY}_verdict"] == NO_CHANGE and same["verdict"] == NO_CHANGE


def test_energy_not_measured_on_a_side_is_its_own_verdict_never_a_regression():
    a = frame([row("offline", 1)])
    b = frame([unmeasured(row("offline", 1, throughput=50.0))])
    [point] = compare_frames(a, b, threshold_pct=10).to_dict("records")
    assert point[f"{ENERGY}_verdict"] == NOT_MEASURED
    assert math.isnan(point[f"{ENERGY}_ratio"])
    # the throughput's regression is not hidden by it, nor named beside it
    assert point["verdict"] == "regression (throughput)"
    # all else equal: the point's verdict as before energy was compared
    [quiet] = compare_frames(a, frame([unmeasured(row("offline", 1))])).to_dict("records")
    assert quiet["verdict"] == NO_CHANGE
    assert point_verdict({"throughput": NO_CHANGE, ENERGY: NOT_MEASURED}) == NO_CHANGE


def test_compare_trees_of_a_csv_before_energy_and_one_without_a_meter(tmp_path):
    write_run(tmp_path / "a", {"offline": [row("offline", 1)]}, drop=[ENERGY, "energy_status"])
    write_run(tmp_path / "b", {"offline": [unmeasured(row("offline", 1))]})
    result = compare_trees(tmp_path / "a", tmp_path / "b", threshold_pct=5)
    assert result.points[f"{ENERGY}_verdict"].tolist() == [NOT_MEASURED]
    assert result.regressions.empty
    notes = " ".join(result.notes)
    assert "A: energy per inference not measured: the CSV has no energy columns" in notes
    assert f"B: energy per inference {NO_NVML}" in notes
    assert result.summary().endswith("; energy per inference: 1 not measured.")
    assert "regression" not in result.summary().replace("no regression", "")


def test_compare_trees_names_an_energy_change(tmp_path):
    write_run(tmp_path / "a", {"offline": [row("offline", 1), row("offline", 8)]})
    b = [row("offline", 1, **{ENERGY: 0.8}), row("offline", 8, **{ENERGY: 0.3})]
    write_run(tmp_path / "b", {"offline": b})
    result = compare_trees(tmp_path / "a", tmp_path / "b", threshold_pct=10)
    assert result.points["verdict"].tolist() == [
        "regression (energy per inference)",
        "less energy (energy per inference)",
    ]
    assert result.counts()[REGRESSION] == 1 and result.counts()["faster"] == 1
    assert "energy per inference: 1 regression, 1 less energy." in result.summary()
    assert not result.notes


def test_not_measured_says_why_per_status():
    rows = frame([row("online", 1), unmeasured(row("online", 2)), unmeasured(row("online", 4))])
    assert not_measured(rows) == [NO_NVML]
    assert not_measured(frame([unmeasured(row("online", 1), status="")])) == [
        "not measured: no energy_status recorded"
    ]
    assert not_measured(frame([row("online", 1)])) == []


# ------------------------------------------------------------------------------------ summary


def write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
        writer.writeheader()
        writer.writerows({k: "" if v is None else v for k, v in r.items()} for r in rows)


def test_summary_shows_joules_per_inference_and_marks_a_thin_tail(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "results" / RUN
    offline = [
        row("offline", 1, **{ENERGY: 0.123, f"{ENERGY}_ci95": 0.004}, tail_note=FEW),
        row("offline", 8, **SLOWED),
    ]
    write_csv(run / "offline.csv", offline)
    write_csv(run / "online.csv", [unmeasured(row("online", c)) for c in (1, 2)])
    lines = summary.summary(run).splitlines()
    start = lines.index("offline (static batching, concurrency 1), 3 trials a point:")
    heading, first, second, energy, footnote = lines[start + 1 : start + 6]
    assert "J/infer ± 95 %" in heading
    assert first.split()[-7:] == ["10.00†", "0.123", "±", "0.004", "(3.3", "%)", "yes"]
    assert "0.500 ± 0.010 (2.0 %)" in second and "†" not in second
    # the mark takes its own place: the columns after it stay aligned
    assert len(first) == len(second) and first.index("%)") == second.index("%)")
    assert energy == (
        "energy: GPU board energy (NVML's total energy counter); idle 62.5 ± 0.4 W; "
        "thermal or hardware slowdown at 1 point (sw thermal slowdown); "
        "power-capped at 1 point (reported only)"
    )
    assert footnote == f"† {FEW.rsplit(': ', 1)[0]}: 120 of 662 (batch 1 conc. 1)"
    # not measured: no column of blanks, the reason once
    start = lines.index("online (dynamic batching over concurrency), 3 trials a point:")
    assert "J/infer" not in lines[start + 1]
    assert lines[start + 4] == f"energy: {NO_NVML}"
    assert not any("not measured" in line for line in lines[start + 2 : start + 4])


def test_summary_of_a_partly_measured_scenario_names_the_rest(tmp_path):
    run = tmp_path / "results" / RUN
    write_csv(run / "online.csv", [row("online", 1), unmeasured(row("online", 2))])
    text = summary.summary(run)
    assert "not measured  yes" in text.replace("    ", "  ")
    assert f"; 1 point {NO_NVML}" in text


def test_summary_decimals_follow_the_value():
    assert summary.interval_text(1234.5, 12.0) == "1234.5 ± 12.0 (1.0 %)"
    assert summary.interval_text(0.0123, 0.0004) == "0.0123 ± 0.0004 (3.3 %)"
    assert summary.interval_text(2.5, math.nan) == "2.50 (no interval)"


# ------------------------------------------------------------------------------------- charts


def inputs(offline: list[dict[str, Any]], online: list[dict[str, Any]]) -> plots.ChartInputs:
    empty = frame([])
    return plots.ChartInputs(frame(offline), frame(online), empty, empty)


def test_energy_throughput_is_a_run_chart_made_by_the_workflow():
    assert RunChart.ENERGY_THROUGHPUT.value == "energy_throughput" in RUN_CHARTS
    assert plots.RUN_CHART_DRAWERS[RunChart.ENERGY_THROUGHPUT] is plots.energy_throughput


def test_energy_throughput_draws_each_point_with_both_intervals():
    offline = [row("offline", b, **{ENERGY: 0.5 / b}) for b in (1, 4)]
    online = [row("online", c, stable=c != 8) for c in (2, 8)]
    chart = plots.energy_throughput(inputs(offline, online))
    spec = chart.to_dict()
    assert spec["title"]["text"] == plots.ENERGY_CHART_TITLE
    panels = spec["hconcat"]
    assert [p["title"]["text"] for p in panels] == list(plots.SCENARIO_PANELS.values())
    data = {name: rows for name, rows in spec["datasets"].items()}
    points = sorted(r["point"] for rows in data.values() for r in rows)
    assert points == ["batch 1", "batch 4", "conc. 2", "conc. 8"]
    for panel in panels:
        channels = {k for layer in panel["layer"] for k in layer["encoding"]}
        assert {"xError", "yError", "text", "stroke"} <= channels | {"stroke"}
        assert any("xError" in layer["encoding"] for layer in panel["layer"])
        assert any("yError" in layer["encoding"] for layer in panel["layer"])
    # the unstable online point is circled
    assert any("stroke" in layer["encoding"] for layer in panels[1]["layer"])
    assert "<svg" in vlc.vegalite_to_svg(plots.sized(chart, 300, 200).to_dict())


def test_energy_throughput_without_a_meter_is_not_drawn_and_says_why():
    offline = [unmeasured(row("offline", 1))]
    online = [unmeasured(row("online", 1))]
    measured = inputs(offline, online)
    why = NO_NVML.removeprefix("not measured: ")
    # nothing to draw: the chart is not drawn, and why is the rows' energy_status
    assert plots.not_drawn(measured) == {"energy_throughput": f"energy not measured: {why}"}
    assert set(plots.draw_run_charts(measured)) == set(RUN_CHARTS) - {"energy_throughput"}
    # called all the same, it is the stand-in its files hold: at a chart's size, the text wrapped
    spec = plots.energy_throughput(measured).to_dict()
    assert spec["title"]["text"] == "energy_throughput"
    assert spec["width"] == 480 and spec["height"] == 300
    [note] = spec["data"]["values"]
    assert note["note"].replace("\n", " ") == f"not drawn: energy not measured: {why}"
    assert "<svg" in vlc.vegalite_to_svg(spec)
    # one scenario measured: drawn, its panel, and the other's says why not
    assert plots.not_drawn(inputs([row("offline", 1)], online)) == {}
    spec = plots.energy_throughput(inputs([row("offline", 1)], online)).to_dict()
    assert spec["hconcat"][1]["data"]["values"] == [{"note": f"energy not measured: {why}"}]
    assert f"online: energy not measured: {why}" in spec["title"]["subtitle"]


def test_energy_throughput_of_csvs_from_before_energy(tmp_path):
    old = [c for c in CSV_COLUMNS if not c.startswith(("energy", "power", "idle", "throttl"))]
    rows = inputs([row("offline", 1)], [row("online", 1)])
    legacy = plots.ChartInputs(rows.offline[old], rows.online[old], rows.published, rows.reference)
    assert "the CSV has no energy columns" in plots.not_drawn(legacy)["energy_throughput"]


# ------------------------------------------------------------------------------------- report


def test_report_tables_show_energy_its_interval_not_measured_and_a_marked_p99():
    rows = frame(
        [
            row("online", 1, tail_note=FEW, p99_bound_ms=None),
            unmeasured(row("online", 2)),
        ]
    )
    table = report.results_table(rows)
    heading = table.splitlines()[0]
    assert "Energy per inference (J)" in heading and "p99 early-stopping estimate (ms)" in heading
    first, second = table.splitlines()[2:4]
    assert "| 0.500 ± 0.010 |" in first and "| 10.00 ± 0.20 † |" in first
    assert "| not measured |" in second and "†" not in second
    assert table.endswith(f"batch 1 concurrency 1: {FEW}.")
    assert "† p99 from fewer requests than loadgen's early-stopping estimate needs" in table
    # the estimate is named as loadgen's SingleStream rule, with the assumption these points break
    assert "MLPerf loadgen's SingleStream early-stopping estimate" in table
    assert "assumes independent queries issued one at a time" in table
    assert "concurrency up to 2" in table and "pool up to 3 trials" in table
    assert "not a 99 % confidence bound" in table


# perf_analyzer's latencies, which the rows above leave empty: every column of a table measured
LATENCIES = dict.fromkeys(
    [c for c in TABLE_LABELS if c.endswith("_ms") and c not in ("p99_latency_ms", "p99_bound_ms")],
    1.0,
) | {"measured_requests": 1500, "duration_capped": False}


def test_a_table_leaves_out_the_columns_no_point_measured_and_says_why():
    points = [unmeasured(row("online", c, **LATENCIES)) for c in (1, 2)]
    points[1]["energy_status"] = "not measured: energy meter none"
    # Triton's GPU metrics, which perf_analyzer collects: a CPU server has none
    no_gpu = "not measured: the server's metrics have no nv_gpu_utilization (a CPU server)"
    for point in points:
        point["triton_gpu_status"] = no_gpu
    table = report.results_table(frame(points))
    heading = table.splitlines()[0]
    for left_out in ("Energy per inference (J)", "Energy above idle (J)", "Mean power (W)"):
        assert left_out not in heading
    assert "| Throttled |" not in heading and "not measured |" not in table
    assert "| Inferences/Second |" in heading and "| Client Send (ms) |" in heading
    # one line under the table: the columns, and the rows' distinct reasons
    said = (
        "Not shown, as no point here measured them: Energy per inference (J), Energy above "
        f"idle (J), Mean power (W), Throttled ({NO_NVML}; not measured: energy meter none); "
        "Triton GPU utilization (%), Triton GPU power (W), Triton GPU memory used (MiB) "
        f"({no_gpu})."
    )
    assert table.split("\n\n")[1] == said
    # measured at one point: the column stays, the other point's cell says "not measured"
    some = report.results_table(frame([row("online", 1, **LATENCIES), points[0]]))
    assert "Energy per inference (J)" in some.splitlines()[0] and "| not measured |" in some
    shown = some.split("\n\n")[1]  # only the GPU metrics are left out
    assert shown.startswith("Not shown, as no point here measured them: Triton GPU utilization")
    assert "Energy" not in shown


def test_measured_columns_keeps_the_point_and_says_why_once():
    columns = {
        "batch": "Batch",
        "throughput": "Inferences/Second",
        "energy_per_inference_triton_j": "Triton energy (J)",
        "gpu_metric": "GPU utilisation (%)",
        "status_text": "Status",
        "absent": "Not in the CSV",
    }
    metrics = "not measured: the server's metrics endpoint has no nv_energy_consumption"
    rows = pd.DataFrame(
        {
            "batch": [None, None],
            "throughput": [100.0, 200.0],
            "energy_per_inference_triton_j": [None, math.nan],
            "triton_energy_status": [metrics, metrics],
            "gpu_metric": ["", None],
            "status_text": ["not measured: no GPU", "not measured: no GPU"],
        }
    )
    kept, note = measured_columns(rows, columns, keep=["batch"])
    assert kept == {"batch": "Batch", "throughput": "Inferences/Second"}  # the key stays
    assert note == (
        f"Not shown, as no point here measured them: Triton energy (J) ({metrics}); "
        f"GPU utilisation (%) ({NO_STATUS}); Status (not measured: no GPU)."
    )
    # every column measured, or no rows at all: nothing left out, nothing said
    assert measured_columns(rows[["throughput"]], columns) == (
        {"throughput": "Inferences/Second"},
        None,
    )
    assert measured_columns(rows.iloc[:0], columns)[1] is None
    assert STATUS_COLUMNS["energy_per_inference_j"] == "energy_status"
    assert STATUS_COLUMNS["throttled"] == "energy_status"


def test_the_estimates_note_says_when_its_assumption_is_only_assumed():
    offline = frame([row("offline", 1, trials=1)])
    note = report.estimate_footnote(offline)
    assert note is not None and note.endswith("one at a time, their independence assumed.")
    assert report.estimate_footnote(frame([row("offline", 1, p99_bound_ms=None)])) is None


def test_energy_note_says_the_meter_idle_power_and_throttling():
    capped = {"throttle_reasons": "sw power cap 100 %", "throttle_power_cap_fraction": 1.0}
    offline = frame([row("offline", 1, **capped)])
    online = frame([row("online", 4, **SLOWED)])
    provenance = {"energy": {"meter_facts": {"name": "NVIDIA H100 80GB HBM3", "driver": "580"}}}
    note = report.energy_note(offline, online, provenance)
    assert "NVML's total energy counter" in note
    assert "Idle power 62.5 ± 0.4 W" in note and "power limit 700 W" in note
    assert "Meter: NVIDIA H100 80GB HBM3, 580." in note
    assert (
        "A thermal or hardware slowdown, so unstable: online batch 1 concurrency 4 "
        "(sw power cap 100 %; sw thermal slowdown 12 %)." in note
    )
    # held at the power limit: said, and no reason to call a point unstable
    assert "not a reason to call a point unstable): offline batch 1 concurrency 1 (100 % of" in note
    assert "No thermal or hardware slowdown." in report.energy_note(
        frame([row("offline", 1)]), frame([])
    )
    rapl = frame([row("offline", 1, energy_status="rapl", throttled=None)])
    assert "RAPL" in report.energy_note(rapl, rapl.iloc[:0])
    none = report.energy_note(frame([unmeasured(row("offline", 1))]), frame([]))
    assert none == f"Offline: energy {NO_NVML}."


def test_run_section_has_the_energy_note():
    offline, online = frame([row("offline", 1)]), frame([unmeasured(row("online", 1))])
    provenance = {"config": {}, "software": {}, "host": {}}
    text = report.run_section(RUN, offline, online, provenance, [])
    assert "### Energy" in text and f"Online: energy {NO_NVML}." in text
