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

from deploybench.columns import WRITTEN_REL
from tests.conftest import REPO, SMOKE_NVML_POWER_W

pytestmark = pytest.mark.e2e

RUN = "results/tft/cpu/onnx/fp32"
STANDIN_UUID = "GPU-00000000-fake-nvml-0000-000000000000"


def rows(path: Path) -> list[dict[str, str]]:
    with path.open() as f:
        return list(csv.DictReader(f))


@pytest.mark.parametrize("scenario", ["offline", "online"])
def test_joules_per_inference_are_the_meters_power_over_the_throughput(smoke_run, scenario):
    trials = rows(smoke_run / RUN / f"{scenario}.trials.csv")
    for trial in trials:
        assert trial["energy_status"] == "nvml"
        # the meter's counter over perf_analyzer's own windows (the profile export's), over the
        # inferences they held: exactly the stand-in's power over perf_analyzer's throughput
        throughput = float(trial["throughput"])
        assert float(trial["energy_per_inference_j"]) == pytest.approx(
            SMOKE_NVML_POWER_W / throughput, rel=1e-3
        )
        # the export holds the requests perf_analyzer counted in its measured windows
        assert trial["tail_requests"] == trial["measured_requests"]
        # the second meter: a CPU server has no nv_energy_consumption, and the trial says so
        assert trial["energy_per_inference_triton_j"] == ""
        assert trial["triton_energy_status"].startswith("not measured: the server's metrics")
        # Triton's GPU metrics: perf_analyzer collected them (--collect-metrics), and a CPU
        # server's cells are empty, the status saying why
        for column in ("triton_gpu_util_pct", "triton_gpu_power_w", "triton_gpu_memory_used_mib"):
            assert trial[column] == ""
        assert trial["triton_gpu_status"].startswith(
            "not measured: the server's metrics have no nv_gpu_utilization"
        )
    perf_log = smoke_run / RUN.replace("results", "logs") / f"{scenario}.perf_analyzer.log"
    commands = [line for line in perf_log.read_text().splitlines() if line.startswith("$ ")]
    assert commands and all("--collect-metrics --metrics-url http://" in c for c in commands)
    points = rows(smoke_run / RUN / f"{scenario}.csv")
    assert points
    for point in points:
        assert point["energy_status"] == "nvml"
        own = [
            t
            for t in trials
            if (t["batch"], t["concurrency"]) == (point["batch"], point["concurrency"])
        ]
        mean = sum(float(t["energy_per_inference_j"]) for t in own) / len(own)
        # the trials' values and the point's mean are each written to WRITTEN_DIGITS
        assert float(point["energy_per_inference_j"]) == pytest.approx(mean, rel=2 * WRITTEN_REL)
        assert point["energy_per_inference_j_ci95"] != ""  # 3 trials: an interval
        assert float(point["power_mean_w"]) == pytest.approx(SMOKE_NVML_POWER_W, rel=0.01)
        assert float(point["idle_power_w"]) == pytest.approx(SMOKE_NVML_POWER_W, rel=0.01)
        # the stand-in's power does not move with load: nothing above idle
        above = float(point["energy_above_idle_per_inference_j"])
        assert abs(above) < 0.02 * float(point["energy_per_inference_j"])
        assert point["throttled"] == "False" and point["throttle_reasons"] == ""
        assert float(point["throttle_power_cap_fraction"]) == 0
        assert point["throttle_source"] == "violation counters; clock-event samples"
        assert point["idle_power_ci95_w"] != ""
        assert float(point["power_limit_w"]) == 350.0
        # the tails: every request of the 3 trials, and whether they back a p99 estimate
        requests = int(point["tail_requests"])
        assert requests == sum(int(t["tail_requests"]) for t in own)
        assert float(point["p99_pooled_ms"]) > 0
        if requests >= 662:
            assert point["tail_note"] == ""
            assert float(point["p99_bound_ms"]) >= float(point["p99_pooled_ms"])
        else:
            assert point["p99_bound_ms"] == "" and point["tail_note"].startswith("too few")


def test_the_provenance_names_the_gpu_the_energy_was_read_on(smoke_run):
    record = json.loads((smoke_run / RUN / "offline.provenance.json").read_text())
    energy = record["config"]["energy"]
    assert energy["meter"] == "nvml" and energy["status"] == "nvml"
    assert energy["meter_facts"]["uuid"] == STANDIN_UUID
    assert energy["idle_power_w"] == pytest.approx(SMOKE_NVML_POWER_W, rel=0.02)
    # read before the first trial and after the sweep, each over its windows, both recorded
    idle = energy["idle"]
    assert idle["before"]["status"] == idle["after"]["status"] == "measured"
    assert len(idle["before"]["windows_w"]) == len(idle["after"]["windows_w"]) == 3
    assert idle["used"] == "the mean of before and after the sweep"
    assert energy["idle_power_ci95_w"] is not None


def test_every_points_p99_says_whether_enough_requests_back_it(smoke_run):
    # every model's points (one trial each but TFT's): loadgen's early-stopping p99 estimate
    # with 662 requests or more, else a note that says how many there were
    points = [
        p
        for path in sorted((smoke_run / "results").glob("*/cpu/*/*/o*line.csv"))
        for p in rows(path)
    ]
    assert len(points) >= 10
    for point in points:
        requests = int(point["tail_requests"])
        assert requests > 0
        if requests >= 662:
            assert point["tail_note"] == "" and float(point["p99_bound_ms"]) > 0
        else:
            assert point["p99_bound_ms"] == ""
            assert (
                point["tail_note"]
                == f"too few requests for an early-stopping p99 estimate: {requests} of 662"
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
