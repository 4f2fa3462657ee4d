"""Latency tails from every request perf_analyzer measured, and how much data backs them.

perf_analyzer (tritonclient 2.41 = triton-inference-server/client r23.12) reports a p99 over
the last ``stability_window`` (3) measurement windows it merged. ``--profile-export-file``
writes every request of every window it measured, so a point's p99 can be pooled over all its
trials, and MLPerf's early stopping (mlcommons/inference loadgen) says whether a pool is large
enough for an estimate of the p99 at all, and which latency its SingleStream rule estimates.

That rule is a binomial test: it holds for queries whose latencies are independent, as in
loadgen's SingleStream scenario, where "the next query is only issued once the previous one has
completed" (loadgen/test_settings.h; early_stopping.cc: "the binomial distribution is the
discrete probability distribution for independent boolean experiments"). An online point runs at
a concurrency up to 256, where requests overlap and queue behind each other, and a point's
trials are pooled: there the assumption does not hold, and the estimate is loadgen's rule
applied, not a 99 % confidence bound.

Sources, read at these revisions:

* client r23.12 (5e60cb5), src/c++/perf_analyzer/: profile_data_exporter.cc (the file's
  format), profile_data_collector.cc (AddWindow: the boundaries), inference_profiler.cc
  (ValidLatencyMeasurement: which requests a window counts; SummarizeLatency: percentiles).
* mlcommons/inference (b66003e), loadgen/early_stopping.cc (odds, find_min_passing; the
  binomial model, :48-49), loadgen/results.cc (PerformanceSummary::EarlyStopping, SingleStream
  branch) and loadgen/test_settings.h (TestScenario: SingleStream, one query at a time).
"""

from __future__ import annotations

import itertools
import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import PerfError

# perf_analyzer merges its last 3 windows into the result it reports (inference_profiler.cc
# r23.12: load_parameters_.stability_window = 3).
STABILITY_WINDOW = 3

NS_PER_MS = 1_000_000


@dataclass(frozen=True)
class MeasuredWindow:
    """The windows perf_analyzer's result covers: from the first one's start to the last one's
    end (system clock, ns since the epoch), and the latency of every request it counted in
    them (ms, ascending)."""

    start_ns: int
    end_ns: int
    latencies_ms: tuple[float, ...]

    @property
    def requests(self) -> int:
        return len(self.latencies_ms)


def read_profile_export(path: Path | str, windows: int = STABILITY_WINDOW) -> MeasuredWindow:
    """The last ``windows`` measurement windows (all of them where fewer were measured) of the
    one experiment in perf_analyzer's ``--profile-export-file`` at ``path``, and the requests
    perf_analyzer counted in them.

    The file (profile_data_exporter.cc r23.12) is
    ``{"experiments": [{"experiment": {"mode", "value"}, "requests": [{"timestamp": ns,
    ["sequence_id": n,] "response_timestamps": [ns, ...]}], "window_boundaries": [ns, ...]}],
    "version": str}``, timestamps from std::chrono::system_clock. One experiment per load
    value; this takes one (one concurrency or rate per perf_analyzer call)."""
    if windows < 1:
        raise PerfError(f"windows must be at least 1, got {windows}")
    path = Path(path)
    try:
        with path.open("rb") as f:
            document = json.load(f)
        experiments = document["experiments"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise PerfError(f"{path}: not a perf_analyzer profile export ({e})") from e
    if not isinstance(experiments, list) or len(experiments) != 1:
        loads = [x.get("experiment") for x in experiments] if isinstance(experiments, list) else []
        raise PerfError(
            f"{path}: expected one experiment (one concurrency or request rate per "
            f"perf_analyzer call), found {len(loads)}: {loads}"
        )
    experiment = experiments[0]
    boundaries = experiment.get("window_boundaries")
    records = experiment.get("requests")
    if not isinstance(boundaries, list) or len(boundaries) < 2 or not isinstance(records, list):
        raise PerfError(
            f"{path}: the experiment has no measurement window (window_boundaries "
            f"{boundaries!r}) or no requests list"
        )
    # One profiling run's windows are contiguous: each starts where the previous one ended
    # (inference_profiler.cc: window_start_ns = previous_window_end_ns_), and AddWindow then
    # pushes only the new end, so N windows have N + 1 increasing boundaries.
    if any(b <= a for a, b in itertools.pairwise(boundaries)):
        raise PerfError(f"{path}: window boundaries do not increase: {boundaries}")
    start_ns = boundaries[-1 - min(windows, len(boundaries) - 1)]
    end_ns = boundaries[-1]
    return MeasuredWindow(start_ns, end_ns, _latencies_ms(records, start_ns, end_ns))


def _latencies_ms(records: list[dict[str, Any]], start_ns: int, end_ns: int) -> tuple[float, ...]:
    """The latency (ms, ascending) of each request perf_analyzer counts in [start_ns, end_ns].

    ValidLatencyMeasurement (inference_profiler.cc r23.12): a request ends at its last response
    (the one before when the last is a null response: the export does not say which are, as
    it writes only response_times_, so this takes the last one, as for every non-decoupled
    model); one without a response is not counted, nor one that ends before it starts; it is
    counted in the window that holds its end, both ends included. (A request ending on the
    very ns of a window boundary may have been counted in the window before: the export cannot
    tell, and this counts it here.)"""
    durations: list[int] = []
    append = durations.append
    for record in records:
        responses = record["response_timestamps"]
        if not responses:
            continue
        end = responses[-1]
        start = record["timestamp"]
        if start_ns <= end <= end_ns and start <= end:
            append(end - start)
    durations.sort()  # integer ns: exact ordering, converted once
    return tuple(d / NS_PER_MS for d in durations)


def percentile(sorted_ms: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0.99 for p99) of ascending ``sorted_ms``, as perf_analyzer reports
    it (SummarizeLatency, inference_profiler.cc r23.12): the element at index
    ``size_t((percentile / 100.0) * (n - 1) + 0.5)``, no interpolation."""
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"percentile q must be in [0, 1] (0.99 for p99), got {q}")
    if not sorted_ms:
        raise ValueError("percentile of no latencies")
    return sorted_ms[int(q * (len(sorted_ms) - 1) + 0.5)]


# --- MLPerf early stopping ------------------------------------------------------------------
#
# loadgen's SingleStream estimate: with n queries, t is the most over-latency queries such that
# seeing t or fewer in n, were each over with probability 1 - p, has odds below 1 - c
# (odds(h, t) = BetaRegularized[p, h, 1 + t] = P(Binomial(h + t, 1 - p) <= t); find_min_passing
# gives the least h with odds < 1 - c, and the loop keeps the largest t with h(t) + t <= n).
# As P(Binomial(m, 1 - p) <= t) falls as m grows, that is the largest t with
# P(Binomial(n, 1 - p) <= t) < 1 - c, and the estimate is the t-th highest latency
# (sample_latencies[n - t]). There is one only when t = 1 qualifies, i.e. n >= h(1) + 1.


@dataclass(frozen=True)
class TailBound:
    """MLPerf's early-stopping estimate of a percentile over ``requests`` latencies: None
    where there are fewer than the ``needed`` that any estimate takes."""

    requests: int
    needed: int
    estimate_ms: float | None
    percentile: float = 0.99


def _check_levels(percentile: float, confidence: float) -> None:
    if not 0.0 < percentile < 1.0:
        raise ValueError(f"percentile must be in (0, 1) (0.99 for p99), got {percentile}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1) (0.99 for 99 %), got {confidence}")


def _log_add(a: float, b: float) -> float:
    """log(exp(a) + exp(b)) without underflow."""
    if a < b:
        a, b = b, a
    return a if b == -math.inf else a + math.log1p(math.exp(b - a))


def _log_cdf(n: int, t: int, over: float) -> float:
    """log P(Binomial(n, over) <= t)."""
    log_p, log_q = math.log(over), math.log1p(-over)
    total = -math.inf
    for k in range(min(t, n) + 1):
        log_pmf = (
            math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)
            + k * log_p + (n - k) * log_q
        )  # fmt: skip
        total = _log_add(total, log_pmf)
    return total


def _most_over_latency(n: int, percentile: float, confidence: float) -> int:
    """The largest t with P(Binomial(n, 1 - percentile) <= t) < 1 - confidence (0: none).

    The pmf terms are walked up from k = 0 in log space (p^n underflows for large n), each
    from the one before (pmf(k + 1) = pmf(k) (n - k) / (k + 1) (1 - p) / p), until the CDF
    reaches 1 - c: about n (1 - p) steps."""
    log_alpha = math.log1p(-confidence)
    log_ratio = math.log1p(-percentile) - math.log(percentile)
    log_pmf = n * math.log(percentile)  # k = 0
    log_cdf = log_pmf
    if log_cdf >= log_alpha:
        return 0
    k = 0
    while k < n:
        log_pmf += math.log((n - k) / (k + 1)) + log_ratio
        k += 1
        log_cdf = _log_add(log_cdf, log_pmf)
        if log_cdf >= log_alpha:
            return k - 1
    return n  # every query may be over: only when 1 - c exceeds 1, which _check_levels bars


def min_requests(percentile: float = 0.99, confidence: float = 0.99) -> int:
    """The fewest requests MLPerf's early stopping estimates ``percentile`` from at
    ``confidence`` (results.cc: "Need to process at least h_min + 1 queries"): the least n
    with P(Binomial(n, 1 - p) <= 1) < 1 - c. 662 for p99, 64 for p90, at 99 %."""
    _check_levels(percentile, confidence)
    log_alpha = math.log1p(-confidence)
    over = 1.0 - percentile
    # below this even zero over-latency queries in n are not rare enough (p^n >= 1 - c):
    # loadgen's own starting point in MinPassingQueriesFinder
    n = max(2, math.ceil(log_alpha / math.log(percentile)))
    while _log_cdf(n, 1, over) >= log_alpha:
        n += 1
    return n


def early_stopping_bound(
    sorted_ms: Sequence[float], percentile: float = 0.99, confidence: float = 0.99
) -> TailBound:
    """MLPerf loadgen's SingleStream early-stopping estimate of ``percentile`` at ``confidence``
    (tolerance 0) over ascending ``sorted_ms``: the t-th highest latency, t the most
    over-latency queries the count still allows (see above); None with fewer than
    :func:`min_requests` latencies. Its confidence assumes independent latencies, queries issued
    one at a time (the module's docstring): over concurrent or pooled requests it is the rule's
    estimate, not a bound at that confidence."""
    _check_levels(percentile, confidence)
    n = len(sorted_ms)
    needed = min_requests(percentile, confidence)
    if n < needed:
        return TailBound(n, needed, None, percentile)
    t = _most_over_latency(n, percentile, confidence)
    return TailBound(n, needed, sorted_ms[n - t], percentile)


def tail_note(bound: TailBound) -> str:
    """ "" where the bound has an estimate, else why not ("too few requests for an
    early-stopping p99 estimate: 120 of 662")."""
    if bound.estimate_ms is not None:
        return ""
    name = f"p{round(bound.percentile * 100, 6):g}"
    return (
        f"too few requests for an early-stopping {name} estimate: "
        f"{bound.requests} of {bound.needed}"
    )


# --- what the export costs ---------------------------------------------------------------------

# perf_analyzer from r24.04 (tritonclient 2.45; the images' r24.09 and r25.x SDK builds) keeps
# every request's input and output tensors for its profile export and writes them there as
# JSON numbers, for every window it measured: triton-inference-server/client r24.04
# src/c++/perf_analyzer/infer_context.cc GetInputs (:189-207, called for every request at
# :117), request_record.h RecordData and request_inputs_ (:38-42, :89), profile_data_exporter.cc
# AddRequestInputs (:126); the same in triton-inference-server/perf_analyzer r24.08 to r25.12
# src/infer_context.cc, src/profile_data_exporter.cc. r24.03 (2.44) records responses' outputs
# only (its request_record.h has ResponseData, no inputs); earlier ones (2.41: client r23.12
# request_record.h) only timestamps. Tensors in shared memory are not kept (client r24.04 and
# r25.12 src/c++/library/common.cc InferInput::RawData: no buffer). It keeps the inputs even
# without an export, which a measurement job's memory accounts for
# (deploybench/planning/measurement_memory.py).
TENSORS_RECORDED_FROM = (2, 45)
EXPORT_BUDGET_BYTES = 256 * 2**20  # what one measuring attempt's export may take, at most
JSON_BYTES_PER_VALUE = 12  # a float as rapidjson writes it, with its comma
DEFAULT_MAX_WINDOWS = 10  # perf_analyzer's --max-trials default: the windows it may keep


def records_tensors(perf_analyzer_version: str | None) -> bool:
    """Whether this perf_analyzer (``provenance.perf_analyzer_version()``: "tritonclient
    2.41.0", or its path when no wheel's metadata is beside it) writes tensors into its export.
    Not known: yes (an image's SDK build is newer)."""
    found = re.search(r"tritonclient (\d+)\.(\d+)", perf_analyzer_version or "")
    if found is None:
        return True
    return (int(found.group(1)), int(found.group(2))) >= TENSORS_RECORDED_FROM


def export_too_costly(
    *,
    tensors_recorded: bool,
    shared_memory: bool,
    values_per_request: int,
    requests_per_window: int | None,
    max_windows: int | None,
) -> str | None:
    """Why a measuring attempt should not ask for the profile export (None: it may): its
    perf_analyzer would keep and write more than EXPORT_BUDGET_BYTES of tensors (every request
    of up to ``max_windows`` windows of ``requests_per_window`` requests, ``values_per_request``
    values each; perf.MeasureSettings.requests_held). ``requests_per_window`` None: not known
    (time windows at a rate not measured yet), so not asked for where tensors are recorded."""
    if not tensors_recorded or shared_memory or values_per_request <= 0:
        return None
    windows = max_windows or DEFAULT_MAX_WINDOWS
    if requests_per_window is None:
        return (
            f"perf_analyzer's profile export would hold every request's tensors "
            f"({values_per_request} values a request) of windows of a length, not a count, at a "
            f"rate not measured yet (no warm-up or earlier trial), so its size is not known: "
            f"not asked for"
        )
    estimate = values_per_request * JSON_BYTES_PER_VALUE * requests_per_window * windows
    if estimate <= EXPORT_BUDGET_BYTES:
        return None
    return (
        f"perf_analyzer's profile export would hold every request's tensors ({values_per_request} "
        f"values a request, about {estimate / 2**20:.0f} MiB for {windows} windows of "
        f"{requests_per_window} requests; budget {EXPORT_BUDGET_BYTES / 2**20:.0f} MiB): not asked for"
    )
