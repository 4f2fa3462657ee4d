"""The python-backend model answers when its stub's Python has NumPy 2, as a GPU image's has.

pytriton 0.7.0's python backend is built with pybind11 2.10, which misreads NumPy 2's dtypes:
on a lent H100 (NumPy 2.5) every answer came back with 0 output bytes
(benchmarks/gpu/results/2026-11-26-H100_SXM/triton-python-gpu/). The same failure shows on
this CPU when the stub imports NumPy 2, so it is tested here: a venv whose own NumPy is 2.x,
the workflow's venv behind it (a ``.pth``), runs ``benchmarks/gpu/triton_python_gpu.py`` on the
CPU entry (the ``numpy2_python`` fixture).
"""

from __future__ import annotations

import json
import subprocess

from tests.conftest import REPO


def test_the_served_model_answers_correctly_under_numpy_2(numpy2_python, tmp_path):
    probe = subprocess.run(
        [str(numpy2_python), "-c", "import numpy, torch; print(numpy.__version__)"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert probe.stdout.startswith("2."), probe.stdout
    out = tmp_path / "out"
    run = subprocess.run(
        [
            str(numpy2_python),
            "benchmarks/gpu/triton_python_gpu.py",
            "--out",
            str(out),
            "--gpu",
            "cpu",
            "--precisions",
            "fp32",
            "--requests",
            "3",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    results = json.loads((out / "triton_python_gpu.json").read_text())
    assert [r["precision"] for r in results] == ["fp32"]  # as asked: fp32 only
    (result,) = results
    assert result["passed"], result
    assert result["accuracy"] and all(o["passed"] for o in result["accuracy"]), result
    # NumPy 2's report of each capsule the stub consumed stays out of the server's log: it was
    # a traceback per output per request, written while serving (triton_model.py's
    # USED_CAPSULE_REPORT; that module imports only inside the stub)
    assert "PyCapsule_GetPointer" not in (out / "server-fp32.log").read_text()
