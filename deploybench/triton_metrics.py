"""A second energy meter where the server has one: Triton's own ``nv_energy_consumption``.

Triton's metrics endpoint (``/metrics`` on ``--metrics-port``, Prometheus text) carries, with
GPU metrics on, the counter ``nv_energy_consumption``: "GPU energy consumption in joules since
Triton started", per GPU (label ``gpu_uuid``), updated "per interval", ``--metrics-interval-ms``
(triton-inference-server/server docs/user_guide/metrics.md, "GPU Metrics"; the interval's
default, 2000 ms, from ``tritonserver --help``). A CPU server (no DCGM, no GPU) has no such
sample: not measured, and the status says why.

How Triton makes it (triton-inference-server/core src/metrics.cc, the same in r23.12, r25.01
and main 73aad7c): DCGM watches ``DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION`` (mJ) with the interval
as its update period (``dcgmWatchFields(..., metrics_interval_ms_ * 1000 ...)``); a poll
thread sleeps half the interval (``metrics_interval_ms_ / 2``), then adds the field's increase
since its previous poll to the counter. Only the GPUs CUDA shows the server are labelled
("Filter out CUDA visible GPUs from GPUs found by DCGM"), so the counters summed here are the
server's GPUs.

So a reading holds the energy up to a moment between about 1.5 intervals before it (DCGM's
period plus Triton's half-period poll) and the reading itself: each end of a window is
uncertain by up to that long × the power. The job reads the endpoint beside perf_analyzer, as
the NVML sampler reads its meter (deploybench.telemetry), and takes the counter at the same
window boundaries (perf_analyzer's measured windows), interpolated between the readings
around them; the interval is recorded with it (the status, the provenance).
"""

from __future__ import annotations

import functools
import itertools
import logging
import re
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # 3.11: jobs run on the V100 images' Python 3.10 too
    from typing_extensions import Self

log = logging.getLogger(__name__)

METRIC = "nv_energy_consumption"
LABEL = "gpu_uuid"
INTERVAL_FLAG = "--metrics-interval-ms"
DEFAULT_INTERVAL_MS = 2000  # tritonserver --help: "Default is 2000 milliseconds"
NOT_READ = "not measured: Triton's metrics not read"
NOT_ON_SERVER = (
    f"not measured: the server's metrics have no {METRIC} (no GPU metrics: a CPU server, "
    "no DCGM, or --allow-gpu-metrics=false)"
)

# A sample line of the Prometheus text format: name, optional {labels}, value, optional
# timestamp (ms). The name must end where the labels or the value begin.
_SAMPLE = r"^{name}(?:\{{(?P<labels>[^}}]*)\}})?[ \t]+(?P<value>\S+)(?:[ \t]+-?\d+)?[ \t]*$"
_LABEL = re.compile(r'(\w+)\s*=\s*"((?:[^"\\]|\\.)*)"')


@functools.cache
def _sample_of(metric: str) -> re.Pattern[str]:
    return re.compile(_SAMPLE.format(name=re.escape(metric)))


def gpu_samples(text: str, metric: str) -> dict[str, float]:
    """Each GPU's ``metric`` in Prometheus text ``text``, by its ``gpu_uuid`` label ("" for a
    sample without one); empty where the metric has no sample (a CPU server's GPU metrics).
    Comments (``# HELP``, ``# TYPE``) and every other metric are skipped."""
    pattern = _sample_of(metric)
    found: dict[str, float] = {}
    for line in text.splitlines():
        match = pattern.match(line.strip())
        if match is None:
            continue
        labels = dict(_LABEL.findall(match.group("labels") or ""))
        uuid = labels.get(LABEL, "").replace('\\"', '"').replace("\\\\", "\\")
        found[uuid] = float(match.group("value"))
    return found


def parse_energy(text: str) -> dict[str, float]:
    """Each GPU's ``nv_energy_consumption`` (J) in ``text``, by UUID (:func:`gpu_samples`)."""
    return gpu_samples(text, METRIC)


def interval_ms(server_args: Sequence[str]) -> int:
    """The ``--metrics-interval-ms`` a server was started with (its extra arguments, as
    ``--metrics-interval-ms=N`` or ``--metrics-interval-ms N``), else Triton's default."""
    args = list(server_args)
    for i, arg in enumerate(args):
        if arg.startswith(INTERVAL_FLAG + "="):
            return int(arg.split("=", 1)[1])
        if arg == INTERVAL_FLAG and i + 1 < len(args):
            return int(args[i + 1])
    return DEFAULT_INTERVAL_MS


def read_metrics(url: str, timeout_s: float = 5.0) -> str:
    """The server's metrics page at ``url`` (``http://127.0.0.1:<metrics port>/metrics``)."""
    with urllib.request.urlopen(url, timeout=timeout_s) as response:
        return str(response.read().decode("utf-8", "replace"))


def metrics_url(metrics_port: int, host: str = "127.0.0.1") -> str:
    """The metrics endpoint of the server on ``metrics_port``."""
    return f"http://{host}:{metrics_port}/metrics"


def read_page(url: str, timeout_s: float = 5.0) -> tuple[str | None, str]:
    """The metrics page at ``url`` read once, or None and why not ("not measured: ... did not
    answer"), for a job's probes of what the server has."""
    try:
        return read_metrics(url, timeout_s), ""
    except (OSError, urllib.error.URLError, ValueError) as error:
        return None, f"not measured: Triton's metrics endpoint {url} did not answer ({error})"


@dataclass(frozen=True)
class TritonEnergy:
    """How a scenario's trials read Triton's energy counter: ``url`` (None: not read, ``status``
    says why), the GPUs it labels, the server's metrics interval and how often the job polls."""

    status: str  # "triton nv_energy_consumption, ..." or "not measured: <why>"
    url: str | None = None
    gpus: tuple[str, ...] = ()
    interval_ms: int = DEFAULT_INTERVAL_MS
    poll_s: float = 0.1

    def record(self) -> dict[str, Any]:
        """What the provenance says of it (``config.energy.triton``)."""
        return {
            "status": self.status,
            "metric": METRIC,
            "gpus": list(self.gpus),
            "metrics_interval_ms": self.interval_ms,
            "poll_ms": round(self.poll_s * 1000),
        }


def measured_status(gpus: Sequence[str], interval: int) -> str:
    """A measured trial's status: the metric, how many GPUs, the server's interval."""
    count = f"{len(gpus)} GPU" + ("" if len(gpus) == 1 else "s")
    return f"triton {METRIC} ({count}, {INTERVAL_FLAG} {interval})"


def probe(
    metrics_port: int,
    server_args: Sequence[str] = (),
    poll_s: float = 0.1,
    host: str = "127.0.0.1",
    timeout_s: float = 5.0,
) -> TritonEnergy:
    """Whether the server on ``metrics_port`` has an energy counter to read, read once: its
    GPUs, or why not (a CPU server has none; an endpoint that does not answer)."""
    url = metrics_url(metrics_port, host)
    interval = interval_ms(server_args)
    text, why = read_page(url, timeout_s)
    if text is None:
        return TritonEnergy(why, interval_ms=interval)
    found = parse_energy(text)
    if not found:
        return TritonEnergy(NOT_ON_SERVER, interval_ms=interval)
    gpus = tuple(sorted(found))
    return TritonEnergy(measured_status(gpus, interval), url, gpus, interval, poll_s)


@dataclass(frozen=True)
class Reading:
    """The counters at one moment (``time.time_ns()``, the clock perf_analyzer's export uses)."""

    time_ns: int
    joules: Mapping[str, float]


@dataclass
class Poller:
    """Reads ``triton``'s endpoint on entry, every ``poll_s`` on a daemon thread, and on exit,
    into ``readings``. A failed read stops the polling and is kept in ``error``: the second
    meter's trial is then not measured, the trial itself goes on."""

    triton: TritonEnergy
    timeout_s: float = 5.0
    readings: list[Reading] = field(default_factory=list)
    error: str | None = None

    def __post_init__(self) -> None:
        from .telemetry import Periodic

        self._periodic = Periodic(self._read, self.triton.poll_s, "triton-metrics")
        self._started = False

    def _read(self) -> None:
        assert self.triton.url is not None  # only a measured TritonEnergy is polled
        text = read_metrics(self.triton.url, self.timeout_s)
        self.readings.append(Reading(time.time_ns(), parse_energy(text)))

    def _try(self, read: Callable[[], None]) -> None:
        try:
            read()
        except Exception as error:  # noqa: BLE001 - recorded, the trial goes on
            self.error = str(error)

    def __enter__(self) -> Self:
        self._try(self._read)
        if self.error is None:
            self._periodic.start()
            self._started = True
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if not self._started:
            return
        self._periodic.stop()
        if self._periodic.failure is not None:
            self.error = str(self._periodic.failure)
        else:
            self._try(self._read)


def _at(readings: Sequence[Reading], gpu: str, t: int) -> float:
    """``gpu``'s counter at ``t``, linear between the readings around it."""
    for a, b in itertools.pairwise(readings):
        if a.time_ns <= t <= b.time_ns:
            ea, eb = a.joules[gpu], b.joules[gpu]
            if b.time_ns == a.time_ns:
                return ea
            return ea + (eb - ea) * (t - a.time_ns) / (b.time_ns - a.time_ns)
    raise ValueError(f"no readings around {t} ns")


def energy_between(
    readings: Sequence[Reading], gpus: Sequence[str], start_ns: int, end_ns: int
) -> float:
    """The counters of ``gpus`` over [start_ns, end_ns], summed (J): each interpolated at both
    ends between the readings (in time order) around them, which must span the window and
    hold every GPU."""
    if end_ns <= start_ns:
        raise ValueError(f"a window must end after it starts: {start_ns}..{end_ns} ns")
    if len(readings) < 2 or not readings[0].time_ns <= start_ns <= end_ns <= readings[-1].time_ns:
        span = f"{readings[0].time_ns}..{readings[-1].time_ns}" if readings else "none"
        raise ValueError(
            f"Triton's metrics readings ({len(readings)}, {span} ns) do not span the window "
            f"{start_ns}..{end_ns} ns"
        )
    missing = sorted({g for r in readings for g in gpus if g not in r.joules})
    if missing:
        raise ValueError(f"{METRIC} of {missing} missing from some readings")
    return sum(_at(readings, g, end_ns) - _at(readings, g, start_ns) for g in gpus)


def trial_energy(
    triton: TritonEnergy | None,
    poller: Poller | None,
    window: tuple[int, int] | None,
    skipped: str | None = None,
) -> tuple[float | None, str]:
    """A trial's energy from Triton's counter over its measured ``window`` (start, end ns) and
    its status: (None, "not measured: <why>") where the server has no counter, the export was
    not asked for (``skipped``: no windows), or the readings failed."""
    if triton is None:
        return None, NOT_READ
    if triton.url is None:
        return None, triton.status
    if skipped:
        return None, f"not measured: {skipped}"
    if poller is None or window is None:
        return None, "not measured: no measured windows"
    if poller.error is not None:
        return None, f"not measured: Triton's metrics endpoint failed ({poller.error})"
    try:
        joules = energy_between(poller.readings, triton.gpus, *window)
    except ValueError as error:
        return None, f"not measured: {error}"
    return joules, triton.status
