"""A trial's energy through perf.measure_point: the sampler around perf_analyzer (a stand-in
that writes the profile export) over the stand-in NVML; slowdowns as fractions of the trial
(NVML's violation counters, else the sampled bits), only a thermal or hardware one marking the
point unstable; the idle baseline read before and after the sweep, its interval carried into
the above-idle figure; and the columns empty, never 0, where nothing measured energy (this
machine has no RAPL)."""

from __future__ import annotations

import csv
import math
from dataclasses import replace
from pathlib import Path

import pytest

from deploybench import perf, stats, tails
from deploybench.collectors import with_idle
from deploybench.instruments import TrialEnergy
from deploybench.io import write_csv
from deploybench.jobs.measure import IdleReads, energy_meter
from deploybench.meters import open_meter
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


def trial_energy(
    library: Path, idle_power_w: float | None = 150.0, idle_ci95_w: float | None = None
) -> TrialEnergy:
    meter = open_meter("nvml", nvml_library=str(library))
    return TrialEnergy(
        "nvml", meter, 0.02, idle_power_w, meter.power_limit_w(), idle_ci95_w=idle_ci95_w
    )


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
    assert row["throttle_power_cap_fraction"] == 0 and row["throttle_slowdown_fraction"] == 0
    assert row["throttle_source"] == "violation counters; clock-event samples"


def test_a_point_power_capped_all_trial_is_stable_and_says_so(tmp_path, monkeypatch, fake_nvml):
    # sw power cap (and idle, no slowdown) in every reading, and its violation counter
    # advancing all the time: the GPU at its power limit, as a loaded GPU normally is
    monkeypatch.setenv("FAKE_NVML_THROTTLE", str(0x4 | 0x1))
    stand_in(tmp_path, monkeypatch)
    settings = perf.MeasureSettings(request_count=50, warmup_factor=0)
    row = measure(tmp_path, settings, energy=trial_energy(fake_nvml))
    assert row["throttle_power_cap_fraction"] == pytest.approx(1.0, abs=0.02)
    assert row["throttle_reasons"].startswith("sw power cap ")
    assert row["throttled"] is False and row["throttle_slowdown_fraction"] == 0
    [point] = perf.summarize([row | {"trial": 1}], max_ci_pct=5)
    assert point["stable"] is True and point["unstable_reason"] == ""
    assert point["throttle_power_cap_fraction"] == row["throttle_power_cap_fraction"]
    assert point["throttle_reasons"] == row["throttle_reasons"]


def test_a_point_thermally_slowed_a_tenth_of_the_trial_is_unstable_saying_why(
    tmp_path, monkeypatch, fake_nvml
):
    # the thermal violation counter advances 10 % of the time; no sampled bit shows it (a
    # 100-ms reading would catch a short slowdown by chance): the counter measures it
    monkeypatch.setenv("FAKE_NVML_VIOLATION_THERMAL", "0.1")
    stand_in(tmp_path, monkeypatch)
    settings = perf.MeasureSettings(request_count=50, warmup_factor=0)
    row = measure(tmp_path, settings, energy=trial_energy(fake_nvml))
    assert row["throttle_slowdown_fraction"] == pytest.approx(0.1, abs=0.02)
    assert row["throttled"] is True and row["throttle_power_cap_fraction"] == 0
    [point] = perf.summarize([row | {"trial": 1}], max_ci_pct=5)
    assert point["stable"] is False and point["throttled"] is True
    reason = point["unstable_reason"]
    assert reason.startswith("GPU thermal or hardware slowdown (sw thermal slowdown ")
    assert reason.endswith(" %) in 1 of 1 trials")
    # under the configured fraction it is reported, and the point stays stable
    energy = replace(trial_energy(fake_nvml), max_slowdown_fraction=0.2)
    below = measure(tmp_path, settings, energy=energy)
    assert below["throttled"] is False and below["throttle_slowdown_fraction"] > 0
    [point] = perf.summarize([below | {"trial": 1}], max_ci_pct=5)
    assert point["stable"] is True


def test_without_violation_counters_the_sampled_bits_give_the_fraction(
    tmp_path, monkeypatch, fake_nvml
):
    monkeypatch.setenv("FAKE_NVML_NO_VIOLATION", "1")
    monkeypatch.setenv("FAKE_NVML_THROTTLE", str(0x40))  # hw thermal slowdown in every reading
    stand_in(tmp_path, monkeypatch)
    settings = perf.MeasureSettings(request_count=50, warmup_factor=0)
    row = measure(tmp_path, settings, energy=trial_energy(fake_nvml))
    assert row["throttle_source"] == "clock-event samples"
    assert row["throttle_reasons"] == "hw thermal slowdown 100 %"
    assert row["throttled"] is True and row["throttle_power_cap_fraction"] == 0
    [point] = perf.summarize([row | {"trial": 1}], max_ci_pct=5)
    assert (
        "GPU thermal or hardware slowdown (hw thermal slowdown 100 %)" in point["unstable_reason"]
    )


def test_the_idle_baselines_interval_reaches_the_above_idle_half_width(
    tmp_path, monkeypatch, fake_nvml
):
    stand_in(tmp_path, monkeypatch)
    settings = perf.MeasureSettings(request_count=50, warmup_factor=0)
    energy = trial_energy(fake_nvml, idle_power_w=140.0, idle_ci95_w=5.0)
    rows = [measure(tmp_path, settings, energy=energy) | {"trial": n} for n in (1, 2, 3)]
    for row in rows:
        # t/n: the windows' seconds over their inferences, = (E/n) / (E/t)
        per_inference = row["energy_per_inference_j"] / row["power_mean_w"]
        assert row["idle_power_ci95_w"] == 5.0
        assert row["idle_ci95_per_inference_j"] == pytest.approx(5.0 * per_inference)
        assert row["energy_above_idle_per_inference_j"] == pytest.approx(
            row["energy_per_inference_j"] - 140.0 * per_inference
        )
    [point] = perf.summarize(rows, max_ci_pct=100)
    above = [r["energy_above_idle_per_inference_j"] for r in rows]
    spread = stats.interval(above).half_width
    share = sum(r["idle_ci95_per_inference_j"] for r in rows) / 3
    # the trials' spread and the idle's share, in quadrature: wider than either
    assert point["energy_above_idle_per_inference_j_ci95"] == pytest.approx(
        math.hypot(spread, share), rel=1e-6
    )
    assert point["energy_above_idle_per_inference_j_ci95"] >= share
    # the energy itself does not rest on the idle: its interval is the trials' spread alone
    total = stats.interval([r["energy_per_inference_j"] for r in rows]).half_width
    assert point["energy_per_inference_j_ci95"] == pytest.approx(total, rel=1e-6)
    assert point["idle_power_ci95_w"] == 5.0


def test_without_a_meter_the_columns_are_empty_and_say_why(tmp_path, monkeypatch):
    stand_in(tmp_path, monkeypatch)
    settings = perf.MeasureSettings(request_count=50, warmup_factor=0)
    why = "not measured: no RAPL: /sys/class/powercap is absent"
    rows = [measure(tmp_path, settings, energy=TrialEnergy(why)) | {"trial": n} for n in (1, 2)]
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


def test_the_idle_is_read_before_and_after_the_sweep_and_both_recorded(fake_nvml, monkeypatch):
    idle = IdleReads({"settle_s": 0, "idle_s": 0.3, "idle_windows": 3}, 0.02)
    with open_meter("nvml", nvml_library=str(fake_nvml)) as meter:
        assert idle.read(meter, "before").endswith(" W")
        monkeypatch.setenv("FAKE_NVML_POWER_MW", "160000")  # warmer after the sweep
        idle.read(meter, "after")
    record = idle.record()
    before, after = record["idle"]["before"], record["idle"]["after"]
    assert before["status"] == after["status"] == "measured"
    assert before["power_w"] == pytest.approx(150, rel=0.02)
    assert after["power_w"] == pytest.approx(160, rel=0.02)
    assert len(before["windows_w"]) == len(after["windows_w"]) == 3
    assert record["idle"]["used"] == "the mean of before and after the sweep"
    assert record["idle_power_w"] == pytest.approx(155, rel=0.02)
    # half the drift between the two, at least
    assert record["idle_power_ci95_w"] >= 4.9 and "idle_status" not in record
    # a trial measured during the sweep takes the final baseline: above idle anew
    trial = {"energy_per_inference_j": 0.06, "power_mean_w": 150.0, "throughput": 2500.0}
    redone = with_idle(trial, record["idle_power_w"], record["idle_power_ci95_w"])
    per_inference = 0.06 / 150.0
    assert redone["energy_above_idle_per_inference_j"] == pytest.approx(
        0.06 - record["idle_power_w"] * per_inference
    )
    assert redone["idle_ci95_per_inference_j"] == pytest.approx(
        record["idle_power_ci95_w"] * per_inference
    )
    assert with_idle({"energy_per_inference_j": None}, 150.0, 1.0) == {
        "energy_per_inference_j": None
    }


def test_a_co_tenant_during_one_idle_read_leaves_the_other(fake_nvml, monkeypatch):
    idle = IdleReads({"settle_s": 0, "idle_s": 0.2, "idle_windows": 2}, 0.02)
    with open_meter("nvml", nvml_library=str(fake_nvml)) as meter:
        monkeypatch.setenv("FAKE_NVML_PROCESSES", "0:1")  # pid 1: no process of this job
        assert idle.read(meter, "before").startswith("not measured (shared GPU: pid 1 ")
        monkeypatch.delenv("FAKE_NVML_PROCESSES")
        idle.read(meter, "after")
    record = idle.record()
    assert record["idle"]["before"]["status"].startswith("not measured: shared GPU: pid 1 ")
    assert record["idle"]["used"] == "after the sweep"
    assert record["idle_power_w"] == pytest.approx(150, rel=0.02)
    # none at all: empty, and why
    none = IdleReads({"idle_s": 0}, 0.02)
    with open_meter("nvml", nvml_library=str(fake_nvml)) as meter:
        none.read(meter, "before")
        none.read(meter, "after")
    assert none.record()["idle_power_w"] is None
    assert none.record()["idle_status"] == (
        "not measured: before the sweep: energy.idle_s 0; after the sweep: energy.idle_s 0"
    )
