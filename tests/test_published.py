"""Every published result row maps to a run the config allows, and its DAG resolves."""

import copy
import csv
from pathlib import Path

import pytest

from deploybench.planning import workflow_config as dbconfig
from deploybench.planning.run_plan import plan_run
from tests.conftest import (
    REPO,
    base_config,
    planned_jobs,
    run_snakemake,
    validated,
    write_config,
)

PUBLISHED = REPO / "config" / "reference" / "published.csv"  # what the code reads
KEYS = ("model", "dataset", "gpu", "format", "precision", "accelerator")


def published_combinations() -> list[dict[str, str]]:
    with PUBLISHED.open() as f:
        rows = {tuple(r[k] for k in KEYS) for r in csv.DictReader(f)}
    return [dict(zip(KEYS, r, strict=True)) for r in sorted(rows)]


pytestmark = pytest.mark.skipif(not PUBLISHED.exists(), reason=f"{PUBLISHED} not present")


def test_every_published_combination_maps_to_an_allowed_run():
    config = base_config()
    runs = {
        tuple(r.values()): dbconfig.reference_run(config, r).path for r in published_combinations()
    }
    assert len(runs) >= 40
    # the two TFT data sets and the two ONNX Runtime accelerators stay apart
    assert runs[("tft", "traffic", "A30", "trt", "fp16", "none")] == "tft_traffic/A30/trt/fp16"
    assert runs[("tft", "electricity", "A30", "trt", "fp16", "none")] == "tft/A30/trt/fp16"
    assert runs[("bert", "", "T4", "onnx", "fp16", "trt")] == "bert/T4/onnx-trt/fp16"
    assert runs[("bert", "", "T4", "onnx", "fp16", "none")] == "bert/T4/onnx/fp16"


def test_unpublished_format_of_a_model_is_rejected_with_choices():
    with pytest.raises(
        dbconfig.ConfigError, match="format 'tf-trt' is not configured for model 'bert'"
    ):
        dbconfig.resolve(base_config(), "bert", "A30", "tf-trt", "fp16")


def test_every_published_combination_resolves_a_dag(tmp_path: Path):
    config = base_config()
    runs = {dbconfig.reference_run(config, r).path for r in published_combinations()}
    # every run plans, the seeds' V100 (compute capability 7.0) too: NGC 25.xx's images start
    # at 7.5, so its runs get the 24.09 ones (images.<i>.older_gpus), exported there
    planned = validated(copy.deepcopy(config))
    v100 = set()
    for path in runs:
        plan = plan_run(planned, *path.split("/"))
        if plan.gpu == "V100":
            v100.add(path)
            assert set(plan.containers.values()) <= {
                "pytorch-24.09",
                "triton-24.09",
                "tensorflow-24.09",
                "triton-24.09-tf",
            }, path
            assert plan.export.image_key == plan.containers["framework"], path
        else:
            assert plan.export.image_key is None, path
    assert len(v100) >= 10
    targets = sorted(f"results/{path}/online.csv" for path in runs)
    write_config(tmp_path, config)
    result = run_snakemake(tmp_path, "-n", *targets, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    jobs = planned_jobs(result)
    assert jobs["online"] == len(targets)
    # one checkpoint per model entry, engines per gpu, nothing measured twice
    assert jobs["prepare_checkpoint"] == len({t.split("/")[1] for t in targets})
    assert "offline" not in jobs and "accuracy" not in jobs
    # the V100's exports are made in its own images; the other GPUs share the models' own
    exported_in_image = {t.split("/")[1] for t in targets if "/V100/" in t}
    assert jobs.get("export_in_image", 0) + jobs.get("export_directory_in_image", 0) >= len(
        exported_in_image
    )
