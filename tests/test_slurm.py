"""SLURM execution (profiles/slurm, snakemake-executor-plugin-slurm).

The dry run shows what each job asks SLURM for; then the CPU chain of one model runs through a
real one-node SLURM cluster started here (tests/slurm_cluster.py), and a GPU run's job is
submitted with its GPU request and fails at run time (there is no GPU here).
"""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

from tests.conftest import (
    BIN,
    REPO,
    base_config,
    processes_mentioning,
    smoke_config,
    write_config,
)
from tests.slurm_cluster import GPU_TYPE, Cluster, slurm_cluster, unavailable_reason

SCHEMA = REPO / "config" / "schema" / "config.schema.yaml"
STANDIN_BIN = (
    REPO / "tests" / "bin"
)  # the TEST STAND-IN `apptainer` (the profile uses --sdm apptainer)
RUN = "results/tft/cpu/onnx/fp32"
CHAIN = [f"{RUN}/{name}" for name in ("accuracy.csv", "task.csv", "offline.csv", "online.csv")]
GPU_JOB = "results/tft/A30/trt/fp16/convert/model.plan"
SLURM_RULES = {"prepare_checkpoint", "export", "repository", "accuracy", "offline", "online"}
# Test-cluster settings on top of the profile: a 2-CPU node, squeue for job status (no slurmdbd
# here: with sacct the plugin would lose the jobs), quick polling, and the per-job SLURM logs kept.
CLUSTER_ARGS = (
    "--cores", "2",
    "--slurm-status-command", "squeue",
    "--slurm-init-seconds-before-status-checks", "2",
    "--seconds-between-status-checks", "2",
    "--slurm-no-account",
    "--slurm-keep-successful-logs",
)  # fmt: skip
SUBMITTED = re.compile(r"Job \d+ has been submitted with SLURM jobid (\d+) \(log: (\S+)\)")


def slurm_snakemake(
    workdir: Path, *args: str, timeout_s: int, dry_run: bool = False
) -> subprocess.CompletedProcess[str]:
    """Snakemake with profiles/slurm, the stand-in `apptainer` and the venv first on PATH (the
    jobs inherit it: sbatch --export=ALL), wrapped in `timeout` since a lost job would make
    Snakemake wait for ever."""
    cmd = [
        "timeout", "-k", "10", str(timeout_s),
        str(BIN / "snakemake"), *(["-n"] if dry_run else []),
        "--snakefile", str(REPO / "Snakefile"),
        "--profile", str(REPO / "profiles" / "slurm"),
        *args,
    ]  # fmt: skip
    env = {
        **os.environ,
        "PATH": os.pathsep.join([str(STANDIN_BIN), str(BIN), os.environ.get("PATH", "")]),
        "APPTAINER_STANDIN_LOG": str(workdir / "apptainer.log"),
    }
    return subprocess.run(
        cmd, cwd=workdir, capture_output=True, text=True, env=env, check=False,
        timeout=timeout_s + 30,
    )  # fmt: skip


def job_resources(output: str) -> dict[str, list[dict[str, str]]]:
    """Rule → the `resources:` of each of its jobs, from a dry run's job listing."""
    jobs: dict[str, list[dict[str, str]]] = {}
    for block in re.split(r"\n(?=\[[^\n]*\]\n(?:local)?rule )", output):
        rule = re.search(r"^(?:local)?rule (\w+):", block, re.MULTILINE)
        res = re.search(r"^\s+resources: (.*)$", block, re.MULTILINE)
        if rule and res:
            pairs = (kv.split("=", 1) for kv in res.group(1).split(", "))
            jobs.setdefault(rule.group(1), []).append(dict(pairs))
    return jobs


def read_csv(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    with path.open() as f:
        reader = csv.DictReader(f)
        return list(reader.fieldnames or []), list(reader)


def scontrol_job(job_id: str) -> dict[str, str]:
    out = subprocess.run(
        ["scontrol", "-o", "show", "job", job_id], capture_output=True, text=True, check=True
    ).stdout
    return dict(f.split("=", 1) for f in out.split() if "=" in f)


# ------------------------------------------------------------------------------ dry run


def test_dry_run_shows_gpu_request_of_perf_job(tmp_path):
    """`snakemake -n --profile profiles/slurm results/tft/A30/trt/fp16/online.csv` with the
    shipped config: GPU jobs ask for one A30 in its partition, CPU-only jobs for no GPU.
    (The dry run needs no SLURM command: it runs without the cluster packages.)"""
    write_config(tmp_path, base_config())
    result = slurm_snakemake(
        tmp_path, "results/tft/A30/trt/fp16/online.csv", timeout_s=120, dry_run=True
    )
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-4000:]
    jobs = job_resources(out)
    a30 = base_config()["gpus"]["A30"]["slurm"]
    assert a30["gpu_model"] and a30["partition"]
    gpu_request = {
        "gpu": "1", "gpu_model": a30["gpu_model"], "slurm_partition": a30["partition"]
    }  # fmt: skip
    for rule in ("convert", "online"):
        [resources] = jobs[rule]
        assert gpu_request.items() <= resources.items(), (rule, resources)
        assert "constraint" not in resources  # null in the config: no -C at all
    # the local one-server-at-a-time resource is still declared; the profile lifts its limit
    assert jobs["online"][0]["triton_server"] == "1"
    for rule in ("prepare_checkpoint", "export", "repository"):
        [resources] = jobs[rule]
        assert not {"gpu", "gpu_model", "slurm_partition"} & resources.keys(), (rule, resources)


def test_cpu_device_asks_for_no_gpu(tmp_path):
    write_config(tmp_path, base_config())
    result = slurm_snakemake(tmp_path, f"{RUN}/online.csv", timeout_s=120, dry_run=True)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    [online] = job_resources(result.stdout + result.stderr)["online"]
    assert online["gpu"] == "0"
    assert "gpu_model" not in online


def test_profile_runs_jobs_in_containers_on_slurm():
    profile = yaml.safe_load((REPO / "profiles" / "slurm" / "config.yaml").read_text())
    assert profile["executor"] == "slurm"
    assert profile["software-deployment-method"] == "apptainer"
    assert profile["apptainer-args"] == "--nv"
    # on a cluster each measurement holds its own GPU: more than one server at a time
    assert profile["resources"]["triton_server"] > 1


@pytest.mark.parametrize(
    ("gpu", "slurm", "message"),
    [
        # a CPU device asks for no GPU, so it names no GPU model
        ("cpu", {"gpu_model": "a30"}, "['gpus']['cpu']['slurm']['gpu_model']"),
        ("A30", {"partition": "gpu; rm -rf /"}, "gpu; rm -rf /"),
        ("A30", {"gpu_model": "'a30'"}, "'a30'"),
        ("A30", {"gres": "gpu:2"}, "gres"),
    ],
)
def test_bad_slurm_mapping_is_rejected(gpu, slurm, message):
    config = base_config()
    config["gpus"][gpu]["slurm"] = slurm
    with pytest.raises(WorkflowError, match=re.escape(message)):
        validate(config, str(SCHEMA))


# ------------------------------------------------------------------------ real cluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """The cluster, up for this module's tests only (torn down before the next module)."""
    reason = unavailable_reason()
    if reason:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must run the SLURM tests (make test runs envs/slurm.sh): {reason}")
        pytest.skip(reason)
    with slurm_cluster(tmp_path_factory.mktemp("slurm")) as c:
        yield c


@pytest.fixture(scope="module")
def slurm_run(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One Snakemake run through SLURM (one run: each costs the plugin's polling): the CPU chain
    of tft at smoke sizes, and, with --keep-going, A30's convert job, which asks for the typed
    stand-in GPU and fails at run time (no GPU here). The cpu and A30 gpus map to the test
    cluster's partition."""
    wd = tmp_path_factory.mktemp("slurm-run")
    config = smoke_config()
    config["gpus"]["cpu"]["slurm"] = {"partition": cluster.partition}
    config["gpus"]["A30"]["slurm"] = {"partition": cluster.partition, "gpu_model": GPU_TYPE}
    write_config(wd, config)
    result = slurm_snakemake(wd, *CHAIN, GPU_JOB, *CLUSTER_ARGS, "--keep-going", timeout_s=420)
    out = result.stdout + result.stderr
    jobs = {}  # rule -> (SLURM job id, the job's SLURM log)
    for job_id, log in SUBMITTED.findall(out):
        jobs[Path(log).parent.parent.name.removeprefix("rule_")] = (job_id, Path(log))
    return {"workdir": wd, "result": result, "out": out, "jobs": jobs}


def test_cpu_chain_runs_through_slurm(slurm_run, cluster, smoke_run):
    wd, out, jobs = slurm_run["workdir"], slurm_run["out"], slurm_run["jobs"]
    # the only failure is the GPU job's (next test)
    assert re.findall(r"Error in rule (\w+):", out) == ["convert"], out[-6000:]

    # every job of the chain was a SLURM job, completed, with no GPU asked for
    assert jobs.keys() == SLURM_RULES | {"convert"}, out[-6000:]
    for rule in SLURM_RULES:
        job_id, log = jobs[rule]
        assert log.exists()  # the job's own SLURM log
        job = scontrol_job(job_id)
        assert job["JobState"] == "COMPLETED", job
        assert "gres/gpu" not in job["TRES"] and "TresPerJob" not in job, job
    assert cluster.squeue() == []
    # the jobs ran in their (stand-in) containers: PATH reached them through SLURM
    calls = [json.loads(line)["argv"] for line in (wd / "apptainer.log").open()]
    assert sum(c[0] == "exec" for c in calls) >= len(SLURM_RULES)

    # same shape as the local run of the same target
    for name in ("accuracy.csv", "task.csv", "offline.csv", "online.csv"):
        columns, rows = read_csv(wd / RUN / name)
        local_columns, local_rows = read_csv(smoke_run / RUN / name)
        assert columns == local_columns, name
        assert len(rows) == len(local_rows), name
        if name in ("offline.csv", "online.csv"):
            points = [(r["batch"], r["concurrency"]) for r in rows]
            assert points == [(r["batch"], r["concurrency"]) for r in local_rows]
            assert all(float(r["throughput"]) > 0 for r in rows)
    assert processes_mentioning(str(wd)) == []


def test_gpu_job_gets_its_gpu_and_failure_is_reported(slurm_run, cluster):
    """A30's convert job goes to SLURM with `--gpus=a30:1` in the mapped partition, fails inside
    its job (no GPU here), and Snakemake exits non-zero naming the failed SLURM job."""
    wd, result, out = slurm_run["workdir"], slurm_run["result"], slurm_run["out"]
    assert result.returncode == 1, out[-6000:]  # not 124/137: `timeout` did not have to stop it
    job_id, log = slurm_run["jobs"]["convert"]
    assert f"SLURM-job '{job_id}' failed, SLURM status is: 'FAILED'" in out
    job = scontrol_job(job_id)
    assert job["JobState"] == "FAILED"
    assert job["Partition"] == cluster.partition
    assert job["TresPerJob"] == f"gres:gpu:{GPU_TYPE}:1"
    assert "needs a GPU node" in log.read_text()  # it failed at run time, inside the job
    assert not (wd / GPU_JOB).exists()
    assert cluster.squeue() == []
    assert processes_mentioning(str(wd)) == []
