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
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml
from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

from deploybench.planning import run_plan as dbplan
from deploybench.planning.export_plan import plan_model
from deploybench.planning.schedule import parse_slurm_time
from tests.conftest import (
    BIN,
    REPO,
    base_config,
    leaked_shm,
    orchestration_config,
    processes_mentioning,
    shm_regions,
    validated,
    write_config,
)
from tests.slurm_cluster import (
    GPU_TYPE,
    Cluster,
    skip_or_fail_unavailable,
    slurm_cluster,
    unavailable_reason,
)

SCHEMA = REPO / "config" / "schema" / "config.schema.yaml"
STANDIN_BIN = (
    REPO / "tests" / "bin"
)  # the TEST STAND-IN `apptainer` (the profile uses --sdm apptainer)
RUN = "results/tft/cpu/onnx/fp32"
CHAIN = [f"{RUN}/{name}" for name in ("accuracy.csv", "task.csv", "offline.csv", "online.csv")]
GPU_JOB = "results/tft/A30/trt/fp16/convert/model.plan"
# the CPU run's preflight (A30's run apart, with a site's settings: preflight_run)
PREFLIGHTS = ["results/preflight/cpu/triton-25.01.json"]
# profiles/slurm's group job of the CPU run (its SLURM log folder's name)
MEASUREMENT_GROUP = "group_run_accuracy_offline_online_repository"
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
# a job's id is a number, a group job's a UUID
SUBMITTED = re.compile(r"Job \S+ has been submitted with SLURM jobid (\d+) \(log: (\S+)\)")


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


def job_field(output: str, field: str) -> dict[str, list[str]]:
    """Rule → ``field`` (e.g. ``input``, ``resources``) of each of its jobs, from a dry run's job
    listing (a group job lists its jobs indented)."""
    jobs: dict[str, list[str]] = {}
    for block in re.split(r"\n(?=\s*\[[^\n]*\]\n\s*(?:local)?rule )", output):
        rule = re.search(r"^\s*(?:local)?rule (\w+):", block, re.MULTILINE)
        value = re.search(rf"^\s+{field}: (.*)$", block, re.MULTILINE)
        if rule and value:
            jobs.setdefault(rule.group(1), []).append(value.group(1))
    return jobs


def job_resources(output: str) -> dict[str, list[dict[str, str]]]:
    """Rule → the `resources:` of each of its jobs, from a dry run's job listing."""
    return {
        rule: [dict(kv.split("=", 1) for kv in res.split(", ")) for res in listed]
        for rule, listed in job_field(output, "resources").items()
    }


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


def test_a_gpus_cpus_set_what_its_measurement_jobs_ask_for(tmp_path):
    """A measurement job asks for the profile's `cores` (16), or its GPU's `slurm.cpus` where a
    node has fewer CPUs per GPU."""
    config = base_config()
    target = "results/tft/A30/trt/fp16/online.csv"
    write_config(tmp_path, config)
    default = slurm_snakemake(tmp_path, target, timeout_s=120, dry_run=True)
    assert job_field(default.stdout + default.stderr, "threads")["online"] == ["16"]
    config["gpus"]["A30"]["slurm"]["cpus"] = 8
    write_config(tmp_path, config)
    own = slurm_snakemake(tmp_path, target, timeout_s=120, dry_run=True)
    assert job_field(own.stdout + own.stderr, "threads")["online"] == ["8"], own.stderr[-3000:]


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
    # one GPU and one server per allocation, not across the cluster (each job holds its own GPU)
    assert {"gpu=local", "triton_server=local"} <= set(profile["set-resource-scopes"])
    assert profile["resources"] == {"gpu": 1, "triton_server": 1}
    assert profile["retries"] >= 1
    # groups are the rules' own (the plan's, within each GPU's max_runtime): none overridden
    assert "groups" not in profile


def group_members(output: str, group: str = "run") -> list[list[str]]:
    """The rules of each group job ``group`` in a dry run's listing."""
    groups = []
    for block in output.split(f"Group job {group} (jobs in lexicogr. order):")[1:]:
        body = re.split(r"\n(?=\[)", block, maxsplit=1)[0]  # up to the next unindented job
        groups.append(re.findall(r"^\s+rule (\w+):", body, re.MULTILINE))
    return groups


def test_dry_run_of_a_run_groups_its_gpu_steps_into_one_job(tmp_path):
    """`snakemake -n --profile profiles/slurm results/tft/A30/trt/fp16/online.csv`: the run's
    GPU steps grouped into one job (no max_runtime), checkpoint and export apart, each job's
    --time from the plan."""
    write_config(tmp_path, base_config())
    result = slurm_snakemake(
        tmp_path, "results/tft/A30/trt/fp16/online.csv", timeout_s=120, dry_run=True
    )
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-4000:]
    jobs = job_resources(out)
    assert group_members(out) == [["convert", "online", "repository"]]
    config = validated(base_config())
    plan = dbplan.plan_run(config, "tft", "A30", "trt", "fp16")
    assert jobs["online"][0]["runtime"] == str(plan.runtime["online"])
    assert jobs["export"][0]["runtime"] == str(plan_model(config, "tft").runtime["export"])


def test_dry_run_of_preflight_shows_only_its_jobs_on_the_gpu_partition(tmp_path):
    """`snakemake -n --profile profiles/slurm preflight --config 'targets=[tft/A30/trt/fp16]'`:
    one preflight job per image of the run, each asking for the run's GPU in its partition,
    and nothing of the run itself; the log says what each of the run's jobs will ask for."""
    write_config(tmp_path, base_config())
    result = slurm_snakemake(
        tmp_path, "preflight", "--config", "targets=[tft/A30/trt/fp16]", timeout_s=120,
        dry_run=True,
    )  # fmt: skip
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-4000:]
    jobs = job_resources(out)
    assert set(jobs) == {"container_image", "preflight_check", "preflight"}, sorted(jobs)
    a30 = base_config()["gpus"]["A30"]["slurm"]
    request = {"gpu": "1", "gpu_model": a30["gpu_model"], "slurm_partition": a30["partition"]}
    assert len(jobs["preflight_check"]) == 2
    for resources in jobs["preflight_check"]:
        assert request.items() <= resources.items(), resources
    for image in ("pytorch-25.01", "triton-25.01"):
        assert f"results/preflight/A30/{image}.json" in out
    plan = dbplan.plan_run(validated(base_config()), "tft", "A30", "trt", "fp16")
    assert "\n".join(plan.submissions()) in out


def test_preflight_beside_a_runs_results_is_refused(tmp_path):
    """Naming a run's results beside `preflight` would start the run: refused before anything
    is planned, saying how to name the runs to check."""
    write_config(tmp_path, base_config())
    result = slurm_snakemake(
        tmp_path, "preflight", "results/tft/A30/trt/fp16/online.csv", timeout_s=120, dry_run=True
    )
    out = result.stdout + result.stderr
    assert result.returncode == 1, out[-4000:]
    assert "would start them" in out and "--config 'targets=[tft/A30/trt/fp16]'" in out
    assert "preflight_check" not in out


def test_a_gpu_grid_search_fans_out_one_gpu_job_per_candidate(tmp_path):
    """`snakemake -n --profile profiles/slurm search` of a 3-candidate grid on A30: each
    candidate's repository and measurement are one group job of their own, asking for the
    run's GPU; the run's conversion is made once, in its own group job."""
    config = base_config()
    config["search_targets"] = ["tft/A30/trt/fp16"]
    config["models"]["tft"]["search"] = {
        "strategy": "grid",
        "latency_budget_ms": 50,
        "axes": {"model_instances": [1, 2, 4]},
        "online": {"concurrency": [8, 64], "batch": 16},
    }
    write_config(tmp_path, config)
    result = slurm_snakemake(tmp_path, "search", timeout_s=120, dry_run=True)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-4000:]
    assert group_members(out, "candidate") == [["search_online", "search_repository"]] * 3
    assert group_members(out) == [["convert"]]
    a30 = base_config()["gpus"]["A30"]["slurm"]
    request = {"gpu": "1", "gpu_model": a30["gpu_model"], "slurm_partition": a30["partition"]}
    measurements = job_resources(out)["search_online"]
    assert len(measurements) == 3
    for resources in measurements:
        assert request.items() <= resources.items(), resources
    for instances in (1, 2, 4):
        assert f"results/tft/A30/trt/fp16/search/i{instances}-b1024-p512.1024-q1/online.csv" in out


def test_preflight_alone_checks_the_configured_targets(tmp_path):
    """`snakemake preflight` with no run named: the runs of the config's `targets`."""
    config = base_config()
    config["targets"] = ["tft/cpu/onnx/fp32", "bert/A30/onnx/fp16"]
    write_config(tmp_path, config)
    result = slurm_snakemake(tmp_path, "preflight", timeout_s=120, dry_run=True)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-4000:]
    reports = sorted(set(re.findall(r"results/preflight/(\w+)/([\w.-]+)\.json", out)))
    images = {
        config["models"][m]["containers"][r]
        for m in ("tft", "bert")
        for r in ("framework", "triton")
    }
    assert reports == sorted({("cpu", i) for i in images} | {("A30", i) for i in images})
    for resources in job_resources(out)["preflight_check"]:
        assert resources["gpu"] in ("0", "1")


def test_required_preflight_gates_every_gpu_job(tmp_path):
    """`preflight.required`: every GPU job of a run needs its GPU and image's passed preflight."""
    config = base_config()
    config["preflight"] = {"required": True}
    write_config(tmp_path, config)
    result = slurm_snakemake(
        tmp_path, "results/tft/A30/trt/fp16/online.csv", timeout_s=120, dry_run=True
    )
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-4000:]
    inputs = {rule: listed[0] for rule, listed in job_field(out, "input").items()}
    assert "results/preflight/A30/pytorch-25.01.json" in inputs["convert"]
    assert "results/preflight/A30/triton-25.01.json" in inputs["online"]
    assert "results/preflight" not in inputs["export"]


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
    skip_or_fail_unavailable(unavailable_reason(), "SLURM tests")
    with slurm_cluster(tmp_path_factory.mktemp("slurm")) as c:
        yield c


@dataclass
class Cancelled:
    """What the test saw of the measurement job it cancelled with scancel."""

    job_id: str = ""
    pids: list[int] = field(default_factory=list)  # its perf_analyzer, tritonserver and script
    shm: set[str] = field(default_factory=set)  # /dev/shm entries made by the run at the time
    gone_after_s: float | None = None  # when the last of ``pids`` had exited
    left_shm: set[str] = field(default_factory=set)
    partial: list[str] = field(default_factory=list)  # temporary outputs left in the results
    error: str = ""


def _job_of(proc: psutil.Process) -> str:
    """The SLURM job a process runs in (SLURM puts SLURM_JOB_ID in its environment)."""
    try:
        return proc.environ().get("SLURM_JOB_ID", "")
    except psutil.Error:
        return ""


def _cwd_in_its_root(proc: psutil.Process) -> Path:
    """A process's working directory as it sees it: in a container (the stand-in's, as a real
    Apptainer's) the host reads it under the container's root."""
    cwd, root = Path(proc.cwd()), Path(os.readlink(f"/proc/{proc.pid}/root"))
    return Path("/", cwd.relative_to(root)) if cwd.is_relative_to(root) else cwd


def _perf_analyzer_in(wd: Path) -> psutil.Process | None:
    """A perf_analyzer measuring the run's model in ``wd`` (it runs in the working directory;
    the preflight's measures a model of its own)."""
    for proc in psutil.process_iter(["name", "cmdline"]):
        try:
            if (
                proc.info["name"] == "perf_analyzer"
                and _cwd_in_its_root(proc).is_relative_to(wd)
                and "tft" in proc.info["cmdline"]
            ):
                return proc
        except (psutil.Error, OSError):
            continue
    return None


def _cancel_first_measurement(wd: Path, shm_before: set[str], seen: Cancelled) -> None:
    """When the run's first perf_analyzer runs, scancel its SLURM job (as preemption or a time
    limit would end it) and watch what it leaves."""
    try:
        deadline = time.monotonic() + 400
        while (perf := _perf_analyzer_in(wd)) is None:
            if time.monotonic() > deadline:
                seen.error = "no perf_analyzer started"
                return
            time.sleep(0.3)
        seen.job_id = _job_of(perf)
        job = [p for p in psutil.process_iter() if _job_of(p) == seen.job_id]
        seen.pids = [p.pid for p in job]
        seen.shm = shm_regions() - shm_before
        subprocess.run(["scancel", seen.job_id], check=True, timeout=30)
        cancelled = time.monotonic()
        _, alive = psutil.wait_procs(job, timeout=90)
        if not alive:
            seen.gone_after_s = time.monotonic() - cancelled
        seen.left_shm = leaked_shm(shm_before) & seen.shm
        seen.partial = [str(p) for p in (wd / "results").rglob("*.tmp")]
    except (psutil.Error, OSError, subprocess.SubprocessError) as error:
        seen.error = repr(error)


@pytest.fixture(scope="module")
def slurm_run(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One Snakemake run through SLURM (one run: each costs the plugin's polling), with the
    profile's grouping, retries and preflight:
    - the CPU chain of tft at smoke sizes (its measurement jobs one group job);
    - with --keep-going, A30's convert job, which asks for the typed stand-in GPU and fails at run
      time (no GPU here);
    - the preflight of the CPU run's image (passes here);
    - the chain's measurement job is cancelled with scancel while perf_analyzer runs, and is
      retried (`--retries 1`: the profile's 2, less one to keep the failing GPU jobs quick).
    The cpu and A30 gpus map to the test cluster's partition."""
    wd = tmp_path_factory.mktemp("slurm-run")
    config = orchestration_config()
    config["gpus"]["cpu"]["slurm"] = {"partition": cluster.partition}
    config["gpus"]["A30"]["slurm"] = {"partition": cluster.partition, "gpu_model": GPU_TYPE}
    write_config(wd, config)
    seen = Cancelled()
    watcher = threading.Thread(
        target=_cancel_first_measurement,
        args=(wd, shm_regions(), seen),
        daemon=True,
    )
    watcher.start()
    started = time.monotonic()
    result = slurm_snakemake(
        wd, *CHAIN, GPU_JOB, *PREFLIGHTS, *CLUSTER_ARGS, "--keep-going", "--retries", "1",
        timeout_s=1200,
    )  # fmt: skip
    watcher.join(timeout=120)
    out = result.stdout + result.stderr
    (wd / "snakemake.out").write_text(out)  # for a failing test's reader
    submissions = []  # (kind, SLURM job id, its log): kind is `rule_<rule>` or `group_<...>`
    for job_id, log in SUBMITTED.findall(out):
        kind = next(part for part in Path(log).parts if part.startswith(("rule_", "group_")))
        submissions.append((kind, job_id, Path(log)))
    return {
        "workdir": wd,
        "result": result,
        "out": out,
        "submissions": submissions,
        "cancelled": seen,
        "seconds": time.monotonic() - started,
    }


def cpu_run_plan() -> dbplan.RunPlan:
    """The plan of the CPU run the cluster's chain runs (RUN, the tests' config)."""
    return dbplan.plan_run(validated(orchestration_config()), *RUN.split("/")[1:])


def jobs_of(slurm_run: dict[str, Any], kind: str) -> list[tuple[str, Path]]:
    return [(job_id, log) for k, job_id, log in slurm_run["submissions"] if k == kind]


def test_cpu_chain_runs_through_slurm(slurm_run, cluster):
    """The chain's jobs ran as SLURM jobs in their containers and wrote whole CSVs: the columns
    the jobs write, the plan's points. (Not checked against the smoke run: waiting for it
    would put this module, most of it waiting on the cluster, after it in the suite.)"""
    from deploybench.accuracy import COLUMNS as ACCURACY_COLUMNS
    from deploybench.accuracy import TASK_COLUMNS
    from deploybench.perf import COLUMNS as PERF_COLUMNS

    wd = slurm_run["workdir"]
    # every job of the chain was a SLURM job, completed, with no GPU asked for
    for kind in ("rule_prepare_checkpoint", "rule_export", MEASUREMENT_GROUP):
        job_id, log = jobs_of(slurm_run, kind)[-1]
        assert log.exists()  # the job's own SLURM log
        job = scontrol_job(job_id)
        assert job["JobState"] == "COMPLETED", job
        assert "gres/gpu" not in job["TRES"] and "TresPerJob" not in job, job
    assert cluster.squeue() == []
    # the jobs ran in their (stand-in) containers: PATH reached them through SLURM
    calls = [json.loads(line)["argv"] for line in (wd / "apptainer.log").open()]
    assert sum(c[0] == "exec" for c in calls) >= 6

    # whole CSVs, as a local run of the same target writes them
    columns, rows = read_csv(wd / RUN / "accuracy.csv")
    assert columns == ACCURACY_COLUMNS and rows, rows
    assert all(r["passed"] == "True" for r in rows), rows
    columns, rows = read_csv(wd / RUN / "task.csv")
    assert columns == TASK_COLUMNS and rows, rows
    plan = cpu_run_plan()
    for scenario in ("offline", "online"):
        columns, rows = read_csv(wd / RUN / f"{scenario}.csv")
        assert columns == PERF_COLUMNS, scenario
        points = [(int(r["batch"]), int(r["concurrency"])) for r in rows]
        assert points == [(p["batch"], p["concurrency"]) for p in plan.points[scenario]]
        assert all(float(r["throughput"]) > 0 for r in rows), scenario
    assert processes_mentioning(str(wd)) == []


def test_a_run_waits_in_the_queue_once(slurm_run):
    """profiles/slurm groups a run's repository, accuracy, offline and online into one job (the
    CPU run stands in for a GPU run's shape, whose convert joins them); checkpoint and export
    stay small jobs of their own. Its time limit is the sum of its steps' `runtime`."""
    kinds = [kind for kind, _, _ in slurm_run["submissions"]]
    chain = [k for k in kinds if k in ("rule_prepare_checkpoint", "rule_export")]
    assert sorted(chain) == ["rule_export", "rule_prepare_checkpoint"], kinds
    # no measurement step was submitted on its own: one group job (and its one retry, after the
    # scancel of the next test)
    assert not {f"rule_{r}" for r in ("repository", "accuracy", "offline", "online")} & set(kinds)
    assert kinds.count(MEASUREMENT_GROUP) == 2, kinds
    plan = cpu_run_plan()
    minutes = sum(plan.runtime[s] for s in ("repository", "accuracy", "offline", "online"))
    job_id, _ = jobs_of(slurm_run, MEASUREMENT_GROUP)[-1]
    hours, mins, secs = map(int, scontrol_job(job_id)["TimeLimit"].split(":"))
    assert (hours * 60 + mins, secs) == (minutes, 0)


def test_cancelled_job_leaves_nothing_and_is_retried(slurm_run):
    """scancel (what preemption and a time limit do) stops the job's script, tritonserver and
    perf_analyzer, leaves no shared memory and no partial output, and Snakemake submits the
    job again (profiles/slurm: retries), which completes the run."""
    seen, out = slurm_run["cancelled"], slurm_run["out"]
    assert not seen.error, seen
    assert seen.job_id == jobs_of(slurm_run, MEASUREMENT_GROUP)[0][0]
    assert len(seen.pids) >= 3, seen  # the script, tritonserver, perf_analyzer (and stubs)
    assert seen.gone_after_s is not None and seen.gone_after_s < 60, seen
    assert seen.left_shm == set(), seen
    assert seen.partial == [], seen
    assert scontrol_job(seen.job_id)["JobState"] == "CANCELLED"
    assert "Trying to restart job" in out
    retry, _ = jobs_of(slurm_run, MEASUREMENT_GROUP)[1]
    assert scontrol_job(retry)["JobState"] == "COMPLETED"
    assert (slurm_run["workdir"] / RUN / "online.csv").exists()


def test_gpu_job_gets_its_gpu_and_failure_is_reported(slurm_run, cluster):
    """A30's convert job goes to SLURM with `--gpus=a30:1` in the mapped partition, fails inside
    its job (no GPU here), and Snakemake exits non-zero naming the failed SLURM job."""
    wd, result, out = slurm_run["workdir"], slurm_run["result"], slurm_run["out"]
    assert result.returncode == 1, out[-6000:]  # not 124/137: `timeout` did not have to stop it
    # the run's group holds only the convert job here (nothing else of that run was asked for)
    attempts = jobs_of(slurm_run, "group_run_convert")
    assert len(attempts) == 2  # the job and its one retry
    for job_id, log in attempts:
        # Snakemake reports a failed group job with its SLURM log
        assert f"{log} (check log file(s) for error details)" in out
        job = scontrol_job(job_id)
        assert job["JobState"] == "FAILED"
        assert job["Partition"] == cluster.partition
        assert job["TresPerJob"] == f"gres:gpu:{GPU_TYPE}:1"
        assert "needs a GPU node" in log.read_text()  # it failed at run time, inside the job
    assert not (wd / GPU_JOB).exists()
    assert cluster.squeue() == []
    assert processes_mentioning(str(wd)) == []


def test_the_cpu_runs_preflight_passes_on_its_partition(slurm_run):
    """The CPU run's preflight job runs in its image on its partition and passes."""
    wd = slurm_run["workdir"]
    [(cpu_job, _)] = [
        (j, log)
        for j, log in jobs_of(slurm_run, "rule_preflight_check")
        if log.parent.name == "cpu_triton-25.01"
    ]
    assert scontrol_job(cpu_job)["JobState"] == "COMPLETED"
    report = json.loads((wd / "results/preflight/cpu/triton-25.01.json").read_text())
    assert report["ok"] is True
    assert {c["name"]: c["status"] for c in report["checks"]}["perf_analyzer"] == "pass"


# A site's settings for the stand-in GPU: GRES instead of --gpus, an account, a QOS, a
# reservation (made on the test cluster for this run) and an extra option SLURM records (nice).
SITE_SLURM = {
    "gres": f"gpu:{GPU_TYPE}:1",
    "account": "deploybench-test",
    "qos": "normal",
    "reservation": "deploybench-test",
    "slurm_extra": "--nice=7",
}


@pytest.fixture(scope="module")
def preflight_run(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """`snakemake --profile profiles/slurm preflight --config 'targets=[tft/A30/trt/fp16]'` on
    the cluster, A30 mapped to its partition with SITE_SLURM (the A30 checks fail here: no
    GPU). Runs after slurm_run (this module's last tests): the reservation holds the node."""
    wd = tmp_path_factory.mktemp("slurm-preflight")
    config = orchestration_config()
    config["gpus"]["A30"]["slurm"] = {"partition": cluster.partition, **SITE_SLURM}
    write_config(wd, config)
    reservation = SITE_SLURM["reservation"]
    subprocess.run(
        ["scontrol", "create", "reservation", f"ReservationName={reservation}",
         "StartTime=now", "Duration=60", "Users=root", "Nodes=ALL", "Flags=IGNORE_JOBS"],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    try:
        result = slurm_snakemake(
            wd, "preflight", "--config", "targets=[tft/A30/trt/fp16]", *CLUSTER_ARGS,
            # 70 s alone, about 2 min in CI: it runs beside the smoke run and the other worker
            "--keep-going", "--verbose", timeout_s=600,
        )  # fmt: skip
        out = result.stdout + result.stderr
        (wd / "snakemake.out").write_text(out)
        submitted = SUBMITTED.findall(out)
        # what SLURM recorded, read while the reservation is there (a job names it until then)
        jobs = {job_id: scontrol_job(job_id) for job_id, _ in submitted}
    finally:
        subprocess.run(
            ["scontrol", "delete", f"ReservationName={reservation}"],
            check=False,
            capture_output=True,
        )
    return {"workdir": wd, "result": result, "out": out, "submitted": submitted, "jobs": jobs}


def test_preflight_submits_only_its_jobs_with_the_sites_settings(preflight_run, cluster):
    """The preflight of a run submits its two checks and nothing of the run; each sbatch call
    carries the site's GRES (not --gpus), account, QOS, reservation and extra option, and
    SLURM accepted them (recorded on the job; this cluster has no accounting, so QOS is only
    seen in the call)."""
    out = preflight_run["out"]
    assert preflight_run["result"].returncode == 1, out[-6000:]  # the GPU checks fail here
    kinds = [
        next(p for p in Path(log).parts if p.startswith(("rule_", "group_")))
        for _, log in preflight_run["submitted"]
    ]
    assert kinds == ["rule_preflight_check"] * 2, kinds
    calls = re.findall(r"sbatch call: (.*)", out)
    assert len(calls) == 2, out[-6000:]
    for call in calls:
        assert f"--gres={SITE_SLURM['gres']}" in call and "--gpus" not in call, call
        assert f"-A {SITE_SLURM['account']}" in call, call
        assert f"--qos={SITE_SLURM['qos']}" in call, call
        assert f"--reservation={SITE_SLURM['reservation']} --nice=7" in call, call
    for job in preflight_run["jobs"].values():
        assert job["Account"] == SITE_SLURM["account"], job
        assert job["Reservation"] == SITE_SLURM["reservation"], job
        assert job["TresPerNode"] == f"gres:{SITE_SLURM['gres']}", job
        assert job["Nice"] == "7", job
        assert job["JobState"] == "FAILED", job
    # the log says what each of the run's jobs will ask for
    assert "tft/A30/trt/fp16 (no max_runtime): its jobs' --time, as submitted" in out
    assert cluster.squeue() == []


def test_gpu_preflight_fails_its_gpu_checks_and_names_what_is_missing(preflight_run, cluster):
    """A30's preflight jobs run on its partition, fail (no GPU, no trtexec, no native backends
    here) without a retry, keep their report in the log directory, and say what to fix."""
    wd, out = preflight_run["workdir"], preflight_run["out"]
    for job in preflight_run["jobs"].values():
        assert job["Partition"] == cluster.partition
        assert job["Restarts"] == "0"
    for image in ("pytorch-25.01", "triton-25.01"):
        assert not (wd / f"results/preflight/A30/{image}.json").exists()
        kept = json.loads((wd / f"logs/preflight/A30/{image}.json").read_text())
        status = {c["name"]: c["status"] for c in kept["checks"]}
        assert status["gpu_visible"] == "fail" and status["deploybench_imports"] == "pass"
    triton = json.loads((wd / "logs/preflight/A30/triton-25.01.json").read_text())
    status = {c["name"]: c["status"] for c in triton["checks"]}
    assert status["tritonserver"] == "pass" and status["perf_analyzer"] == "pass"
    assert status["tritonserver_gpu"] == "fail"
    framework = json.loads((wd / "logs/preflight/A30/pytorch-25.01.json").read_text())
    assert {c["name"]: c["status"] for c in framework["checks"]}["trtexec"] == "fail"
    # the failure Snakemake shows names the missing piece and the fix, with the GPU's mapping
    assert "gpu_visible" in out and f"gres: {SITE_SLURM['gres']}" in out


def test_a_run_longer_than_its_partitions_maxtime_is_refused_by_the_preflight(cluster, tmp_path):
    """`snakemake preflight` reads the partition's MaxTime with sinfo (here the test cluster's,
    set to an hour with scontrol) and refuses a run whose submissions cannot fit, naming both
    numbers and the setting that splits it; with that setting the run fits."""
    config = base_config()
    config["gpus"]["A30"]["slurm"] = {"partition": cluster.partition, "gpu_model": GPU_TYPE}
    write_config(tmp_path, config)
    update = ["scontrol", "update", f"PartitionName={cluster.partition}"]
    subprocess.run([*update, "MaxTime=01:00:00"], check=True, timeout=30)
    try:
        args = ("preflight", "--config", "targets=[tft/A30/trt/fp16]")
        refused = slurm_snakemake(tmp_path, *args, timeout_s=120, dry_run=True)
        out = refused.stdout + refused.stderr
        assert refused.returncode == 1, out[-4000:]
        assert re.search(rf"partition {cluster.partition}: MaxTime [0-9:]+ \(60 min\)", out)
        assert (
            f"tft/A30/trt/fp16: partition '{cluster.partition}' allows 60 min a job (its "
            "MaxTime, read with sinfo), but group job run " in out
        )
        assert "set gpus.A30.slurm.max_runtime to 60 or less" in out
        assert "preflight_check" not in out
        config["gpus"]["A30"]["slurm"]["max_runtime"] = 60
        write_config(tmp_path, config)
        fits = slurm_snakemake(tmp_path, *args, timeout_s=120, dry_run=True)
        assert fits.returncode == 0, (fits.stdout + fits.stderr)[-4000:]
    finally:
        subprocess.run([*update, "MaxTime=INFINITE"], check=True, timeout=30)


def test_slurm_time_limits_read_as_minutes():
    assert [parse_slurm_time(t) for t in ("1-00:00:00", "2:00:00", "30:00", "45")] == [
        1440, 120, 30, 45
    ]  # fmt: skip
    assert parse_slurm_time("infinite") is None and parse_slurm_time("UNLIMITED") is None
    with pytest.raises(ValueError, match="not a SLURM time"):
        parse_slurm_time("1:2:3:4")
