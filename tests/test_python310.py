"""The jobs' code on the V100 images' Python: NGC 24.09 runs Python 3.10 (images.<i>.release
.python), while the driver (Snakemake 9) needs 3.11 or later.

What runs inside a job must run on 3.10. This is checked on another interpreter with only the image's
packages: the stand-in of image ``triton-24.09`` (tests/standin_image.py). It has this machine's
pyenv 3.10, the lock's entries that install there (no torch: no CPU wheel for 3.10 here), and
``/opt/tritonserver`` with its 3.10 python-backend stub and perf_analyzer. The test harness
(pytest and what the suite's conftest imports) is put beside it on ``PYTHONPATH``, never into it.
The driver's venv is never on the path.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from deploybench import images
from tests import standin_image
from tests.conftest import REPO
from tests.test_containers import standin_cannot_isolate

IMAGE = "triton-24.09"
# The suite's tests of code that jobs run, which need no torch, TensorFlow or Snakemake: the
# server's start, readiness and stop with a real tritonserver and python backend (test_server);
# the perf_analyzer command line, measurement loop, statistics and repository writing
# (test_units, test_trials); the job's import confinement (test_import_paths); the job's process
# handling (test_process); the lock installer the definitions run (test_install_lock).
JOB_SIDE_TESTS = (
    "tests/test_server.py",
    "tests/test_units.py",
    "tests/test_trials.py",
    "tests/test_import_paths.py",
    "tests/test_process.py",
    "tests/test_install_lock.py",
)
# What the harness adds, at the driver's versions (pytest's own dependencies follow).
HARNESS = ("pytest", "pytest-timeout", "psutil", "packaging")
# Modules a job never imports from the image's packages: the python backend's own module (the
# stub provides it at run time) and the charts' libraries (plots run in the driver).
NOT_IN_IMAGES = {"triton_python_backend_utils", "altair", "vl_convert"}


def build_image(sif: Path) -> Path:
    """The stand-in ``apptainer build`` of image ``triton-24.09`` as rule container_image asks
    for it, written to ``sif``; returns its environment (made once, cached)."""
    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    image = images.in_source_tree(config["images"][IMAGE], REPO)
    assert image["release"]["python"] == "3.10"
    args = dict(arg.split("=", 1) for arg in images.build_args(image))
    sif.parent.mkdir(parents=True, exist_ok=True)
    standin_image.build(Path(image["definition"]), args, sif)
    return Path(json.loads(sif.read_text())["env"])


@pytest.fixture(scope="module")
def image_env() -> Path:
    """The stand-in environment of image ``triton-24.09`` (built once, cached)."""
    python = standin_image.OTHER_PYTHONS["3.10"]
    assert Path(python).exists(), f"{python}: the V100 images' Python (pyenv 3.10) is needed"
    return build_image(standin_image.cache_dir() / f"{IMAGE}.test.sif")


@pytest.fixture(scope="module")
def harness(image_env: Path) -> Path:
    """pytest and what conftest imports, for that Python, in a folder of their own."""
    pins = [f"{name}=={importlib.metadata.version(name)}" for name in HARNESS]
    target = standin_image.cache_dir() / ("harness-310-" + "-".join(pins).replace("==", "_"))
    if not (target / ".complete").exists():
        subprocess.run(
            [sys.executable, "-m", "pip", "--python", str(image_env / "bin" / "python"),
             "install", "-q", "--disable-pip-version-check", "--target", str(target), *pins],
            check=True,
        )  # fmt: skip
        (target / ".complete").touch()
    return target


def image_environment(image_env: Path, *path: Path) -> dict[str, str]:
    """An environment as the image's: its tritonserver and perf_analyzer, nothing of the
    driver's venv on PATH or PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "VIRTUAL_ENV"))}
    driver_bin = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join(
        [str(image_env / "bin")] + [p for p in env["PATH"].split(os.pathsep) if p != driver_bin]
    )
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in (REPO, *path))
    opt = image_env / "opt" / "tritonserver"
    env["DEPLOYBENCH_TRITON_ROOT"] = str(opt)
    env["DEPLOYBENCH_PERF_ANALYZER"] = str(image_env / "bin" / "perf_analyzer")
    env["LD_LIBRARY_PATH"] = str(opt / "lib")  # the stub's CUDA runtime, as in the image
    return env


def test_every_module_a_job_may_import_imports_on_python_310(image_env: Path):
    skipped = json.loads((image_env / "standin.json").read_text())["skipped"]
    absent = {entry.split("==")[0] for entry in skipped} | NOT_IN_IMAGES
    script = """
import importlib, json, pkgutil, sys
import deploybench
failed = {}
for module in pkgutil.walk_packages(deploybench.__path__, "deploybench."):
    try:
        importlib.import_module(module.name)
    except ModuleNotFoundError as error:
        failed[module.name] = error.name.split(".")[0]
    except Exception as error:
        failed[module.name] = f"{type(error).__name__}: {error}"
print(json.dumps({"python": sys.version.split()[0], "failed": failed}))
"""
    out = subprocess.run(
        [str(image_env / "bin" / "python"), "-c", script],
        env=image_environment(image_env), capture_output=True, text=True, check=True,
    )  # fmt: skip
    result = json.loads(out.stdout)
    assert result["python"].startswith("3.10."), result
    # a module fails only for a package the stand-in lacks (torch) or no image holds
    wrong = {m: why for m, why in result["failed"].items() if why not in absent}
    assert not wrong, wrong
    assert result["failed"], "the stand-in was expected to lack torch"


def test_the_job_side_tests_pass_on_python_310(image_env: Path, harness: Path, tmp_path: Path):
    result = subprocess.run(
        [str(image_env / "bin" / "python"), "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "--basetemp", str(tmp_path / "inner"), *JOB_SIDE_TESTS],
        cwd=REPO, env=image_environment(image_env, harness), check=False,
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-6000:]
    assert " passed" in out and "skipped" not in out, out[-3000:]


def test_snakemakes_script_preamble_runs_in_a_python_310_image(image_env: Path, tmp_path: Path):
    """A rule's `script:` in the image: Snakemake's preamble (which imports `snakemake` from
    the driver's site-packages, a 3.11 install) and the job's imports under the image's 3.10,
    through the stand-in `apptainer exec`."""
    if reason := standin_cannot_isolate():
        pytest.skip(reason)
    assert build_image(tmp_path / "images" / "volta.sif") == image_env
    (tmp_path / "probe.py").write_text(
        "import sys\n"
        "from deploybench import import_paths, perf  # a job's first imports\n"
        "import_paths.confine_to_image()\n"
        "open(snakemake.output[0], 'w').write(sys.version.split()[0] + ' ' + sys.executable)\n"
    )
    (tmp_path / "Snakefile").write_text(
        'rule probe:\n    output: "out.txt"\n    container: "images/volta.sif"\n'
        '    script: "probe.py"\n'
    )
    env = {
        **os.environ,
        "PATH": os.pathsep.join([str(REPO / "tests" / "bin"), str(Path(sys.executable).parent),
                                 os.environ["PATH"]]),
        "PYTHONPATH": str(REPO),
    }  # fmt: skip
    result = subprocess.run(
        [str(Path(sys.executable).parent / "snakemake"), "-c1", "--sdm", "apptainer",
         "--apptainer-args", f"--bind {REPO}:{REPO}:ro --env PYTHONPATH={REPO}"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    version, executable = (tmp_path / "out.txt").read_text().split()
    assert version.startswith("3.10."), version
    assert executable.startswith(str(image_env)), executable
