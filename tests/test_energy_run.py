"""Energy per inference and the tails on the shared CPU run, measured under the stand-in NVML
(tests/fixtures/fake_libnvidia_ml.c: a constant power, so a trial's joules per inference are
power over throughput) through real tritonserver and perf_analyzer, end to end: the CSVs, the
trials, the provenance, `deploybench summary` and the energy chart."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, SMOKE_NVML_POWER_W

pytestmark = pytest.mark.e2e

RUN = "results/tft/cpu/onnx/fp32"
STANDIN_UUID = "GPU-00000000-fake-nvml-0000-000000000000"


def rows(path: Path) -> list[dict[str, str]]:
    with path.open() as f:
        return list(csv.DictReader(f))


@pytest.mark.parametrize("scenario", ["offline", "online"])
def test_joules_per_inference_are_the_meters_power_over_the_throughput(smoke_run, scenario):
    points = rows(smoke_run / RUN / f"{scenario}.csv")
    assert points
    for point in points:
        assert point["energy_status"] == "nvml"
        throughput = float(point["throughput"])
        # each trial's window energy over its inferences: P / throughput of that trial; the
        # point's mean of those is within a few % of P over the mean throughput
        assert float(point["energy_per_inference_j"]) == pytest.approx(
            SMOKE_NVML_POWER_W / throughput, rel=0.05
        )
        assert float(point["power_mean_w"]) == pytest.approx(SMOKE_NVML_POWER_W, rel=0.02)
        assert float(point["idle_power_w"]) == pytest.approx(SMOKE_NVML_POWER_W, rel=0.02)
        # the stand-in's power does not move with load: nothing above idle
        above = float(point["energy_above_idle_per_inference_j"])
        assert abs(above) < 0.03 * float(point["energy_per_inference_j"])
        assert point["energy_per_inference_j_ci95"] != ""  # 3 trials: an interval
        assert point["throttled"] == "False" and point["throttle_reasons"] == ""
        assert float(point["power_limit_w"]) == 350.0
        # the tails: every request of the 3 trials, and whether they back a p99 bound
        requests = int(point["tail_requests"])
        assert requests > 0 and float(point["p99_pooled_ms"]) > 0
        if requests >= 662:
            assert point["tail_note"] == "" and float(point["p99_bound_ms"]) > 0
        else:
            assert point["p99_bound_ms"] == "" and point["tail_note"].startswith("too few")
    trials = rows(smoke_run / RUN / f"{scenario}.trials.csv")
    assert all(
        t["energy_status"] == "nvml" and float(t["energy_per_inference_j"]) > 0 for t in trials
    )


def test_the_provenance_names_the_gpu_the_energy_was_read_on(smoke_run):
    record = json.loads((smoke_run / RUN / "offline.provenance.json").read_text())
    energy = record["config"]["energy"]
    assert energy["meter"] == "nvml" and energy["status"] == "nvml"
    assert energy["meter_facts"]["uuid"] == STANDIN_UUID
    assert energy["idle_power_w"] == pytest.approx(SMOKE_NVML_POWER_W, rel=0.02)


def test_slow_points_say_their_p99_is_backed_by_too_few_requests(smoke_run):
    # BERT on the CPU: duration-capped points of a few requests each
    capped = [
        p
        for scenario in ("offline", "online")
        for p in rows(smoke_run / "results/bert/cpu/onnx/fp32" / f"{scenario}.csv")
    ]
    few = [p for p in capped if int(p["tail_requests"]) < 662]
    assert few, "expected BERT's capped points to hold fewer requests than a p99 bound needs"
    for point in few:
        assert point["p99_bound_ms"] == ""
        assert (
            point["tail_note"]
            == f"too few requests for a p99 bound: {point['tail_requests']} of 662"
        )


def test_summary_shows_joules_per_inference(smoke_run):
    shown = subprocess.run(
        [sys.executable, "-m", "deploybench", "summary", str(smoke_run / RUN)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
        check=True,
    ).stdout
    assert "J/infer" in shown
