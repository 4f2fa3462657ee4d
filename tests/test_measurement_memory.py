"""What a measurement job asks SLURM for in memory (deploybench/planning/measurement_memory.py):
perf_analyzer from tritonclient 2.45 keeps every request's inputs over a window, so ResNet-50
online over HTTP without shared memory holds tens of GB; the job's `mem_mb` says so, and a job
that needs more than its node has fails while the DAG is built."""

from __future__ import annotations

import csv
import math
import re

import numpy as np
import pytest
import yaml

from deploybench import tails
from deploybench.errors import ConfigError
from deploybench.planning import measurement_memory as dbmemory
from deploybench.planning import run_plan as dbplan
from deploybench.planning.workflow_config import containers_on, deep_merge, model_settings
from tests.conftest import REPO, base_config, validated, write_config
from tests.test_plan import workflow_config
from tests.test_slurm import job_field, job_resources, slurm_snakemake

PUBLISHED = REPO / "config" / "reference" / "published.csv"
MODEL, FORMAT, PRECISION = "resnet50", "tf-trt", "fp16"  # the published ResNet-50 rows


def published_online() -> dict[str, float]:
    """GPU -> the highest published ResNet-50 online rate (inferences/s) of the runs it has."""
    rates: dict[str, float] = {}
    with PUBLISHED.open() as f:
        for row in csv.DictReader(f):
            if (row["model"], row["scenario"], row["format"], row["precision"]) == (
                MODEL, "online", FORMAT, PRECISION
            ):  # fmt: skip
                rates[row["gpu"]] = max(rates.get(row["gpu"], 0.0), float(row["throughput"]))
    return rates


def copies_of(gpu: str) -> int:
    """Copies of a window's inputs the run's perf_analyzer holds, from its image's SDK tag:
    none before Triton 24.04, one from 24.04, two from 24.11 (the append copies them again)."""
    config = base_config()
    sdk = config["images"][containers_on(config, MODEL, gpu)["triton"]]["sdk"]
    release = tuple(int(x) for x in re.search(r":(\d+)\.(\d+)-py3-sdk$", sdk).groups())
    return 0 if release < (24, 4) else 1 if release < (24, 11) else 2


def test_resnet50_online_asks_for_the_inputs_its_window_holds(tmp_path):
    """A dry run with profiles/slurm of ResNet-50 online on every GPU the published table has
    it for (A100 and V100 among them): each online job's mem_mb holds, at least, the published
    rate x the longest window (the warm-up's: interval x warmup_factor) x 602,112 bytes (one
    224x224x3 float32 image) x the copies its perf_analyzer keeps."""
    config = base_config()
    settings = model_settings(workflow_config(), MODEL, "A100")
    assert settings["perf"]["online"]["transport"]["shared_memory"] == "none"  # HTTP, no shm
    size = settings["hparams"]["image_size"]
    image_bytes = size * size * 3 * np.dtype("float32").itemsize
    assert image_bytes == 602_112
    window_s = (
        settings["perf"]["measurement_interval_ms"] / 1000 * settings["perf"]["warmup_factor"]
    )
    rates = {g: r for g, r in published_online().items() if g in config["gpus"]}
    assert {"A100", "V100"} <= rates.keys()
    write_config(tmp_path, config)
    targets = [f"results/{MODEL}/{g}/{FORMAT}/{PRECISION}/online.csv" for g in sorted(rates)]
    result = slurm_snakemake(tmp_path, *targets, timeout_s=120, dry_run=True)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-4000:]
    wildcards = [
        dict(kv.split("=", 1) for kv in w.split(", "))
        for w in job_field(out, "wildcards")["online"]
    ]
    asked = {w["gpu"]: int(r["mem_mb"]) for w, r in zip(wildcards, job_resources(out)["online"])}
    assert asked.keys() == rates.keys()
    for gpu, rate in rates.items():
        held = rate * window_s * image_bytes * copies_of(gpu)
        assert asked[gpu] * 2**20 >= held, (gpu, asked[gpu], held)
    # the figures of the issue: A100 (25.02, two copies) ~4617 inf/s, V100 (24.09, one copy)
    assert copies_of("A100") == 2 and copies_of("V100") == 1
    assert asked["A100"] * 2**20 >= 2 * 4617 * 10 * image_bytes  # 10-s window, twice: ~56 GB
    assert asked["V100"] * 2**20 >= 2743.8 * 10 * image_bytes  # ~16.5 GB
    assert asked["A100"] > asked["V100"] > config["measurement_memory"]["baseline_mb"]


def test_a_job_over_its_nodes_memory_fails_naming_both_and_the_knobs():
    """gpus.<gpu>.slurm.node_mem_mb below what the job needs: ConfigError at plan time, with
    the job's figure, the node's and what to change."""
    config = workflow_config({"gpus": {"A100": {"slurm": {"node_mem_mb": 64000}}}})
    plan = dbplan.plan_run(config, MODEL, "A100", FORMAT, PRECISION)
    with pytest.raises(ConfigError) as failed:
        dbmemory.plan_measurement_mem_mb(config, plan, "online")
    message = str(failed.value)
    needed = int(re.search(r"needs (\d+) MB", message).group(1))
    assert needed > 64000
    for knob in (
        "gpus.A100.slurm.node_mem_mb (64000 MB)",
        "models.resnet50.perf.measurement_interval_ms",
        "warmup_factor",
        "models.resnet50.perf.online.transport",
        "measurement_memory.margin",
    ):
        assert knob in message, (knob, message)
    # within the node: the same figure, no error; the offline job needs far less
    roomy = deep_merge(config, {"gpus": {"A100": {"slurm": {"node_mem_mb": needed}}}})
    assert dbmemory.plan_measurement_mem_mb(roomy, plan, "online") == needed
    assert dbmemory.plan_measurement_mem_mb(config, plan, "offline") < 64000


def test_the_formula():
    """baseline + margin x copies x bytes x the most requests a window holds, MiB up."""
    measure = dict(dbplan.plan_run(workflow_config(), MODEL, "A100", FORMAT, PRECISION).measure)
    args = {"measure": measure, "input_bytes": 1000, "baseline_mb": 100, "margin": 1.5}
    # time windows: 10 s x warm-up 2 at 100 requests/s (400 inf/s at batch 4): 2000 requests
    held = 2000 * 1000 * 2 * 1.5
    assert dbmemory.measurement_mem_mb(points=[(4, 400.0)], copies=2, **args) == math.ceil(
        100 + held / 2**20
    )
    assert dbmemory.measurement_mem_mb(points=[(4, 400.0)], copies=0, **args) == 100
    # count windows: the warm-up's requests, or the floor's at the rate, plus the retries
    counted = {**measure, "measurement_mode": "count_windows", "request_count": 50}
    counted |= {"warmup_factor": 4, "max_retries": 0, "min_duration_ms": 0}
    low = dbmemory.measurement_mem_mb(points=[(1, 1.0)], copies=1, **(args | {"measure": counted}))
    assert low == math.ceil(100 + 200 * 1000 * 1.5 / 2**20)


def test_copies_by_perf_analyzer_release():
    """Triton 24.04 (tritonclient 2.45) is the first to record inputs; 24.11 (2.52) the first
    to copy them again on append; shared memory records none; the images' SDKs map to their
    tritonclient (server TRITON_VERSION of each release branch)."""
    assert tails.TENSORS_RECORDED_FROM == (2, 45)
    assert not tails.records_tensors("tritonclient 2.44.0")
    assert tails.records_tensors("tritonclient 2.45.0")
    tags = {
        "23.12": (2, 41),
        "24.04": (2, 45),
        "24.09": (2, 50),
        "25.01": (2, 54),
        "25.02": (2, 55),
    }
    for tag, version in tags.items():
        assert dbmemory.sdk_tritonclient(f"nvcr.io/nvidia/tritonserver:{tag}-py3-sdk") == version
    copies = {(2, 41): 0, (2, 44): 0, (2, 45): 1, (2, 51): 1, (2, 52): 2, (2, 55): 2, None: 2}
    for version, expected in copies.items():
        assert dbmemory.recorded_copies(version, "none") == expected
        assert dbmemory.recorded_copies(version, "system") == 0
        assert dbmemory.recorded_copies(version, "cuda") == 0


@pytest.mark.parametrize("model", sorted(base_config()["models"]))
def test_input_bytes_are_the_familys(model):
    """models.<m>.perf.input_bytes is what the family's inputs take (shape x type size)."""
    from deploybench.models import load_family

    settings = model_settings(workflow_config(), model, "A100")
    family = load_family(settings["module"], dict(settings["hparams"]))
    taken = sum(math.prod(s.shape) * np.dtype(s.dtype).itemsize for s in family.inputs)
    assert settings["perf"]["input_bytes"] == taken


def test_a_search_candidates_measurement_asks_as_its_runs_online_job(tmp_path):
    """The search's candidate measurements (rule search_online: the online job with its own
    resources) ask for their memory too, by the same formula as the run's online job."""
    smoke = yaml.safe_load((REPO / "config" / "smoke.yaml").read_text())
    config = deep_merge(base_config(), smoke)
    write_config(tmp_path, config)
    result = slurm_snakemake(tmp_path, "search", timeout_s=120, dry_run=True)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-4000:]
    asked = {int(r["mem_mb"]) for r in job_resources(out)["search_online"]}
    [target] = config["search_targets"]
    plan = dbplan.plan_run(validated(config), *target.split("/"))
    run_online = dbmemory.plan_measurement_mem_mb(validated(config), plan, "online")
    # the smoke search measures the run's own online point: the same inputs, rate and windows
    assert asked == {run_online} and run_online > config["measurement_memory"]["baseline_mb"]
