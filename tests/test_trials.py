"""Repeated trials and their intervals: the arithmetic against hand-computed values, the duration
floor and cap, the alternation of points, and the `stable` rule (perf_analyzer stood in for)."""

import math

import pytest

from deploybench import columns, perf, stats
from tests.perf_standin import PROFILE_EXPORT
from tests.test_units import PA_CSV, TIME_WINDOWS, _fake_perf_analyzer, measure, stand_in

# --------------------------------------------------------------------------- the arithmetic


def test_t_quantiles_are_students():
    # t(0.975, df) from statistical tables
    assert stats.t_critical(1) == pytest.approx(12.7062, abs=1e-4)
    assert stats.t_critical(2) == pytest.approx(4.3027, abs=1e-4)
    assert stats.t_critical(4) == pytest.approx(2.7764, abs=1e-4)
    assert stats.t_critical(40) == pytest.approx(2.0211, abs=1e-4)
    assert stats.t_critical(120) == pytest.approx(1.9799, abs=1e-4)
    with pytest.raises(ValueError, match="at least 1"):
        stats.t_critical(0)


def test_interval_by_hand():
    # 10, 12, 14: mean 12, s = 2, s/sqrt(3) = 1.1547, t(0.975, 2) = 4.3027 -> 4.9683
    iv = stats.interval([10.0, 12.0, 14.0])
    assert iv.mean == 12.0 and iv.n == 3
    assert iv.half_width == pytest.approx(4.9683, abs=1e-4)
    assert iv.relative == pytest.approx(0.41402, abs=1e-5)
    assert iv.within(41.5) and not iv.within(41.3)
    # 100, 102: s = sqrt(2), s/sqrt(2) = 1, t(0.975, 1) = 12.706 -> 12.706
    assert stats.interval([100.0, 102.0]).half_width == pytest.approx(12.7062, abs=1e-4)
    one = stats.interval([5.0])
    assert one.mean == 5.0 and math.isnan(one.half_width) and not one.within(100)


def test_change_is_significant_only_outside_the_combined_intervals():
    a = stats.Interval(100.0, 3.0, 3)
    # 100 ± 3 vs 95 ± 4: |Δ| = 5 = sqrt(9 + 16): not outside
    assert not stats.change(a, stats.Interval(95.0, 4.0, 3)).significant
    slower = stats.change(a, stats.Interval(94.9, 4.0, 3))
    assert slower.significant and slower.ratio == pytest.approx(0.949)
    # ratio's half-width: 0.949 * sqrt((3/100)^2 + (4/94.9)^2)
    assert slower.ratio_half_width == pytest.approx(0.949 * math.hypot(0.03, 4 / 94.9))
    assert not stats.change(a, stats.Interval(50.0, math.nan, 1)).significant  # no interval
    assert stats.ratio_to(stats.Interval(90.0, 4.5, 3), 100.0) == (0.9, 0.045)


# ------------------------------------------------------------------------ requests per window


def test_floor_raises_and_cap_lowers_the_request_count():
    settings = perf.MeasureSettings(request_count=10, min_duration_ms=6000, max_duration_ms=30000)
    assert settings.requests_per_window(None) == (10, False)  # rate not known yet
    # 500 requests/s: 2 s windows (x 1.1) need 1100 requests
    assert settings.requests_per_window(500.0) == (1100, False)
    # 0.1 requests/s: 10 requests a window would take 300 s; the cap fits 1 (30 s / 3 windows)
    assert settings.requests_per_window(0.1) == (1, True)
    # 1 request/s: 10 a window = 30 s a trial, exactly the cap: not cut
    assert settings.requests_per_window(1.0) == (10, False)
    assert settings.requests_per_window(0.5) == (5, True)
    no_cap = perf.MeasureSettings(request_count=10)
    assert no_cap.requests_per_window(0.1) == (10, False)


# ------------------------------------------------------------------------- one trial, stood in


def test_warm_up_rate_sets_the_floor(tmp_path, monkeypatch):
    calls = stand_in(tmp_path, monkeypatch)
    settings = perf.MeasureSettings(request_count=10, warmup_factor=1, min_duration_ms=3000)
    row = measure(tmp_path, settings)
    # the stand-in's 255.716 inf/s at batch 1: 1 s windows (x 1.1) need 282 requests
    assert calls.read_text().split("\n")[:-1] == ["10 1000", "282 "]
    assert row["request_count"] == 282 and row["measured_requests"] == 846
    assert row["measured_s"] == pytest.approx(846 / 255.716, abs=1e-3)
    assert row["stable"] is True and row["duration_capped"] is False and row["attempts"] == 1


def test_a_trial_short_of_the_floor_is_measured_again(tmp_path, monkeypatch):
    calls = stand_in(tmp_path, monkeypatch)
    # no warm-up, no rate: the first trial measures 10 a window (0.12 s), then the floor's count
    settings = perf.MeasureSettings(request_count=10, warmup_factor=0, min_duration_ms=3000)
    row = measure(tmp_path, settings)
    assert calls.read_text().split("\n")[:-1] == ["10 ", "282 "]
    assert row["measured_s"] >= 3.0 and row["attempts"] == 2


def test_slow_point_is_capped_and_says_so(tmp_path, monkeypatch):
    calls = stand_in(tmp_path, monkeypatch)
    settings = perf.MeasureSettings(
        request_count=2000, warmup_factor=0, min_duration_ms=0, max_duration_ms=3000
    )
    # 255.716 requests/s known from a previous trial: 3 s over 3 windows fits 255
    row = measure(tmp_path, settings, warm_up=False, rate=255.716)
    assert calls.read_text().split("\n")[:-1] == ["255 "]
    assert row["duration_capped"] is True and row["request_count"] == 255


def test_unstable_retries_stay_within_the_cap(tmp_path, monkeypatch):
    calls = stand_in(tmp_path, monkeypatch, ok=10**6)
    settings = perf.MeasureSettings(
        request_count=300, warmup_factor=0, max_retries=2, retry_request_step=50,
        max_duration_ms=3000,
    )  # fmt: skip
    row = measure(tmp_path, settings, rate=255.716)
    # capped at 255 a window: retries cannot add requests; the last try runs without the check
    assert calls.read_text().split("\n")[:-1] == ["255 ", "255 ", "255 ", "255 1000"]
    assert row["stable"] is False and row["duration_capped"] is True and row["attempts"] == 4


def test_the_requests_a_window_holds():
    """One estimate for the export's budget and a job's memory: time windows hold the rate x
    the interval (not known without a rate), count windows the count or a second's worth."""
    timed = perf.MeasureSettings(
        request_count=50, measurement_interval_ms=10000, measurement_mode="time_windows"
    )
    assert timed.requests_held(255.716, 50) == 2558  # not the 50 asked for
    assert timed.requests_held(255.716, 50, windows_of=2) == 5115  # the warm-up's windows
    assert timed.requests_held(None, 50) is None and timed.requests_held(0.0, 50) is None
    counted = perf.MeasureSettings(request_count=50)
    assert counted.requests_held(None, 50) == 50 and counted.requests_held(10.0, 50) == 50
    assert counted.requests_held(255.716, 50) == 256  # a window lasts a second at least


def test_a_time_windows_export_is_budgeted_at_the_rate_x_the_interval(
    tmp_path, monkeypatch, caplog
):
    """10 s windows at the stand-in's 255.716 requests/s hold 2558 requests, not the 50 of
    request_count: 10,000 values each over 10 windows is 3 GB of JSON, so not asked for."""
    calls = tmp_path / "calls"
    _fake_perf_analyzer(
        tmp_path, monkeypatch, TIME_WINDOWS.format(calls=calls, csv=PA_CSV, export=PROFILE_EXPORT)
    )
    settings = perf.MeasureSettings(
        request_count=50, measurement_interval_ms=10000, measurement_mode="time_windows"
    )
    big = perf.ExportSize(tensors_recorded=True, input_values=9000, output_values=1000)

    def measured(size, **options):
        calls.write_text("")
        caplog.clear()
        row = measure(tmp_path, settings, export_size=size, **options)
        last = calls.read_text().splitlines()[-1]  # the measuring attempt
        return row, "--profile-export-file" in last.split(), caplog.text

    # the warm-up measured the rate: the export's estimate is for 2558 requests a window
    row, exported, log = measured(big)
    assert not exported and row["tail_requests"] is None
    assert "10 windows of 2558 requests" in log and "not asked for" in log
    # small tensors at that rate fit the budget: asked for, the trial has its tails
    row, exported, _ = measured(perf.ExportSize(True, 10, 1))
    assert exported and row["tail_requests"] == 120
    # the rate of a previous trial decides it too: at 1 request/s a window holds 10
    row, exported, _ = measured(big, warm_up=False, rate=1.0)
    assert exported and row["tail_requests"] == 120
    # no rate known (no warm-up, no earlier trial): the size is not known, so not asked for
    row, exported, log = measured(big, warm_up=False)
    assert not exported and row["tail_requests"] is None
    assert "rate not measured yet" in log and "not asked for" in log
    # a perf_analyzer that records no tensors is always asked for it
    row, exported, _ = measured(perf.TIMESTAMPS_ONLY, warm_up=False)
    assert exported and row["tail_requests"] == 120


# ---------------------------------------------------------------------- trials and the summary


def test_points_alternate_and_warm_up_once():
    seen = []

    def fake(point, warm_up, rate):
        seen.append((point.batch, warm_up, rate))
        return {"batch": point.batch, "concurrency": 1, "throughput": 10.0 * point.batch}

    points = [perf.Point(1, 1), perf.Point(4, 1)]
    rows = perf.measure_trials(points, 3, fake)
    assert seen == [
        (1, True, None),
        (4, True, None),
        (1, False, 10.0),  # requests per second: throughput / batch
        (4, False, 10.0),
        (1, False, 10.0),
        (4, False, 10.0),
    ]
    assert [r["trial"] for r in rows] == [1, 1, 2, 2, 3, 3]


def test_a_resumed_attempt_measures_only_the_trials_not_kept(tmp_path):
    """A job stopped after its first point's trials: run again, it takes the kept trials in
    their places, measures only the others (warming up a point on its first visit, from the
    rate its last kept trial measured), and hears of those only; the partial file holds every
    trial of both attempts, each with its attempt."""
    from deploybench.partial import PartialMeasurement, finished_points, read

    def fake(point, warm_up, rate):
        seen.append((point.batch, warm_up, rate))
        return {"batch": point.batch, "concurrency": 1, "throughput": 10.0 * point.batch}

    points = [perf.Point(1, 1), perf.Point(4, 1)]
    planned = [{"batch": p.batch, "concurrency": p.concurrency} for p in points]
    path = tmp_path / "offline.partial.jsonl"
    first = PartialMeasurement(path, "same", "offline", trials=3)
    assert first.open(planned, {"host": "a"}) == [] and not path.exists()
    seen: list = []
    # attempt 1 stops (SIGTERM) in trial 3 of batch 4, once batch 1 has all three
    stop_at = (4, 3)

    def stopping(point, warm_up, rate):
        if (point.batch, len([s for s in seen if s[0] == point.batch]) + 1) == stop_at:
            raise KeyboardInterrupt
        return fake(point, warm_up, rate)

    with pytest.raises(KeyboardInterrupt):
        perf.measure_trials(points, 3, stopping, keep=lambda r: first.add(r | {"attempt": 1}))
    assert [[r["trial"] for r in p] for p in finished_points(read(path))] == [[1, 2, 3]]

    second = PartialMeasurement(path, "same", "offline", trials=3)
    kept = second.open(planned, {"host": "b"})
    assert second.attempt == 2 and len(kept) == 5
    seen, heard = [], []
    # (the job's measure tags each row with its attempt)
    rows = perf.measure_trials(
        points, 3, lambda *a: fake(*a) | {"attempt": 2}, heard.append, kept=kept, keep=second.add
    )
    assert seen == [(4, True, 10.0)]  # the one trial missing, warmed up on this server
    assert [(d.done, d.total) for d in heard] == [(1, 1)]
    assert [(r["batch"], r["trial"], r["attempt"]) for r in rows] == [
        (1, 1, 1), (4, 1, 1), (1, 2, 1), (4, 2, 1), (1, 3, 1), (4, 3, 2)
    ]  # fmt: skip
    assert [(a["attempt"], a["host"], len(a["trials"])) for a in second.attempts()] == [
        (1, "a", 5),
        (2, "b", 1),
    ]
    # another measurement (its spec or repository changed) keeps nothing of it
    assert PartialMeasurement(path, "other", "offline", 3).open(planned, {}) == []


def test_a_partial_file_cut_mid_line_keeps_its_whole_trials(tmp_path):
    from deploybench.partial import PartialMeasurement, read

    path = tmp_path / "online.partial.jsonl"
    partial = PartialMeasurement(path, "f", "online", trials=1)
    partial.open([{"batch": 1, "concurrency": 2}], {})
    partial.add({"batch": 1, "concurrency": 2, "trial": 1, "latencies_ms": [1.5, 2.25]})
    with path.open("a") as f:
        f.write('{"kind": "trial", "attempt": 1, "row": {"bat')  # a kill mid-write
    assert read(path).trials == [
        {"batch": 1, "concurrency": 2, "trial": 1, "latencies_ms": [1.5, 2.25], "attempt": 1}
    ]


def trial(batch, throughput, p99, stable=True, capped=False, seconds=5.0):
    values = dict.fromkeys(perf.MEASURED, 1.0)
    return values | {
        "batch": batch,
        "concurrency": 1,
        "throughput": throughput,
        "p99_latency_ms": p99,
        "request_count": 50,
        "measured_requests": 100,
        "measured_s": seconds,
        "duration_capped": capped,
        "stable": stable,
        "attempts": 1,
    }


def test_summary_is_the_mean_with_its_interval_and_the_stable_rule():
    rows = [
        trial(1, 100.0, 2.0),
        trial(8, 400.0, 9.0),
        trial(1, 102.0, 2.2, seconds=4.0),
        trial(8, 300.0, 9.0),
        trial(1, 104.0, 2.4),
        trial(8, 500.0, 9.0, capped=True),
    ]
    one, eight = perf.summarize(rows, max_ci_pct=10)
    assert (one["batch"], eight["batch"]) == (1, 8)
    assert one["throughput"] == 102.0 and one["trials"] == 3
    # 100, 102, 104: s = 2 -> 4.3027 * 2 / sqrt(3) = 4.9683 (4.9 % of the mean: stable)
    assert one["throughput_ci95"] == pytest.approx(4.9683, abs=1e-4)
    assert one["p99_latency_ms"] == pytest.approx(2.2)
    assert one["p99_latency_ms_ci95"] == pytest.approx(0.49683, abs=1e-5)
    assert one["stable"] is True and one["measured_s"] == 4.0 and one["measured_requests"] == 300
    assert one["attempts"] == 3 and one["duration_capped"] is False
    # 300..500: ± 248 (62 % of the mean): every trial stable, yet the point is not
    assert eight["throughput_ci95"] == pytest.approx(248.4138, abs=1e-3)
    assert eight["stable"] is False and eight["duration_capped"] is True
    # one trial called unstable by perf_analyzer makes the point unstable
    rows[2] = trial(1, 102.0, 2.2, stable=False)
    assert perf.summarize(rows, max_ci_pct=10)[0]["stable"] is False


def test_one_trial_has_no_interval():
    [row] = perf.summarize([trial(1, 100.0, 2.0)], max_ci_pct=5)
    assert row["throughput_ci95"] is None and row["trials"] == 1 and row["stable"] is True


def test_a_small_mean_keeps_its_significant_digits():
    """Means are written to WRITTEN_DIGITS significant digits, not a count of decimals: 3e-5 J
    per inference (a fast model at batch 1) keeps nine digits, as a throughput of 30,000 does."""
    rows = [trial(1, 30_000.123456789, 0.01) | {"measured_s": s} for s in (1.0, 2.0, 3.0)]
    for row, value in zip(rows, (3.0114613e-5, 3.0114614e-5, 3.0114615e-5), strict=True):
        row["p99_latency_ms"] = value
    [point] = perf.summarize(rows, max_ci_pct=5)
    assert point["p99_latency_ms"] == 3.0114614e-5  # 6 decimals would write 3e-05
    assert point["p99_latency_ms_ci95"] == pytest.approx(2.4841e-12, rel=1e-4)  # not 0
    assert point["throughput"] == 30_000.1235  # 9 significant digits
    assert str(columns.as_written(-0.0)) == "0.0"  # no "-0.0" in a CSV
