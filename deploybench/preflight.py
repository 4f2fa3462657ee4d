"""Preflight: what the runs on one GPU need of one image, checked where those runs will run.

``snakemake preflight`` (rules/preflight.smk) runs one job per GPU and image, in that image on
that GPU's partition; the job (``jobs.preflight``) calls :func:`run_checks`. Every check runs
(a failed one does not hide the next), and each failure names the missing piece and its fix,
so that one job on a new cluster lists everything to change before the runs can work.

Checks (names are stable: the rules' tests and the README use them): ``gpu_visible``,
``framework_cuda``, ``driver``, ``tritonserver``, ``tritonserver_gpu``, ``backends``,
``perf_analyzer``, ``trtexec``, ``tensorrt_version``, ``deploybench_imports``. One that does
not apply to the spec (a GPU check on the CPU default, a Triton check in a framework image) is
skipped.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import re
import shutil
import tempfile
import textwrap
import urllib.error
import urllib.request
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from .errors import ConfigError, PreflightError, ServerError, ToolNotFound
from .images import running_image
from .probe import python_probe, run_command, tail
from .trt_version import ENGINE_CONVERTERS

if TYPE_CHECKING:
    from .server import TritonServer

log = logging.getLogger(__name__)

CHECKS = (
    "image",
    "gpu_visible",
    "framework_cuda",
    "driver",
    "tritonserver",
    "tritonserver_gpu",
    "backends",
    "perf_analyzer",
    "trtexec",
    "tensorrt_version",
    "deploybench_imports",
)
PASS, FAIL, SKIP = "pass", "fail", "skip"
# Passes, with a limit the runs may meet: the checks after it decide (the driver's
# minor-version compatibility: a framework's kernel, trtexec's build).
WARN = "warn"

DEVICES = ("gpu", "cpu")
ROLES = ("framework", "triton")
FRAMEWORKS = ("torch", "tensorflow")
BACKENDS = ("python", "onnxruntime", "pytorch", "tensorrt", "tensorflow")
# Where NGC tritonserver images keep their backends (tritonserver's default backend directory).
NGC_BACKEND_DIR = Path("/opt/tritonserver/backends")
# Where NGC framework images keep trtexec when it is not on PATH.
NGC_TRTEXEC = Path("/usr/src/tensorrt/bin/trtexec")

# Timeouts (s) of the probes: a hung nvidia-smi or trtexec must not hang the job.
NVIDIA_SMI_TIMEOUT_S = 30
FRAMEWORK_TIMEOUT_S = 300  # importing TensorFlow from a shared file system is slow
IMPORTS_TIMEOUT_S = 300
TRTEXEC_TIMEOUT_S = 60
PERF_ANALYZER_TIMEOUT_S = 120


class PreflightSpec(TypedDict):
    """One preflight job (``plan.plan_preflight``): the GPU, the image, and what the runs on
    that GPU need of the image."""

    gpu: str  # config key of the GPU
    gpu_name: str  # gpus.<g>.name
    device: str  # gpus.<g>.device: gpu | cpu
    image: str  # config key of the image
    role: str  # framework | triton
    modules: list[str]  # what the jobs of the rules declaring this image import (job_imports)
    release: dict[str, Any] | None  # images.<image>.release (python, cuda, driver, ships)
    frameworks: list[str]  # python modules whose CUDA visibility to check
    backends: list[str]  # Triton backends the runs serve with (triton role)
    trtexec_flags: list[str]  # trtexec options the convert step passes (framework role)
    # converters (tensorrt | tf-trt) whose TensorRT engines the runs build in this image
    # (framework role) or load in it (triton role): release.tensorrt must be what it ships
    tensorrt_engines: list[str]
    slurm: dict[str, Any]  # gpus.<g>.slurm, for the fixes
    server: dict[str, Any]  # config `server`: startup_timeout_s, shutdown_timeout_s


@dataclass
class Check:
    name: str
    status: str  # pass | warn | fail | skip
    detail: str
    fix: str = ""  # what to change (failures)
    facts: dict[str, Any] = field(default_factory=dict)  # what was found (versions, GPUs)

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": self.status,
            "detail": self.detail,
            "fix": self.fix,
            "facts": self.facts,
        }


def check_spec(spec: Mapping[str, Any]) -> None:
    """A spec the checks can act on: each choice among the valid ones."""
    singles: tuple[tuple[str, str, tuple[str, ...]], ...] = (
        ("device", spec["device"], DEVICES),
        ("role", spec["role"], ROLES),
    )
    for key, value, choices in singles:
        if value not in choices:
            raise ConfigError(
                f"preflight of {spec['gpu']}/{spec['image']}: {key} {value!r}; valid choices: "
                f"{', '.join(choices)}"
            )
    lists: tuple[tuple[str, list[str], tuple[str, ...]], ...] = (
        ("frameworks", spec["frameworks"], FRAMEWORKS),
        ("backends", spec["backends"], BACKENDS),
        ("tensorrt_engines", spec.get("tensorrt_engines", []), ENGINE_CONVERTERS),
    )
    for key, values, choices in lists:
        unknown = [v for v in values if v not in choices]
        if unknown:
            raise ConfigError(
                f"preflight of {spec['gpu']}/{spec['image']}: {key} {unknown}; valid choices: "
                f"{', '.join(choices)}"
            )


# ---------------------------------------------------------------------------- GPU and driver


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


def _mapping(values: Mapping[str, Any]) -> str:
    """A config mapping as YAML's flow style writes it: ``partition: gpu, gpu_model: a30``."""
    return ", ".join(f"{k}: {'null' if v is None else v}" for k, v in values.items())


def gpu_fix(spec: PreflightSpec) -> str:
    return (
        f"run the job on a node with an {spec['gpu_name']} and pass the GPU into the container: "
        f"set gpus.{spec['gpu']}.slurm (now {_mapping(spec['slurm'])}) to the partition and "
        "GPU type (GRES) of those nodes (`sinfo -o '%P %G %f'` lists them), and keep "
        "Apptainer's --nv (apptainer-args in profiles/slurm)"
    )


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


# ---------------------------------------------------------------------------- frameworks

FRAMEWORK_PROBE = textwrap.dedent(
    """
    import json, sys
    info = {"module": sys.argv[1]}
    try:
        if sys.argv[1] == "torch":
            import torch
            info.update(version=torch.__version__, cuda=torch.version.cuda,
                        available=torch.cuda.is_available(), devices=torch.cuda.device_count())
            if info["available"]:
                info["names"] = [torch.cuda.get_device_name(i) for i in range(info["devices"])]
                info["capability"] = "%d.%d" % torch.cuda.get_device_capability(0)
                info["arch_list"] = torch.cuda.get_arch_list()
                try:  # seeing a GPU is not running on it (a build without its kernels)
                    x = torch.arange(4.0, device="cuda")
                    info["kernel"] = float((x * 2 + 1).sum().item())
                except Exception as exc:
                    info["kernel_error"] = f"{type(exc).__name__}: {exc}"
        else:
            import tensorflow as tf
            gpus = tf.config.list_physical_devices("GPU")
            cuda = tf.sysconfig.get_build_info().get("cuda_version")
            info.update(version=tf.__version__, cuda=cuda, available=bool(gpus),
                        devices=len(gpus), names=[g.name for g in gpus])
            if gpus:
                try:
                    with tf.device("/GPU:0"):
                        info["kernel"] = float(tf.reduce_sum(tf.range(4.0) * 2 + 1).numpy())
                except Exception as exc:
                    info["kernel_error"] = f"{type(exc).__name__}: {exc}"
    except Exception as exc:
        info["error"] = f"{type(exc).__name__}: {exc}"
    print("PREFLIGHT " + json.dumps(info))
    """
)


# What FRAMEWORK_PROBE's kernel computes: sum(2 * [0, 1, 2, 3] + 1) (a `not 16` below says it).
KERNEL_RESULT = 16.0


def check_framework_cuda(spec: PreflightSpec, probe: GpuProbe) -> Check:
    name = "framework_cuda"
    if not spec["frameworks"]:
        return Check(name, SKIP, "no framework job runs in this image")
    found, failures, fixes = [], [], []
    facts: dict[str, Any] = {}
    for module in spec["frameworks"]:
        info, why = python_probe(FRAMEWORK_PROBE, [module], FRAMEWORK_TIMEOUT_S)
        facts[module] = info or {"error": why}
        requirements = f"images.{spec['image']}.requirements and its lock"
        if not info or "error" in info:
            failures.append(f"{module} does not import: {info.get('error') or why}")
            fixes.append(f"install {module} in the image ({requirements})")
        elif info["cuda"] is None:
            failures.append(f"{module} {info['version']} is a build without CUDA")
            fixes.append(f"install {module}'s CUDA build in the image ({requirements})")
        elif not info["available"] or not info["devices"]:
            failures.append(f"{module} {info['version']} (CUDA {info['cuda']}) sees no GPU")
            fixes.append(
                gpu_fix(spec)
                if probe.error
                else f"if the driver check failed, a newer driver for CUDA {info['cuda']}; if it "
                f"passed, {module} cannot load the CUDA libraries it was built for in this image "
                "(its message in the job's log names them): use the image's own build of it"
            )
        elif "kernel_error" in info or info.get("kernel") != KERNEL_RESULT:
            built = ", ".join(info.get("arch_list") or []) or "not stated"
            why = info.get("kernel_error") or f"a kernel computed {info.get('kernel')}, not 16"
            failures.append(
                f"{module} {info['version']} sees the GPU but cannot run on it: {why} "
                f"(compute capability {info.get('capability', '?')}; built for: {built})"
            )
            fixes.append(
                f"install a {module} built for compute capability {info.get('capability', '?')} "
                f"in the image ({requirements})"
            )
        else:
            found.append(
                f"{module} {info['version']} (CUDA {info['cuda']}) sees {info['devices']} GPU(s)"
            )
    if failures:
        return Check(name, FAIL, "; ".join(failures + found), "; ".join(fixes), facts)
    return Check(name, PASS, "; ".join(found), facts=facts)


# ---------------------------------------------------------------------------- Triton

IDENTITY_MODEL_PY = textwrap.dedent(
    """
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            return [
                pb_utils.InferenceResponse(
                    [pb_utils.Tensor("y", pb_utils.get_input_tensor_by_name(r, "x").as_numpy())]
                )
                for r in requests
            ]
    """
)
CPU_MODEL = "preflight_cpu"
LOAD_FAILED_PREFIX = r"^load failed for model '[^']*': version \d+ is at UNAVAILABLE state: "


@dataclass(frozen=True)
class TinyModel:
    name: str
    backend: str
    kind: str  # KIND_CPU | KIND_GPU
    input: str
    output: str


def _write_onnx_identity(path: Path) -> None:
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "identity",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
    )
    # An old IR and opset: every onnxruntime an NGC image ships reads them.
    onnx.save(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), path
    )


def _write_torchscript_identity(path: Path) -> None:
    import torch

    class Identity(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x

    # TorchScript is what Triton's libtorch backend loads, deprecated in torch or not
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.jit.script(Identity()).save(str(path))


# Backends with no tiny model here, and why.
NOT_WRITTEN = {
    "tensorrt": "a TensorRT plan is built on the GPU itself (the convert step's job)",
    "tensorflow": "preflight writes no SavedModel",
}
# Backends whose tiny model can be written without a GPU toolchain, and the module it needs.
MODEL_WRITERS: dict[str, tuple[str, str, Callable[[Path], None]]] = {
    "onnxruntime": ("onnx", "model.onnx", _write_onnx_identity),
    "pytorch": ("torch", "model.pt", _write_torchscript_identity),
}


def write_tiny_repository(
    root: Path, gpu_backends: Sequence[str]
) -> tuple[list[TinyModel], dict[str, str]]:
    """A repository of identity models: the python backend's on KIND_CPU, and on KIND_GPU the
    python backend's plus one per backend in ``gpu_backends`` that can be written here. Returns
    the models and, per backend left out, why."""
    from .backends import PLATFORMS
    from .tensors import TensorSpec
    from .triton_config import build_model_config, to_pbtxt

    models = [TinyModel(CPU_MODEL, "python", "KIND_CPU", "x", "y")]
    left_out: dict[str, str] = {}
    for backend in ["python", *[b for b in gpu_backends if b != "python"]]:
        model = TinyModel(f"preflight_gpu_{backend}", backend, "KIND_GPU", "x", "y")
        if backend == "pytorch":  # libtorch names tensors by position
            model = TinyModel(model.name, backend, "KIND_GPU", "INPUT__0", "OUTPUT__0")
        if backend in NOT_WRITTEN:
            left_out[backend] = NOT_WRITTEN[backend]
            continue
        if backend in MODEL_WRITERS:
            module = MODEL_WRITERS[backend][0]
            try:
                __import__(module)
            except ImportError:
                left_out[backend] = f"{module} is not importable here to write its model"
                continue
        models.append(model)
    for model in models:
        version = root / model.name / "1"
        version.mkdir(parents=True)
        if model.backend == "python":
            (version / "model.py").write_text(IDENTITY_MODEL_PY)
        else:
            _, filename, write = MODEL_WRITERS[model.backend]
            write(version / filename)
        config = build_model_config(
            name=model.name,
            max_batch_size=8,
            inputs=[TensorSpec(model.input, "float32", (4,))],
            outputs=[TensorSpec(model.output, "float32", (4,))],
            instance_count=1,
            instance_kind=model.kind,
            preferred_batch_sizes=[],
            max_queue_delay_us=0,
            backend="python" if model.backend == "python" else "",
            platform=PLATFORMS.get(model.backend, ""),
        )
        (root / model.name / "config.pbtxt").write_text(to_pbtxt(config))
    return models, left_out


def load_model(server: TritonServer, name: str, timeout_s: float) -> str:
    """Load ``name`` (explicit model control); "" when loaded, else Triton's message."""
    request = urllib.request.Request(
        f"http://{server.http_url}/v2/repository/models/{name}/load", data=b"", method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s):
            return ""
    except urllib.error.HTTPError as exc:
        body = exc.read().decode(errors="replace")
        try:
            message = str(json.loads(body)["error"])
        except (ValueError, KeyError, TypeError):
            return body.strip() or str(exc)
        # Triton's own reason, without the boilerplate that names the model and its version
        return re.sub(LOAD_FAILED_PREFIX, "", message.strip()).rstrip(";")
    except (urllib.error.URLError, OSError) as exc:
        return f"tritonserver did not answer: {exc}"


def serve_once(server: TritonServer, model: TinyModel, timeout_s: float) -> str:
    """Load ``model`` and send it one request; "" when it answered right, else why not."""
    import numpy as np

    from .triton_client import infer_triton

    error = load_model(server, model.name, timeout_s)
    if error:
        return error
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    try:
        out = infer_triton(server.http_url, model.name, {model.input: x}, [model.output])
    except Exception as exc:  # noqa: BLE001 - the client's many error types: this model failed
        return f"inference failed: {type(exc).__name__}: {exc}"
    if not np.array_equal(out[model.output], x):
        return "inference returned other values than it was sent"
    return ""


def full_image_fix(spec: PreflightSpec) -> str:
    return (
        f"use the full NGC tritonserver image (nvcr.io/nvidia/tritonserver:<release>-py3) as "
        f"images.{spec['image']}.from, not a -pyt-python-py3 or -python-py3 variant: those "
        "ship only some backends"
    )


@dataclass
class TritonRun:
    """What the Triton checks share: one server, started once."""

    server: TritonServer | None
    start_error: str
    models: list[TinyModel]
    left_out: dict[str, str]
    cpu_error: str = "not run"
    metadata: dict[str, Any] = field(default_factory=dict)


def check_tritonserver(spec: PreflightSpec, run: TritonRun) -> Check:
    name = "tritonserver"
    if run.server is None:
        return Check(
            name,
            FAIL,
            run.start_error,
            f"run the Triton jobs in an NGC tritonserver image (images.{spec['image']}.from); "
            "the server's own message is above",
        )
    [model] = [m for m in run.models if m.name == CPU_MODEL]
    run.cpu_error = serve_once(run.server, model, float(spec["server"]["startup_timeout_s"]))
    version = run.metadata.get("version")
    if run.cpu_error:
        return Check(
            name,
            FAIL,
            f"tritonserver {version} started, but {CPU_MODEL} (python backend, KIND_CPU): "
            f"{run.cpu_error}",
            "the python backend and its stub must work in the image: " + full_image_fix(spec),
            run.metadata,
        )
    return Check(
        name,
        PASS,
        f"tritonserver {version} loaded {CPU_MODEL} (python backend, KIND_CPU) and served it",
        facts=run.metadata,
    )


def check_tritonserver_gpu(spec: PreflightSpec, run: TritonRun) -> Check:
    name = "tritonserver_gpu"
    if run.server is None:
        return Check(
            name, FAIL, "not run: tritonserver did not start", "see the tritonserver check"
        )
    timeout_s = float(spec["server"]["startup_timeout_s"])
    results = {
        m.backend: serve_once(run.server, m, timeout_s) for m in run.models if m.kind == "KIND_GPU"
    }
    facts = {"served": results, "not_tried": run.left_out}
    parts = [f"{b}: {error or 'served on KIND_GPU'}" for b, error in results.items()]
    parts += [
        f"{b}: not tried ({why}; its library: see backends)" for b, why in run.left_out.items()
    ]
    failed = {b: e for b, e in results.items() if e}
    if not failed:
        return Check(name, PASS, "; ".join(parts), facts=facts)
    fixes = []
    if any("no GPUs are available" in e or "CUDA" in e for e in failed.values()):
        fixes.append(gpu_fix(spec))
    if any("unable to find backend library" in e for e in failed.values()):
        fixes.append(full_image_fix(spec))
    if not fixes:
        fixes.append("see Triton's message (the job's log has the server's log)")
    return Check(name, FAIL, "; ".join(parts), "; ".join(fixes), facts)


def check_backends(spec: PreflightSpec) -> Check:
    from . import tools

    name = "backends"
    if not spec["backends"]:
        return Check(name, SKIP, "no run on this GPU serves with this image")
    try:
        directory = tools.backend_directory() or NGC_BACKEND_DIR
    except ToolNotFound as exc:
        return Check(name, FAIL, str(exc), full_image_fix(spec))
    missing: list[str] = []
    found: list[str] = []
    for backend in spec["backends"]:
        files = [directory / backend / f"libtriton_{backend}.so"]
        if backend == "python":
            files.append(directory / backend / "triton_python_backend_stub")
        absent = [f.name for f in files if not f.is_file()]
        (missing if absent else found).append(
            f"{backend} ({', '.join(absent)})" if absent else backend
        )
    facts = {"directory": str(directory)}
    if missing:
        return Check(
            name,
            FAIL,
            f"missing from {directory}: {', '.join(missing)}"
            + (f"; present: {', '.join(found)}" if found else ""),
            full_image_fix(spec),
            facts,
        )
    return Check(name, PASS, f"{', '.join(found)} in {directory}", facts=facts)


def check_perf_analyzer(spec: PreflightSpec, run: TritonRun, work: Path) -> Check:
    from . import tools

    name = "perf_analyzer"
    fix = (
        f"perf_analyzer comes from the NGC tritonserver -sdk image (images.{spec['image']}.sdk, "
        "copied in by envs/triton.def)"
    )
    try:
        binary = tools.perf_analyzer_binary()
    except ToolNotFound as exc:
        return Check(name, FAIL, str(exc), fix)
    if run.server is None or run.cpu_error:
        return Check(
            name, FAIL, "not run: no model served (see tritonserver)", "see the tritonserver check"
        )
    # HTTP without shared memory: a few requests, and nothing left in /dev/shm.
    cmd = [
        str(binary),
        "-m", CPU_MODEL,
        "-u", run.server.http_url,
        "-i", "http",
        "-b", "1",
        "--concurrency-range", "1:1:1",
        "--measurement-mode", "count_windows",
        "--measurement-request-count", "20",
        "--stability-percentage", "999",
        "--max-trials", "5",
        "-f", str(work / "perf.csv"),
    ]  # fmt: skip
    out = run_command(cmd, PERF_ANALYZER_TIMEOUT_S, tools.perf_analyzer_environment())
    if out.code != 0:
        return Check(
            name,
            FAIL,
            f"perf_analyzer {out.error or f'exit {out.code}'}: {tail(out.text)}",
            f"{fix}; it links libb64.so.0d and libcudart.so.12",
            {"binary": str(binary)},
        )
    match = re.search(r"throughput:\s*([\d.]+)\s*infer/sec", out.text, re.IGNORECASE)
    rate = f"{float(match.group(1)):g} infer/s" if match else "a measurement"
    return Check(
        name, PASS, f"{binary} measured {CPU_MODEL}: {rate}", facts={"binary": str(binary)}
    )


@contextlib.contextmanager
def triton_run(spec: PreflightSpec, work: Path) -> Iterator[TritonRun]:
    """One tritonserver (explicit model control: each model's load is answered on its own) over
    the tiny repository; stopped on the way out whatever happened."""
    from .server import TritonServer

    gpu_backends = spec["backends"] if spec["device"] == "gpu" else []
    models, left_out = write_tiny_repository(work / "repository", gpu_backends)
    settings = spec["server"]
    server = TritonServer(
        work / "repository",
        work / "tritonserver.log",
        startup_timeout_s=float(settings["startup_timeout_s"]),
        shutdown_timeout_s=float(settings["shutdown_timeout_s"]),
        extra_args=("--model-control-mode=explicit",),
    )
    run = TritonRun(server, "", models, left_out)
    try:
        server.start()
    except (ServerError, ToolNotFound) as exc:  # the checks report it
        run.server, run.start_error = None, str(exc)
    try:
        if run.server is not None:
            with contextlib.suppress(OSError, ValueError):
                meta = server.metadata()
                run.metadata = {k: meta.get(k) for k in ("name", "version", "extensions")}
        yield run
    finally:
        server.stop()


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


# ---------------------------------------------------------------------------- trtexec


def check_trtexec(spec: PreflightSpec) -> Check:
    from .trt_version import parse_banner, parse_trt_version, same_release

    name = "trtexec"
    if not spec["trtexec_flags"]:
        return Check(name, SKIP, "no run on this GPU converts with TensorRT in this image")
    exe = shutil.which("trtexec")
    if exe is None:
        if NGC_TRTEXEC.is_file():
            return Check(
                name,
                FAIL,
                f"trtexec is at {NGC_TRTEXEC} but not on PATH",
                f"put {NGC_TRTEXEC.parent} on PATH in the image (%environment of its definition, "
                f"images.{spec['image']}.definition)",
            )
        return Check(
            name,
            FAIL,
            "trtexec is not on PATH",
            "convert with TensorRT in an NGC image that ships it (nvcr.io/nvidia/pytorch or "
            f"tensorrt; images.{spec['image']}.from)",
        )
    out = run_command([exe, "--help"], TRTEXEC_TIMEOUT_S)
    version = parse_trt_version(out.text)
    missing = [
        flag
        for flag in spec["trtexec_flags"]
        if not re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", out.text)
    ]
    facts = {"trtexec": exe, "tensorrt": ".".join(map(str, version)) if version else None}
    if out.error or version is None:
        return Check(
            name,
            FAIL,
            f"`trtexec --help` gave no TensorRT version ({out.error or f'exit {out.code}'}): "
            f"{tail(out.text, 3)}",
            f"check TensorRT's installation in the image (images.{spec['image']}.from)",
            facts,
        )
    if missing:
        return Check(
            name,
            FAIL,
            f"TensorRT {facts['tensorrt']}'s trtexec lacks {', '.join(missing)}",
            "the convert step needs TensorRT 8.4 or later: use a newer NGC release "
            f"(images.{spec['image']}.from)",
            facts,
        )
    # a plan loads only in the TensorRT that built it: this trtexec's must be the image's
    release = parse_banner(out.text) or str(facts["tensorrt"])
    wanted = (spec["release"] or {}).get("tensorrt")
    facts["tensorrt_release"] = release
    facts["recorded"] = wanted
    if wanted and not same_release(release, str(wanted)):
        return Check(
            name,
            FAIL,
            f"trtexec ({exe}) is TensorRT {release}, but images.{spec['image']}.release.tensorrt "
            f"is {wanted}: its plans would load only in TensorRT {release}, not in the serving "
            "image's recorded one",
            f"convert in an image that ships TensorRT {wanted} (images.{spec['image']}.from), or "
            f"record the version the image really ships as images.{spec['image']}.release"
            ".tensorrt (and serve with an image that ships it)",
            facts,
        )
    compared = (
        f"; images.{spec['image']}.release.tensorrt {wanted}"
        if wanted
        else f"; images.{spec['image']}.release.tensorrt is not recorded: not compared"
    )
    return Check(
        name,
        PASS,
        f"TensorRT {release} ({exe}) has {', '.join(spec['trtexec_flags'])}{compared}",
        facts=facts,
    )


# ---------------------------------------------------------------------------- TensorRT version


def check_tensorrt_version(spec: PreflightSpec) -> Check:
    """The TensorRT this image really builds engines with (framework role: TF-TRT's; trtexec's
    is the trtexec check's) or loads them with (triton role: the libnvinfer Triton's tensorrt
    backend links, and the one the tensorflow backend's TF-TRT loads), against
    ``images.<image>.release.tensorrt``: the version the DAG matched the run's other image to."""
    from . import tools
    from .trt_version import (
        ENGINE_BACKENDS,
        TF_TRT_PROBE,
        backend_tensorrt,
        parts,
        run_probe,
        same_release,
    )

    name = "tensorrt_version"
    engines = list(spec.get("tensorrt_engines") or [])
    if spec["role"] == "framework" and "tensorrt" in engines:
        engines.remove("tensorrt")
        if not engines:
            return Check(name, SKIP, "trtexec builds this image's engines: see the trtexec check")
    if not engines:
        return Check(name, SKIP, "no run on this GPU builds or loads a TensorRT engine here")
    image = spec["image"]
    where = f"images.{image}.release.tensorrt"
    wanted = (spec["release"] or {}).get("tensorrt")
    if not wanted:
        return Check(
            name,
            FAIL,
            f"{where} is not recorded: nothing to compare the image's TensorRT with",
            f"record the TensorRT version the image's NGC release notes list as {where}",
        )
    wanted = str(wanted)
    found: dict[str, dict[str, Any]] = {}  # what was read -> version, how, error
    if spec["role"] == "framework":  # TF-TRT (tf.experimental.tensorrt) builds them
        info = run_probe(TF_TRT_PROBE)
        found["TF-TRT"] = {
            "version": info.get("loaded"),
            "how": f"the TensorRT it loads; built against {info.get('linked')}",
            "error": info.get("error", ""),
        }
        unread_fix = f"TF-TRT needs NVIDIA's TensorFlow build (images.{image}.from)"
    else:
        try:
            directory = tools.backend_directory() or NGC_BACKEND_DIR
        except ToolNotFound as exc:
            return Check(name, FAIL, str(exc), full_image_fix(spec))
        for engine in engines:
            backend = ENGINE_BACKENDS[engine]
            library = backend_tensorrt(directory, backend, parts(wanted)[0])
            found[f"{backend} backend"] = {
                "version": library.version,
                "how": library.how,
                "library": None if library.path is None else str(library.path),
                "error": library.error,
            }
        unread_fix = "the backends must load the image's TensorRT: " + full_image_fix(spec)
    facts = {"recorded": wanted, "found": found}
    read = [
        f"{what}: TensorRT {f['version']} ({f['how']})" for what, f in found.items() if f["version"]
    ]
    other = [
        f"{what} is TensorRT {f['version']}, but {where} is {wanted}"
        for what, f in found.items()
        if f["version"] and not same_release(str(f["version"]), wanted)
    ]
    unread = [
        f"{what}: its TensorRT could not be read ({f['error'] or 'no version'})"
        for what, f in found.items()
        if not f["version"]
    ]
    if other or unread:
        fixes = []
        if other:
            fixes.append(
                f"an engine built with TensorRT {wanted} (what the run's other image records) "
                f"would not load here: record what the image really ships as {where} (the DAG "
                "then refuses the runs whose other image differs), or use an image that ships "
                f"{wanted} (images.{image}.from)"
            )
        if unread:
            fixes.append(unread_fix)
        return Check(name, FAIL, "; ".join(other + unread + read), "; ".join(fixes), facts)
    return Check(name, PASS, f"{'; '.join(read)}; {where} {wanted}", facts=facts)


# ---------------------------------------------------------------------------- deploybench

IMPORTS_PROBE = textwrap.dedent(
    """
    import importlib, importlib.metadata, json, sys
    result = {"errors": {}}
    for name in sys.argv[1:]:
        try:
            importlib.import_module(name)
        except Exception as exc:
            result["errors"][name] = f"{type(exc).__name__}: {exc}"
    module = sys.modules.get("deploybench")
    result["file"] = getattr(module, "__file__", None)
    try:
        result["version"] = importlib.metadata.version("deploybench")
    except importlib.metadata.PackageNotFoundError:
        result["version"] = None
    print("PREFLIGHT " + json.dumps(result))
    """
)


def check_image(spec: PreflightSpec) -> Check:
    """Which image the job runs in, and its digest: the workflow's build (with its record) or a
    prebuilt one (``images.<image>.image``), named the same way as in every result's
    provenance."""
    name = "image"
    info = running_image()
    if info["image"] is None:
        return Check(name, SKIP, "not in a container (native venv)", facts=info)
    origin = "built by rule container_image" if "record" in info else "prebuilt, used as is"
    digest = info.get("sha256")
    where = f"sha256 {digest}" if digest else "no digest (not a file)"
    return Check(name, PASS, f"{info['image']} ({origin}), {where}", facts=info)


def check_deploybench_imports(spec: PreflightSpec) -> Check:
    name = "deploybench_imports"
    modules = ["deploybench", *spec["modules"]]
    info, why = python_probe(IMPORTS_PROBE, modules, IMPORTS_TIMEOUT_S)
    if not info:
        return Check(name, FAIL, f"the import probe failed: {why}", "see the job's log")
    where = f"deploybench {info['version'] or '(not installed)'} from {info['file']}"
    facts = {"modules": modules, "file": info["file"], "version": info["version"]}
    if info["errors"]:
        failed = "; ".join(f"{m}: {e}" for m, e in info["errors"].items())
        fix = (
            "run the job from the workflow's directory (it is bound into the container) or put "
            "deploybench's source on PYTHONPATH"
            if "deploybench" in info["errors"]
            else f"install what is missing in the image (images.{spec['image']}.requirements "
            "and its lock)"
        )
        return Check(name, FAIL, f"{failed} ({where})", fix, facts)
    return Check(name, PASS, f"{len(modules)} modules import; {where}", facts=facts)


# ---------------------------------------------------------------------------- all of them


def applies(spec: PreflightSpec, name: str) -> str:
    """Why check ``name`` does not apply to ``spec`` ("" when it does)."""
    if spec["device"] == "cpu" and name in (
        "gpu_visible",
        "framework_cuda",
        "driver",
        "tritonserver_gpu",
    ):
        return f"gpu {spec['gpu']} runs on CPU"
    if spec["role"] == "framework" and name in (
        "tritonserver",
        "tritonserver_gpu",
        "backends",
        "perf_analyzer",
    ):
        return f"image {spec['image']} runs framework jobs, not Triton"
    return ""


def _guarded(name: str, check: Callable[[], Check]) -> Check:
    """A check's result; one that raises fails with the error, and the next still runs."""
    try:
        return check()
    except Exception as exc:  # any error is this check's failure, never the job's end
        log.exception("check %s raised", name)
        return Check(
            name, FAIL, f"the check raised {type(exc).__name__}: {exc}", "see the job's log"
        )


def run_checks(spec: PreflightSpec) -> list[Check]:
    """Every check, in :data:`CHECKS` order (those that do not apply: skipped)."""
    check_spec(spec)
    probe = GpuProbe([], "")
    if spec["device"] == "gpu":
        try:
            probe = probe_gpus()
        except Exception as exc:  # noqa: BLE001 - the GPU checks report it
            probe = GpuProbe([], f"probing the GPUs raised {type(exc).__name__}: {exc}")
    done: dict[str, Check] = {}

    def add(name: str, check: Callable[[], Check]) -> None:
        why_not = applies(spec, name)
        done[name] = Check(name, SKIP, why_not) if why_not else _guarded(name, check)

    add("image", lambda: check_image(spec))
    add("gpu_visible", lambda: check_gpu_visible(spec, probe))
    add("framework_cuda", lambda: check_framework_cuda(spec, probe))
    add("driver", lambda: check_driver(spec, probe))
    with tempfile.TemporaryDirectory(prefix="deploybench-preflight-") as tmp:
        work = Path(tmp)
        if spec["role"] == "triton":
            try:
                with triton_run(spec, work) as run:
                    add("tritonserver", lambda: check_tritonserver(spec, run))
                    add("tritonserver_gpu", lambda: check_tritonserver_gpu(spec, run))
                    add("perf_analyzer", lambda: check_perf_analyzer(spec, run, work))
            except Exception as exc:  # writing the repository or stopping the server
                log.exception("the tiny Triton repository or its server failed")
                error = f"{type(exc).__name__}: {exc}"
                for name in ("tritonserver", "tritonserver_gpu", "perf_analyzer"):
                    if name not in done:  # those that ran keep their result
                        add(name, functools.partial(Check, name, FAIL, error, "see the job's log"))
            if any(done[n].status == FAIL for n in ("tritonserver", "tritonserver_gpu")):
                # the server's log goes with the temp dir: keep its end in the job's log
                log.info("tritonserver log (end):\n%s", tail(_read(work / "tritonserver.log"), 40))
        else:
            for name in ("tritonserver", "tritonserver_gpu", "perf_analyzer"):
                done[name] = Check(name, SKIP, applies(spec, name))
    add("backends", lambda: check_backends(spec))
    add("trtexec", lambda: check_trtexec(spec))
    add("tensorrt_version", lambda: check_tensorrt_version(spec))
    add("deploybench_imports", lambda: check_deploybench_imports(spec))
    return [done[name] for name in CHECKS]


def table(checks: Sequence[Check]) -> str:
    """One line per check: status, name, detail, and for a failure its fix."""
    lines = []
    for c in checks:
        detail = " ".join(c.detail.split())  # one line, whatever Triton's message spans
        fix = f"  fix: {c.fix}" if c.status in (FAIL, WARN) and c.fix else ""
        lines.append(f"{c.status.upper():<4}  {c.name:<19}  {detail}{fix}")
    return "\n".join(lines)


def failure_message(spec: PreflightSpec, checks: Sequence[Check]) -> str:
    failed = [c for c in checks if c.status == FAIL]
    lines = [
        (
            f"preflight of image {spec['image']} on gpu {spec['gpu']} ({spec['gpu_name']}): "
            f"{len(failed)} check(s) failed"
        )
    ]
    for c in failed:
        lines.append(f"- {c.name}: {' '.join(c.detail.split())}")
        lines.append(f"  fix: {c.fix}")
    return "\n".join(lines)


def raise_on_failure(spec: PreflightSpec, checks: Sequence[Check]) -> None:
    if any(c.status == FAIL for c in checks):
        raise PreflightError(failure_message(spec, checks))
