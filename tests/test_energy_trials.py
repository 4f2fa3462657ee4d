"""A trial's energy through perf.measure_point: the sampler around perf_analyzer (a stand-in
that writes the profile export) over the stand-in NVML, throttling marking the point unstable,
and the columns empty, never 0, where nothing measured energy (this machine has no RAPL)."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from deploybench import perf, tails
from deploybench.io import write_csv
from deploybench.jobs.measure import energy_meter
from deploybench.telemetry import open_meter
from tests.nvml_standin import build_fake_nvml
from tests.test_units import measure, stand_in

ENERGY_NUMBERS = [
    "energy_per_inference_j",
    "energy_above_idle_per_inference_j",
    "power_mean_w",
    "power_max_w",
    "idle_power_w",
    "sm_clock_mhz",
    "temperature_c",
    "power_limit_w",
]


@pytest.fixture(scope="module")
def fake_nvml(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_fake_nvml(tmp_path_factory.mktemp("nvml"))


def trial_energy(library: Path, idle_power_w: float | None = 150.0) -> perf.TrialEnergy:
    meter = open_meter("nvml", nvml_library=str(library))
    return perf.TrialEnergy("nvml", meter, 0.02, idle_power_w, meter.power_limit_w())


def test_a_trial_reads_the_meter_over_the_exported_windows(tmp_path, monkeypatch, fake_nvml):
    stand_in(tmp_path, monkeypatch)
    settings = perf.MeasureSettings(request_count=50, warmup_factor=0)
    row = measure(tmp_path, settings, energy=trial_energy(fake_nvml))
    # the stand-in's export: 150 requests (3 windows of 50) over 0.06 s at 150 W: 9 J
    assert row["tail_requests"] == 150 and len(row["latencies_ms"]) == 150
    assert row["energy_per_inference_j"] == pytest.approx(9.0 / 150, rel=0.01)
    assert row["power_mean_w"] == pytest.approx(150.0, rel=0.01)
    assert row["energy_above_idle_per_inference_j"] == pytest.approx(0.0, abs=0.003)
    assert row["power_limit_w"] == 350.0 and row["energy_status"] == "nvml"
    assert row["throttled"] is False and row["throttle_reasons"] == ""


def test_a_throttled_trial_makes_its_point_unstable_saying_why(tmp_path, monkeypatch, fake_nvml):
    monkeypatch.setenv("FAKE_NVML_THROTTLE", str(0x4 | 0x1))  # sw power cap (and idle: no)
    stand_in(tmp_path, monkeypatch)
    settings = perf.MeasureSettings(request_count=50, warmup_factor=0)
    row = measure(tmp_path, settings, energy=trial_energy(fake_nvml))
    assert row["throttled"] is True and row["throttle_reasons"] == "sw power cap"
    [point] = perf.summarize([row | {"trial": 1}], max_ci_pct=5)
    assert point["stable"] is False
    assert point["unstable_reason"] == "GPU throttled (sw power cap) in 1 of 1 trials"


def test_without_a_meter_the_columns_are_empty_and_say_why(tmp_path, monkeypatch):
    stand_in(tmp_path, monkeypatch)
    settings = perf.MeasureSettings(request_count=50, warmup_factor=0)
    why = "not measured: no RAPL: /sys/class/powercap is absent"
    rows = [
        measure(tmp_path, settings, energy=perf.TrialEnergy(why)) | {"trial": n} for n in (1, 2)
    ]
    assert all(r["energy_status"] == why for r in rows)
    assert all(r.get(c) is None for r in rows for c in ENERGY_NUMBERS)
    [point] = perf.summarize(rows, max_ci_pct=50)
    assert point["energy_status"] == why and point["throttled"] is None
    assert point["energy_per_inference_j"] is None and point["energy_per_inference_j_ci95"] is None
    # the point is judged on what was measured: energy's absence does not make it unstable
    assert "throttled" not in point["unstable_reason"]
    write_csv(tmp_path / "p.csv", [point], [c for c in perf.COLUMNS if c in point])
    with (tmp_path / "p.csv").open() as f:
        [written] = list(csv.DictReader(f))
    assert written["energy_per_inference_j"] == "" and written["power_mean_w"] == ""


def test_the_jobs_meter_says_why_energy_is_not_measured(fake_nvml, monkeypatch):
    # this machine has no RAPL: the CPU's default meter measures nothing, and says so
    with energy_meter({"meter": "rapl"}) as (meter, status):
        assert meter is None and status.startswith("not measured: no RAPL")
    with energy_meter({"meter": "none"}) as (meter, status):
        assert meter is None and status.startswith("not measured: energy meter none")
    monkeypatch.setenv("FAKE_NVML_NO_ENERGY", "1")  # a GPU older than Volta
    with energy_meter({"meter": "nvml", "nvml_library": str(fake_nvml)}) as (meter, status):
        assert meter is None and "no total-energy counter" in status
    monkeypatch.delenv("FAKE_NVML_NO_ENERGY")
    with energy_meter({"meter": "nvml", "nvml_library": str(fake_nvml)}) as (meter, status):
        assert meter is not None and status == "nvml"


def test_which_perf_analyzers_write_tensors_into_their_export():
    assert not tails.records_tensors("tritonclient 2.41.0")  # the venv's and the GPU kit's
    assert tails.records_tensors("tritonclient 2.54.0")
    assert tails.records_tensors("/opt/deploybench/bin/perf_analyzer")  # an image's: not known
    ask = {"tensors_recorded": True, "requests_per_window": 1000, "max_windows": None}
    # in shared memory, or small: asked for; ResNet-50's 150,528 input values: not
    assert tails.export_too_costly(shared_memory=True, values_per_request=10**6, **ask) is None
    assert tails.export_too_costly(shared_memory=False, values_per_request=100, **ask) is None
    why = tails.export_too_costly(shared_memory=False, values_per_request=151_529, **ask)
    assert why is not None and "151529 values a request" in why and "not asked for" in why


def test_an_export_too_costly_is_not_asked_for_and_the_trial_says_why(
    tmp_path, monkeypatch, fake_nvml
):
    calls = stand_in(tmp_path, monkeypatch)
    calls.write_text("")
    # a perf_analyzer that records tensors, a ResNet-50-sized input, no shared memory
    size = perf.ExportSize(tensors_recorded=True, input_values=150_528, output_values=1001)
    settings = perf.MeasureSettings(request_count=1000, warmup_factor=0)
    row = measure(tmp_path, settings, energy=trial_energy(fake_nvml), export_size=size)
    assert row["energy_status"].startswith("not measured: perf_analyzer's profile export")
    assert row["energy_per_inference_j"] is None and row["tail_requests"] is None
    [point] = perf.summarize([row | {"trial": 1}], max_ci_pct=5)
    assert point["tail_note"] == "no per-request record" and point["p99_pooled_ms"] is None
    # the throughput and perf_analyzer's own latencies are measured as ever
    assert point["throughput"] > 0 and point["p99_latency_ms"] > 0
