"""Every check of one preflight job, in :data:`CHECKS` order: each guarded (one that raises fails,
and the next still runs), those that do not apply to the spec skipped."""

from __future__ import annotations

import functools
import logging
import tempfile
from collections.abc import Callable
from pathlib import Path

from ..probe import tail
from .energy import check_energy
from .frameworks import check_framework_cuda
from .gpu import GpuProbe, check_driver, check_gpu_visible, probe_gpus
from .image import check_deploybench_imports, check_image
from .networks import check_model_networks
from .spec import CHECKS, FAIL, SKIP, Check, PreflightSpec, check_spec
from .tensorrt import check_tensorrt_version, check_trtexec
from .triton import (
    check_backends,
    check_perf_analyzer,
    check_tritonserver,
    check_tritonserver_gpu,
    triton_run,
)

log = logging.getLogger(__name__)


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def applies(spec: PreflightSpec, name: str) -> str:
    """Why check ``name`` does not apply to ``spec`` ("" when it does)."""
    if spec["device"] == "cpu" and name in (
        "gpu_visible",
        "framework_cuda",
        "driver",
        "tritonserver_gpu",
        "energy",
    ):
        return f"gpu {spec['gpu']} runs on CPU"
    if spec["role"] == "framework" and name in (
        "tritonserver",
        "tritonserver_gpu",
        "backends",
        "perf_analyzer",
        "energy",
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
    add("model_networks", lambda: check_model_networks(spec))
    add("energy", lambda: check_energy(spec))
    return [done[name] for name in CHECKS]
