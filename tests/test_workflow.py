"""End to end: real Snakemake, real tritonserver, real perf_analyzer, on a tiny config."""

import csv
import json
import os
import time
from pathlib import Path

import pytest
import yaml

from deploybench import provenance, stats
from deploybench.checkpoint import write_seeded_checkpoint
from deploybench.columns import INTERVAL_COLUMNS, TRIAL_COLUMNS
from deploybench.models import load_family
from deploybench.perf import COLUMNS
from deploybench.planning.workflow_config import deep_merge
from tests.conftest import (
    REPO,
    SMOKE,
    SMOKE_TFT_CHECKPOINT,
    base_config,
    planned_jobs,
    processes_mentioning,
    run_snakemake,
    smoke_config,
    write_config,
)
from tests.dle_fixtures import tft_reference_checkpoint

pytestmark = pytest.mark.e2e

RUN = "results/tft/cpu/onnx/fp32"
# For dry runs only; the measured workdir is the shared smoke run (config/smoke.yaml's sizes:
# max batch 8, offline batch sizes 1 and 4, online concurrency 2).
TINY = yaml.safe_load(SMOKE.read_text())


def write_overlay(workdir: Path, name: str, overlay: dict) -> str:
    path = workdir / name
    path.write_text(yaml.safe_dump(overlay))
    return str(path)


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open() as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def workdir(smoke_run):
    return smoke_run


def test_perf_csvs_have_published_columns_and_plausible_values(workdir):
    for scenario, points in (("offline", [(1, 1), (4, 1)]), ("online", [(1, 2)])):
        path = workdir / RUN / f"{scenario}.csv"
        assert list(read_csv(path)[0]) == COLUMNS
        rows = read_csv(path)
        assert [(int(r["batch"]), int(r["concurrency"])) for r in rows] == points
        for r in rows:
            assert r["scenario"] == scenario and r["model"] == "tft" and r["gpu"] == "cpu"
            assert float(r["throughput"]) > 0
            p50, p90, p99 = (float(r[f"p{q}_latency_ms"]) for q in (50, 90, 99))
            assert 0 < p50 <= p90 <= p99 < 10_000
            assert float(r["server_compute_infer_ms"]) > 0
            assert r["stable"] in ("True", "False")
            assert int(r["request_count"]) >= 10


def test_points_are_measured_in_alternating_trials_with_intervals(workdir):
    """The smoke TFT measures each point 3 times (each trial at least the 2 s floor): the CSV
    holds the trials' mean and 95 % half-width, and `stable` follows the rule."""
    settings = TINY["sizings"]["cpu"]["tft"]["perf"]
    trials, floor_s = settings["trials"], settings["min_duration_ms"] / 1000
    for scenario, points in (("offline", [(1, 1), (4, 1)]), ("online", [(1, 2)])):
        rows = read_csv(workdir / RUN / f"{scenario}.csv")
        measured = read_csv(workdir / RUN / f"{scenario}.trials.csv")
        assert list(measured[0]) == TRIAL_COLUMNS
        # alternating: trial 1 of every point, then trial 2, ...
        assert [(int(t["batch"]), int(t["concurrency"]), int(t["trial"])) for t in measured] == [
            (*p, n) for n in range(1, trials + 1) for p in points
        ]
        for r in rows:
            mine = [
                t
                for t in measured
                if (t["batch"], t["concurrency"]) == (r["batch"], r["concurrency"])
            ]
            assert int(r["trials"]) == trials == len(mine)
            for column in ("throughput", "p99_latency_ms"):
                iv = stats.interval([float(t[column]) for t in mine])
                assert float(r[column]) == pytest.approx(iv.mean, rel=1e-5)
                assert float(r[INTERVAL_COLUMNS[column]]) == pytest.approx(iv.half_width, rel=1e-4)
            # the floor: fast points get more than the configured 10 requests a window, and no
            # trial measured less than the floor
            assert all(float(t["measured_s"]) >= floor_s for t in mine)
            assert int(r["request_count"]) > settings["request_count"]
            assert float(r["measured_s"]) == min(float(t["measured_s"]) for t in mine)
            assert r["duration_capped"] == "False"
            assert int(r["measured_requests"]) == sum(int(t["measured_requests"]) for t in mine)
            throughput = stats.interval([float(t["throughput"]) for t in mine])
            stable = all(t["stable"] == "True" for t in mine) and throughput.within(
                settings["max_ci_pct"]
            )
            assert r["stable"] == str(stable)
    # a one-trial model (the smoke run's others) has no interval, and says so
    [first, *_] = read_csv(workdir / "results/bert/cpu/onnx/fp32/offline.csv")
    assert first["trials"] == "1" and first["throughput_ci95"] == ""


def test_accuracy_csv_passes(workdir):
    [row] = read_csv(workdir / RUN / "accuracy.csv")
    assert row["output"] == "target__0" and row["passed"] == "True" and row["batch"] == "4"
    assert float(row["max_abs_err"]) <= float(row["atol"]) + 1e-3


def test_dle_checkpoint_drives_the_default_run(workdir):
    """The smoke run's TFT serves a checkpoint.pt as DLE 23.04+ writes it (``TFTpart2.``
    names): the workflow's checkpoint holds its weights by this project's names, and the
    accuracy above passed on them."""
    import torch

    from deploybench.checkpoint import load_checkpoint

    prov = json.loads(
        (workdir / "results/tft/checkpoint/checkpoint.pt.provenance.json").read_text()
    )
    assert prov["origin"] == f"checkpoint {SMOKE_TFT_CHECKPOINT}"
    _, _, dle = tft_reference_checkpoint("TFTpart2")
    served = load_checkpoint(workdir / "results/tft/checkpoint/checkpoint.pt")["model"]
    assert served.keys() == {k.removeprefix("TFTpart2.") for k in dle}
    for name in ("TFTpart2.quantile_proj.weight", "embedding.s_cat_embed.0.weight"):
        assert torch.equal(served[name.removeprefix("TFTpart2.")], dle[name])


def test_results_have_provenance(workdir):
    for name in ("accuracy", "offline", "online"):
        prov = json.loads((workdir / RUN / f"{name}.provenance.json").read_text())
        assert prov["config"]["backend"] == "python" and prov["config"]["runtime"] == "onnxruntime"
        assert prov["software"]["torch"].startswith("2.13")
        assert prov["tritonserver"]["version"]
        # the server process's own environment and the TF32 state it makes (no override here)
        server_environment = prov["tritonserver"]["environment"]
        assert server_environment["source"].startswith("/proc/")
        assert server_environment["tf32"].startswith("default")
        assert prov["host"]["cpu_count"] >= 1 and prov["container"]["runtime"] == "native venv"
        # the source tree's commit, though the working directory is no checkout
        assert prov["git"] == provenance.git_state(REPO)
    offline = json.loads((workdir / RUN / "offline.provenance.json").read_text())
    assert offline["config"]["points"] == [
        {"batch": 1, "concurrency": 1},
        {"batch": 4, "concurrency": 1},
    ]


def test_repository_config_comes_from_config(workdir):
    text = (workdir / RUN / "repository" / "tft" / "config.pbtxt").read_text()
    assert "max_batch_size: 8" in text and "preferred_batch_size: [4, 8]" in text
    assert 'string_value: "onnxruntime"' in text


def test_second_run_schedules_nothing(workdir):
    assert planned_jobs(run_snakemake(workdir, "-n")) == {}


def test_online_only_change_reruns_only_online(workdir):
    overlay = write_overlay(
        workdir,
        "online.yaml",
        {"sizings": {"cpu": {"tft": {"perf": {"online": {"concurrency": [1, 3]}}}}}},
    )
    result = run_snakemake(workdir, "-n", "--configfile", overlay)
    assert result.returncode == 0, result.stderr[-3000:]
    # the default target's charts and report page read online.csv too
    assert planned_jobs(result) == {"online": 1, "plots": 1, "model_report": 1, "all": 1}


def test_new_checkpoint_reruns_export_and_downstream(copy_of):
    # Snakemake ignores an mtime change of a small file whose content it has checksummed, so
    # the checkpoint really changes: another seed's weights.
    checkpoint = copy_of / "results/tft/checkpoint/checkpoint.pt"
    settings = smoke_config()["models"]["tft"]
    write_seeded_checkpoint(load_family("tft", settings["hparams"]), 1, checkpoint)
    later = time.time() + 5
    os.utime(checkpoint, (later, later))
    jobs = planned_jobs(run_snakemake(copy_of, "-n"))
    assert jobs == {
        "export": 1,
        "repository": 1,
        "accuracy": 1,
        "offline": 1,
        "online": 1,
        "plots": 1,
        "model_report": 1,
        "all": 1,
    }


def test_accuracy_miss_fails_and_leaves_no_server(copy_of):
    overlay = write_overlay(
        copy_of,
        "strict.yaml",
        {
            "sizings": {
                "cpu": {
                    "tft": {"accuracy": {"tolerance": {"target__0": {"atol": 0.0, "rtol": 0.0}}}}
                }
            }
        },
    )
    result = run_snakemake(copy_of, f"{RUN}/accuracy.csv", "--configfile", overlay)
    out = result.stdout + result.stderr
    assert result.returncode != 0
    assert "Triton's output differs from the framework" in out
    assert not (copy_of / RUN / "accuracy.csv").exists()  # no stale or partial result
    assert processes_mentioning(str(copy_of)) == []


def test_gpu_conversion_here_says_it_needs_a_gpu(copy_of):
    result = run_snakemake(copy_of, "results/tft/A30/trt/fp16/convert/model.plan")
    assert result.returncode != 0
    assert "needs a GPU node" in result.stdout + result.stderr
    assert not (copy_of / "results/tft/A30/trt/fp16/convert/model.plan").exists()


@pytest.fixture(scope="module")
def fresh(tmp_path_factory):
    wd = tmp_path_factory.mktemp("fresh")
    write_config(wd, deep_merge(base_config(), TINY))
    return wd


def test_gpu_target_resolves_full_chain(fresh):
    result = run_snakemake(fresh, "-n", "results/tft/A30/trt/fp16/online.csv")
    assert result.returncode == 0, result.stderr[-3000:]
    assert planned_jobs(result) == {
        "prepare_checkpoint": 1,
        "export": 1,
        "convert": 1,
        "repository": 1,
        "online": 1,
    }


def test_runs_from_a_working_directory_without_a_config(tmp_path):
    """`snakemake -s <checkout>/Snakefile` from another directory reads the workflow's own
    config/config.yaml (a relative `configfile:` is read from the working directory only)."""
    result = run_snakemake(tmp_path, "-n", "results/tft/A30/trt/fp16/online.csv")
    assert result.returncode == 0, result.stderr[-3000:]
    assert planned_jobs(result)["online"] == 1
    assert not (tmp_path / "config").exists()


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("results/bert9/cpu/onnx/fp32/online.csv", "unknown model 'bert9'; valid choices: "),
        ("results/tft/H100/onnx/fp32/online.csv", "unknown gpu 'H100'; valid choices:"),
        ("results/tft/cpu/tflite/fp32/offline.csv", "unknown format 'tflite'; valid choices:"),
        (
            "results/tft/cpu/onnx/fp64/accuracy.csv",
            "precision 'fp64' is not available for tft/cpu/onnx; valid choices: fp16, fp32",
        ),
        (
            "results/tft/cpu/trt/fp32/online.csv",
            "format 'trt' does not run on gpu 'cpu'; valid choices: onnx, tf-savedmodel, ts-script, ts-trace",
        ),
    ],
)
def test_bad_targets_fail_at_dag_time(fresh, target, message):
    result = run_snakemake(fresh, "-n", target)
    assert result.returncode != 0
    assert message in result.stdout + result.stderr
    assert not (fresh / "results").exists()


def test_default_target_draws_the_targets_charts_and_page(fresh):
    """`snakemake` (and `make demo`) also draws the charts of the runs under `targets` and a
    report page of them, reports/targets/<model>.html."""
    result = run_snakemake(fresh, "-n")
    assert result.returncode == 0, result.stderr[-3000:]
    jobs = planned_jobs(result)
    assert jobs["plots"] == 1 and jobs["model_report"] == 1 and jobs["online"] == 1
    assert "reports/targets/tft.html" in result.stdout + result.stderr
    overlay = write_overlay(
        fresh, "sets.yaml", {"report": {"sets": {"targets": {"gpus": ["cpu"]}}}}
    )
    refused = run_snakemake(fresh, "-n", "--configfile", overlay)
    assert refused.returncode != 0
    assert "report.sets: 'targets' is the report set of the runs under `targets`" in (
        refused.stdout + refused.stderr
    )


def test_hostile_wildcards_never_reach_a_job(fresh):
    for target in [
        "results/tft;touch${IFS}pwned/cpu/onnx/fp32/online.csv",
        "results/tft/cpu/onnx/fp32$(touch pwned)/online.csv",
        "results/tft/cpu`touch pwned`/onnx/fp32/offline.csv",
        "results/tft/cpu/onnx';touch pwned;'/fp32/accuracy.csv",
        "results/tft/cpu/onnx/fp32/../../../../pwned/online.csv",
        "results/tft/export/onnx/fp32/model.onnx;touch pwned",
        "results/tft/checkpoint/checkpoint.pt|touch pwned",
        "reports/cpu$(touch pwned)/tft.html",
        "images/x;touch pwned.sif",
    ]:
        result = run_snakemake(fresh, "-n", target)
        assert result.returncode != 0
    assert not (fresh / "pwned").exists() and not (fresh / "results").exists()


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"models": {"tft": {"perf": {"request_count": "lots"}}}}, "request_count"),
        (
            {"sizings": {"cpu": {"tft": {"triton": {"max_batch_size": -1}}}}},
            "sizings.cpu.tft.triton.max_batch_size: -1 is less than the minimum of 1",
        ),
        (
            {"server": {"startup_timeout_s": "soon"}},
            "On instance['server']['startup_timeout_s']",
        ),
        (
            {"models": {"tft": {"perf": {"offline": {"batch_sizes": [0]}}}}},
            "On instance['models']['tft']['perf']['offline']['batch_sizes'][0]",
        ),
        (
            {"models": {"tft": {"checkpoint": "/no/such/checkpoint.pt"}}},
            "models.tft.checkpoint: '/no/such/checkpoint.pt' does not exist",
        ),
        (
            {"models": {"tft": {"accuracy": {"task": {"path": "/no/such/data", "batch_size": 8}}}}},
            "models.tft.accuracy.task.path: '/no/such/data' does not exist",
        ),
    ],
)
def test_bad_config_values_fail_before_any_job(tmp_path, overrides, message):
    write_config(tmp_path, deep_merge(base_config(), deep_merge(TINY, overrides)))
    result = run_snakemake(tmp_path, "-n")
    assert result.returncode != 0
    assert message in result.stdout + result.stderr
