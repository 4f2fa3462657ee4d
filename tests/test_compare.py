"""`deploybench compare` on small perf CSVs: verdicts within the trials' intervals, the
regression threshold, exit statuses and messages."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from deploybench import cli
from deploybench.columns import CSV_COLUMNS
from deploybench.compare import (
    FASTER,
    NO_CHANGE,
    NO_INTERVAL,
    REGRESSION,
    SLOWER,
    CompareError,
    compare_frames,
    compare_trees,
    format_interval,
)
from deploybench.errors import DeploybenchError
from tests.conftest import REPO

RUN = "tft/cpu/onnx/fp32"


def write_run(
    root: Path,
    throughput: float = 100.0,
    ci: float = 2.0,
    p99: float = 10.0,
    p99_ci: float = 0.2,
    *,
    run: str = RUN,
    trials: int = 3,
    old: bool = False,
) -> Path:
    """``run``'s offline.csv (batches 1 and 8) and online.csv (concurrency 1 and 2) under
    ``root``; ``old``: without the interval and trials columns, as before repeated trials."""
    directory = root / run
    directory.mkdir(parents=True, exist_ok=True)
    model, gpu, fmt, precision = run.split("/")
    for scenario, points in (("offline", [(1, 1), (8, 1)]), ("online", [(1, 1), (1, 2)])):
        rows = []
        for batch, concurrency in points:
            row = dict.fromkeys(CSV_COLUMNS)
            row |= {
                "model": model,
                "gpu": gpu,
                "format": fmt,
                "precision": precision,
                "scenario": scenario,
                "batch": batch,
                "concurrency": concurrency,
                "throughput": throughput * batch,
                "throughput_ci95": ci * batch,
                "p99_latency_ms": p99,
                "p99_latency_ms_ci95": p99_ci,
                "trials": trials,
                "stable": True,
            }
            rows.append(row)
        frame = pd.DataFrame(rows, columns=CSV_COLUMNS)
        if old:
            frame = frame.drop(columns=[c for c in CSV_COLUMNS if c.endswith("_ci95")] + ["trials"])
        frame.to_csv(directory / f"{scenario}.csv", index=False)
    return directory


def run_cli(*args: str | Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = cli.main(["compare", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


def test_identical_trees_exit_0_with_no_significant_change(tmp_path, capsys):
    write_run(tmp_path / "a")
    write_run(tmp_path / "b")
    code, out, _ = run_cli(tmp_path / "a", tmp_path / "b", capsys=capsys)
    assert code == 0, out
    rows = [line for line in out.splitlines() if line.startswith(f"| {RUN} |")]
    assert len(rows) == 4 and all(row.endswith("| no significant change |") for row in rows)
    assert "| 100.0 ± 2.0 | 100.0 ± 2.0 | 1.000 ± 0.028 |" in rows[0]
    assert "4 point(s) of 1 run(s) compared" in out
    # "regression" appears only where there is one
    assert "regression" not in out.lower().replace("no regression", "")


def test_a_clearly_slower_b_is_a_regression_naming_the_point(tmp_path, capsys):
    write_run(tmp_path / "a")
    write_run(tmp_path / "b", throughput=50.0, ci=1.0)  # half the throughput, tight intervals
    code, out, _ = run_cli(tmp_path / "a", tmp_path / "b", capsys=capsys)
    assert code == 1
    assert f"| {RUN} | offline | 8 | 1 | 800 ± 16 | 400.0 ± 8.0 | 0.500 ± 0.014 |" in out
    assert f"- {RUN} offline batch 8 concurrency 1: throughput B/A 0.500 ± 0.014" in out
    assert "4 regression(s)" in out
    # latency unchanged: the verdict names the metric it comes from
    assert "| regression (throughput) |" in out


def test_the_other_way_round_is_faster_and_exit_0(tmp_path, capsys):
    write_run(tmp_path / "a", throughput=50.0, ci=1.0)
    write_run(tmp_path / "b")
    code, out, _ = run_cli(tmp_path / "a", tmp_path / "b", capsys=capsys)
    assert code == 0 and "| faster (throughput) |" in out and "4 faster" in out


def test_a_difference_within_the_combined_intervals_is_not_significant(tmp_path):
    # 8 % slower, but each side ±6 %: the intervals overlap, the difference is noise.
    write_run(tmp_path / "a", ci=6.0)
    write_run(tmp_path / "b", throughput=92.0, ci=5.5)
    result = compare_trees(tmp_path / "a", tmp_path / "b", threshold_pct=1)
    assert set(result.points["throughput_verdict"]) == {NO_CHANGE}
    assert not result.points["throughput_significant"].any()
    assert result.regressions.empty


def test_the_threshold_separates_slower_from_regression(tmp_path, capsys):
    write_run(tmp_path / "a")
    write_run(tmp_path / "b", throughput=80.0, ci=1.6)  # significantly 20 % slower
    assert set(compare_trees(tmp_path / "a", tmp_path / "b", 25).points["verdict"]) == {
        f"{SLOWER} (throughput)"
    }
    # the config's compare.regression_pct (25) by default, --threshold over it
    code, out, _ = run_cli(tmp_path / "a", tmp_path / "b", capsys=capsys)
    assert code == 0 and "worse than 25 %" in out
    code, out, _ = run_cli(tmp_path / "a", tmp_path / "b", "--threshold", "15", capsys=capsys)
    assert code == 1 and "worse than 15 %" in out


def test_latency_regresses_upwards(tmp_path):
    write_run(tmp_path / "a")
    write_run(tmp_path / "b", p99=14.0, p99_ci=0.3)  # p99 40 % higher, throughput the same
    points = compare_trees(tmp_path / "a", tmp_path / "b", 25).points
    assert set(points["p99_latency_ms_verdict"]) == {REGRESSION}
    assert set(points["verdict"]) == {f"{REGRESSION} (p99 latency)"}
    assert points["p99_latency_ms_ratio"].tolist() == pytest.approx([1.4] * 4)


def test_threshold_from_a_config_file_is_validated(tmp_path, capsys):
    write_run(tmp_path / "a")
    write_run(tmp_path / "b", throughput=80.0, ci=1.6)
    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    config["compare"] = {"regression_pct": 10}
    (tmp_path / "ten.yaml").write_text(yaml.safe_dump(config))
    code, _, _ = run_cli(
        tmp_path / "a", tmp_path / "b", "--configfile", tmp_path / "ten.yaml", capsys=capsys
    )
    assert code == 1
    config["compare"] = {"regression_pct": -5}
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(config))
    code, _, err = run_cli(
        tmp_path / "a", tmp_path / "b", "--configfile", tmp_path / "bad.yaml", capsys=capsys
    )
    assert code == 2 and "bad.yaml" in err and "-5" in err


def test_bad_paths_exit_2_naming_them(tmp_path, capsys):
    write_run(tmp_path / "a")
    code, out, err = run_cli(tmp_path / "a", tmp_path / "missing", capsys=capsys)
    assert code == 2 and out == ""
    assert f"B: {tmp_path / 'missing'} does not exist" in err
    (tmp_path / "empty").mkdir()
    code, _, err = run_cli(tmp_path / "empty", tmp_path / "a", capsys=capsys)
    assert code == 2 and f"A ({tmp_path / 'empty'}) holds no perf results" in err
    code, _, err = run_cli(tmp_path / "a", tmp_path / "a", "--threshold", "-1", capsys=capsys)
    assert code == 2 and "threshold" in err and "-1" in err
    broken = write_run(tmp_path / "broken")
    (broken / "online.csv").write_text("batch,concurrency\n1,1\n")
    code, _, err = run_cli(tmp_path / "a", tmp_path / "broken", capsys=capsys)
    assert code == 2 and "online.csv is not a perf CSV" in err and "throughput" in err


def test_no_runs_in_common_names_what_each_side_holds(tmp_path, capsys):
    write_run(tmp_path / "a")
    write_run(tmp_path / "b", run="bert/cpu/onnx/fp32")
    write_run(tmp_path / "b", run="tft/cpu/ts-trace/fp32")
    code, _, err = run_cli(tmp_path / "a", tmp_path / "b", capsys=capsys)
    assert code == 2
    assert "no runs in common" in err and RUN in err
    assert "bert/cpu/onnx/fp32, tft/cpu/ts-trace/fp32" in err
    with pytest.raises(CompareError) as raised:
        compare_trees(tmp_path / "a", tmp_path / "b", 25)
    assert isinstance(raised.value, DeploybenchError) and isinstance(raised.value, ValueError)


def test_trees_pair_runs_by_name_and_note_the_rest(tmp_path):
    write_run(tmp_path / "a" / "results")  # a workdir: its results/ is found
    write_run(tmp_path / "a" / "results", run="bert/cpu/onnx/fp32")
    write_run(tmp_path / "b")
    result = compare_trees(tmp_path / "a", tmp_path / "b", 25)
    assert set(result.points["run"]) == {RUN}
    assert "A only: bert/cpu/onnx/fp32 (not compared)" in result.notes


def test_a_run_directory_on_each_side(tmp_path):
    a = write_run(tmp_path / "a")
    b = write_run(tmp_path / "b", run="tft/cpu/ts-trace/fp32", throughput=50.0, ci=1.0)
    result = compare_trees(a, b, 25)
    assert set(result.points["run"]) == {f"{RUN} → tft/cpu/ts-trace/fp32"}
    assert len(result.regressions) == 4
    # and a run directory against a tree: paired by the run's name
    assert len(compare_trees(a, tmp_path / "a", 25).points) == 4


def test_old_csvs_without_intervals_are_never_significant_and_say_so(tmp_path, capsys):
    write_run(tmp_path / "a", old=True)
    write_run(tmp_path / "b", throughput=50.0, ci=1.0)
    code, out, _ = run_cli(tmp_path / "a", tmp_path / "b", capsys=capsys)
    assert code == 0
    assert "| 100 | 50.0 ± 1.0 | 0.5 |" in out  # A's value alone, the ratio without interval
    assert "A: 2 CSV(s) without _ci95 columns" in out and "never significant" in out
    assert "4 no interval" in out


def test_one_trial_has_no_interval():
    one = pd.DataFrame(
        [{"scenario": "offline", "batch": 1, "concurrency": 1, "throughput": 100.0,
          "throughput_ci95": None, "p99_latency_ms": 10.0, "p99_latency_ms_ci95": None,
          "trials": 1}]
    )  # fmt: skip
    slow = one.assign(throughput=10.0, p99_latency_ms=100.0)
    table = compare_frames(one, slow, threshold_pct=25)
    assert table["verdict"].tolist() == [NO_INTERVAL]
    assert table["throughput_ratio"].tolist() == pytest.approx([0.1])


def test_a_throughput_fallen_to_zero_is_a_regression():
    base = {"scenario": "offline", "batch": 1, "concurrency": 1, "trials": 3}
    a = pd.DataFrame([base | {"throughput": 10.0, "throughput_ci95": 0.5,
                              "p99_latency_ms": 20.0, "p99_latency_ms_ci95": 0.5}])  # fmt: skip
    b = a.assign(throughput=0.0, throughput_ci95=0.0)
    assert compare_frames(a, b, threshold_pct=25)["verdict"].tolist() == [
        f"{REGRESSION} (throughput)"
    ]


def test_faster_latency_is_faster():
    base = {"scenario": "online", "batch": 1, "concurrency": 4, "trials": 5}
    a = pd.DataFrame([base | {"throughput": 10.0, "throughput_ci95": 0.1,
                              "p99_latency_ms": 20.0, "p99_latency_ms_ci95": 0.5}])  # fmt: skip
    b = a.assign(p99_latency_ms=10.0)
    assert compare_frames(a, b)["p99_latency_ms_verdict"].tolist() == [FASTER]


def test_format_interval_rounds_to_the_half_width():
    assert format_interval(123.456, 5.64) == "123.5 ± 5.6"
    assert format_interval(0.93123, 0.0431) == "0.931 ± 0.043"
    assert format_interval(12345.6, 56.7) == "12346 ± 57"
    assert format_interval(12.3456, float("nan")) == "12.35"
    assert format_interval(float("nan"), 1.0) == ""


def test_csv_output_and_python_m(tmp_path):
    write_run(tmp_path / "a")
    write_run(tmp_path / "b", throughput=50.0, ci=1.0)
    out = tmp_path / "out" / "compare.csv"
    result = subprocess.run(
        [sys.executable, "-m", "deploybench", "compare", tmp_path / "a", tmp_path / "b",
         "--csv", out],
        capture_output=True, text=True, cwd=REPO, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 1, result.stdout + result.stderr
    table = pd.read_csv(out)
    assert len(table) == 4 and set(table["throughput_verdict"]) == {REGRESSION}
    assert table["throughput_ratio"].tolist() == pytest.approx([0.5] * 4)
