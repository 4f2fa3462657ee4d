"""Energy and GPU telemetry over a measurement's windows.

Energy comes from a *counter* differenced over whole windows, never from power samples times
time: NVML's total-energy counter on a GPU (mJ since the driver loaded, Volta and later), RAPL's
package counters on a CPU. Here: what a meter reads (:class:`Sample`, the :class:`Meter`
interface, the clock slowdowns NVML reports, the counter's update period); the meters themselves
and opening one are deploybench.meters. A :class:`Sampler` thread in the measuring job's process
reads the meter every ``interval_s`` while perf_analyzer runs; :func:`window` interpolates the
counter at the measured windows' ends; :func:`read_idle` reads the idle power. Timestamps are
``time.time_ns()``: perf_analyzer's profile export stamps requests with
std::chrono::system_clock, ns since the epoch (deploybench.tails).
"""

from __future__ import annotations

import itertools
import logging
import math
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, Any

from .columns import POWER_CAP_REASON
from .errors import ConfigError, DeploybenchError
from .stats import Interval, interval

if TYPE_CHECKING:  # 3.11: jobs run on the V100 images' Python 3.10 too
    from typing_extensions import Self

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Slowdown:
    """A reason NVML gives for clocks held below what the GPU could run at, and how it is
    measured over a window: NVML's violation-time counter (ns the reason held the clocks down,
    cumulative: ``nvmlDeviceGetViolationStatus`` of ``policy``, else the field ``field``)
    differenced over the window, else the fraction of the sampler's readings whose
    clocks-event-reasons bitmask has ``bit``. ``unstable``: a thermal or hardware slowdown,
    which above ``energy.max_slowdown_fraction`` of a trial makes its point unstable; power
    capping is the GPU's normal state at its power limit, reported only."""

    name: str
    bit: int | None  # nvmlClocksEventReason*
    policy: int | None  # nvmlPerfPolicyType_t
    field: int | None  # NVML_FI_DEV_*, in ns
    unstable: bool


# nvml.h (NVIDIA/go-nvml 2f9e261, pkg/nvml/nvml.h): the nvmlClocksEventReason* bits, the
# nvmlPerfPolicyType_t values and the NVML_FI_DEV_* field ids (nvml.h's translation of the
# deprecated nvmlDeviceGetViolationStatus's policies into fields). Not slowdowns: 0x1 GPU idle,
# 0x2 applications clocks setting, 0x10 sync boost, 0x100 display clock setting, and the
# policies SYNC_BOOST (2) and LOW_UTILIZATION (4).
SLOWDOWNS: tuple[Slowdown, ...] = (
    # "Software power cap activated": the clocks kept so that the power stays under its limit
    Slowdown(POWER_CAP_REASON, 0x4, 0, 74, unstable=False),  # NVML_PERF_POLICY_POWER
    # "HW Slowdown (reducing the core clocks by a factor of 2 or more)": heat, an external power
    # brake, Fast Trigger protection; no counter of its own
    Slowdown("hw slowdown", 0x8, None, None, unstable=True),
    Slowdown("sw thermal slowdown", 0x20, 1, 269, unstable=True),  # NVML_PERF_POLICY_THERMAL
    Slowdown("hw thermal slowdown", 0x40, None, 270, unstable=True),
    Slowdown("hw power brake slowdown", 0x80, None, 271, unstable=True),
    # "How long did the board limit / the board reliability limit cause the GPU to be below
    # application clocks": no clocks-event bit
    Slowdown("board limit", None, 3, 77, unstable=True),  # NVML_PERF_POLICY_BOARD_LIMIT
    Slowdown("reliability", None, 5, 79, unstable=True),  # NVML_PERF_POLICY_RELIABILITY
)
POWER_CAP = SLOWDOWNS[0].name
# the bits the sampler falls back to, by name
THROTTLING: dict[int, str] = {s.bit: s.name for s in SLOWDOWNS if s.bit is not None}
BY_COUNTERS = "violation counters"
BY_SAMPLES = "clock-event samples"


def throttle_names(bits: int) -> list[str]:
    """The throttling reasons set in an NVML clocks-event-reasons bitmask, in bit order."""
    return [name for bit, name in sorted(THROTTLING.items()) if bits & bit]


class NotMeasured(DeploybenchError, RuntimeError):
    """Energy cannot be measured here; ``reason`` says why (the energy_status column's text)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Sample:
    """One reading of a meter: its energy counter (J, from an arbitrary origin) and what else
    it reports (None where it does not)."""

    time_ns: int
    energy_j: float
    power_w: float | None = None
    sm_clock_mhz: float | None = None
    mem_clock_mhz: float | None = None
    temperature_c: float | None = None
    gpu_util_pct: float | None = None
    memory_used_mib: float | None = None
    throttle_reasons: int | None = None  # NVML clocks-event-reasons bitmask
    # processes of no one in this job computing on a metered GPU ("pid 4242 (python3) on
    # GPU-..."); None where the meter cannot list them
    sharing: tuple[str, ...] | None = None
    # each slowdown's violation-time counter (ns, cumulative), one per metered GPU, for the
    # slowdowns the GPUs count (SLOWDOWNS); None for a GPU that stopped answering
    violation_ns: Mapping[str, tuple[int | None, ...]] | None = None


# The counter's update period, measured once per job (Meter.measure_counter_period): polled
# until each counter has changed COUNTER_CHANGES times, for at most COUNTER_TIMEOUT_S.
COUNTER_CHANGES = 5
COUNTER_TIMEOUT_S = 5.0
COUNTER_POLL_S = 0.002
# A window's energy is the counter at its ends, and a counter holds its value between updates:
# each end may lag by up to one period, so the figure is off by at most one period's energy.
# Under MIN_COUNTER_PERIODS periods (over 10 %) the window is not measured.
MIN_COUNTER_PERIODS = 10
SHARED_GPU = "shared GPU"


class Meter(ABC):
    """An energy counter and what comes with it. A context manager: closed on exit."""

    name: str
    # how often the counter updates (s), once measured (measure_counter_period); None before
    counter_period_s: float | None = None

    @abstractmethod
    def read(self) -> Sample: ...

    @abstractmethod
    def facts(self) -> dict[str, Any]:
        """Where the readings come from, for the run's provenance."""

    def power_limit_w(self) -> float | None:
        return None

    def counters(self) -> list[tuple[str, float]]:
        """Each energy counter the meter sums, named, with its value now."""
        return [(self.name, self.read().energy_j)]

    def measure_counter_period(
        self, changes: int = COUNTER_CHANGES, timeout_s: float = COUNTER_TIMEOUT_S
    ) -> float:
        """How often the counters update (s, the slowest's), kept as ``counter_period_s``;
        NotMeasured where one does not advance (:func:`counter_period_s`)."""
        self.counter_period_s = counter_period_s(self.counters, changes, timeout_s)
        return self.counter_period_s

    def close(self) -> None:
        """Release what the meter holds (nothing, unless a meter says so)."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def counter_period_s(
    read: Callable[[], Sequence[tuple[str, float]]],
    changes: int = COUNTER_CHANGES,
    timeout_s: float = COUNTER_TIMEOUT_S,
    poll_s: float = COUNTER_POLL_S,
) -> float:
    """The update period of the counters ``read`` returns (named values): polled every
    ``poll_s`` until each has changed ``changes`` times, the median time between a counter's
    changes; the slowest counter's. A counter that changes fewer than twice within
    ``timeout_s`` is NotMeasured. A counter that changes at every poll reads as the poll's
    period: it updates at least that often."""
    first = list(read())
    names, last = [n for n, _ in first], [v for _, v in first]
    changed: list[list[float]] = [[] for _ in first]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and min(len(c) for c in changed) < changes:
        time.sleep(poll_s)
        now = time.monotonic()
        values = [v for _, v in read()]
        for times, before, after in zip(changed, last, values, strict=True):
            if after != before:
                times.append(now)
        last = values
    periods = []
    for name, times in zip(names, changed, strict=True):
        if len(times) < 2:
            what = "did not advance" if not times else "advanced once"
            raise NotMeasured(
                f"the energy counter ({name}) {what} in {timeout_s:g} s: its update period "
                "cannot be measured, nor a window's energy"
            )
        gaps = sorted(b - a for a, b in itertools.pairwise(times))
        periods.append(gaps[len(gaps) // 2])
    return max(periods)


# --- sampling -------------------------------------------------------------------------------


class Periodic:
    """Calls ``tick`` every ``interval_s`` on a daemon thread named ``name``, from start() until
    stop(); the first exception ends the calls and is kept in ``failure`` (the owner decides
    what it means). The energy meter's sampler and Triton's metrics poller both run on one."""

    def __init__(self, tick: Callable[[], None], interval_s: float, name: str) -> None:
        self.tick, self.interval_s, self.name = tick, interval_s, name
        self.failure: BaseException | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _run(self) -> None:
        try:
            while not self._stop.wait(self.interval_s):
                self.tick()
        except BaseException as error:  # noqa: BLE001 - kept for the owner, on its thread
            self.failure = error

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()


class Sampler:
    """Reads ``meter`` on entry, every ``interval_s`` on a daemon thread, and on exit, into
    ``samples`` (in time order). An error in the thread stops the sampling and is raised on
    exit (unless the block raised its own)."""

    def __init__(self, meter: Meter, interval_s: float) -> None:
        if not interval_s > 0:
            raise ConfigError(f"the energy sampling interval must be > 0 s, not {interval_s}")
        self.meter = meter
        self.interval_s = interval_s
        self.samples: list[Sample] = []
        self._periodic = Periodic(
            lambda: self.samples.append(self.meter.read()), interval_s, "energy-sampler"
        )

    def __enter__(self) -> Self:
        self.samples.append(self.meter.read())
        self._periodic.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._periodic.stop()
        failure = self._periodic.failure
        if failure is not None:
            if exc is None:
                raise failure
            log.warning("energy sampler failed too: %s", failure)
            return
        if exc is None:
            self.samples.append(self.meter.read())
            return
        try:
            self.samples.append(self.meter.read())
        except Exception as error:  # noqa: BLE001 - the block's own error says more
            log.warning("energy sampler's last reading failed: %s", error)


# --- a window's telemetry -------------------------------------------------------------------


@dataclass(frozen=True)
class WindowTelemetry:
    """The meter over one time window: energy from the counter, interpolated at both ends; the
    rest from the samples in the window (None for what the meter does not report)."""

    start_ns: int
    end_ns: int
    energy_j: float
    seconds: float
    power_mean_w: float  # energy_j / seconds
    power_max_w: float | None
    sm_clock_mhz: float | None  # mean
    mem_clock_mhz: float | None  # mean
    temperature_c: float | None  # max
    gpu_util_pct: float | None  # mean
    memory_used_mib: float | None  # max
    throttle_reasons: int | None  # OR of the samples' bitmasks
    samples: int  # the samples the statistics are over
    # the processes not the job's that computed on a metered GPU (in or around the window)
    sharing: tuple[str, ...] = ()
    # each slowdown measured (SLOWDOWNS, by name): the fraction of the window it held the
    # clocks down (the most of the metered GPUs'), and how it was measured (BY_COUNTERS or
    # BY_SAMPLES)
    slowdowns: Mapping[str, float] = field(default_factory=dict)
    slowdown_sources: Mapping[str, str] = field(default_factory=dict)


def _energy_at(samples: Sequence[Sample], t: int) -> float:
    """The counter at ``t``, linear between the samples around it (within their span)."""
    return _at(samples, t, lambda s: s.energy_j)


def _at(samples: Sequence[Sample], t: int, value: Callable[[Sample], float]) -> float:
    """A counter of the samples (``value``) at ``t``, linear between the samples around it."""
    for a, b in itertools.pairwise(samples):
        if a.time_ns <= t <= b.time_ns:
            if b.time_ns == a.time_ns:
                return value(a)
            return value(a) + (value(b) - value(a)) * (t - a.time_ns) / (b.time_ns - a.time_ns)
    raise AssertionError("unreachable: t within the samples' span")


def slowdown_fractions(
    samples: Sequence[Sample], inside: Sequence[Sample], start_ns: int, end_ns: int
) -> tuple[dict[str, float], dict[str, str]]:
    """Each slowdown's fraction of [start_ns, end_ns] and how it was measured: its violation
    counters, interpolated at both ends as the energy counter is, differenced, over the
    window's nanoseconds (the most of the GPUs', within 0..1), where every sample has them;
    else the fraction of the readings ``inside`` the window whose bitmask has its bit; neither:
    not measured (left out)."""
    fractions: dict[str, float] = {}
    sources: dict[str, str] = {}
    length = end_ns - start_ns
    bits = [s.throttle_reasons for s in inside if s.throttle_reasons is not None]
    for slowdown in SLOWDOWNS:
        name = slowdown.name
        counted = [(s.violation_ns or {}).get(name) for s in samples]
        if all(c is not None and None not in c for c in counted):
            gpus = len(counted[0] or ())
            per_gpu = []
            for gpu in range(gpus):

                def held(s: Sample, name: str = name, gpu: int = gpu) -> float:
                    return float((s.violation_ns or {})[name][gpu] or 0)

                per_gpu.append((_at(samples, end_ns, held) - _at(samples, start_ns, held)) / length)
            if per_gpu:
                fractions[name] = min(1.0, max(0.0, max(per_gpu)))
                sources[name] = BY_COUNTERS
                continue
        if slowdown.bit is not None and bits:
            fractions[name] = sum(1 for b in bits if b & slowdown.bit) / len(bits)
            sources[name] = BY_SAMPLES
    return fractions, sources


def window(samples: Sequence[Sample], start_ns: int, end_ns: int) -> WindowTelemetry:
    """The telemetry of ``samples`` (in time order) over [start_ns, end_ns], which the samples
    must span. Energy: the counter interpolated linearly at both ends. The other values: over
    the samples within the window, or the two around it when none falls inside (a window
    shorter than the sampling interval). Power max: the samples' power readings, or for a
    meter without them (RAPL) the counter's steepest stretch between consecutive points."""
    if end_ns <= start_ns:
        raise ValueError(f"a window must end after it starts: {start_ns}..{end_ns} ns")
    if len(samples) < 2 or not samples[0].time_ns <= start_ns or not end_ns <= samples[-1].time_ns:
        span = f"{samples[0].time_ns}..{samples[-1].time_ns}" if samples else "none"
        raise ValueError(
            f"the meter's samples ({len(samples)}, {span} ns) do not span the window "
            f"{start_ns}..{end_ns} ns: the sampler must run around the whole measurement"
        )
    start_e, end_e = _energy_at(samples, start_ns), _energy_at(samples, end_ns)
    seconds = (end_ns - start_ns) / 1e9
    energy = end_e - start_e

    inside = [s for s in samples if start_ns <= s.time_ns <= end_ns]
    if not inside:
        before = max(i for i, s in enumerate(samples) if s.time_ns < start_ns)
        inside = list(samples[before : before + 2])

    def values(field: str) -> list[float]:
        return [v for s in inside if (v := getattr(s, field)) is not None]

    def mean(field: str) -> float | None:
        found = values(field)
        return sum(found) / len(found) if found else None

    def maximum(field: str) -> float | None:
        found = values(field)
        return max(found) if found else None

    power_max = maximum("power_w")
    if power_max is None:
        points = [(start_ns, start_e)]
        points += [(s.time_ns, s.energy_j) for s in samples if start_ns < s.time_ns < end_ns]
        points.append((end_ns, end_e))
        power_max = max(
            (e1 - e0) / ((t1 - t0) / 1e9)
            for (t0, e0), (t1, e1) in itertools.pairwise(points)
            if t1 > t0
        )
    # a co-tenant seen by any reading the window's energy rests on: those inside and the two
    # around it
    around = [
        s
        for i, s in enumerate(samples)
        if start_ns <= s.time_ns <= end_ns
        or (s.time_ns < start_ns and samples[i + 1].time_ns >= start_ns)
        or (s.time_ns > end_ns and samples[i - 1].time_ns <= end_ns)
    ]
    sharing = tuple(dict.fromkeys(p for s in around for p in s.sharing or ()))
    reasons = [s.throttle_reasons for s in inside if s.throttle_reasons is not None]
    bits: int | None = None
    if reasons:
        bits = 0
        for r in reasons:
            bits |= r
    slowdowns, sources = slowdown_fractions(samples, inside, start_ns, end_ns)
    return WindowTelemetry(
        start_ns=start_ns,
        end_ns=end_ns,
        energy_j=energy,
        seconds=seconds,
        power_mean_w=energy / seconds,
        power_max_w=power_max,
        sm_clock_mhz=mean("sm_clock_mhz"),
        mem_clock_mhz=mean("mem_clock_mhz"),
        temperature_c=maximum("temperature_c"),
        gpu_util_pct=mean("gpu_util_pct"),
        memory_used_mib=maximum("memory_used_mib"),
        throttle_reasons=bits,
        samples=len(inside),
        sharing=sharing,
        slowdowns=slowdowns,
        slowdown_sources=sources,
    )


def window_refusal(telemetry: WindowTelemetry, period_s: float | None) -> str | None:
    """Why a window's energy is not a measurement of the server's (None: it is): another
    process computed on a metered GPU ("shared GPU: pid ..."), the window is shorter than
    MIN_COUNTER_PERIODS of the counter's update period ``period_s`` (its steps could be over
    1/MIN_COUNTER_PERIODS of the energy), or the counter did not advance over it."""
    if telemetry.sharing:
        return f"{SHARED_GPU}: {'; '.join(telemetry.sharing)}"
    if period_s is not None and telemetry.seconds < MIN_COUNTER_PERIODS * period_s:
        return (
            f"the window ({telemetry.seconds:.3g} s) is shorter than {MIN_COUNTER_PERIODS} "
            f"updates of the energy counter ({period_s * 1000:.0f} ms each): its steps could "
            f"be over {100 // MIN_COUNTER_PERIODS} % of the energy"
        )
    if not telemetry.energy_j > 0:
        return f"the energy counter did not advance over the {telemetry.seconds:.3g} s window"
    return None


@dataclass(frozen=True)
class IdleRead:
    """One idle read: the meter's power over each of its equal windows of no load (W), and
    the read's seconds. Its power is their mean, with the 95 % half-width over the windows
    (Student's t, deploybench.stats)."""

    windows_w: tuple[float, ...]
    seconds: float

    @property
    def interval(self) -> Interval:
        return interval(self.windows_w)

    def record(self) -> dict[str, Any]:
        """For the run's provenance (``config.energy.idle``)."""
        iv = self.interval
        return {
            "status": "measured",
            "power_w": round(iv.mean, 4),
            "ci95_w": None if math.isnan(iv.half_width) else round(iv.half_width, 4),
            "windows_w": [round(w, 4) for w in self.windows_w],
            "seconds": round(self.seconds, 3),
        }


def read_idle(
    meter: Meter,
    seconds: float,
    windows: int,
    interval_s: float,
    settle_s: float = 0.0,
    sleep: Callable[[float], None] = time.sleep,
) -> IdleRead:
    """The meter's power over ``seconds`` of no load, after ``settle_s`` more of them (the
    clocks and the power coming down from the last load), as ``windows`` equal windows, each
    the counter's increase over its seconds (:func:`window`), read every ``interval_s`` (so
    that a RAPL counter's wrap is seen). NotMeasured where another process computed on a
    metered GPU meanwhile, or a window is too short for the counter's steps or saw it stand
    still (:func:`window_refusal`)."""
    if not seconds > 0:
        raise ConfigError(f"the idle baseline needs a duration > 0 s, not {seconds}")
    if windows < 2:
        raise ConfigError(
            f"the idle baseline needs 2 windows or more for an interval, not {windows}"
        )
    if settle_s > 0:
        sleep(settle_s)
    with Sampler(meter, interval_s) as sampler:
        sleep(seconds)
    samples = sampler.samples
    sharing = dict.fromkeys(p for s in samples for p in s.sharing or ())
    if sharing:
        raise NotMeasured(f"{SHARED_GPU}: {'; '.join(sharing)}")
    start, end = samples[0].time_ns, samples[-1].time_ns
    edges = [start + (end - start) * k // windows for k in range(windows + 1)]
    powers = []
    for a, b in itertools.pairwise(edges):
        telemetry = window(samples, a, b)
        refused = window_refusal(telemetry, meter.counter_period_s)
        if refused:
            raise NotMeasured(f"idle baseline: {refused}")
        powers.append(telemetry.power_mean_w)
    return IdleRead(tuple(powers), (end - start) / 1e9)


@dataclass(frozen=True)
class IdleBaseline:
    """The idle power that "above idle" takes away, with its 95 % half-width (NaN: none), and
    which reads it comes from."""

    power_w: float
    half_width_w: float
    source: str


def idle_baseline(before: IdleRead | None, after: IdleRead | None) -> IdleBaseline | None:
    """The idle power of the reads there are: the one read's mean and half-width; with both,
    the mean of the two, its half-width the two reads' half-widths (each halved, as the mean
    halves them) and half their difference added in quadrature: the idle while the trials ran
    may lie anywhere between the two. None without a read."""
    if before is None and after is None:
        return None
    if before is None or after is None:
        read = before or after
        assert read is not None
        iv = read.interval
        return IdleBaseline(
            iv.mean, iv.half_width, "before the sweep" if before else "after the sweep"
        )
    a, b = before.interval, after.interval
    half = math.sqrt(
        (a.half_width / 2) ** 2 + (b.half_width / 2) ** 2 + ((a.mean - b.mean) / 2) ** 2
    )
    return IdleBaseline((a.mean + b.mean) / 2, half, "the mean of before and after the sweep")
