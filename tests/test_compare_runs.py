"""`deploybench compare` on real CPU runs: the shared smoke run's TFT online sweep against its
search's baseline candidate (one configuration measured twice: no false alarm) and against a
copy served slower on purpose (a significant regression, exit 1), throughput, p99 and energy
per inference (the smoke run's stand-in NVML) alike."""

import math
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from deploybench.compare import ENERGY, METRICS, REGRESSION, category
from tests.conftest import REPO, RUN_TO_RUN_PCT, run_snakemake

pytestmark = pytest.mark.e2e

RUN = "results/tft/cpu/onnx/fp32"
OFFLINE = f"{RUN}/offline.csv"
# the search's candidate with the run's own settings (config/smoke.yaml's TFT)
BASELINE = "i1-b8-p4.8-q1-t1"


def copy_run(smoke_run: Path, into: Path) -> Path:
    copy = into / "workdir"
    shutil.copytree(smoke_run, copy, symlinks=True)
    return copy


def compare(a: Path, b: Path, *options: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "deploybench", "compare", str(a), str(b), *options],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
        check=False,
    )


def test_one_configuration_measured_twice_raises_no_alarm(smoke_run, tmp_path):
    """The smoke run measured TFT's own configuration twice: the run's online sweep and, in its
    search, the baseline candidate (the same Triton settings over the same sweep, another
    job, another server): a candidate's folder compares like any run directory. No alarm is
    no regression past what this machine moves between two runs, and every metric compared
    with its interval; not "no difference": this machine's speed moves between the two
    measurements, and a significant change is then the truth."""
    baseline = smoke_run / RUN / "search" / BASELINE
    assert (baseline / "online.csv").read_text() != (smoke_run / RUN / "online.csv").read_text()
    table = tmp_path / "compared.csv"
    threshold = ("--threshold", f"{RUN_TO_RUN_PCT:g}", "--csv", str(table))
    outcome = compare(smoke_run / RUN, baseline, *threshold)
    assert outcome.returncode == 0, outcome.stdout + outcome.stderr
    assert "| online | 1 | 2 |" in outcome.stdout, outcome.stdout
    assert "regression" not in outcome.stdout.lower().replace("no regression", "")
    points = pd.read_csv(table).to_dict("records")
    assert points
    for point in points:
        for metric in METRICS:  # energy per inference (the stand-in NVML's) as throughput is
            assert math.isfinite(point[f"{metric}_ratio"]), point
            assert math.isfinite(point[f"{metric}_ratio_ci95"]), point  # 3 trials a side
            assert category(point[f"{metric}_verdict"]) != REGRESSION, point
        assert point[f"{ENERGY}_a"] > 0 and point[f"{ENERGY}_b"] > 0
    assert f"energy per inference: {len(points)} " in outcome.stdout, outcome.stdout


def test_a_run_slowed_on_purpose_is_a_significant_regression(smoke_run, tmp_path):
    """The slowed copy's dynamic batcher holds every request 100 ms for company (a serving
    misconfiguration): offline batch 1, alone at concurrency 1, waits the whole delay."""
    slowed = copy_run(smoke_run, tmp_path)
    overlay = slowed / "slow.yaml"
    # batch 1 only: the point the test reads (the delay costs every point a request's wait)
    slow = {"triton": {"max_queue_delay_us": 100_000}, "perf": {"offline": {"batch_sizes": [1]}}}
    overlay.write_text(yaml.safe_dump({"sizings": {"cpu": {"tft": slow}}}))
    result = run_snakemake(slowed, OFFLINE, "--configfile", str(overlay))
    assert result.returncode == 0, result.stderr[-3000:]
    outcome = compare(smoke_run / RUN, slowed / RUN)
    assert outcome.returncode == 1, outcome.stdout + outcome.stderr
    regressions = [
        line for line in outcome.stdout.splitlines() if "regression" in line.lower() and "|" in line
    ]
    assert any("offline" in line and "| 1 |" in line for line in regressions), outcome.stdout
    # a request held 100 ms costs its joules too: energy per inference is a regression as well
    assert "energy per inference: 1 regression" in outcome.stdout, outcome.stdout
    # the same trees the other way round: a significant improvement, no regression
    assert compare(slowed / RUN, smoke_run / RUN).returncode == 0
