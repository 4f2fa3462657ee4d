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
import math
import os
import re
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from .columns import POWER_CAP_REASON
from .errors import ConfigError, DeploybenchError
from .stats import Interval, interval

if TYPE_CHECKING:  # 3.11: jobs run on the V100 images' Python 3.10 too
    from typing_extensions import Self

    from .gpu_identity import ServerGpus

log = logging.getLogger(__name__)

METERS = ("nvml", "rapl", "none")
# UUIDs or NVML indices, comma-separated: the GPUs the NVML meter reads, named outright
GPU_ENV = "DEPLOYBENCH_NVML_GPU"
NO_ENERGY_COUNTER = "NVML: the GPU has no total-energy counter (Volta and later have one)"
MIG_INSTANCE = "MIG instance: NVML's energy counter is the whole GPU's, shared with other instances"


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


# --- NVML -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Gpu:
    """One GPU the NVML meter reads: its handle, UUID and NVML index (PCI bus order)."""

    device: Any
    uuid: str
    nvml_index: int | None


POWER_INSTANT = "NVML_FI_DEV_POWER_INSTANT (instantaneous)"
POWER_AVERAGED = (
    "nvmlDeviceGetPowerUsage (a 1-s average on Ampere, except GA100, and later; "
    "instantaneous before)"
)


class NvmlMeter(Meter):
    """The GPUs a server computes on, through NVML, their counters summed (:func:`choose_gpus`
    says which). Raises NotMeasured where NVML, a GPU or its energy counter is missing, a GPU
    cannot be identified or opened, or the server runs on a MIG instance."""

    name = "nvml"

    def __init__(
        self,
        library: str = "libnvidia-ml.so.1",
        environ: Mapping[str, str] = os.environ,
        gpus: ServerGpus | None = None,
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
            self._open(environ, gpus)
        except NvmlError as error:
            self._nvml.shutdown()
            raise NotMeasured(str(error)) from None
        except NotMeasured:
            self._nvml.shutdown()
            raise

    def _open(self, environ: Mapping[str, str], gpus: ServerGpus | None) -> None:
        nvml = self._nvml
        self._gpus, self._how = choose_gpus(nvml, environ, gpus)
        for gpu in self._gpus:
            if nvml.mig_enabled(gpu.device):
                raise NotMeasured(MIG_INSTANCE)
            if nvml.total_energy_mj(gpu.device) is None:
                raise NotMeasured(NO_ENERGY_COUNTER)
        limits = [nvml.enforced_power_limit_mw(g.device) for g in self._gpus]
        self._limit_w = None if None in limits else sum(v or 0 for v in limits) / 1000
        self._own = {os.getpid()}  # this job's processes: it, the server, its stubs, clients
        self._listed = True  # whether the driver lists the GPUs' processes
        # power: the instantaneous field where every metered GPU gives it, else
        # nvmlDeviceGetPowerUsage (a 1-s average on Ampere, except GA100, and later: nvml.h)
        self._warned: set[str] = set()
        self._instant = all(
            self._optional("the instantaneous power", nvml.power_instant_mw, g.device) is not None
            for g in self._gpus
        )
        # each slowdown's counter, per GPU: ("policy", n) or ("field", id); a slowdown some
        # metered GPU does not count is read from the clock-event bits
        self._counters: dict[str, list[tuple[str, int]]] = {}
        for slowdown in SLOWDOWNS:
            ways = [self._counter_of(g, slowdown) for g in self._gpus]
            if all(w is not None for w in ways):
                self._counters[slowdown.name] = [w for w in ways if w is not None]
        # the fields each GPU is read for at every reading, in one call
        self._fields = [
            sorted({ways[n][1] for ways in self._counters.values() if ways[n][0] == "field"})
            for n in range(len(self._gpus))
        ]

    def _counter_of(self, gpu: Gpu, slowdown: Slowdown) -> tuple[str, int] | None:
        """How ``gpu`` counts ``slowdown``'s violation time: nvmlDeviceGetViolationStatus of
        its policy, else its field; None where it counts it neither way."""
        nvml, what = self._nvml, f"the {slowdown.name} counter"
        if (
            slowdown.policy is not None
            and self._optional(what, nvml.violation_ns, gpu.device, slowdown.policy) is not None
        ):
            return ("policy", slowdown.policy)
        if slowdown.field is not None:
            found = self._optional(what, nvml.field_values, gpu.device, [slowdown.field]) or {}
            if found.get(slowdown.field) is not None:
                return ("field", slowdown.field)
        return None

    def _optional(self, what: str, call: Callable[..., Any], *args: Any) -> Any:
        """``call(*args)``, or None where NVML fails it: a slowdown counter or the
        instantaneous power is worth no trial's energy (the log says so, once)."""
        from .nvml import NvmlError

        try:
            return call(*args)
        except NvmlError as error:
            if what not in self._warned:
                self._warned.add(what)
                log.warning("energy: %s not read: %s", what, error)
            return None

    @property
    def uuids(self) -> list[str]:
        return [g.uuid for g in self._gpus]

    def counters(self) -> list[tuple[str, float]]:
        from .nvml import NvmlError

        values = []
        for gpu in self._gpus:
            energy = self._nvml.total_energy_mj(gpu.device)
            if energy is None:
                raise NvmlError("nvmlDeviceGetTotalEnergyConsumption", 3, "stopped answering")
            values.append((gpu.uuid, energy / 1000))
        return values

    def read(self) -> Sample:
        from .nvml import CLOCK_MEM, CLOCK_SM

        nvml, gpus = self._nvml, self._gpus
        before = time.time_ns()
        energy = sum(v for _, v in self.counters())
        violations = self._violations()
        after = time.time_ns()
        power = [
            self._optional("the instantaneous power", nvml.power_instant_mw, g.device)
            if self._instant
            else nvml.power_usage_mw(g.device)
            for g in gpus
        ]
        rates = [nvml.utilization(g.device) for g in gpus]
        memory = [nvml.memory_info(g.device) for g in gpus]
        reasons = [nvml.clocks_event_reasons(g.device) for g in gpus]
        return Sample(
            time_ns=(before + after) // 2,  # the counters' read, between the two
            energy_j=energy,
            power_w=None if None in power else sum(p or 0 for p in power) / 1000,
            sm_clock_mhz=_mean([nvml.clock_mhz(g.device, CLOCK_SM) for g in gpus]),
            mem_clock_mhz=_mean([nvml.clock_mhz(g.device, CLOCK_MEM) for g in gpus]),
            temperature_c=_max([nvml.temperature_c(g.device) for g in gpus]),
            gpu_util_pct=_mean([None if r is None else r.gpu for r in rates]),
            memory_used_mib=None
            if None in memory
            else sum(m.used for m in memory if m is not None) / 2**20,
            throttle_reasons=None if None in reasons else _or(reasons),
            sharing=self.sharing(),
            violation_ns=violations,
        )

    def _violations(self) -> dict[str, tuple[int | None, ...]]:
        """Each counted slowdown's violation time (ns) on each metered GPU, now."""
        nvml = self._nvml
        fields = [
            (self._optional("the violation fields", nvml.field_values, g.device, ids) or {})
            if ids
            else {}
            for g, ids in zip(self._gpus, self._fields, strict=True)
        ]
        found: dict[str, tuple[int | None, ...]] = {}
        for name, ways in self._counters.items():
            values: list[int | None] = []
            for gpu, (kind, which), read in zip(self._gpus, ways, fields, strict=True):
                value = (
                    self._optional(f"the {name} counter", nvml.violation_ns, gpu.device, which)
                    if kind == "policy"
                    else read.get(which)
                )
                values.append(None if value is None else int(value))
            found[name] = tuple(values)
        return found

    def sharing(self) -> tuple[str, ...] | None:
        """The processes on the metered GPUs that are not this job's (its process and its
        descendants: the server, the python backend's stubs, perf_analyzer), each "pid <n>
        (<name>) on <uuid>"; None where the driver does not list them."""
        from .nvml import NvmlError

        found: list[str] = []
        for gpu in self._gpus:
            try:
                pids = self._nvml.compute_processes(gpu.device)
            except NvmlError as error:
                log.warning("energy: the processes on %s cannot be listed: %s", gpu.uuid, error)
                pids = None
            if pids is None:
                self._listed = False
                return None
            for pid in pids:
                if pid in self._own:
                    continue
                if descends_from(pid, os.getpid()):
                    self._own.add(pid)
                    continue
                found.append(f"pid {pid} ({process_name(pid)}) on {gpu.uuid}")
        return tuple(found)

    def power_limit_w(self) -> float | None:
        return self._limit_w

    def facts(self) -> dict[str, Any]:
        from .nvml import CLOCK_MEM, CLOCK_SM

        nvml = self._nvml

        def one(gpu: Gpu) -> dict[str, Any]:
            limit = nvml.enforced_power_limit_mw(gpu.device)
            return {
                "uuid": gpu.uuid,
                "name": nvml.name(gpu.device),
                "nvml_index": gpu.nvml_index,
                "power_limit_w": None if limit is None else limit / 1000,
                "application_clocks_mhz": {
                    "sm": nvml.applications_clock_mhz(gpu.device, CLOCK_SM),
                    "mem": nvml.applications_clock_mhz(gpu.device, CLOCK_MEM),
                },
                "persistence_mode": nvml.persistence_mode(gpu.device),
            }

        first = one(self._gpus[0])
        return {
            "meter": "nvml",
            **first,
            "driver": nvml.driver_version(),
            "power_limit_w": self._limit_w,  # the metered GPUs' together
            "uuids": self.uuids,
            "gpus": [first, *(one(g) for g in self._gpus[1:])],
            "how_chosen": self._how,
            "counter_period_ms": None
            if self.counter_period_s is None
            else round(self.counter_period_s * 1000, 1),
            "processes_listed": self._listed,
            "power_reading": POWER_INSTANT if self._instant else POWER_AVERAGED,
            "slowdown_counters": {s.name: self._describe_counter(s.name) for s in SLOWDOWNS},
        }

    def _describe_counter(self, name: str) -> str:
        ways = self._counters.get(name)
        if ways is None:
            bit = next(s.bit for s in SLOWDOWNS if s.name == name)
            return f"{BY_SAMPLES} (bit {bit:#x})" if bit is not None else "not counted by this GPU"
        said = dict.fromkeys(
            f"nvmlDeviceGetViolationStatus policy {i}" if kind == "policy" else f"field {i}"
            for kind, i in ways
        )
        return "; ".join(said)

    def close(self) -> None:
        self._nvml.shutdown()


def _mean(values: Sequence[int | float | None]) -> float | None:
    found = [float(v) for v in values if v is not None]
    return sum(found) / len(found) if found else None


def _max(values: Sequence[int | float | None]) -> float | None:
    found = [float(v) for v in values if v is not None]
    return max(found) if found else None


def _or(values: Sequence[int | None]) -> int:
    bits = 0
    for value in values:
        bits |= value or 0
    return bits


def descends_from(pid: int, root: int, proc: Path = Path("/proc")) -> bool:
    """Whether ``pid`` is ``root`` or one of its descendants, by the parents in
    ``/proc/<pid>/stat``. False for a process not visible here (another PID namespace)."""
    for _ in range(256):  # deeper than any process tree
        if pid == root:
            return True
        if pid <= 1:
            return False
        try:
            stat = (proc / str(pid) / "stat").read_text()
        except OSError:
            return False
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses
        pid = int(stat.rsplit(")", 1)[1].split()[1])
    return False


def process_name(pid: int, proc: Path = Path("/proc")) -> str:
    try:
        return (proc / str(pid) / "comm").read_text().strip() or "?"
    except OSError:
        return "not visible from this job"


def choose_gpus(
    nvml: Any, environ: Mapping[str, str], gpus: ServerGpus | None
) -> tuple[list[Gpu], str]:
    """The GPUs the NVML meter reads and how they were chosen:

    - ``$GPU_ENV`` (in ``environ``, the job's), if set: UUIDs (``GPU-``, whole or a unique
      prefix) or NVML indices, comma-separated, named outright;
    - else the server's (``gpus``): its CUDA ordinals named by UUID through CUDA's driver API in
      its environment (:func:`deploybench.gpu_identity.cuda_uuids`; without one, the UUIDs its
      ``CUDA_VISIBLE_DEVICES`` holds), each opened by UUID; a MIG device is NotMeasured;
    - else (no server GPUs: a server on the CPU) NVML's first GPU this job may read.

    Never another GPU in place of one that cannot be identified or opened: NotMeasured."""
    named = environ.get(GPU_ENV, "").strip()
    if named:
        chosen = [_gpu_of(nvml, entry.strip(), GPU_ENV) for entry in named.split(",")]
        return chosen, f"{GPU_ENV}={named}: named outright"
    if gpus is not None:
        return _server_gpus(nvml, gpus)
    from .nvml import ERROR_NO_PERMISSION, NvmlError

    count = nvml.device_count()
    for index in range(count):
        try:
            device = nvml.handle_by_index(index)
        except NvmlError as error:
            if error.code == ERROR_NO_PERMISSION:
                continue
            raise
        how = f"no server GPU given (a server on the CPU): NVML's first GPU this job may read, index {index}"
        return [Gpu(device, nvml.uuid(device) or "", index)], how
    raise NotMeasured(f"NVML: this job may read none of the node's {count} GPUs")


def _full_uuid(entry: str) -> tuple[str, str] | None:
    """A CUDA_VISIBLE_DEVICES entry as (GPU|MIG, its UUID's groups); None unless a whole UUID
    (a MIG entry in any form counts: a MIG device is not measured)."""
    if entry.startswith("MIG-"):
        return "MIG", entry.removeprefix("MIG-").lower()
    match = re.fullmatch(r"GPU-([0-9a-fA-F]{8}(?:-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12})", entry)
    return ("GPU", match.group(1).lower()) if match else None


def _server_gpus(nvml: Any, gpus: ServerGpus) -> tuple[list[Gpu], str]:
    from .gpu_identity import CudaUnavailable, cuda_uuids

    visible = gpus.environ.get("CUDA_VISIBLE_DEVICES")
    shown = "unset" if visible is None else repr(visible)
    uuids: list[tuple[str | None, str]]
    try:
        uuids = [(None, u) for u in cuda_uuids(gpus.environ, gpus.cuda_library)]
        named = "CUDA's driver API in the server's environment (cuDeviceGetUuid_v2)"
    except CudaUnavailable as why:
        entries = [e.strip() for e in (visible or "").split(",") if e.strip()]
        full = [_full_uuid(e) for e in entries]
        if not entries or any(f is None for f in full):
            raise NotMeasured(
                f"NVML: the server's GPUs cannot be named by UUID: {why}; and its "
                f"CUDA_VISIBLE_DEVICES ({shown}) does not name them by UUID"
            ) from None
        uuids = [f for f in full if f is not None]
        named = f"the server's CUDA_VISIBLE_DEVICES (CUDA's driver API: {why})"
    if not uuids:
        raise NotMeasured(f"NVML: CUDA shows the server no GPU (CUDA_VISIBLE_DEVICES {shown})")
    ordinals = gpus.ordinals if gpus.ordinals is not None else tuple(range(len(uuids)))
    chosen = []
    for ordinal in ordinals:
        if not 0 <= ordinal < len(uuids):
            raise NotMeasured(
                f"NVML: {gpus.source or 'the server'} place instances on CUDA GPU {ordinal}; "
                f"CUDA shows the server {len(uuids)} (CUDA_VISIBLE_DEVICES {shown})"
            )
        kind, groups = uuids[ordinal]
        chosen.append(_open_uuid(nvml, kind, groups, f"the server's CUDA GPU {ordinal}"))
    how = (
        f"the server's CUDA GPU(s) {list(ordinals)} ({gpus.source or 'as given'}; "
        f"CUDA_VISIBLE_DEVICES {shown}), named by {named}, opened by UUID"
    )
    return chosen, how


def _open_uuid(nvml: Any, kind: str | None, groups: str, what: str) -> Gpu:
    """The GPU of a UUID (``kind``: GPU, MIG, or None: either), opened by it."""
    from .nvml import ERROR_NO_PERMISSION, NvmlError

    if kind == "MIG":
        raise NotMeasured(f"{MIG_INSTANCE} ({what} is MIG-{groups})")
    for prefix in [kind] if kind else ["GPU", "MIG"]:
        uuid = f"{prefix}-{groups}"
        try:
            device = nvml.handle_by_uuid(uuid)
        except NvmlError as error:
            if error.code == ERROR_NO_PERMISSION:
                raise NotMeasured(
                    f"NVML: {what} is {uuid}, which this job has no permission to read ({error})"
                ) from None
            raise
        if prefix == "MIG" and device is not None:
            raise NotMeasured(f"{MIG_INSTANCE} ({what} is {uuid})")
        if device is not None:
            return Gpu(device, uuid, _index_of(nvml, uuid))
    raise NotMeasured(
        f"NVML: {what} is {kind or 'GPU'}-{groups}, which NVML does not know (its GPUs: "
        f"{_uuids(nvml, nvml.device_count())})"
    )


def _index_of(nvml: Any, uuid: str) -> int | None:
    found = _uuids(nvml, nvml.device_count())
    return found.index(uuid) if uuid in found else None


def _gpu_of(nvml: Any, entry: str, variable: str) -> Gpu:
    from .nvml import ERROR_NO_PERMISSION, NvmlError

    if entry.startswith("MIG-"):
        raise NotMeasured(MIG_INSTANCE)
    count = nvml.device_count()
    if entry.startswith("GPU-"):
        try:
            device = nvml.handle_by_uuid(entry)
        except NvmlError as error:
            if error.code != ERROR_NO_PERMISSION:
                raise
            raise NotMeasured(
                f"NVML: {variable} names {entry}, which this job has no permission to read"
            ) from None
        uuids = _uuids(nvml, count)
        matches = [i for i, u in enumerate(uuids) if (u or "").startswith(entry)]
        if device is None and len(matches) == 1:  # a prefix, as CUDA accepts
            device = nvml.handle_by_index(matches[0])
        if device is None:
            which = "more than one of" if matches else "none of"
            raise NotMeasured(f"NVML: {variable} names {entry}, {which} NVML's GPUs {uuids}")
        index = matches[0] if len(matches) == 1 else None
        return Gpu(device, nvml.uuid(device) or entry, index)
    if re.fullmatch(r"\d+", entry):
        index = int(entry)
        if index >= count:
            raise NotMeasured(
                f"NVML: {variable} names GPU {index}; NVML sees {count} (0..{count - 1})"
            )
        device = nvml.handle_by_index(index)
        return Gpu(device, nvml.uuid(device) or "", index)
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
    gpus: ServerGpus | None = None,
) -> Meter:
    """The meter of ``kind`` (nvml, rapl); NotMeasured where it cannot measure here (and for
    ``none``), ConfigError for another kind. ``gpus``: the GPUs the server computes on, which
    the NVML meter reads (:func:`choose_gpus`)."""
    if kind == "nvml":
        return NvmlMeter(nvml_library, environ, gpus)
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
