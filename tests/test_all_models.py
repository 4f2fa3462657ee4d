"""Every model, in every format that runs on CPU: the real chain at smoke sizes.

One `snakemake cpu` run with `config/smoke.yaml` layered over the shipped config (tiny networks,
tiny perf grids): checkpoint → export → repository → accuracy, task, offline and online CSVs,
through real tritonserver and perf_analyzer processes. (The CPU's fp16 chain, which rule `cpu`
leaves out, runs in tests/test_gpu_kit.py as the GPU kit runs it.)
"""

import csv
import shutil

import pytest

from deploybench.models import load_family
from deploybench.planning import workflow_config as dbconfig
from tests.conftest import REPO, SMOKE, base_config, planned_jobs, run_snakemake, smoke_config

pytestmark = pytest.mark.e2e


def cpu_runs():
    """What rule `cpu` runs: the runs of report set `cpu` (every model and format, fp32)."""
    config = smoke_config()
    return dbconfig.in_report_set(config, "cpu", dbconfig.all_runs(config))


def read_csv(path):
    with path.open() as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def workdir(smoke_run):
    return smoke_run


def test_every_model_has_a_cpu_run():
    models = {r.split("/")[0] for r in cpu_runs()}
    assert models == set(base_config()["models"])


def test_the_cpu_default_runs_fp16_and_rule_cpu_leaves_it_out():
    every = [r for r in dbconfig.all_runs(smoke_config()) if r.split("/")[1] == "cpu"]
    assert "tft/cpu/ts-trace/fp16" in every
    assert {r.split("/")[3] for r in every} == {"fp32", "fp16"}
    assert {r.split("/")[3] for r in cpu_runs()} == {"fp32"}


@pytest.mark.parametrize("run", cpu_runs())
def test_run_has_passing_accuracy_and_measurements(workdir, run):
    model = run.split("/")[0]
    settings = smoke_config()["models"][model]
    family = load_family(settings["module"], settings["hparams"])
    folder = workdir / "results" / run
    accuracy = read_csv(folder / "accuracy.csv")
    assert {r["output"] for r in accuracy} == {s.name for s in family.outputs}
    assert all(r["passed"] == "True" for r in accuracy)
    [task] = read_csv(folder / "task.csv")
    assert task["metric"] == family.metric_name and "not measured" in task["note"]
    for scenario, points in (("offline", 2), ("online", 1)):
        rows = read_csv(folder / f"{scenario}.csv")
        assert len(rows) == points
        assert all(float(r["throughput"]) > 0 and r["model"] == model for r in rows)


def test_nothing_left_to_do_after_the_run(workdir):
    assert planned_jobs(run_snakemake(workdir, "-n", "cpu")) == {}


def test_smoke_file_layers_over_the_shipped_config(tmp_path):
    (tmp_path / "config").mkdir()
    shutil.copy2(REPO / "config" / "config.yaml", tmp_path / "config" / "config.yaml")
    result = run_snakemake(tmp_path, "-n", "cpu", "--configfile", str(SMOKE))
    assert result.returncode == 0, result.stderr[-3000:]
    assert planned_jobs(result)["online"] == len(cpu_runs())
