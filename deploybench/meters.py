"""The energy meters: NVML's on the GPUs a server computes on (which GPUs, and how they are
chosen: :func:`choose_gpus`), RAPL's on the CPU packages, and opening the configured one
(:func:`open_meter`). What a meter reads and how its readings become a window's energy:
deploybench.telemetry. NVML is loaded (ctypes: deploybench.nvml) only when a meter is opened.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import ConfigError
from .telemetry import BY_SAMPLES, SLOWDOWNS, Meter, NotMeasured, Sample, Slowdown

if TYPE_CHECKING:
    from .gpu_identity import ServerGpus

log = logging.getLogger(__name__)

METERS = ("nvml", "rapl", "none")
# UUIDs or NVML indices, comma-separated: the GPUs the NVML meter reads, named outright
GPU_ENV = "DEPLOYBENCH_NVML_GPU"
NO_ENERGY_COUNTER = "NVML: the GPU has no total-energy counter (Volta and later have one)"
MIG_INSTANCE = "MIG instance: NVML's energy counter is the whole GPU's, shared with other instances"


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
