"""The stand-in libnvidia-ml.so.1 (tests/fixtures/fake_libnvidia_ml.c), compiled for a test.

    library = build_fake_nvml(tmp_dir)   # -> tmp_dir / "libnvidia-ml.so.1", compiled once
    open_meter("nvml", nvml_library=str(library))

Its energy counter advances at FAKE_NVML_POWER_MW (default 150000 mW, so 150 W) of the
monotonic clock; the C file lists every FAKE_NVML_* setting, read at each call (set them in
the environment of the process that loads it), among them a node of FAKE_NVML_GPUS GPUs
(:func:`gpu_uuid`) of which the job may open FAKE_NVML_ALLOWED. The stand-in libcuda.so.1
(:func:`build_fake_libcuda`) names CUDA's devices by UUID as the driver API does. Raises pytest's skip where there is no C
compiler, and fails in CI (``CI=true``: envs/test-packages.sh installs gcc).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
from pathlib import Path

SOURCE = Path(__file__).parent / "fixtures" / "fake_libnvidia_ml.c"
LIBRARY = "libnvidia-ml.so.1"
UUID = "GPU-00000000-fake-nvml-0000-000000000000"  # the one GPU's, FAKE_NVML_GPUS unset
CUDA_SOURCE = Path(__file__).parent / "fixtures" / "fake_libcuda.c"
NAME = "Stand-in NVML GPU"
POWER_MW = 150_000
LIMIT_MW = 350_000

_lock = threading.Lock()


def gpu_uuid(index: int) -> str:
    """The UUID of the stand-in's GPU ``index`` (NVML's, PCI order) with FAKE_NVML_GPUS set."""
    return f"GPU-fa4e{index:04x}-0000-4000-8000-{index:012x}"


def mig_uuid(index: int) -> str:
    """The UUID of the MIG device on GPU ``index`` (FAKE_NVML_MIG=1)."""
    return f"MIG-fa4e{index:04x}-0000-4000-9000-{index:012x}"


def _compiler() -> str:
    import pytest

    compiler = shutil.which("gcc") or shutil.which("cc")
    if compiler is None:
        if os.environ.get("CI") == "true":
            pytest.fail("no C compiler: envs/test-packages.sh installs gcc")
        pytest.skip("no C compiler (gcc) to build the stand-in libraries")
    return compiler


def build_fake_libcuda(tmp_dir: Path) -> Path:
    """``tmp_dir``/libcuda.so.1 compiled from tests/fixtures/fake_libcuda.c (once per path):
    the devices a process may open are FAKE_CUDA_UUIDS, selected by its CUDA_VISIBLE_DEVICES."""
    library = Path(tmp_dir) / "libcuda.so.1"
    with _lock:
        if library.exists():
            return library
        library.parent.mkdir(parents=True, exist_ok=True)
        partial = library.with_suffix(".partial")
        subprocess.run(
            [_compiler(), "-shared", "-fPIC", "-O2", "-Wall", "-o", str(partial), str(CUDA_SOURCE)],
            check=True,
            capture_output=True,
        )
        partial.replace(library)
    return library


def build_fake_nvml(tmp_dir: Path, *, old_driver: bool = False) -> Path:
    """``tmp_dir``/libnvidia-ml.so.1 compiled from the stand-in (once per path: a library
    already there is reused). ``old_driver``: without the calls drivers before 535 lack
    (nvmlDeviceGetCurrentClocksEventReasons, nvmlDeviceGetMigMode)."""
    library = Path(tmp_dir) / LIBRARY
    with _lock:
        if library.exists():
            return library
        compiler = _compiler()
        library.parent.mkdir(parents=True, exist_ok=True)
        partial = library.with_suffix(".partial")
        defines = ["-DFAKE_NVML_OLD_DRIVER"] if old_driver else []
        subprocess.run(
            [
                compiler,
                "-shared",
                "-fPIC",
                "-O2",
                "-Wall",
                *defines,
                "-o",
                str(partial),
                str(SOURCE),
            ],
            check=True,
            capture_output=True,
        )
        partial.replace(library)  # whole or not at all: another process may be loading it
    return library
