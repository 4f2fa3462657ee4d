"""Preflight: what the runs on one GPU need of one image, checked where those runs will run.

``snakemake preflight`` (rules/preflight.smk) runs one job per GPU and image, in that image on
that GPU's partition; the job (``jobs.preflight``) calls :func:`run_checks`. Every check runs
(a failed one does not hide the next), and each failure names the missing piece and its fix,
so that one job on a new cluster lists everything to change before the runs can work.

Checks (names are stable: the rules' tests and the README use them): ``gpu_visible``,
``framework_cuda``, ``driver``, ``tritonserver``, ``tritonserver_gpu``, ``backends``,
``perf_analyzer``, ``trtexec``, ``tensorrt_version``, ``deploybench_imports``,
``model_networks``, ``energy``. One that does
not apply to the spec (a GPU check on the CPU default, a Triton check in a framework image) is
skipped.

One module per family of checks: the GPU and its driver (:mod:`.gpu`), the frameworks' CUDA
(:mod:`.frameworks`), Triton and its tiny repository (:mod:`.triton`), TensorRT (:mod:`.tensorrt`),
the image and its imports (:mod:`.image`), the models' networks (:mod:`.networks`), what the
measurements will meter (:mod:`.energy`); the spec and a check's result (:mod:`.spec`), the run of
them all (:mod:`.runner`) and the report (:mod:`.report`). This package exposes what the job
calls (``jobs.preflight``).
"""

from .report import raise_on_failure, table
from .runner import run_checks
from .spec import CHECKS, FAIL, PASS, SKIP, WARN, Check, PreflightSpec

__all__ = [
    "CHECKS",
    "FAIL",
    "PASS",
    "SKIP",
    "WARN",
    "Check",
    "PreflightSpec",
    "raise_on_failure",
    "run_checks",
    "table",
]
