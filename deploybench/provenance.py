"""Provenance sidecars: what produced a result (software, image, hardware, config, commit)."""

from __future__ import annotations

import datetime as dt
import importlib.metadata
import json
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from .errors import ArtifactChanged
from .io import sha256_of

PACKAGES = (
    "deploybench",
    "torch",
    "onnx",
    "onnxruntime",
    "numpy",
    "snakemake",
    "tritonclient",
    "nvidia-pytriton",
)


def package_versions(names: tuple[str, ...] = PACKAGES) -> dict[str, str | None]:
    """Installed versions of ``names`` (None: not installed)."""
    versions: dict[str, str | None] = {}
    for name in names:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def perf_analyzer_version() -> str | None:
    """The tritonclient wheel that shipped the perf_analyzer binary in use."""
    from . import tools

    try:
        binary = tools.perf_analyzer_binary()
    except tools.ToolNotFound:
        return None
    dist = sorted(binary.parent.parent.glob("tritonclient-*.dist-info"))
    # "tritonclient-2.41.0.dist-info": the version between the name and the suffix
    return (
        f"tritonclient {dist[-1].name.removesuffix('.dist-info').split('-')[1]}"
        if dist
        else str(binary)
    )


# The workflow's source tree's git state, as the driver read it (rules/common.smk): a job runs
# in the working directory, which need not be the source tree, and in a container that has no
# git or no view of the tree's .git.
SOURCE_GIT_ENV = "DEPLOYBENCH_SOURCE_GIT"


def source_git_state() -> dict[str, Any]:
    """The git state the driver recorded for the workflow's source tree, else that of the
    tree holding this package."""
    recorded = os.environ.get(SOURCE_GIT_ENV)
    if recorded:
        state: dict[str, Any] = json.loads(recorded)
        return state
    return git_state(Path(__file__).resolve().parent.parent)


def git_state(repo: Path | None = None) -> dict[str, Any]:
    cwd = repo or Path.cwd()
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = bool(
            subprocess.run(
                ["git", "status", "--porcelain", "--untracked-files=no"],
                cwd=cwd,
                capture_output=True,
                text=True,
                check=True,
            ).stdout.strip()
        )
    except (OSError, subprocess.CalledProcessError):
        return {"commit": None, "dirty": None}
    return {"commit": commit, "dirty": dirty}


# The server's environment recorded with every measurement (server_environment): the variables
# that decide how tritonserver and its backends compute, by these names and prefixes, and every
# name the run sets itself (`server.environment`). Nothing else of the job's environment, and no
# name that looks like a credential's, even under these prefixes.
SERVER_ENV_NAMES = frozenset(
    {
        "CUDA_VISIBLE_DEVICES",
        "NVIDIA_VISIBLE_DEVICES",
        "NVIDIA_TF32_OVERRIDE",
        "LD_LIBRARY_PATH",  # which CUDA, cuBLAS, cuDNN and libpython the server loads
        "OMP_NUM_THREADS",
        "MKL_NUM_THREADS",
        "OPENBLAS_NUM_THREADS",
    }
)
SERVER_ENV_PREFIXES = (
    "CUDA_",
    "CUBLAS_",
    "CUBLASLT_",
    "CUDNN_",
    "TORCH_",
    "PYTORCH_",
    "TF_",  # TF_ENABLE_ONEDNN_OPTS, TF_ENABLE_AUTO_MIXED_PRECISION, ...
    "ORT_",
    "OMP_",
    "KMP_",
    "MKL_",
    "TRITON_",
)
_CREDENTIAL = re.compile(r"TOKEN|SECRET|PASSW|CREDENTIAL|KEY|AUTH|COOKIE", re.IGNORECASE)

# TF32, as the server's environment decides it. PyTorch reads TORCH_ALLOW_TF32_CUBLAS_OVERRIDE
# with c10::utils::check_env: "1" allows TF32 in cuBLAS matmuls (fp32 matmul precision HIGH),
# "0" or anything else leaves its default (HIGHEST from PyTorch 1.12). NVIDIA_TF32_OVERRIDE=0
# turns TF32 off in NVIDIA's libraries (cuBLAS, cuDNN) whatever a framework asks for.
TORCH_TF32 = "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE"
NVIDIA_TF32 = "NVIDIA_TF32_OVERRIDE"


def recorded_environment(
    env: Mapping[str, str], configured: Collection[str] = ()
) -> dict[str, str]:
    """Of ``env``, the variables a server's provenance records (SERVER_ENV_NAMES and _PREFIXES,
    and the names in ``configured``, the run's `server.environment`), sorted by name."""
    return {
        name: env[name]
        for name in sorted(env)
        if not _CREDENTIAL.search(name)
        and (name in configured or name in SERVER_ENV_NAMES or name.startswith(SERVER_ENV_PREFIXES))
    }


def tf32_state(env: Mapping[str, str]) -> str:
    """What ``env`` (a server's environment) makes of TF32, in a sentence."""
    torch_allows = env.get(TORCH_TF32) == "1"
    if env.get(NVIDIA_TF32) == "0":
        over = f", over {TORCH_TF32}=1" if torch_allows else ""
        return f"TF32 off in NVIDIA's libraries (cuBLAS, cuDNN) by {NVIDIA_TF32}=0{over}"
    if torch_allows:
        return f"cuBLAS TF32 allowed by {TORCH_TF32}=1 (PyTorch's fp32 matmul precision: high)"
    return "default (no TF32 override in the server's environment: each library's own)"


def server_environment(server: Any) -> dict[str, Any]:
    """A running ``deploybench.server.TritonServer``'s environment as its process has it
    (``/proc/<pid>/environ``, else the Popen env it was started with; ``source`` says which):
    the recorded variables (recorded_environment) and the TF32 state they make."""
    env, source = server.process_environment()
    return {
        "variables": recorded_environment(env, server.environment),
        "tf32": tf32_state(env),
        "source": source,
    }


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _memory_gb() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 1024**2, 1)
    except OSError:
        pass
    return None


def gpus() -> list[str]:
    """Each GPU as nvidia-smi names it: "name, driver version, memory" ([] without one)."""
    if not shutil.which("nvidia-smi"):
        return []
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in out.splitlines() if line.strip()]


def host() -> dict[str, Any]:
    return {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "memory_gb": _memory_gb(),
        "gpus": gpus(),
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
    }


def container() -> dict[str, Any]:
    """The image the job runs in and its digest (see deploybench.images), or the native venv."""
    from .images import running_image

    return running_image()


def collect(result: str, config: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """Everything that describes how ``result`` was produced (``result`` is already written)."""
    return {
        "result": result,
        "sha256": sha256_of(result) if Path(result).exists() else None,
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "python": sys.version.split()[0],
        "software": package_versions(),
        "perf_analyzer": perf_analyzer_version(),
        "git": source_git_state(),
        "host": host(),
        "container": container(),
        "config": config,
        **extra,
    }


def verify(result: str | Path, sidecar: str | Path) -> None:
    """Check ``result`` against the sha256 its sidecar recorded when it was written, so that a
    truncated or corrupt artifact fails here, naming the file, not as a server that cannot load."""
    recorded = json.loads(Path(sidecar).read_text()).get("sha256")
    if recorded is None:
        return  # written before digests were recorded
    actual = sha256_of(result)
    if actual != recorded:
        raise ArtifactChanged(
            f"{result} changed after the job that wrote it (sha256 {actual[:12]}, recorded "
            f"{recorded[:12]} in {sidecar}): it is truncated, corrupt or replaced. Rebuild it with "
            f"`snakemake --forcerun {result} <target>`"
        )
