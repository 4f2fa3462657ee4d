"""Where the external programs are, and the environment each needs.

On the embedded default, ``tritonserver`` and its python backend come from the ``nvidia-pytriton``
wheel and ``perf_analyzer`` from ``tritonclient==2.41.0``'s manylinux wheel (installed into
``<venv>/perf-analyzer``). In an NGC container both are on ``PATH``. ``DEPLOYBENCH_TRITONSERVER``
and ``DEPLOYBENCH_PERF_ANALYZER`` override either; ``DEPLOYBENCH_TRITON_ROOT`` names a folder laid
out as pytriton's ``tritonserver`` (``bin/``, ``backends/``, ``python_backend_stubs/``) without
the pytriton package (the GPU kit's, benchmarks/gpu/kit/).
"""

from __future__ import annotations

import os
import shutil
import sys
import sysconfig
from pathlib import Path

from .errors import ToolNotFound


def _pytriton_root() -> Path | None:
    unpacked = os.environ.get("DEPLOYBENCH_TRITON_ROOT")
    if unpacked:
        root = Path(unpacked)
        if not (root / "bin" / "tritonserver").is_file():
            raise ToolNotFound(
                f"DEPLOYBENCH_TRITON_ROOT={unpacked}: no bin/tritonserver there (expected "
                "pytriton's tritonserver folder: bin/, backends/, python_backend_stubs/)"
            )
        return root
    try:
        import pytriton  # optional: absent in NGC containers
    except ImportError:
        return None
    root = Path(pytriton.__file__).parent / "tritonserver"
    return root if root.is_dir() else None


def tritonserver_binary() -> Path:
    override = os.environ.get("DEPLOYBENCH_TRITONSERVER")
    if override:
        return Path(override)
    root = _pytriton_root()
    if root and (root / "bin" / "tritonserver").exists():
        return root / "bin" / "tritonserver"
    found = shutil.which("tritonserver")
    if found:
        return Path(found)
    raise ToolNotFound(
        "tritonserver not found: install nvidia-pytriton==0.7.0 (see docs/index.md) or run in an NGC "
        "tritonserver image, or set DEPLOYBENCH_TRITONSERVER"
    )


def backend_directory() -> Path | None:
    """pytriton's backend folder, with the python-backend stub for this Python in place.

    pytriton ships one stub per Python version beside the backend; Triton looks for it next to
    ``libtriton_python.so``, so it is copied there once (idempotent).
    """
    root = _pytriton_root()
    if root is None:
        return None  # an NGC image: tritonserver knows its own backends
    backends = root / "backends"
    stub = backends / "python" / "triton_python_backend_stub"
    if not stub.exists():
        version = f"{sys.version_info.major}.{sys.version_info.minor}"
        source = root / "python_backend_stubs" / version / "triton_python_backend_stub"
        if not source.exists():
            raise ToolNotFound(f"pytriton ships no python-backend stub for Python {version}")
        tmp = stub.with_suffix(".tmp")
        shutil.copy2(source, tmp)
        tmp.replace(stub)
    return backends


def server_environment() -> dict[str, str]:
    """The server's environment: this venv first on PATH (the stub imports its numpy and
    runtimes) and this Python's libpython first on LD_LIBRARY_PATH (else the stub may load the
    system's libpython3.11 and fail at model load)."""
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    libdir = sysconfig.get_config_var("LIBDIR")
    env["LD_LIBRARY_PATH"] = os.pathsep.join(
        p for p in [libdir, env.get("LD_LIBRARY_PATH", "")] if p
    )
    return env


def perf_analyzer_binary() -> Path:
    override = os.environ.get("DEPLOYBENCH_PERF_ANALYZER")
    if override:
        return Path(override)
    bundled = Path(sys.prefix) / "perf-analyzer" / "bin" / "perf_analyzer"
    if bundled.exists():
        return bundled
    found = shutil.which("perf_analyzer")
    if found:
        return Path(found)
    raise ToolNotFound(
        "perf_analyzer not found: install tritonclient==2.41.0 into <venv>/perf-analyzer "
        "(see docs/index.md), run in an NGC tritonserver -sdk image, or set DEPLOYBENCH_PERF_ANALYZER"
    )


def perf_analyzer_environment() -> dict[str, str]:
    """perf_analyzer links libcudart.so.12 (even without a GPU) and libb64.so.0d: the PyPI CUDA
    runtime has the first, Debian the second; a ``lib/`` beside its ``bin/`` (the GPU kit's)
    has both."""
    env = dict(os.environ)
    extra = []
    beside = perf_analyzer_binary().parent.parent / "lib"
    if (beside / "libcudart.so.12").exists():
        extra.append(str(beside))
    try:
        import nvidia.cuda_runtime  # optional: only the CPU venv has it

        extra.append(str(Path(next(iter(nvidia.cuda_runtime.__path__))) / "lib"))
    except ImportError:
        pass
    env["LD_LIBRARY_PATH"] = os.pathsep.join(
        p for p in [*extra, env.get("LD_LIBRARY_PATH", "")] if p
    )
    return env
