"""The login node's driver venv (`make driver` = envs/driver.sh): it plans and submits.

envs/driver.sh itself makes one fresh venv for this module (pip's cache, PyPI); in it the job
frameworks do not import, and the SLURM dry runs of the first run in docs/clusters.md resolve with
the GPU jobs' requests — with no SLURM command on PATH (the dry run needs none) and the test
stand-in `apptainer` (Snakemake asks for one under `--sdm apptainer`, even with `-n`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from deploybench import job_imports
from tests.conftest import REPO, base_config, workflow_rules, write_config
from tests.test_slurm import STANDIN_BIN, job_resources

# What only the jobs import (in their images): none of it may be needed to build the DAG.
JOB_ONLY = ("torch", "tensorflow", "pytriton", "tritonclient", "google.protobuf", "onnx")
# The charts' (drawn by the driver, rules/report.smk): not needed to build the DAG either.
CHARTS = ("altair", "vl_convert")

A30_RUN = "tft/A30/trt/fp16"


@pytest.fixture(scope="module")
def driver(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The driver venv's bin/, made by envs/driver.sh (one per session)."""
    venv = tmp_path_factory.mktemp("driver") / "venv"
    env = {**os.environ, "VENV": str(venv), "PYTHON": sys.executable}
    result = subprocess.run(
        ["bash", str(REPO / "envs" / "driver.sh")],
        env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    assert "driver: snakemake 9." in result.stdout, result.stdout
    return venv / "bin"


def _requirements(path: Path) -> dict[str, str]:
    """Name → its specifier, from a requirements file's lines."""
    lines = (line.split("#")[0].strip() for line in path.read_text().splitlines())
    return {
        m[1].lower(): m[2]
        for line in lines
        if line and (m := re.match(r"([A-Za-z0-9_.\-]+)(?:\[[^]]*\])?(.*)", line))
    }


def test_driver_pins_are_the_full_setups():
    """envs/driver.txt asks for Snakemake as requirements.txt does and for the SLURM plugins as
    constraints.txt pins them, and for nothing the jobs need."""
    envs = REPO / "envs"
    driver = _requirements(envs / "driver.txt")
    full = {**_requirements(envs / "requirements.txt"), **_requirements(envs / "constraints.txt")}
    assert set(driver) == {
        "snakemake", "snakemake-executor-plugin-slurm", "snakemake-executor-plugin-slurm-jobstep",
        "pyyaml", "jsonschema", "altair", "vl-convert-python",
    }  # fmt: skip
    for name, spec in driver.items():
        assert spec == full[name], (name, spec, full[name])


def test_dag_modules_import_no_job_framework():
    """What rules/common.smk imports from deploybench loads none of ``JOB_ONLY``: checked in the
    dev venv, which has them all, so a new heavy import shows here by name in a second."""
    common = (REPO / "rules" / "common.smk").read_text()
    modules = re.findall(r"^from deploybench(?:\.(planning))? import (\w+)", common, re.MULTILINE)
    modules = [f"{package}.{name}" if package else name for package, name in modules]
    assert {"planning.workflow_config", "planning.run_plan", "images"} <= set(modules), modules
    probe = (
        "import importlib, json, sys\n"
        f"for m in {modules!r}:\n"
        "    importlib.import_module('deploybench.' + m)\n"
        f"print(json.dumps(sorted(n for n in {JOB_ONLY + CHARTS!r} if n in sys.modules)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=REPO
    ).stdout
    assert json.loads(out) == []


def test_driver_has_no_job_frameworks(driver):
    probe = (
        "import importlib, json, sys\n"
        "found = {}\n"
        f"for name in {JOB_ONLY!r}:\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "        found[name] = True\n"
        "    except ImportError:\n"
        "        found[name] = False\n"
        "print(json.dumps(found))\n"
    )
    out = subprocess.run(
        [str(driver / "python"), "-c", probe], capture_output=True, text=True, check=True
    ).stdout
    assert json.loads(out) == dict.fromkeys(JOB_ONLY, False)


def test_driver_imports_what_its_rules_jobs_import(driver):
    """The charts and reports run in the driver's venv: what their jobs import (read from the
    jobs' code, deploybench.job_imports) imports there."""
    rules = job_imports.rules_by_role(workflow_rules())[job_imports.DRIVER_ROLE]
    modules = job_imports.role_imports({"driver": rules})["driver"]
    assert "altair" in modules and "deploybench.plots" in modules
    probe = "import importlib, sys\nfor m in sys.argv[1:]:\n    importlib.import_module(m)\n"
    result = subprocess.run(
        [str(driver / "python"), "-c", probe, *modules],
        capture_output=True, text=True, check=False, cwd=REPO,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]


def test_driver_names_how_to_get_a_python(tmp_path):
    """An old `python3` (a RHEL 8 login node's 3.6, here a stand-in answering 3.9) stops the
    script before any venv is made, saying how to get Python >= 3.11."""
    old = tmp_path / "python3.9"
    old.write_text('#!/bin/sh\n[ "$1" = --version ] && echo "Python 3.9.18" && exit 0\nexit 1\n')
    old.chmod(0o755)
    venv = tmp_path / "venv"
    result = subprocess.run(
        ["bash", str(REPO / "envs" / "driver.sh")],
        env={**os.environ, "VENV": str(venv), "PYTHON": str(old)},
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 1, result.stdout + result.stderr
    assert "needs Python >= 3.11" in result.stderr and "Python 3.9.18" in result.stderr
    assert "module load python/3.11" in result.stderr
    assert "uv python install 3.11" in result.stderr
    assert not venv.exists()


def driver_dry_run(driver: Path, workdir: Path, *targets: str) -> dict[str, list[dict[str, str]]]:
    """`snakemake -n --profile profiles/slurm TARGETS` in the driver venv, from ``workdir`` (its
    config: the shipped one, TFT's A30 run as `targets`), with only the stand-in `apptainer`, the
    venv, `bash` and `which` on PATH (no sbatch, sinfo, squeue). Rule → its jobs' resources."""
    config = base_config()
    config["targets"] = [A30_RUN]
    write_config(workdir, config)
    tools = workdir / "tools"
    tools.mkdir(exist_ok=True)
    for tool in ("bash", "which"):
        if not (tools / tool).exists():
            (tools / tool).symlink_to(shutil.which(tool) or f"/usr/bin/{tool}")
    result = subprocess.run(
        [
            str(driver / "snakemake"), "-n",
            "--snakefile", str(REPO / "Snakefile"),
            "--profile", str(REPO / "profiles" / "slurm"),
            *targets,
        ],
        cwd=workdir, capture_output=True, text=True, timeout=180, check=False,
        env={
            "HOME": os.environ.get("HOME", str(workdir)),
            "PATH": os.pathsep.join(map(str, (STANDIN_BIN, driver, tools))),
            "APPTAINER_STANDIN_LOG": str(workdir / "apptainer.log"),
        },
    )  # fmt: skip
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-4000:]
    return job_resources(out)


def assert_gpu_request(jobs: dict[str, list[dict[str, str]]], *rules: str) -> None:
    """Each job of ``rules`` asks for one A30 in its partition (the shipped `gpus.A30.slurm`)."""
    a30 = base_config()["gpus"]["A30"]["slurm"]
    request = {"gpu": "1", "gpu_model": a30["gpu_model"], "slurm_partition": a30["partition"]}
    assert request == {"gpu": "1", "gpu_model": "a30", "slurm_partition": "gpu"}
    for rule in rules:
        assert jobs[rule], rule
        for resources in jobs[rule]:
            assert request.items() <= resources.items(), (rule, resources)


def test_driver_dry_runs_the_preflight(driver, tmp_path):
    """docs/clusters.md, "First run on your cluster": the preflight of the A30 run, one job per
    image."""
    jobs = driver_dry_run(driver, tmp_path, "preflight")
    assert set(jobs) == {"container_image", "preflight_check", "preflight"}, sorted(jobs)
    assert len(jobs["preflight_check"]) == 2
    assert_gpu_request(jobs, "preflight_check")


def test_driver_dry_runs_the_target(driver, tmp_path):
    """docs/clusters.md, "First run on your cluster": the target, its chain, GPU steps on one
    A30."""
    jobs = driver_dry_run(driver, tmp_path, f"results/{A30_RUN}/online.csv")
    assert set(jobs) >= {
        "container_image", "prepare_checkpoint", "export", "convert", "repository", "online",
    }, sorted(jobs)  # fmt: skip
    assert_gpu_request(jobs, "convert", "online")
    for rule in ("prepare_checkpoint", "export"):
        [resources] = jobs[rule]
        assert not {"gpu", "gpu_model", "slurm_partition"} & resources.keys(), (rule, resources)


def test_driver_dry_runs_a_tensorflow_run(driver, tmp_path):
    """A TF-TRT run (SavedModel export and conversion) plans without TensorFlow too."""
    jobs = driver_dry_run(driver, tmp_path, "results/resnet50/A30/tf-trt/fp16/online.csv")
    assert {"export_directory", "convert_directory", "online"} <= set(jobs), sorted(jobs)
    assert_gpu_request(jobs, "online")
