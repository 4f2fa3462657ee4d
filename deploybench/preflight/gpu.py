"""The GPU checks: the GPU the job got (``gpu_visible``, from nvidia-smi) and whether its driver
runs the image's CUDA (``driver``: the CUDA driver API in the job, explained by the release
notes' table of driver branches)."""

from __future__ import annotations

import re
import shutil
import textwrap
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError
from ..probe import python_probe, run_command, tail
from .spec import FAIL, PASS, SKIP, WARN, Check, PreflightSpec, gpu_fix

# A hung nvidia-smi must not hang the job.
NVIDIA_SMI_TIMEOUT_S = 30


@dataclass(frozen=True)
class GpuProbe:
    gpus: list[dict[str, str]]  # name, driver_version, uuid of each GPU nvidia-smi lists
    error: str  # why none are listed


def probe_gpus(timeout_s: float = NVIDIA_SMI_TIMEOUT_S) -> GpuProbe:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return GpuProbe([], "nvidia-smi is not in the container (no GPU passed in)")
    out = run_command(
        [exe, "--query-gpu=name,driver_version,uuid", "--format=csv,noheader"], timeout_s
    )
    if out.code != 0:
        return GpuProbe(
            [], f"nvidia-smi failed ({out.error or f'exit {out.code}'}): {tail(out.text)}"
        )
    gpus = []
    for line in out.text.splitlines():
        parts = [p.strip() for p in line.rsplit(",", 2)]
        if len(parts) == 3 and parts[0]:
            gpus.append({"name": parts[0], "driver_version": parts[1], "uuid": parts[2]})
    return GpuProbe(gpus, "" if gpus else "nvidia-smi lists no GPU")


def model_tokens(name: str) -> list[str]:
    """The GPU model names in a configured name: "NVIDIA DGX A100 (1x A100 80GB)" -> A100."""
    return sorted(set(re.findall(r"\b[A-Z]{1,2}\d{1,4}[A-Za-z]*\b", name)))


def is_datacenter_gpu(name: str) -> bool:
    """Whether NVIDIA's forward compatibility (an older driver branch for a newer CUDA) applies:
    data center GPUs only, not GeForce, TITAN, Quadro or RTX workstation boards."""
    return not re.search(r"geforce|titan|quadro|\brtx\b", name, re.IGNORECASE)


def _version(text: str) -> tuple[int, ...] | None:
    try:
        return tuple(int(part) for part in str(text).strip().split("."))
    except ValueError:
        return None


def _required_version(text: str, what: str) -> tuple[int, ...]:
    version = _version(text)
    if version is None:
        raise ConfigError(f"{what} {text!r} is not a driver version (numbers and dots)")
    return version


def driver_supports(
    driver: str, requirement: Mapping[str, Any], *, datacenter: bool
) -> tuple[bool, str]:
    """Whether driver ``driver`` runs an image whose CUDA needs ``requirement``
    (``{"minimum": "570", "datacenter": ["470.57", "525.85", ...]}``, from NVIDIA's release
    notes), and why: at least the minimum; or, on a data center GPU, a listed older branch at
    or past its listed version (forward compatibility: "470.57 or later R470")."""
    if "minimum" not in requirement:
        raise ConfigError(f"release.driver {dict(requirement)} names no minimum")
    minimum = str(requirement["minimum"])
    floor = _required_version(minimum, "release.driver.minimum")
    version = _version(driver)
    if version is None:
        return False, f"driver version {driver!r} is not numbers and dots"
    if version >= floor:
        return True, f"driver {driver} >= {minimum}"
    branches = [str(b) for b in requirement.get("datacenter") or []]
    for branch in branches:
        listed = _required_version(branch, "release.driver.datacenter entry")
        if version[0] == listed[0] and version >= listed:
            if datacenter:
                return True, (
                    f"driver {driver} < {minimum}, but R{listed[0]} >= {branch} on a data "
                    "center GPU: forward compatibility"
                )
            return False, (
                f"driver {driver} < {minimum}; R{listed[0]} >= {branch} works by forward "
                "compatibility only on data center GPUs, which this is not"
            )
    older = f", and not one of the data center branches ({', '.join(branches)})" if branches else ""
    return False, f"driver {driver} < {minimum}{older}"


def check_gpu_visible(spec: PreflightSpec, probe: GpuProbe) -> Check:
    name = "gpu_visible"
    if probe.error:
        return Check(name, FAIL, probe.error, gpu_fix(spec))
    names = [g["name"] for g in probe.gpus]
    listed = ", ".join(f"{g['name']} (driver {g['driver_version']})" for g in probe.gpus)
    facts = {"gpus": probe.gpus}
    wanted = model_tokens(spec["gpu_name"])
    # A node of another GPU model would record its numbers under this GPU's name.
    if wanted and not any(
        re.search(rf"\b{re.escape(t)}(?!\d)", n, re.IGNORECASE) for t in wanted for n in names
    ):
        return Check(
            name,
            FAIL,
            f"the job got {listed}, not an {spec['gpu_name']}",
            gpu_fix(spec),
            facts,
        )
    return Check(name, PASS, f"{len(names)} GPU(s): {listed}", facts=facts)


# The CUDA driver API in the job's own process, as every CUDA program there will load it: the
# driver's libcuda.so.1 (Apptainer's --nv binds the host's into the container), or the image's
# CUDA forward-compatibility libcuda where it is loaded instead. cuInit and cuDriverGetVersion
# are the driver API's own calls (cuda.h); the version is the CUDA release that libcuda
# implements (12080 = 12.8), which is what an image built on that CUDA needs.
CUDA_DRIVER_PROBE = textwrap.dedent(
    """
    import ctypes, json
    info = {}
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        info["error"] = f"libcuda.so.1 does not load: {exc}"
    else:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "libcuda.so" in line}
        info["library"] = sorted(paths)
        status = lib.cuInit(0)
        info["cuInit"] = status
        if status:
            name = ctypes.c_char_p()
            getter = getattr(lib, "cuGetErrorName", None)
            if getter is not None and getter(status, ctypes.byref(name)) == 0 and name.value:
                info["cuInit_name"] = name.value.decode()
        version = ctypes.c_int(0)
        info["version"] = version.value if lib.cuDriverGetVersion(ctypes.byref(version)) == 0 else None
    print("PREFLIGHT " + json.dumps(info))
    """
)
CUDA_PROBE_TIMEOUT_S = 60
# cuda.h's CUresult names, for a libcuda without cuGetErrorName (or one that cannot name it).
CUDA_ERRORS = {
    3: "CUDA_ERROR_NOT_INITIALIZED",
    35: "CUDA_ERROR_INSUFFICIENT_DRIVER",
    100: "CUDA_ERROR_NO_DEVICE",
    803: "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH",
    804: "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE",
}
# NVIDIA's CUDA forward compatibility: an older data center driver runs a newer CUDA only with
# the cuda-compat package's libcuda loaded in its place
# (https://docs.nvidia.com/deploy/cuda-compatibility/forward-compatibility.html). NVIDIA's CUDA
# images install it under /usr/local/cuda/compat (`/usr/local/cuda-12.8/compat/libcuda.so.1` in
# nvidia/cuda:12.8.1, NVIDIA/nvidia-container-toolkit PR 1055); Apptainer's --nv puts the host's
# libcuda first instead, so nothing in `apptainer exec` loads the compat one by itself.
COMPAT_LIBRARY_DIR = "/usr/local/cuda/compat"
# The oldest driver of each CUDA major release that runs any of its minor releases ("CUDA 11 and
# later defaults to minor version compatibility ... with limited feature-set", NVIDIA's CUDA
# Compatibility guide, docs.nvidia.com/deploy/cuda-compatibility/minor-version-compatibility;
# the versions: the CUDA Toolkit release notes' table, 12.x >= 525.60.13, 11.x >= 450.80.02).
MINOR_VERSION_DRIVERS = {12: "525.60.13", 11: "450.80.02"}


def cuda_version_of(text: str | None) -> tuple[int, int] | None:
    """``"12.8.0.38"`` -> (12, 8); None when it is not a CUDA version."""
    match = re.match(r"\s*(\d+)\.(\d+)", str(text or ""))
    return (int(match.group(1)), int(match.group(2))) if match else None


def probe_cuda_driver(timeout_s: float = CUDA_PROBE_TIMEOUT_S) -> dict[str, Any]:
    """``cuInit`` and ``cuDriverGetVersion`` in a child process of the job's Python (a driver
    that hangs or crashes it cannot take the job along): its result, or ``{"error": ...}``."""
    info, why = python_probe(CUDA_DRIVER_PROBE, [], timeout_s)
    return info or {"error": f"the CUDA driver probe failed: {why}"}


def check_driver(
    spec: PreflightSpec,
    probe: GpuProbe,
    cuda: Callable[[], dict[str, Any]] = probe_cuda_driver,
) -> Check:
    """The driver runs the image's CUDA when CUDA initialises in the job and its driver API
    implements at least the image's CUDA release. The release notes' table of driver branches
    (:func:`driver_supports`) only explains a failure: a forward-compatible branch passes the
    table yet fails here when the compat libcuda is not the one loaded."""
    name = "driver"
    if probe.error:
        return Check(name, FAIL, f"no driver to check: {probe.error}", gpu_fix(spec))
    driver = probe.gpus[0]["driver_version"]
    release = spec["release"] or {}
    facts: dict[str, Any] = {"driver": driver, "cuda": release.get("cuda")}
    if not release.get("driver"):
        return Check(
            name,
            SKIP,
            f"driver {driver}; images.{spec['image']}.release names no driver requirement to "
            "compare it with",
            facts=facts,
        )
    datacenter = all(is_datacenter_gpu(g["name"]) for g in probe.gpus)
    table_ok, table_why = driver_supports(driver, release["driver"], datacenter=datacenter)
    result = cuda()
    facts["cuda_driver_api"] = result
    needed = cuda_version_of(release.get("cuda"))
    update = (
        f"update the nodes' driver to {release['driver']['minimum']} or later, or use an older "
        f"NGC release whose CUDA this driver runs (images.{spec['image']}.from)"
    )
    compat = (
        f"; or, on a forward-compatible data center branch, make the job load the image's "
        f"CUDA forward-compatibility libcuda (under {COMPAT_LIBRARY_DIR}) ahead of the host's "
        f"that --nv binds (images.{spec['image']}.definition)"
        if datacenter
        else ""
    )
    table = f"release notes: {table_why}"
    if "error" in result:
        return Check(name, FAIL, f"{result['error']} ({table})", gpu_fix(spec), facts)
    status = int(result.get("cuInit", -1))
    if status != 0:
        error = result.get("cuInit_name") or CUDA_ERRORS.get(status, "unknown CUresult")
        return Check(
            name,
            FAIL,
            f"cuInit failed with {error} ({status}) under driver {driver} ({table})",
            update + compat,
            facts,
        )
    version = result.get("version")
    implements = (int(version) // 1000, int(version) % 1000 // 10) if version else None
    shown = f"{implements[0]}.{implements[1]}" if implements else "an unknown CUDA"
    loaded = ", ".join(result.get("library") or []) or "libcuda.so.1"
    # a driver of the image's CUDA major release but older than its minor: see its limits
    family_floor = MINOR_VERSION_DRIVERS.get(needed[0]) if needed else None
    if (
        needed is not None
        and implements is not None
        and implements[0] == needed[0]
        and implements < needed
        and family_floor is not None
        and (_version(driver) or ()) >= _required_version(family_floor, "minor-version floor")
    ):
        return Check(
            name,
            WARN,
            f"CUDA initialises; the driver API ({loaded}) implements CUDA {shown}, older than "
            f"the image's CUDA {release.get('cuda')}, which driver {driver} runs by CUDA "
            f"{needed[0]}.x minor-version compatibility (>= {family_floor}) with a limited "
            "feature set (no PTX newer than the driver's): the framework_cuda kernel and "
            f"trtexec's build decide ({table})",
            update,
            facts,
        )
    if needed is not None and (implements is None or implements < needed):
        return Check(
            name,
            FAIL,
            f"CUDA initialises, but the driver API ({loaded}) implements CUDA {shown}, older "
            f"than the image's CUDA {release.get('cuda')} ({table})",
            update + compat,
            facts,
        )
    note = "" if table_ok else f"; the release notes' table alone would fail it: {table_why}"
    return Check(
        name,
        PASS,
        f"cuInit succeeds; the driver API ({loaded}) implements CUDA {shown} for the image's "
        f"CUDA {release.get('cuda')} (driver {driver}){note}",
        facts=facts,
    )
