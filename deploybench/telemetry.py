"""Energy and GPU telemetry over a measurement's windows.

Energy comes from a *counter* differenced over whole windows, never from power samples times
time: NVML's total-energy counter on a GPU (mJ since the driver loaded, Volta and later), RAPL's
package counters on a CPU. A :class:`Sampler` thread in the measuring job's process reads the
meter every ``interval_s`` while perf_analyzer runs; :func:`window` interpolates the counter at
the measured windows' ends. Timestamps are ``time.time_ns()``: perf_analyzer's profile export
stamps requests with std::chrono::system_clock, ns since the epoch (deploybench.tails).
"""

from __future__ import annotations

import itertools
import logging
import os
import re
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from .errors import ConfigError, DeploybenchError

if TYPE_CHECKING:  # 3.11: jobs run on the V100 images' Python 3.10 too
    from typing_extensions import Self

log = logging.getLogger(__name__)

METERS = ("nvml", "rapl", "none")
GPU_ENV = "DEPLOYBENCH_NVML_GPU"  # a UUID or an NVML index: which GPU the NVML meter reads
NO_ENERGY_COUNTER = "NVML: the GPU has no total-energy counter (Volta and later have one)"
MIG_INSTANCE = "MIG instance: NVML's energy counter is the whole GPU's, shared with other instances"

# NVML's clocks event (throttle) reasons that mean the GPU ran slower than it could for power
# or heat (nvml.h nvmlClocksEventReason*, NVIDIA/go-nvml v0.13.3-0 gen/nvml/nvml.h). Not
# throttling: 0x1 GPU idle, 0x2 applications clocks setting, 0x10 sync boost, 0x100 display
# clock setting.
THROTTLING: dict[int, str] = {
    0x4: "sw power cap",
    0x8: "hw slowdown",
    0x20: "sw thermal slowdown",
    0x40: "hw thermal slowdown",
    0x80: "hw power brake slowdown",
}


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


class Meter(ABC):
    """An energy counter and what comes with it. A context manager: closed on exit."""

    name: str

    @abstractmethod
    def read(self) -> Sample: ...

    @abstractmethod
    def facts(self) -> dict[str, Any]:
        """Where the readings come from, for the run's provenance."""

    def power_limit_w(self) -> float | None:
        return None

    def close(self) -> None:
        """Release what the meter holds (nothing, unless a meter says so)."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --- NVML -----------------------------------------------------------------------------------


class NvmlMeter(Meter):
    """One GPU through NVML (:func:`choose_gpu` says which). Raises NotMeasured where NVML or
    the GPU's energy counter is missing, or the job runs on a MIG instance."""

    name = "nvml"

    def __init__(
        self, library: str = "libnvidia-ml.so.1", environ: Mapping[str, str] = os.environ
    ) -> None:
        from .nvml import Nvml, NvmlError

        try:
            self._nvml = Nvml(library)
        except OSError as error:
            if "No such file" in str(error) or "cannot open" in str(error):
                raise NotMeasured(f"NVML: {library} not found") from None
            raise NotMeasured(f"NVML: {library} cannot be loaded ({error})") from None
        except NvmlError as error:
            raise NotMeasured(str(error)) from None
        try:
            self._open(environ)
        except NvmlError as error:
            self._nvml.shutdown()
            raise NotMeasured(str(error)) from None
        except NotMeasured:
            self._nvml.shutdown()
            raise

    def _open(self, environ: Mapping[str, str]) -> None:
        nvml = self._nvml
        self._device, self._index, self._how = choose_gpu(nvml, environ)
        if nvml.mig_enabled(self._device):
            raise NotMeasured(MIG_INSTANCE)
        if nvml.total_energy_mj(self._device) is None:
            raise NotMeasured(NO_ENERGY_COUNTER)
        self._uuid = nvml.uuid(self._device)
        limit = nvml.enforced_power_limit_mw(self._device)
        self._limit_w = None if limit is None else limit / 1000

    def read(self) -> Sample:
        from .nvml import CLOCK_MEM, CLOCK_SM, NvmlError

        nvml, device = self._nvml, self._device
        before = time.time_ns()
        energy = nvml.total_energy_mj(device)
        after = time.time_ns()
        if energy is None:
            raise NvmlError("nvmlDeviceGetTotalEnergyConsumption", 3, "stopped answering")
        power = nvml.power_usage_mw(device)
        rates = nvml.utilization(device)
        memory = nvml.memory_info(device)
        return Sample(
            time_ns=(before + after) // 2,  # the counter's read, between the two
            energy_j=energy / 1000,
            power_w=None if power is None else power / 1000,
            sm_clock_mhz=_float(nvml.clock_mhz(device, CLOCK_SM)),
            mem_clock_mhz=_float(nvml.clock_mhz(device, CLOCK_MEM)),
            temperature_c=_float(nvml.temperature_c(device)),
            gpu_util_pct=None if rates is None else float(rates.gpu),
            memory_used_mib=None if memory is None else memory.used / 2**20,
            throttle_reasons=nvml.clocks_event_reasons(device),
        )

    def power_limit_w(self) -> float | None:
        return self._limit_w

    def facts(self) -> dict[str, Any]:
        from .nvml import CLOCK_MEM, CLOCK_SM

        nvml, device = self._nvml, self._device
        return {
            "meter": "nvml",
            "uuid": self._uuid,
            "name": nvml.name(device),
            "driver": nvml.driver_version(),
            "nvml_index": self._index,
            "power_limit_w": self._limit_w,
            "application_clocks_mhz": {
                "sm": nvml.applications_clock_mhz(device, CLOCK_SM),
                "mem": nvml.applications_clock_mhz(device, CLOCK_MEM),
            },
            "persistence_mode": nvml.persistence_mode(device),
            "how_chosen": self._how,
        }

    def close(self) -> None:
        self._nvml.shutdown()


def _float(value: int | None) -> float | None:
    return None if value is None else float(value)


# The order behind an integer in CUDA_VISIBLE_DEVICES is CUDA's (fastest first unless
# CUDA_DEVICE_ORDER=PCI_BUS_ID), NVML's is PCI bus order: on a node with mixed GPUs the two
# may differ, so the meter records the UUID it read and says so.
ORDER_NOTE = (
    "NVML enumerates GPUs in PCI bus order; CUDA's default order (fastest first) may differ on "
    "a node with mixed GPUs: the uuid names the GPU read"
)


def choose_gpu(nvml: Any, environ: Mapping[str, str]) -> tuple[Any, int | None, str]:
    """The GPU the NVML meter reads, its NVML index and how it was chosen: ``$GPU_ENV`` (a
    UUID or an NVML index) if set; else the first of CUDA_VISIBLE_DEVICES (a ``GPU-`` UUID,
    whole or a unique prefix as CUDA takes it; an index; a ``MIG-`` instance: NotMeasured);
    else NVML's GPU 0."""
    if environ.get(GPU_ENV, "").strip():
        return _gpu_of(nvml, environ[GPU_ENV].strip(), GPU_ENV)
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        device = nvml.handle_by_index(0)
        return device, 0, "CUDA_VISIBLE_DEVICES unset: NVML index 0"
    first = visible.split(",")[0].strip()
    if first in ("", "-1"):
        raise NotMeasured(f"NVML: CUDA_VISIBLE_DEVICES={visible!r} hides every GPU from this job")
    return _gpu_of(nvml, first, "CUDA_VISIBLE_DEVICES")


def _gpu_of(nvml: Any, entry: str, variable: str) -> tuple[Any, int | None, str]:
    if entry.startswith("MIG-"):
        raise NotMeasured(MIG_INSTANCE)
    count = nvml.device_count()
    if entry.startswith("GPU-"):
        device = nvml.handle_by_uuid(entry)
        uuids = _uuids(nvml, count)
        matches = [i for i, u in enumerate(uuids) if (u or "").startswith(entry)]
        if device is None and len(matches) == 1:  # a prefix, as CUDA accepts
            device = nvml.handle_by_index(matches[0])
        if device is None:
            which = "more than one of" if matches else "none of"
            raise NotMeasured(f"NVML: {variable} names {entry}, {which} NVML's GPUs {uuids}")
        index = matches[0] if len(matches) == 1 else None
        return device, index, f"{variable}={entry}: by UUID"
    if re.fullmatch(r"\d+", entry):
        index = int(entry)
        if index >= count:
            raise NotMeasured(
                f"NVML: {variable} names GPU {index}; NVML sees {count} (0..{count - 1})"
            )
        how = f"{variable}={entry}: NVML index {index}"
        if variable == "CUDA_VISIBLE_DEVICES":  # CUDA's index, read as NVML's
            how += f" ({ORDER_NOTE})"
        return nvml.handle_by_index(index), index, how
    raise NotMeasured(
        f"NVML: {variable}={entry!r} is neither a GPU UUID (GPU-...), a MIG instance nor an index"
    )


def _uuids(nvml: Any, count: int) -> list[str | None]:
    """Every GPU's UUID in NVML's order (None for one NVML cannot open, e.g. no permission)."""
    from .nvml import NvmlError

    found: list[str | None] = []
    for index in range(count):
        try:
            found.append(nvml.uuid(nvml.handle_by_index(index)))
        except NvmlError:
            found.append(None)
    return found


# --- RAPL -----------------------------------------------------------------------------------


class RaplMeter(Meter):
    """The CPU packages' energy from RAPL (deploybench.rapl): energy only."""

    name = "rapl"

    def __init__(self, powercap_root: Path = Path("/sys/class/powercap")) -> None:
        from .rapl import Rapl, RaplUnavailable

        try:
            self._rapl = Rapl(powercap_root)
        except RaplUnavailable as why:
            raise NotMeasured(str(why)) from None

    def read(self) -> Sample:
        before = time.time_ns()
        energy = self._rapl.energy_uj()
        after = time.time_ns()
        return Sample(time_ns=(before + after) // 2, energy_j=energy / 1e6)

    def facts(self) -> dict[str, Any]:
        return {"meter": "rapl", "root": str(self._rapl.root), "domains": self._rapl.describe()}


def open_meter(
    kind: str,
    *,
    nvml_library: str = "libnvidia-ml.so.1",
    powercap_root: Path = Path("/sys/class/powercap"),
    environ: Mapping[str, str] = os.environ,
) -> Meter:
    """The meter of ``kind`` (nvml, rapl); NotMeasured where it cannot measure here (and for
    ``none``), ConfigError for another kind."""
    if kind == "nvml":
        return NvmlMeter(nvml_library, environ)
    if kind == "rapl":
        return RaplMeter(powercap_root)
    if kind == "none":
        raise NotMeasured("energy meter none")
    raise ConfigError(f"energy meter {kind!r} is not one of {list(METERS)}")


def describe(meter_or_reason: Meter | NotMeasured | str) -> str:
    """The energy_status text: the meter's name, or ``not measured: <reason>``."""
    if isinstance(meter_or_reason, Meter):
        return meter_or_reason.name
    reason = meter_or_reason.reason if isinstance(meter_or_reason, NotMeasured) else meter_or_reason
    return f"not measured: {reason}"


# --- sampling -------------------------------------------------------------------------------


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
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None

    def _run(self) -> None:
        try:
            while not self._stop.wait(self.interval_s):
                self.samples.append(self.meter.read())
        except BaseException as error:  # noqa: BLE001 - re-raised by the thread leaving the block
            self._error = error

    def __enter__(self) -> Self:
        self.samples.append(self.meter.read())
        self._thread = threading.Thread(target=self._run, name="energy-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._error is not None:
            if exc is None:
                raise self._error
            log.warning("energy sampler failed too: %s", self._error)
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


def _energy_at(samples: Sequence[Sample], t: int) -> float:
    """The counter at ``t``, linear between the samples around it (within their span)."""
    for a, b in itertools.pairwise(samples):
        if a.time_ns <= t <= b.time_ns:
            if b.time_ns == a.time_ns:
                return a.energy_j
            return a.energy_j + (b.energy_j - a.energy_j) * (t - a.time_ns) / (
                b.time_ns - a.time_ns
            )
    raise AssertionError("unreachable: t within the samples' span")


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
    reasons = [s.throttle_reasons for s in inside if s.throttle_reasons is not None]
    bits: int | None = None
    if reasons:
        bits = 0
        for r in reasons:
            bits |= r
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
    )


def idle_power_w(meter: Meter, seconds: float, interval_s: float) -> float:
    """The meter's power over ``seconds`` of no load: its counter's increase over the time,
    read every ``interval_s`` (so that a RAPL counter's wrap is seen)."""
    if not seconds > 0:
        raise ConfigError(f"the idle baseline needs a duration > 0 s, not {seconds}")
    with Sampler(meter, interval_s) as sampler:
        time.sleep(seconds)
    first, last = sampler.samples[0], sampler.samples[-1]
    return (last.energy_j - first.energy_j) / ((last.time_ns - first.time_ns) / 1e9)
