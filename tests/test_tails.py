"""Tails (deploybench.tails): perf_analyzer's profile export read as perf_analyzer counts it,
its percentile rule, and MLPerf's early-stopping bound checked against a transcription of
loadgen's own search."""

from __future__ import annotations

import bisect
import json
import math
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from deploybench.errors import PerfError
from deploybench.tails import (
    MeasuredWindow,
    TailBound,
    early_stopping_bound,
    min_requests,
    percentile,
    read_profile_export,
    tail_note,
)

MS = 1_000_000  # ns
T0 = 1_700_000_000_000_000_000  # system clock, ns since the epoch


def write_export(path: Path, experiments: list[dict[str, Any]]) -> Path:
    """As perf_analyzer 2.41 writes it (client r23.12 profile_data_exporter.cc): rapidjson's
    compact Writer, "experiments" then "version"."""
    path.write_text(
        json.dumps({"experiments": experiments, "version": "2.41.0"}, separators=(",", ":"))
    )
    return path


def request(start_ms: float, *responses_ms: float, sequence_id: int = 0) -> dict[str, Any]:
    record: dict[str, Any] = {"timestamp": T0 + int(start_ms * MS)}
    if sequence_id:  # written only for sequence models
        record["sequence_id"] = sequence_id
    record["response_timestamps"] = [T0 + int(r * MS) for r in responses_ms]
    return record


def experiment(requests: list[dict[str, Any]], boundaries_ms: Sequence[float]) -> dict[str, Any]:
    return {
        "experiment": {"mode": "concurrency", "value": 4},
        "requests": requests,
        "window_boundaries": [T0 + int(b * MS) for b in boundaries_ms],
    }


# 5 contiguous windows of 100 ms (AddWindow pushes start and end for the first, then each
# end): the measured ones are the last 3, [200, 500] ms.
BOUNDARIES = [0, 100, 200, 300, 400, 500]
REQUESTS = [
    request(10, 15),  # window 1: before the measured windows
    request(150, 190),  # window 2: before
    request(195, 200),  # ends on the measured windows' start: counted (both ends included)
    request(190, 203),  # starts before, ends inside: 13 ms
    request(250, 252, sequence_id=7),  # 2 ms
    request(300, 301, 302, 309),  # several responses: ends at the last, 9 ms
    request(310),  # no response: not counted
    request(350, 340),  # ends before it starts: perf_analyzer skips it
    request(480, 500),  # ends on the last window's end: counted, 20 ms
    request(490, 501),  # after the measured windows
]


def test_reads_the_last_three_windows(tmp_path: Path) -> None:
    export = write_export(tmp_path / "e.json", [experiment(REQUESTS, BOUNDARIES)])
    measured = read_profile_export(export)
    assert isinstance(measured, MeasuredWindow)
    assert (measured.start_ns, measured.end_ns) == (T0 + 200 * MS, T0 + 500 * MS)
    assert measured.requests == 5
    assert measured.latencies_ms == (2.0, 5.0, 9.0, 13.0, 20.0)


def test_fewer_windows_than_asked_takes_them_all(tmp_path: Path) -> None:
    export = write_export(tmp_path / "e.json", [experiment(REQUESTS, BOUNDARIES)])
    every = read_profile_export(export, windows=10)
    assert (every.start_ns, every.end_ns) == (T0, T0 + 500 * MS)
    assert every.latencies_ms == (2.0, 5.0, 5.0, 9.0, 13.0, 20.0, 40.0)
    last = read_profile_export(export, windows=1)
    assert (last.start_ns, last.latencies_ms) == (T0 + 400 * MS, (20.0,))


def test_one_window(tmp_path: Path) -> None:
    export = write_export(tmp_path / "e.json", [experiment(REQUESTS[:2], [0, 100])])
    assert read_profile_export(export).latencies_ms == (5.0,)


@pytest.mark.parametrize(
    "experiments, message",
    [
        ([], "expected one experiment"),
        (
            [experiment(REQUESTS, BOUNDARIES), experiment(REQUESTS, BOUNDARIES)],
            "expected one experiment",
        ),
        ([experiment(REQUESTS, [0])], "no measurement window"),
        ([experiment(REQUESTS, [0, 200, 100])], "do not increase"),
    ],
)
def test_bad_exports(tmp_path: Path, experiments: list[dict[str, Any]], message: str) -> None:
    export = write_export(tmp_path / "e.json", experiments)
    with pytest.raises(PerfError, match=message):
        read_profile_export(export)


def test_not_an_export(tmp_path: Path) -> None:
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(PerfError, match="not a perf_analyzer profile export"):
        read_profile_export(tmp_path / "bad.json")
    with pytest.raises(PerfError, match="not a perf_analyzer profile export"):
        read_profile_export(tmp_path / "missing.json")


def test_a_large_export(tmp_path: Path) -> None:
    rng = random.Random(1)
    requests = []
    for i in range(200_000):
        start = i * 0.005
        requests.append(request(start, start + 1 + rng.random()))
    export = write_export(tmp_path / "e.json", [experiment(requests, [0, 400, 700, 1000])])
    measured = read_profile_export(export)
    assert 199_000 < measured.requests <= 200_000
    assert list(measured.latencies_ms) == sorted(measured.latencies_ms)


# --- percentile -----------------------------------------------------------------------------


def test_percentile_is_perf_analyzers_rule() -> None:
    # SummarizeLatency (inference_profiler.cc r23.12):
    # latencies[size_t((percentile / 100.0) * (size - 1) + 0.5)]
    hundred = [float(i) for i in range(1, 101)]
    assert percentile(hundred, 0.99) == 99.0  # index int(98.51) = 98
    assert percentile(hundred, 0.50) == 51.0  # index int(50.0) = 50
    assert percentile(hundred, 0.90) == 90.0  # index int(89.6) = 89
    assert percentile([1.0, 2.0, 3.0, 4.0], 0.50) == 3.0  # index int(2.0) = 2
    assert percentile([7.0], 0.99) == 7.0
    for n in range(1, 400):
        latencies = list(range(n))
        for p in (50, 90, 95, 99):
            assert percentile(latencies, p / 100) == int((p / 100.0) * (n - 1) + 0.5)


def test_percentile_refuses() -> None:
    with pytest.raises(ValueError, match="no latencies"):
        percentile([], 0.99)
    with pytest.raises(ValueError, match=r"in \[0, 1\]"):
        percentile([1.0], 99)


# --- MLPerf early stopping: a transcription of loadgen's search -----------------------------


def odds(h: int, t: int, p: float) -> float:
    """early_stopping.cc odds(h, t, p, d = 0) = BetaRegularized[p, h, 1 + t], as the binomial
    sum its comment gives: Sum[Binomial[h + t, x] p^(h + t - x) (1 - p)^x, {x, 0, t}]."""
    m = h + t
    return math.fsum(
        math.exp(
            math.lgamma(m + 1)
            - math.lgamma(x + 1)
            - math.lgamma(m - x + 1)
            + (m - x) * math.log(p)
            + x * math.log(1 - p)
        )
        for x in range(t + 1)
    )


def find_min_passing(min_h: int, max_h: int, t: int, p: float, c: float) -> int:
    count = max_h - min_h
    while count > 0:
        step = count // 2
        h = min_h + step
        if odds(h, t, p) < 1 - c:
            count = step
        else:
            min_h = h + 1
            count -= step + 1
    return min_h


class MinPassingQueriesFinder:
    """early_stopping.cc MinPassingQueriesFinder::operator(), with its cache of earlier t."""

    def __init__(self) -> None:
        self.cache: dict[int, int] = {}

    def __call__(self, t: int, p: float, c: float) -> int:
        if t in self.cache:
            return self.cache[t]
        keys = sorted(self.cache)
        i = bisect.bisect_left(keys, t)  # cache.lower_bound(t)
        x0, y0, x1, y1 = -1, 0, 0, math.ceil(math.log(1 - c) / math.log(p))
        if i > 0:
            x1, y1 = keys[i - 1], self.cache[keys[i - 1]]
        if i > 1:
            x0, y0 = keys[i - 2], self.cache[keys[i - 2]]
        min_slope = p / (1 - p)
        max_slope = (y1 - y0) * (x1 - x0)
        min_h = int((t - x1) * min_slope + y1)  # int64_t from double: truncation
        max_h = (t - x1) * max_slope + y1 + 1
        h = find_min_passing(min_h, max_h, t, p, c)
        self.cache[t] = h
        return h


def loadgen_single_stream(sorted_ms: list[float], p: float, c: float) -> float | None:
    """results.cc PerformanceSummary::EarlyStopping, SingleStream branch (tolerance 0)."""
    find = MinPassingQueriesFinder()
    queries_issued = len(sorted_ms)
    t = 1
    h_min = find(1, p, c)
    if queries_issued < h_min + 1:
        return None
    for i in range(2, queries_issued + 1):
        h = find(i, p, c)
        if queries_issued < h + i:
            t = i - 1
            break
    return sorted_ms[queries_issued - t]


def test_min_requests() -> None:
    assert min_requests(0.99, 0.99) == 662
    assert min_requests(0.90, 0.99) == 64
    assert min_requests() == 662
    # exactly: P(Binomial(n, 1/100) <= 1) < 1/100  <=>  100 (99^n + n 99^(n-1)) < 100^n
    assert 100 * (99**662 + 662 * 99**661) < 100**662
    assert not 100 * (99**661 + 661 * 99**660) < 100**661


@pytest.mark.parametrize("p", [0.99, 0.90])
def test_min_requests_is_loadgens(p: float) -> None:
    assert min_requests(p, 0.99) == MinPassingQueriesFinder()(1, p, 0.99) + 1


@pytest.mark.parametrize(
    "p, n",
    [(0.99, n) for n in (661, 662, 663, 700, 1000, 2000, 5000)]
    + [(0.90, n) for n in (63, 64, 65, 100, 661, 1000, 5000)],
)
def test_bound_agrees_with_loadgen(p: float, n: int) -> None:
    latencies = sorted(random.Random(n).lognormvariate(1, 0.5) for _ in range(n))
    bound = early_stopping_bound(latencies, p, 0.99)
    assert bound == TailBound(n, min_requests(p, 0.99), bound.estimate_ms, p)
    assert bound.estimate_ms == loadgen_single_stream(latencies, p, 0.99)


def test_the_estimate_is_the_t_th_highest() -> None:
    latencies = [float(i) for i in range(1, 1001)]  # p99 over 1000: t = 2 (loadgen)
    assert early_stopping_bound(latencies).estimate_ms == 999.0
    assert early_stopping_bound(list(range(662))).estimate_ms == 661  # t = 1: the highest


def test_large_counts_are_quick() -> None:
    latencies = [float(i) for i in range(1_000_000)]
    bound = early_stopping_bound(latencies, 0.90)
    assert bound.estimate_ms is not None
    # about 1.0e5 over-latency queries expected, less ~2.33 sd (300) at 99 %
    assert 1_000_000 - 100_000 < bound.estimate_ms < 1_000_000 - 99_000


def test_too_few_requests() -> None:
    bound = early_stopping_bound([5.0] * 120)
    assert bound == TailBound(120, 662, None)
    assert tail_note(bound) == "too few requests for an early-stopping p99 estimate: 120 of 662"
    p90 = early_stopping_bound([5.0] * 10, percentile=0.90)
    assert tail_note(p90) == "too few requests for an early-stopping p90 estimate: 10 of 64"
    assert (
        tail_note(early_stopping_bound([]))
        == "too few requests for an early-stopping p99 estimate: 0 of 662"
    )
    assert tail_note(early_stopping_bound([5.0] * 662)) == ""


def test_bad_levels() -> None:
    with pytest.raises(ValueError, match="percentile must be in"):
        early_stopping_bound([1.0], percentile=99)
    with pytest.raises(ValueError, match="confidence must be in"):
        min_requests(0.99, confidence=1.0)
