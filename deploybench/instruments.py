"""Instruments: what measures beside perf_analyzer while a trial runs.

perf_analyzer measures every trial; an instrument adds to it. It may add perf_analyzer flags
(``flags``: ``--collect-metrics``), run alongside it (``during``: a thread reading the energy
meter, a poller of Triton's counter), and hands its output for the trial to the collector of
its ``source`` (:mod:`deploybench.collectors`), which turns it into column values. A trial's
measured windows are the ones perf_analyzer's profile export records (deploybench.tails): an
instrument reads only over them, and a trial whose export was not asked for (too costly) has no
windows, so an instrument then says why it measured nothing.

A :class:`deploybench.perf.Measurement` carries its instruments; ``perf.measure_point`` runs
them without knowing what they are. A new one is a class here, its collector and columns
(docs/extending.md, "A metric column").
"""

from __future__ import annotations

import contextlib
import logging
from abc import ABC, abstractmethod
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from .collectors import (
    ENERGY,
    TRITON_GPU_METRICS,
    TRITON_METRICS,
    EnergyOutput,
    GpuMetricsOutput,
    TritonMetricsOutput,
)

if TYPE_CHECKING:
    from .tails import MeasuredWindow
    from .telemetry import Meter
    from .triton_metrics import TritonEnergy

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Attempt:
    """One perf_analyzer run of a trial, as an instrument sees it: its point (batch,
    concurrency), whether perf_analyzer records its requests (a measuring attempt whose export
    was asked for: its windows will be known) and, for a measuring attempt that does not, why
    (``unrecorded``)."""

    label: str  # the point, for log lines
    recording: bool
    unrecorded: str | None = None


@dataclass(frozen=True)
class Recorded:
    """What perf_analyzer recorded of a measuring attempt: its measured windows (None: not
    recorded), the inferences they completed, and its ``-f`` CSV (None: none)."""

    window: MeasuredWindow | None
    inferences: int
    perf_csv: Path | None = None


class Instrument(ABC):
    """A tool measuring beside perf_analyzer: the collector its output feeds (``source``)."""

    source: ClassVar[str]

    def flags(self) -> list[str]:
        """perf_analyzer flags this instrument adds to every attempt."""
        return []

    def during(self, attempt: Attempt) -> AbstractContextManager[Any]:
        """What runs while perf_analyzer runs ``attempt`` (entered just before, left just
        after); what it yields comes back to :meth:`output`."""
        return contextlib.nullcontext()

    @abstractmethod
    def output(self, attempt: Attempt, ran: Any, recorded: Recorded) -> Any:
        """This instrument's output of a measuring attempt, for its source's collector."""


@dataclass(frozen=True)
class TrialEnergy(Instrument):
    """How a scenario's trials measure energy: its meter (None: not measured, ``status`` says
    why), read every ``interval_s`` by a sampler thread in this process while perf_analyzer
    measures, and the idle power measured before the first trial (None: not measured)."""

    source: ClassVar[str] = ENERGY
    status: str  # the meter's name, or "not measured: <why>"
    meter: Meter | None = None
    interval_s: float = 0.1
    idle_power_w: float | None = None
    power_limit_w: float | None = None
    # how often the meter's counter updates (s), measured once per job; a window shorter than
    # telemetry.MIN_COUNTER_PERIODS of it is not measured (telemetry.window_refusal)
    counter_period_s: float | None = None
    # the idle power's 95 % half-width (None: none), which widens the interval above it
    idle_ci95_w: float | None = None
    # the share of a trial's windows a thermal or hardware slowdown may take before the trial
    # counts as throttled, its point unstable (energy.max_slowdown_fraction)
    max_slowdown_fraction: float = 0.05

    def during(self, attempt: Attempt) -> AbstractContextManager[Any]:
        if self.meter is None or not attempt.recording:
            return contextlib.nullcontext()
        from .telemetry import Sampler  # a thread and ctypes: only where measured

        return Sampler(self.meter, self.interval_s)

    def output(self, attempt: Attempt, ran: Any, recorded: Recorded) -> EnergyOutput:
        from .telemetry import window, window_refusal

        samples = ran.samples if ran is not None else []
        telemetry = (
            window(samples, recorded.window.start_ns, recorded.window.end_ns)
            if samples and recorded.window is not None
            else None
        )
        # a co-tenant on the GPU, a counter that did not advance, a window too short for the
        # counter's steps: no energy, and the status says why
        refused = window_refusal(telemetry, self.counter_period_s) if telemetry else None
        if refused:
            log.warning("%s: energy not measured: %s", attempt.label, refused)
        status = (
            f"not measured: {attempt.unrecorded}"
            if attempt.unrecorded and self.meter is not None
            else f"not measured: {refused}"
            if refused
            else self.status
        )
        return EnergyOutput(
            status,
            None if refused else telemetry,
            recorded.inferences,
            self.idle_power_w,
            self.power_limit_w,
            self.idle_ci95_w,
            self.max_slowdown_fraction,
        )


NOT_MEASURED = TrialEnergy("not measured: no energy meter configured")


@dataclass(frozen=True)
class TritonCounter(Instrument):
    """The second energy meter: Triton's own energy counter (deploybench.triton_metrics),
    polled beside perf_analyzer where the server has one (``triton``: the job's probe of it;
    None: not read)."""

    source: ClassVar[str] = TRITON_METRICS
    triton: TritonEnergy | None = None

    def during(self, attempt: Attempt) -> AbstractContextManager[Any]:
        if not attempt.recording or self.triton is None or self.triton.url is None:
            return contextlib.nullcontext()
        from .triton_metrics import Poller

        return Poller(self.triton)

    def output(self, attempt: Attempt, ran: Any, recorded: Recorded) -> TritonMetricsOutput:
        from .triton_metrics import trial_energy

        window = recorded.window
        joules, status = trial_energy(
            self.triton,
            ran,
            (window.start_ns, window.end_ns) if window is not None else None,
            attempt.unrecorded,
        )
        return TritonMetricsOutput(status, joules, recorded.inferences)


NOT_READ = TritonCounter()

# perf_analyzer polls Triton's metrics this often at most (its default, client r23.12
# command_line_parser.h): a poll a second keeps a reading in each 1-s count window even where the
# server updates its metrics every 2 s (Triton's default: the same reading is then taken twice)
METRICS_POLL_MS = 1000


@dataclass(frozen=True)
class TritonGpuMetrics(Instrument):
    """Triton's GPU utilisation, power and memory, collected by perf_analyzer itself from the
    server's metrics endpoint over its measured windows (``--collect-metrics --metrics-url
    --metrics-interval``, client r23.12 command_line_parser.cc; the cells: collectors). ``url``:
    the endpoint (None: not asked for, ``status`` says why); a CPU server's endpoint has no GPU
    metric, so its cells stay empty and ``status`` says so (:func:`probe_gpu_metrics`)."""

    source: ClassVar[str] = TRITON_GPU_METRICS
    status: str
    url: str | None = None
    interval_ms: int = METRICS_POLL_MS

    def flags(self) -> list[str]:
        if self.url is None:
            return []
        # perf_analyzer's own default URL is the -u host's port 8002, not the server's
        return [
            "--collect-metrics",
            "--metrics-url",
            self.url,
            "--metrics-interval",
            str(self.interval_ms),
        ]

    def output(self, attempt: Attempt, ran: Any, recorded: Recorded) -> GpuMetricsOutput:
        return GpuMetricsOutput(self.status, recorded.perf_csv if self.url else None)


NO_GPU_METRICS = TritonGpuMetrics("not measured: Triton's GPU metrics not asked for")


# The GPU metric whose samples say the server has GPU metrics: perf_analyzer's --collect-metrics
# reads it with nv_gpu_power_usage, nv_gpu_memory_used_bytes and nv_gpu_memory_total_bytes
# (client r23.12, metrics_manager.cc: one per column of its CSV)
GPU_UTILIZATION = "nv_gpu_utilization"


def probe_gpu_metrics(
    metrics_port: int,
    server_args: Sequence[str] = (),
    host: str = "127.0.0.1",
    timeout_s: float = 5.0,
) -> TritonGpuMetrics:
    """How perf_analyzer collects Triton's GPU metrics from the server on ``metrics_port``
    (TritonGpuMetrics): asked for wherever the endpoint answers, which
    perf_analyzer needs (an endpoint it cannot reach fails windows at random: client r23.12,
    inference_profiler.cc), and "not measured: <why>" where it does not, or where the server
    reports no GPU (a CPU server: the cells stay empty)."""
    from .triton_metrics import gpu_samples, interval_ms, metrics_url, read_page

    url = metrics_url(metrics_port, host)
    poll = min(METRICS_POLL_MS, interval_ms(server_args))
    text, why = read_page(url, timeout_s)
    if text is None:
        return TritonGpuMetrics(why)
    gpus = sorted(gpu_samples(text, GPU_UTILIZATION))
    if not gpus:
        return TritonGpuMetrics(
            f"not measured: the server's metrics have no {GPU_UTILIZATION} (no GPU metrics: a "
            "CPU server, no DCGM, or --allow-gpu-metrics=false)",
            url,
            poll,
        )
    count = f"{len(gpus)} GPU" + ("" if len(gpus) == 1 else "s")
    status = f"triton nv_gpu_* via perf_analyzer --collect-metrics ({count}, every {poll} ms)"
    return TritonGpuMetrics(status, url, poll)


# what a measurement has where it is given nothing else: every source's "not measured"
UNMEASURED: tuple[Instrument, ...] = (NOT_MEASURED, NOT_READ, NO_GPU_METRICS)
