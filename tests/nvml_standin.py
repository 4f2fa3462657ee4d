"""The stand-in libnvidia-ml.so.1 (tests/fixtures/fake_libnvidia_ml.c), compiled for a test.

    library = build_fake_nvml(tmp_dir)   # -> tmp_dir / "libnvidia-ml.so.1", compiled once
    open_meter("nvml", nvml_library=str(library))

Its energy counter advances at FAKE_NVML_POWER_MW (default 150000 mW, so 150 W) of the
monotonic clock; the C file lists every FAKE_NVML_* setting, read at each call (set them in
the environment of the process that loads it). Raises pytest's skip where there is no C
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
UUID = "GPU-00000000-fake-nvml-0000-000000000000"
NAME = "Stand-in NVML GPU"
POWER_MW = 150_000
LIMIT_MW = 350_000

_lock = threading.Lock()


def build_fake_nvml(tmp_dir: Path, *, old_driver: bool = False) -> Path:
    """``tmp_dir``/libnvidia-ml.so.1 compiled from the stand-in (once per path: a library
    already there is reused). ``old_driver``: without the calls drivers before 535 lack
    (nvmlDeviceGetCurrentClocksEventReasons, nvmlDeviceGetMigMode)."""
    import pytest

    library = Path(tmp_dir) / LIBRARY
    with _lock:
        if library.exists():
            return library
        compiler = shutil.which("gcc") or shutil.which("cc")
        if compiler is None:
            if os.environ.get("CI") == "true":
                pytest.fail("no C compiler: envs/test-packages.sh installs gcc")
            pytest.skip("no C compiler (gcc) to build the stand-in libnvidia-ml.so.1")
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
