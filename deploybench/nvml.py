"""A minimal ctypes binding to NVML (libnvidia-ml.so.1): the calls the energy meter makes.

The standard library only: the measuring job runs in NGC images, where nvidia-ml-py may be
missing or of another version, while the driver's libnvidia-ml.so.1 is always mounted beside
libcuda.so.1. Signatures and constants are nvml.h's (NVIDIA/go-nvml v0.13.3-0,
gen/nvml/nvml.h, NVML API version 13).

A call the driver lacks (an older driver: the symbol is not exported) or answers
``NVML_ERROR_NOT_SUPPORTED`` gives None; any other failure raises :class:`NvmlError`.
"""

from __future__ import annotations

import ctypes
from typing import Any

from .errors import DeploybenchError

# nvmlReturn_t (nvml.h `typedef enum nvmlReturn_enum`)
SUCCESS = 0
ERROR_UNINITIALIZED = 1
ERROR_NOT_SUPPORTED = 3
ERROR_NO_PERMISSION = 4  # "The current user does not have permission for operation"
ERROR_NOT_FOUND = 6
ERROR_INSUFFICIENT_SIZE = 7
ERROR_FUNCTION_NOT_FOUND = 13
ERROR_DEPRECATED = 26
# answers that mean "this driver or GPU has no such value": read as None
ABSENT = frozenset({ERROR_NOT_SUPPORTED, ERROR_FUNCTION_NOT_FOUND, ERROR_DEPRECATED})

CLOCK_SM = 1  # nvmlClockType_t NVML_CLOCK_SM
CLOCK_MEM = 2  # NVML_CLOCK_MEM
TEMPERATURE_GPU = 0  # nvmlTemperatureSensors_t NVML_TEMPERATURE_GPU
FEATURE_ENABLED = 1  # nvmlEnableState_t NVML_FEATURE_ENABLED
DEVICE_MIG_ENABLE = 1  # NVML_DEVICE_MIG_ENABLE

# nvmlPerfPolicyType_t: what held the clocks below the application clocks, and for how long
# (nvmlDeviceGetViolationStatus)
PERF_POLICY_POWER = 0  # NVML_PERF_POLICY_POWER: power violations
PERF_POLICY_THERMAL = 1  # NVML_PERF_POLICY_THERMAL: thermal violations
PERF_POLICY_BOARD_LIMIT = 3  # NVML_PERF_POLICY_BOARD_LIMIT: the board limit
PERF_POLICY_RELIABILITY = 5  # NVML_PERF_POLICY_RELIABILITY: the board reliability limit

# NVML field ids (nvml.h `#define NVML_FI_*`), read with nvmlDeviceGetFieldValues
FI_DEV_PERF_POLICY_POWER = 74  # = NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP, in ns
FI_DEV_PERF_POLICY_BOARD_LIMIT = 77
FI_DEV_PERF_POLICY_RELIABILITY = 79
FI_DEV_POWER_INSTANT = 186  # "Current GPU power, supported on all architectures."
FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN = 269  # ns
FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN = 270  # ns
FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN = 271  # ns

# nvmlValueType_t: which member of nvmlValue_t a field value holds
VALUE_TYPES = {
    0: "dVal",  # NVML_VALUE_TYPE_DOUBLE
    1: "uiVal",  # NVML_VALUE_TYPE_UNSIGNED_INT
    2: "ulVal",  # NVML_VALUE_TYPE_UNSIGNED_LONG
    3: "ullVal",  # NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
    4: "sllVal",  # NVML_VALUE_TYPE_SIGNED_LONG_LONG
    5: "siVal",  # NVML_VALUE_TYPE_SIGNED_INT
    6: "usVal",  # NVML_VALUE_TYPE_UNSIGNED_SHORT
}

# buffer sizes (nvml.h nvmlConstants): the _V2 sizes are the larger ones
UUID_BUFFER_SIZE = 96  # NVML_DEVICE_UUID_V2_BUFFER_SIZE
NAME_BUFFER_SIZE = 96  # NVML_DEVICE_NAME_V2_BUFFER_SIZE
DRIVER_VERSION_BUFFER_SIZE = 80  # NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE

Device = ctypes.c_void_p  # nvmlDevice_t: `typedef struct nvmlDevice_st* nvmlDevice_t`


class Utilization(ctypes.Structure):
    """nvmlUtilization_t: percent of the last sample period (1/6 s to 1 s) busy."""

    _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]


class Memory(ctypes.Structure):
    """nvmlMemory_t (v1), in bytes."""

    _fields_ = [
        ("total", ctypes.c_ulonglong),
        ("free", ctypes.c_ulonglong),
        ("used", ctypes.c_ulonglong),
    ]


class ProcessInfo(ctypes.Structure):
    """nvmlProcessInfo_t, which nvml.h defines as ``nvmlProcessInfo_v2_st`` (the struct
    ``nvmlDeviceGetComputeRunningProcesses_v3`` and ``_v2`` fill; ``_v1`` has the first two
    fields only). The instance ids are 0xFFFFFFFF outside MIG."""

    _fields_ = [
        ("pid", ctypes.c_uint),
        ("usedGpuMemory", ctypes.c_ulonglong),
        ("gpuInstanceId", ctypes.c_uint),
        ("computeInstanceId", ctypes.c_uint),
    ]


class ViolationTime(ctypes.Structure):
    """nvmlViolationTime_t: ``referenceTime``, a CPU timestamp in microseconds;
    ``violationTime``, how long the policy held the clocks down, in nanoseconds (cumulative)."""

    _fields_ = [("referenceTime", ctypes.c_ulonglong), ("violationTime", ctypes.c_ulonglong)]


class Value(ctypes.Union):
    """nvmlValue_t."""

    _fields_ = [
        ("dVal", ctypes.c_double),
        ("siVal", ctypes.c_int),
        ("uiVal", ctypes.c_uint),
        ("ulVal", ctypes.c_ulong),
        ("ullVal", ctypes.c_ulonglong),
        ("sllVal", ctypes.c_longlong),
        ("usVal", ctypes.c_ushort),
    ]


class FieldValue(ctypes.Structure):
    """nvmlFieldValue_t: ``fieldId`` (and ``scopeId``) set before the call; ``nvmlReturn``
    says whether ``value`` (of ``valueType``) holds the field."""

    _fields_ = [
        ("fieldId", ctypes.c_uint),
        ("scopeId", ctypes.c_uint),
        ("timestamp", ctypes.c_longlong),
        ("latencyUsec", ctypes.c_longlong),
        ("valueType", ctypes.c_int),
        ("nvmlReturn", ctypes.c_int),
        ("value", Value),
    ]


# nvml.h maps nvmlDeviceGetComputeRunningProcesses to _v3; _v2, which older drivers export in
# its place, takes the same struct. The unversioned symbol takes nvmlProcessInfo_v1_t: not bound.
COMPUTE_PROCESSES_CALLS = (
    "nvmlDeviceGetComputeRunningProcesses_v3",
    "nvmlDeviceGetComputeRunningProcesses_v2",
)


class NvmlError(DeploybenchError, RuntimeError):
    """An NVML call failed (other than "not supported"), naming the call and NVML's error."""

    def __init__(self, call: str, code: int, message: str) -> None:
        super().__init__(f"NVML {call} failed: {message} (nvmlReturn_t {code})")
        self.call = call
        self.code = code


class Nvml:
    """NVML, loaded from ``library`` and initialised (``nvmlInit_v2``); :meth:`shutdown` when
    done (NVML counts its initialisations). Raises OSError where the library cannot be loaded
    and :class:`NvmlError` where it does not initialise."""

    def __init__(self, library: str = "libnvidia-ml.so.1") -> None:
        self.library = library
        self._lib = ctypes.CDLL(library)
        error_string = self._lib.nvmlErrorString
        error_string.restype = ctypes.c_char_p
        error_string.argtypes = [ctypes.c_int]
        self._error_string = error_string
        self._call("nvmlInit_v2")
        self._open = True

    # --- plumbing ---------------------------------------------------------------------------

    def error_string(self, code: int) -> str:
        text = self._error_string(code)
        return text.decode(errors="replace") if text else f"error {code}"

    def _function(self, name: str) -> Any | None:
        """The library's function ``name``, or None where this driver does not export it."""
        try:
            return getattr(self._lib, name)
        except AttributeError:
            return None

    def _call(self, name: str, *args: Any) -> bool:
        """Call ``name``: True on success, False where the driver lacks it or answers "not
        supported"; NvmlError on any other failure."""
        function = self._function(name)
        if function is None:
            return False
        code = int(function(*args))
        if code == SUCCESS:
            return True
        if code in ABSENT:
            return False
        raise NvmlError(name, code, self.error_string(code))

    def _uint(self, name: str, *args: Any) -> int | None:
        value = ctypes.c_uint()
        return value.value if self._call(name, *args, ctypes.byref(value)) else None

    def _ulonglong(self, name: str, *args: Any) -> int | None:
        value = ctypes.c_ulonglong()
        return value.value if self._call(name, *args, ctypes.byref(value)) else None

    def _string(self, name: str, size: int, *args: Any) -> str | None:
        buffer = ctypes.create_string_buffer(size)
        ok = self._call(name, *args, buffer, ctypes.c_uint(size))
        return buffer.value.decode(errors="replace") if ok else None

    # --- system -----------------------------------------------------------------------------

    def shutdown(self) -> None:
        if self._open:
            self._open = False
            self._call("nvmlShutdown")

    def driver_version(self) -> str | None:
        return self._string("nvmlSystemGetDriverVersion", DRIVER_VERSION_BUFFER_SIZE)

    def device_count(self) -> int:
        return self._uint("nvmlDeviceGetCount_v2") or 0

    def handle_by_index(self, index: int) -> Device:
        device = Device()
        if not self._call(
            "nvmlDeviceGetHandleByIndex_v2", ctypes.c_uint(index), ctypes.byref(device)
        ):
            raise NvmlError("nvmlDeviceGetHandleByIndex_v2", ERROR_NOT_SUPPORTED, "not supported")
        return device

    def handle_by_uuid(self, uuid: str) -> Device | None:
        """The GPU or MIG device of ``uuid`` (``GPU-...`` or ``MIG-...``, in full), or None where
        NVML has none; NvmlError for another failure (``ERROR_NO_PERMISSION``: a GPU this job's
        cgroup does not let it open)."""
        device = Device()
        try:
            found = self._call("nvmlDeviceGetHandleByUUID", uuid.encode(), ctypes.byref(device))
        except NvmlError as error:
            if error.code == ERROR_NOT_FOUND:
                return None
            raise
        return device if found else None

    # --- one device -------------------------------------------------------------------------

    def uuid(self, device: Device) -> str | None:
        return self._string("nvmlDeviceGetUUID", UUID_BUFFER_SIZE, device)

    def name(self, device: Device) -> str | None:
        return self._string("nvmlDeviceGetName", NAME_BUFFER_SIZE, device)

    def total_energy_mj(self, device: Device) -> int | None:
        """Energy since the driver was last loaded, in mJ (Volta and later)."""
        return self._ulonglong("nvmlDeviceGetTotalEnergyConsumption", device)

    def power_usage_mw(self, device: Device) -> int | None:
        """The board's power draw in mW (a 1 s average on Ampere, except GA100, and later;
        instantaneous on GA100 and older: nvml.h)."""
        return self._uint("nvmlDeviceGetPowerUsage", device)

    def field_values(self, device: Device, fields: list[int]) -> dict[int, float | None]:
        """Each of ``fields`` (NVML field ids) as ``nvmlDeviceGetFieldValues`` answers it; None
        for a field this driver or GPU does not give (its own ``nvmlReturn`` is not success:
        an unknown id, NOT_SUPPORTED), or for all where the driver lacks the call."""
        values = (FieldValue * len(fields))()
        for value, field in zip(values, fields, strict=True):
            value.fieldId = field
        if not self._call("nvmlDeviceGetFieldValues", device, ctypes.c_int(len(fields)), values):
            return dict.fromkeys(fields)
        found: dict[int, float | None] = {}
        for value, field in zip(values, fields, strict=True):
            member = VALUE_TYPES.get(value.valueType)
            ok = value.nvmlReturn == SUCCESS and member is not None
            found[field] = getattr(value.value, member) if ok and member else None
        return found

    def power_instant_mw(self, device: Device) -> float | None:
        """The board's power now (``NVML_FI_DEV_POWER_INSTANT``: "Current GPU power, supported
        on all architectures"), in mW as nvmlDeviceGetPowerUsage's (nvml.h states no unit for
        the field); None where the driver does not give the field."""
        return self.field_values(device, [FI_DEV_POWER_INSTANT])[FI_DEV_POWER_INSTANT]

    def violation_ns(self, device: Device, policy: int) -> int | None:
        """How long ``policy`` (nvmlPerfPolicyType_t) has held the clocks below the application
        clocks, in ns, cumulative (``nvmlDeviceGetViolationStatus``; nvml.h 13 deprecates it
        for the field values, "removed in CUDA 14.0"); None where the driver lacks it or the
        GPU does not count it."""
        violation = ViolationTime()
        found = self._call(
            "nvmlDeviceGetViolationStatus", device, ctypes.c_int(policy), ctypes.byref(violation)
        )
        return int(violation.violationTime) if found else None

    def enforced_power_limit_mw(self, device: Device) -> int | None:
        return self._uint("nvmlDeviceGetEnforcedPowerLimit", device)

    def clock_mhz(self, device: Device, clock: int) -> int | None:
        """The current clock of ``clock`` (:data:`CLOCK_SM`, :data:`CLOCK_MEM`), in MHz."""
        return self._uint("nvmlDeviceGetClockInfo", device, ctypes.c_int(clock))

    def applications_clock_mhz(self, device: Device, clock: int) -> int | None:
        """The clock that applications run at unless throttled (set by nvidia-smi -ac)."""
        return self._uint("nvmlDeviceGetApplicationsClock", device, ctypes.c_int(clock))

    def temperature_c(self, device: Device) -> int | None:
        return self._uint("nvmlDeviceGetTemperature", device, ctypes.c_int(TEMPERATURE_GPU))

    def utilization(self, device: Device) -> Utilization | None:
        rates = Utilization()
        return (
            rates
            if self._call("nvmlDeviceGetUtilizationRates", device, ctypes.byref(rates))
            else None
        )

    def memory_info(self, device: Device) -> Memory | None:
        memory = Memory()
        return (
            memory if self._call("nvmlDeviceGetMemoryInfo", device, ctypes.byref(memory)) else None
        )

    def clocks_event_reasons(self, device: Device) -> int | None:
        """Why the clocks are below their maximum (a bitmask: nvml.h nvmlClocksEventReason*).
        Drivers from 535 name it ClocksEventReasons; nvml.h 13 deprecates the older
        ClocksThrottleReasons, which older drivers alone have."""
        if self._function("nvmlDeviceGetCurrentClocksEventReasons") is not None:
            return self._ulonglong("nvmlDeviceGetCurrentClocksEventReasons", device)
        return self._ulonglong("nvmlDeviceGetCurrentClocksThrottleReasons", device)

    def persistence_mode(self, device: Device) -> bool | None:
        mode = self._uint("nvmlDeviceGetPersistenceMode", device)
        return None if mode is None else mode == FEATURE_ENABLED

    def mig_enabled(self, device: Device) -> bool | None:
        """Whether MIG mode is on (None: the GPU or driver has no MIG)."""
        current, pending = ctypes.c_uint(), ctypes.c_uint()
        if not self._call(
            "nvmlDeviceGetMigMode", device, ctypes.byref(current), ctypes.byref(pending)
        ):
            return None
        return current.value == DEVICE_MIG_ENABLE

    def compute_processes(self, device: Device) -> list[int] | None:
        """The pids of the processes with a compute context on ``device`` (CUDA programs, an
        MPS server), as the driver numbers them (the host's PID namespace); None where this
        driver cannot list them. nvml.h: call with ``*infoCount`` = 0 for the count
        (``NVML_ERROR_INSUFFICIENT_SIZE``, or success when none run); the list may grow
        between the calls, so a short buffer is retried."""
        for name in COMPUTE_PROCESSES_CALLS:
            function = self._function(name)
            if function is None:
                continue
            size = 8
            for _ in range(4):
                count = ctypes.c_uint(size)
                infos = (ProcessInfo * size)()
                code = int(function(device, ctypes.byref(count), infos))
                if code == SUCCESS:
                    return [int(infos[i].pid) for i in range(min(count.value, size))]
                if code == ERROR_INSUFFICIENT_SIZE:
                    size = max(size * 2, count.value + 8)
                    continue
                if code in ABSENT:
                    return None
                raise NvmlError(name, code, self.error_string(code))
            raise NvmlError(name, ERROR_INSUFFICIENT_SIZE, "the process list kept growing")
        return None
