"""Long jobs say how they are doing, and a run is summarised by one command (issue 28, items 2
and 3): the progress lines and their time-left arithmetic, why a point is unstable, and
``deploybench summary`` over run directories written here by hand. Fast: no server, no
perf_analyzer."""

from __future__ import annotations

import csv
import json
import logging
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from deploybench import cli, jobs, perf, progress, stats
from deploybench.chart_names import RUN_CHARTS
from deploybench.columns import CSV_COLUMNS
from deploybench.summary import summary
from tests.conftest import REPO

RUN = "tft/cpu/onnx/fp32"

# ---------------------------------------------------------------------------- progress lines


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.0, "nothing left"),
        (0.4, "nothing left"),
        (-3.0, "nothing left"),
        (40.4, "~40 s left"),
        (59.6, "~1 min 0 s left"),
        (130.0, "~2 min 10 s left"),
        (3599.0, "~59 min 59 s left"),
        (3900.0, "~1 h 5 min left"),
        (math.nan, "time left not known"),
    ],
)
def test_time_left_is_said_in_whole_seconds(seconds, text):
    assert progress.format_left(seconds) == text


def test_durations_read_as_the_time_left_does():
    assert (progress.count(1, "point"), progress.count(3, "trial")) == ("1 point", "3 trials")
    assert progress.format_duration(0.2) == "0 s"
    assert progress.format_duration(65.0) == "1 min 5 s"
    assert progress.format_duration(7260.0) == "2 h 1 min"


def done(**changes: Any) -> progress.TrialDone:
    values: dict[str, Any] = {
        "batch": 4,
        "concurrency": 1,
        "trial": 2,
        "trials": 3,
        "done": 5,
        "total": 9,
        "throughput": 1843.24,
        "p99_latency_ms": 2.3149,
        "spent_s": 130.0,
    }
    return progress.TrialDone(**(values | changes))


def test_time_left_is_the_mean_trial_times_the_trials_left():
    # 5 trials in 130 s: 26 s each; 4 left: 104 s
    assert done().left_s == pytest.approx(104.0)
    assert done(done=9).left_s == 0.0
    assert math.isnan(done(done=0, spent_s=0.0).left_s)


def test_a_trial_line_names_the_run_the_point_and_the_trial():
    line = progress.trial_line(f"offline {RUN}", done())
    assert line == (
        f"offline {RUN} batch 4 concurrency 1: trial 2 of 3, 1843.2 infer/s, p99 2.31 ms; "
        "~1 min 44 s left (5 of 9 trials done)"
    )
    # a value the trial's row lacks is a question mark, not an error
    assert "? infer/s, p99 ? ms" in progress.trial_line(
        "x", done(throughput=None, p99_latency_ms=None)
    )


class Clock:
    """A stand-in for time.monotonic: each trial takes the next of ``durations``."""

    def __init__(self, durations: list[float]) -> None:
        self.now = 0.0
        self.durations = iter(durations)
        self.started = False

    def __call__(self) -> float:
        if self.started:
            self.now += next(self.durations)
        self.started = not self.started
        return self.now


def test_measure_trials_says_each_trial_in_order_between_trials():
    events: list[tuple[str, Any]] = []

    def fake(point, warm_up, rate):
        events.append(("measure", (point.batch, point.concurrency)))
        return {"batch": point.batch, "throughput": 100.0 * point.batch, "p99_latency_ms": 2.0}

    points = [perf.Point(1, 1), perf.Point(4, 1), perf.Point(8, 1)]
    # the first visit of each point includes its warm-up: 20 s, then 10 s a trial
    clock = Clock([20.0, 20.0, 20.0, 10.0, 10.0, 10.0])
    rows = perf.measure_trials(points, 2, fake, lambda d: events.append(("said", d)), clock)
    assert [r["trial"] for r in rows] == [1, 1, 1, 2, 2, 2]
    # one line after each trial, never before the trial it tells of
    assert [kind for kind, _ in events] == ["measure", "said"] * 6
    said = [d for kind, d in events if kind == "said"]
    assert [(d.batch, d.trial, d.trials, d.done, d.total) for d in said] == [
        (1, 1, 2, 1, 6),
        (4, 1, 2, 2, 6),
        (8, 1, 2, 3, 6),
        (1, 2, 2, 4, 6),
        (4, 2, 2, 5, 6),
        (8, 2, 2, 6, 6),
    ]
    assert [d.throughput for d in said] == [100.0, 400.0, 800.0] * 2
    # 20 s a trial so far, 5 left: 100 s; after 4 trials (70 s): 17.5 s each, 2 left: 35 s
    assert said[0].left_s == pytest.approx(100.0)
    assert said[3].left_s == pytest.approx(35.0)
    assert said[-1].left_s == 0.0
    lines = [progress.trial_line(f"offline {RUN}", d) for d in said]
    assert lines[0].endswith(
        "trial 1 of 2, 100.0 infer/s, p99 2.00 ms; ~1 min 40 s left (1 of 6 trials done)"
    )
    assert lines[-1].endswith("nothing left (6 of 6 trials done)")


def test_measure_trials_without_a_listener_measures_as_before():
    def fake(point, warm_up, rate):
        return {"batch": point.batch, "concurrency": 1, "throughput": 10.0}

    rows = perf.measure_trials([perf.Point(1, 1)], 2, fake)
    assert [r["trial"] for r in rows] == [1, 2]


@pytest.fixture
def restored_logging() -> Iterator[None]:
    root, said = logging.getLogger(), progress.PROGRESS
    kept = (root.handlers[:], root.level, said.handlers[:])
    yield
    root.handlers[:], said.handlers[:] = kept[0], kept[2]
    root.setLevel(kept[1])


def test_progress_reaches_the_terminal_and_the_log_the_rest_the_log_only(
    tmp_path, capsys, restored_logging
):
    log_file = tmp_path / "logs" / "offline.log"
    jobs.setup_logging(log_file)
    logging.getLogger("deploybench").info("a detail for the log")
    progress.say("offline %s: measuring %s …", RUN, progress.count(3, "point"))
    err = capsys.readouterr().err
    assert f"deploybench: offline {RUN}: measuring 3 points …" in err
    assert "a detail" not in err
    written = log_file.read_text()
    assert "a detail for the log" in written and "measuring 3 points" in written
    # without a log file everything goes to stderr, each line once
    jobs.setup_logging(None)
    progress.say("once")
    assert capsys.readouterr().err.count("once") == 1


# ------------------------------------------------------------------------ why a point is unstable


def trial(batch: int, throughput: float, stable: bool = True) -> dict[str, Any]:
    return dict.fromkeys(perf.MEASURED, 1.0) | {
        "batch": batch,
        "concurrency": 1,
        "throughput": throughput,
        "request_count": 50,
        "measured_requests": 100,
        "measured_s": 3.0,
        "duration_capped": False,
        "stable": stable,
        "attempts": 1,
    }


def test_the_row_says_why_a_point_is_unstable():
    rows = [
        trial(1, 100.0),
        trial(2, 100.0, stable=False),
        trial(4, 300.0),
        trial(8, 300.0, stable=False),
        trial(1, 102.0),
        trial(2, 101.0),
        trial(4, 500.0),
        trial(8, 500.0, stable=False),
        trial(1, 104.0),
        trial(2, 102.0),
        trial(4, 400.0),
        trial(8, 400.0),
    ]
    one, two, four, eight = perf.summarize(rows, max_ci_pct=5)
    assert (one["stable"], one["unstable_reason"]) == (True, "")
    assert two["stable"] is False
    assert two["unstable_reason"] == "perf_analyzer did not settle (1 of 3 trials)"
    # 300, 500, 400: ± 248.4 = 62.1 % of 400
    assert four["unstable_reason"] == "interval ±62.1 % > max_ci_pct 5 %"
    assert eight["unstable_reason"] == (
        "perf_analyzer did not settle (2 of 3 trials); interval ±62.1 % > max_ci_pct 5 %"
    )
    assert all(p["stable"] is not bool(p["unstable_reason"]) for p in (one, two, four, eight))
    assert list(one)[-1] == "unstable_reason" and CSV_COLUMNS[-1] == "unstable_reason"


def test_one_trial_is_unstable_only_by_perf_analyzer():
    [row] = perf.summarize([trial(1, 100.0, stable=False)], max_ci_pct=5)
    assert row["unstable_reason"] == "perf_analyzer did not settle (1 of 1 trials)"
    assert perf.unstable_reason(0, 3, stats.Interval(0.0, 1.0, 3), 5.0) == (
        "interval not known (mean 0) > max_ci_pct 5 %"
    )


# ---------------------------------------------------------------------------- the summary


def perf_row(scenario: str, batch: int, concurrency: int, throughput: float, **more: Any):
    row: dict[str, Any] = dict.fromkeys(CSV_COLUMNS, "")
    row |= dict(zip(("model", "gpu", "format", "precision"), RUN.split("/"), strict=True))
    row |= {
        "scenario": scenario,
        "batch": batch,
        "concurrency": concurrency,
        "throughput": throughput,
        "throughput_ci95": throughput * 0.02,
        "p99_latency_ms": 1.5 * batch * concurrency,
        "trials": 3,
        "stable": True,
    }
    return row | more


def write(path: Path, rows: list[dict[str, Any]], columns: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)


@pytest.fixture
def run_dir(tmp_path, monkeypatch) -> Path:
    """A finished run of the cpu sizing's shape (3 offline points, 3 online) in a workdir that
    is the current directory: accuracy, task metric and the perf CSVs, no charts yet."""
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "results" / RUN
    accuracy = {"output": "target__0", "batch": 8, "max_abs_err": 3.1e-8, "passed": True}
    write(run / "accuracy.csv", [accuracy], list(accuracy))
    task = {"metric": "quantile_risk_p50", "value": "", "passed": "", "note": "not measured"}
    write(run / "task.csv", [task], list(task))
    offline = [perf_row("offline", b, 1, 1000.0 * b) for b in (1, 4, 8)]
    reason = "interval ±8.1 % > max_ci_pct 5 %"
    online = [
        perf_row("online", 1, 1, 900.0),
        perf_row("online", 1, 2, 1500.0, stable=False, unstable_reason=reason),
        perf_row("online", 1, 4, 1700.0),
    ]
    write(run / "offline.csv", offline, CSV_COLUMNS)
    write(run / "online.csv", online, CSV_COLUMNS)
    return run


def test_summary_of_a_run(run_dir):
    text = summary(Path("results", RUN))
    lines = text.splitlines()
    assert lines[:3] == [
        f"run {RUN} (results/{RUN})",
        "accuracy: passed, 1 output within tolerance at batch 8 (max abs err 3.1e-08)",
        "task metric quantile_risk_p50: not measured",
    ]
    assert "offline (static batching, concurrency 1), 3 trials a point:" in lines
    assert "online (dynamic batching over concurrency), 3 trials a point:" in lines
    rows = [line.split() for line in lines if line.startswith("  ") and "batch" not in line]
    assert len(rows) == 6
    # batch, concurrency, throughput ± half-width (its %), p99, stable or why not
    assert rows[0] == ["1", "1", "1000.0", "±", "20.0", "(2.0", "%)", "1.50", "yes"]
    assert " ".join(rows[4]).endswith("3.00 no: interval ±8.1 % > max_ci_pct 5 %")
    for name in ("accuracy", "task", "offline", "online"):
        assert f"csv     results/{RUN}/{name}.csv" in lines
    make = f".venv/bin/snakemake --profile profiles/local results/{RUN}/plots/{RUN_CHARTS[0]}.html"
    assert f"charts  none yet; make them with: {make}" in lines
    assert (
        "report  none yet; make it with: .venv/bin/snakemake --profile profiles/local "
        "reports/cpu/tft.html (after every tft run of the set)" in lines
    )
    assert len(lines) < 34  # each scenario says its energy and GPU metrics in a line each


def test_summary_names_what_measured_the_run(run_dir):
    """The GPU and driver nvidia-smi named to the measuring job (its provenance), else the CPU:
    a row is labelled by the machine, not only by its `gpus` entry."""
    smi = "NVIDIA H200, 580.159.03, 143771 MiB"
    (run_dir / "offline.provenance.json").write_text(json.dumps({"host": {"gpus": [smi]}}))
    lines = summary(Path("results", RUN)).splitlines()
    assert lines[1] == f"measured on {smi}"
    cpu = {"host": {"gpus": [], "cpu": "AMD EPYC 9654", "cpu_count": 2}}
    (run_dir / "offline.provenance.json").write_text(json.dumps(cpu))
    assert (
        summary(Path("results", RUN)).splitlines()[1] == "measured on CPU AMD EPYC 9654 (2 cores)"
    )


def test_summary_lists_the_charts_and_report_pages_that_exist(run_dir, tmp_path):
    plots = run_dir / "plots"
    plots.mkdir()
    for chart in RUN_CHARTS:
        for ext in ("html", "svg", "png"):
            (plots / f"{chart}.{ext}").write_text("")
    (tmp_path / "reports" / "cpu").mkdir(parents=True)
    (tmp_path / "reports" / "cpu" / "tft.html").write_text("")
    (tmp_path / "reports" / "cpu" / "bert.html").write_text("")
    lines = summary(run_dir).splitlines()
    charts = [line.split()[1] for line in lines if line.startswith("chart ")]
    assert charts == [f"results/{RUN}/plots/{c}.html" for c in RUN_CHARTS]
    assert [line for line in lines if line.startswith("report")] == ["report  reports/cpu/tft.html"]
    assert not any("none yet" in line for line in lines)
    assert len(lines) < 34  # each scenario says its energy and GPU metrics in a line each


def test_summary_of_a_part_of_a_run_and_of_a_run_elsewhere(run_dir, tmp_path, monkeypatch):
    (run_dir / "online.csv").unlink()
    (run_dir / "accuracy.csv").unlink()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    text = summary(run_dir)
    assert "accuracy: not measured (no accuracy.csv)" in text
    assert "online (" not in text and "offline (" in text
    assert "charts  none yet (they need offline.csv and online.csv)" in text
    # the workdir is not the current directory: the command says which it is
    assert f"--directory {tmp_path} reports/cpu/tft.html" in text


def test_an_older_csv_without_reasons_says_unstable_only(run_dir):
    rows = [perf_row("offline", 1, 1, 10.0, stable=False, trials=1, throughput_ci95="")]
    old = [c for c in CSV_COLUMNS if c != "unstable_reason"]
    write(run_dir / "offline.csv", [{k: r[k] for k in old} for r in rows], old)
    text = summary(run_dir)
    assert "1 trial a point" in text
    assert "10.0 (no interval)" in text and text.split("10.0 (no interval)")[1].split()[1] == "no"


@pytest.mark.parametrize("where", ["missing", "file", "workdir"])
def test_summary_of_what_is_not_a_run_is_a_usage_error(run_dir, tmp_path, capsys, where):
    path = {"missing": tmp_path / "nothing", "file": run_dir / "offline.csv", "workdir": tmp_path}
    status = cli.main(["summary", str(path[where])])
    err = capsys.readouterr().err
    assert status == cli.USAGE_ERROR == 2
    assert err.startswith(f"deploybench summary: {path[where]} ")
    assert "expected a run directory, results/<model>/<gpu>/<format>/<precision>" in err
    if where == "workdir":  # the runs under it, to pick from
        assert err.rstrip().endswith(f"runs below it: results/{RUN}")


def test_summary_command_prints_the_summary(run_dir, capsys):
    assert cli.main(["summary", f"results/{RUN}"]) == 0
    assert capsys.readouterr().out == summary(Path("results", RUN)) + "\n"


def test_summary_without_a_run_summarises_the_targets(run_dir, tmp_path, capsys):
    """`make demo` ends with `deploybench summary`: the runs under `targets` of the workdir's
    config/config.yaml."""
    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    assert config["targets"] == [RUN]  # the shipped default target is the run made above
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "config.yaml").write_text(yaml.safe_dump(config))
    assert cli.main(["summary"]) == 0
    assert capsys.readouterr().out == summary(Path("results", RUN)) + "\n"


def test_a_scenario_stopped_partway_shows_its_finished_points_marked_partial(run_dir):
    """online's job stopped (no online.csv) after point (1, 1)'s trials and one of (1, 2)'s:
    the summary shows the finished point as its CSV row would be, marked PARTIAL, and names the
    file; the unfinished point is not shown."""
    from deploybench.partial import PartialMeasurement, partial_path

    (run_dir / "online.csv").unlink()
    planned = [{"batch": 1, "concurrency": c} for c in (1, 2)]
    kept = PartialMeasurement(partial_path(run_dir / "online.csv"), "f", "online", 2, 5.0)
    kept.open(planned, {"host": "node1"})
    for row, number in ((trial(1, 100.0), 1), (trial(1, 200.0), 1), (trial(1, 104.0), 2)):
        concurrency = 2 if row["throughput"] == 200.0 else 1
        kept.add(row | {"concurrency": concurrency, "trial": number, "attempt": 1})
    lines = summary(Path("results", RUN)).splitlines()
    heading = next(line for line in lines if line.startswith("online"))
    assert heading == (
        "online (dynamic batching over concurrency), 2 trials a point, PARTIAL: 1 of 2 points "
        f"finished (3 trials kept in results/{RUN}/online.partial.jsonl; the job was stopped: "
        "run it again to measure the rest):"
    )
    shown = lines[lines.index(heading) + 2].split()
    # 100 and 104: mean 102, ± 25.4 (t, 1 degree of freedom), beyond max_ci_pct 5 %
    assert shown[:6] == ["1", "1", "102.0", "±", "25.4", "(24.9"], shown
    assert "no: interval ±24.9 % > max_ci_pct 5 %" in lines[lines.index(heading) + 2]
    assert not lines[lines.index(heading) + 3].startswith("      1      2")
    assert f"partial results/{RUN}/online.partial.jsonl" in lines
