"""The energy meters (deploybench.meters, telemetry, nvml, rapl): NVML against the stand-in
libnvidia-ml.so.1 (tests/fixtures/fake_libnvidia_ml.c: a counter advancing at a constant
power), RAPL against a stand-in powercap tree, the sampler thread and a window's numbers."""

from __future__ import annotations

import itertools
import math
import os
import time
from pathlib import Path

import pytest

from deploybench.errors import ConfigError, DeploybenchError
from deploybench.gpu_identity import ServerGpus
from deploybench.meters import (
    MIG_INSTANCE,
    NO_ENERGY_COUNTER,
    POWER_AVERAGED,
    POWER_INSTANT,
    describe,
    open_meter,
)
from deploybench.telemetry import (
    BY_COUNTERS,
    BY_SAMPLES,
    SLOWDOWNS,
    THROTTLING,
    IdleRead,
    Meter,
    NotMeasured,
    Sample,
    Sampler,
    idle_baseline,
    read_idle,
    throttle_names,
    window,
)
from tests.nvml_standin import LIMIT_MW, NAME, POWER_MW, UUID, build_fake_nvml, gpu_uuid

S = 1_000_000_000  # ns


@pytest.fixture(scope="session")
def fake_nvml(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The stand-in libnvidia-ml.so.1 (its path)."""
    return build_fake_nvml(tmp_path_factory.mktemp("fake-nvml"))


@pytest.fixture(autouse=True)
def _no_fake_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("FAKE_NVML_"):
            monkeypatch.delenv(name)


def nvml(library: Path, **environ: str) -> Meter:
    return open_meter("nvml", nvml_library=str(library), environ=environ)


# --- NVML -----------------------------------------------------------------------------------


def test_nvml_energy_over_a_window_is_the_power_times_its_seconds(fake_nvml):
    with nvml(fake_nvml) as meter, Sampler(meter, 0.05) as sampler:
        time.sleep(0.5)
    samples = sampler.samples
    start, end = samples[0].time_ns + S // 20, samples[-1].time_ns - S // 20
    telemetry = window(samples, start, end)
    # the block slept 0.5 s; a loaded machine only makes the exit reading later
    assert telemetry.seconds == pytest.approx((end - start) / S) and telemetry.seconds >= 0.4
    assert telemetry.energy_j == pytest.approx(POWER_MW / 1000 * telemetry.seconds, rel=0.02)
    assert telemetry.power_mean_w == pytest.approx(150, rel=0.02)
    assert telemetry.power_max_w == 150
    assert (telemetry.sm_clock_mhz, telemetry.mem_clock_mhz) == (1755, 2619)
    assert telemetry.temperature_c == 45 and telemetry.gpu_util_pct == 37
    assert telemetry.memory_used_mib == 1536 and telemetry.throttle_reasons == 0


def test_nvml_reads_what_the_gpu_reports(fake_nvml, monkeypatch):
    monkeypatch.setenv("FAKE_NVML_POWER_MW", "200000")
    monkeypatch.setenv("FAKE_NVML_SM_MHZ", "1410")
    monkeypatch.setenv("FAKE_NVML_TEMP_C", "83")
    monkeypatch.setenv("FAKE_NVML_THROTTLE", str(0x4 | 0x1))
    with nvml(fake_nvml) as meter:
        first = meter.read()
        time.sleep(0.2)
        second = meter.read()
        assert meter.power_limit_w() == LIMIT_MW / 1000
    assert (first.power_w, first.sm_clock_mhz, first.temperature_c) == (200, 1410, 83)
    assert first.throttle_reasons == 0x5
    seconds = (second.time_ns - first.time_ns) / S
    assert second.energy_j - first.energy_j == pytest.approx(200 * seconds, rel=0.02)


def test_nvml_facts_name_the_gpu_read(fake_nvml):
    with nvml(fake_nvml) as meter:
        facts = meter.facts()
    gpu = {
        "uuid": UUID,
        "name": NAME,
        "nvml_index": 0,
        "power_limit_w": 350.0,
        "application_clocks_mhz": {"sm": 1755, "mem": 2619},
        "persistence_mode": True,
    }
    assert facts == {
        "meter": "nvml",
        **gpu,
        "driver": "999.99.99-standin",
        "uuids": [UUID],
        "gpus": [gpu],
        "how_chosen": "no server GPU given (a server on the CPU): NVML's first GPU this job "
        "may read, index 0",
        "counter_period_ms": None,  # until measured (Meter.measure_counter_period)
        "processes_listed": True,
        "power_reading": POWER_INSTANT,
        "slowdown_counters": {
            "sw power cap": "nvmlDeviceGetViolationStatus policy 0",
            "hw slowdown": "clock-event samples (bit 0x8)",
            "sw thermal slowdown": "nvmlDeviceGetViolationStatus policy 1",
            "hw thermal slowdown": "field 270",
            "hw power brake slowdown": "field 271",
            "board limit": "nvmlDeviceGetViolationStatus policy 3",
            "reliability": "nvmlDeviceGetViolationStatus policy 5",
        },
    }
    assert describe(meter) == "nvml"


def test_power_is_the_instantaneous_field_where_the_gpu_has_it(fake_nvml, monkeypatch):
    # NVML_FI_DEV_POWER_INSTANT where the driver gives it; nvmlDeviceGetPowerUsage (a 1-s
    # average on Ampere, except GA100, and later) where it does not, and the facts say which
    monkeypatch.setenv("FAKE_NVML_POWER_INSTANT_MW", "410000")
    with nvml(fake_nvml) as meter:
        assert meter.read().power_w == 410
        assert meter.facts()["power_reading"] == POWER_INSTANT
    monkeypatch.setenv("FAKE_NVML_NO_POWER_INSTANT", "1")
    with nvml(fake_nvml) as meter:
        assert meter.read().power_w == POWER_MW / 1000
        assert meter.facts()["power_reading"] == POWER_AVERAGED


def test_the_violation_counters_are_read_where_the_gpu_counts_them(fake_nvml, monkeypatch):
    monkeypatch.setenv("FAKE_NVML_VIOLATION_THERMAL", "0.25")
    with nvml(fake_nvml) as meter:
        first = meter.read()
        time.sleep(0.2)
        second = meter.read()
    assert first.violation_ns is not None and second.violation_ns is not None
    assert set(first.violation_ns) == {s.name for s in SLOWDOWNS if s.name != "hw slowdown"}
    [held] = second.violation_ns["sw thermal slowdown"]
    [before] = first.violation_ns["sw thermal slowdown"]
    assert (held - before) / (second.time_ns - first.time_ns) == pytest.approx(0.25, rel=0.05)
    assert second.violation_ns["sw power cap"] == first.violation_ns["sw power cap"] == (0,)
    # a GPU that counts none: the bits alone, and the facts say so
    monkeypatch.setenv("FAKE_NVML_NO_VIOLATION", "1")
    with nvml(fake_nvml) as meter:
        assert meter.read().violation_ns == {}
        counters = meter.facts()["slowdown_counters"]
    assert counters["sw thermal slowdown"] == "clock-event samples (bit 0x20)"
    assert counters["board limit"] == "not counted by this GPU"


def test_an_old_driver_without_the_newer_calls_still_measures(tmp_path, monkeypatch):
    # drivers before 535: no ClocksEventReasons (the ThrottleReasons call instead), no MIG call
    old = build_fake_nvml(tmp_path / "old", old_driver=True)
    monkeypatch.setenv("FAKE_NVML_THROTTLE", "8")
    with nvml(old) as meter:
        assert meter.read().throttle_reasons == 8


def test_a_gpu_without_an_energy_counter_is_not_measured(fake_nvml, monkeypatch):
    monkeypatch.setenv("FAKE_NVML_NO_ENERGY", "1")
    with pytest.raises(NotMeasured) as raised:
        nvml(fake_nvml)
    assert raised.value.reason == NO_ENERGY_COUNTER
    assert describe(raised.value) == f"not measured: {NO_ENERGY_COUNTER}"


def test_no_nvml_library_is_not_measured(tmp_path):
    with pytest.raises(NotMeasured) as raised:
        nvml(tmp_path / "libnvidia-ml.so.1")
    assert raised.value.reason == f"NVML: {tmp_path / 'libnvidia-ml.so.1'} not found"
    assert isinstance(raised.value, DeploybenchError)


def test_nvml_that_does_not_initialise_is_not_measured_naming_its_error(fake_nvml, monkeypatch):
    monkeypatch.setenv("FAKE_NVML_INIT", "9")
    with pytest.raises(
        NotMeasured, match=r"nvmlInit_v2 failed: Driver Not Loaded \(nvmlReturn_t 9\)"
    ):
        nvml(fake_nvml)


# without libcuda (this machine has none; a path that does not exist elsewhere), the server's
# GPUs can be named only by the UUIDs its CUDA_VISIBLE_DEVICES holds
NO_LIBCUDA = "/nonexistent/libcuda.so.1"


def standin_settings(monkeypatch: pytest.MonkeyPatch, environ: dict[str, str]) -> bool:
    """Move the stand-in's settings out of ``environ`` into the process's (the library reads
    them there); whether they model a node (FAKE_NVML_GPUS)."""
    for key in [k for k in environ if k.startswith("FAKE_NVML_")]:
        monkeypatch.setenv(key, environ.pop(key))
    return "FAKE_NVML_GPUS" in os.environ


def server(visible: str | None, ordinals: tuple[int, ...] | None = (0,)) -> ServerGpus:
    environ = {} if visible is None else {"CUDA_VISIBLE_DEVICES": visible}
    return ServerGpus(ordinals, environ, "a test's instance group", NO_LIBCUDA)


@pytest.mark.parametrize(
    ("environ", "gpus", "how"),
    [
        ({"DEPLOYBENCH_NVML_GPU": UUID}, None, f"DEPLOYBENCH_NVML_GPU={UUID}: named outright"),
        ({"DEPLOYBENCH_NVML_GPU": "GPU-00000000-fake"}, None, "named outright"),  # a prefix
        ({"DEPLOYBENCH_NVML_GPU": "0"}, server("MIG-x"), "DEPLOYBENCH_NVML_GPU=0"),
        # (a node's UUIDs, FAKE_NVML_GPUS set, are hex as a real one's)
        (
            {"FAKE_NVML_GPUS": "1"},
            server(gpu_uuid(0)),
            "the server's CUDA_VISIBLE_DEVICES (CUDA's driver API: ",
        ),
        ({}, None, "no server GPU given (a server on the CPU)"),
        # the job's own CUDA_VISIBLE_DEVICES does not say which GPU the server computes on
        ({"CUDA_VISIBLE_DEVICES": "0"}, None, "NVML's first GPU this job may read, index 0"),
    ],
)
def test_the_gpu_read_is_named_outright_or_the_servers(fake_nvml, monkeypatch, environ, gpus, how):
    node = standin_settings(monkeypatch, environ)
    with open_meter("nvml", nvml_library=str(fake_nvml), environ=environ, gpus=gpus) as meter:
        facts = meter.facts()
    assert facts["uuid"] == (gpu_uuid(0) if node else UUID) and facts["nvml_index"] == 0
    assert how in facts["how_chosen"]


@pytest.mark.parametrize(
    ("environ", "gpus", "reason"),
    [
        ({}, server("MIG-4a9c5e3b-0000-0000-0000-000000000000"), MIG_INSTANCE),
        ({"FAKE_NVML_MIG": "1"}, None, MIG_INSTANCE),
        # an index the server sees, which only CUDA can name
        ({}, server("3"), "NVML: the server's GPUs cannot be named by UUID: "),
        ({}, server("GPU-ffff"), "does not name them by UUID"),  # a prefix: CUDA's to resolve
        ({}, server(""), "CUDA_VISIBLE_DEVICES ('') does not name them by UUID"),
        (
            {"FAKE_NVML_GPUS": "2"},
            server(gpu_uuid(0), (1,)),
            "place instances on CUDA GPU 1; CUDA shows the server 1",
        ),
        ({"DEPLOYBENCH_NVML_GPU": "first"}, None, "DEPLOYBENCH_NVML_GPU='first' is neither"),
        ({"DEPLOYBENCH_NVML_GPU": "3"}, None, "names GPU 3; NVML sees 1 (0..0)"),
        ({"DEPLOYBENCH_NVML_GPU": "GPU-ffff"}, None, "names GPU-ffff, none of"),
    ],
)
def test_a_gpu_that_cannot_be_read_alone_is_not_measured(
    fake_nvml, monkeypatch, environ, gpus, reason
):
    standin_settings(monkeypatch, environ)
    with pytest.raises(NotMeasured) as raised:
        open_meter("nvml", nvml_library=str(fake_nvml), environ=environ, gpus=gpus)
    assert reason in raised.value.reason


def test_an_idle_read_is_the_counters_rate_over_windows_with_an_interval(fake_nvml):
    slept = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        time.sleep(seconds if len(slept) > 1 else 0)  # the settle wait: recorded, not waited

    with nvml(fake_nvml) as meter:
        read = read_idle(meter, 0.6, 3, 0.05, settle_s=7, sleep=sleep)
    assert slept == [7, 0.6]  # settled first, then read
    assert len(read.windows_w) == 3 and read.seconds >= 0.6
    assert all(w == pytest.approx(POWER_MW / 1000, rel=0.02) for w in read.windows_w)
    iv = read.interval
    assert iv.n == 3 and iv.mean == pytest.approx(150, rel=0.02) and iv.half_width >= 0
    record = read.record()
    assert record["status"] == "measured" and record["power_w"] == pytest.approx(150, rel=0.02)
    assert len(record["windows_w"]) == 3 and record["ci95_w"] is not None
    with pytest.raises(ConfigError, match="2 windows or more"):
        read_idle(meter, 0.6, 1, 0.05)


def test_the_idle_baseline_is_the_mean_of_before_and_after_and_carries_both():
    before = IdleRead((99.0, 100.0, 101.0), 3.0)  # mean 100, half-width 4.303 x 1 / sqrt 3
    after = IdleRead((105.0, 106.0, 107.0), 3.0)  # mean 106, the same half-width
    h = 4.302652730 / math.sqrt(3)
    both = idle_baseline(before, after)
    assert both is not None and both.power_w == pytest.approx(103.0)
    # each read's half-width halved, and half the drift between them, in quadrature
    assert both.half_width_w == pytest.approx(math.sqrt(2 * (h / 2) ** 2 + 3.0**2))
    assert both.source == "the mean of before and after the sweep"
    only = idle_baseline(None, after)
    assert only is not None and only.power_w == pytest.approx(106.0)
    assert only.half_width_w == pytest.approx(h) and only.source == "after the sweep"
    assert idle_baseline(None, None) is None


def test_meter_kinds(tmp_path):
    with pytest.raises(NotMeasured, match="energy meter none"):
        open_meter("none")
    with pytest.raises(ConfigError, match=r"'ipmi' is not one of \['nvml', 'rapl', 'none'\]"):
        open_meter("ipmi")
    assert describe("no RAPL: x") == "not measured: no RAPL: x"


# --- throttling -----------------------------------------------------------------------------


def test_throttle_bits_name_only_power_and_thermal_reasons():
    assert throttle_names(0) == []
    # idle (0x1), applications clocks (0x2), sync boost (0x10), display clock (0x100) do not count
    assert throttle_names(0x1 | 0x2 | 0x10 | 0x100) == []
    assert throttle_names(0x4 | 0x40 | 0x1) == ["sw power cap", "hw thermal slowdown"]
    assert throttle_names(sum(THROTTLING)) == [
        "sw power cap",
        "hw slowdown",
        "sw thermal slowdown",
        "hw thermal slowdown",
        "hw power brake slowdown",
    ]


# --- a window's numbers ---------------------------------------------------------------------


def gpu_sample(t_s: float, energy_j: float, **values: float) -> Sample:
    return Sample(int(t_s * S), energy_j, **values)  # type: ignore[arg-type]


SAMPLES = [
    gpu_sample(0.0, 100.0, power_w=100, sm_clock_mhz=1000, temperature_c=40, throttle_reasons=0x1),
    gpu_sample(1.0, 200.0, power_w=120, sm_clock_mhz=1400, temperature_c=60, throttle_reasons=0x4),
    gpu_sample(2.0, 400.0, power_w=300, sm_clock_mhz=1600, temperature_c=50, throttle_reasons=0x40),
    gpu_sample(3.0, 500.0, power_w=90, sm_clock_mhz=1000, temperature_c=70, throttle_reasons=0x8),
]


def test_a_window_interpolates_the_counter_at_both_ends():
    telemetry = window(SAMPLES, int(0.5 * S), int(2.5 * S))
    # 150 J at 0.5 s, 450 J at 2.5 s
    assert telemetry.energy_j == 300.0 and telemetry.seconds == 2.0
    assert telemetry.power_mean_w == 150.0
    # the samples inside (1 s, 2 s)
    assert telemetry.samples == 2
    assert telemetry.power_max_w == 300 and telemetry.sm_clock_mhz == 1500
    assert telemetry.temperature_c == 60
    assert telemetry.throttle_reasons == 0x44
    assert telemetry.mem_clock_mhz is None and telemetry.gpu_util_pct is None


def test_a_window_shorter_than_the_interval_takes_the_samples_around_it():
    telemetry = window(SAMPLES, int(1.25 * S), int(1.75 * S))
    assert telemetry.energy_j == pytest.approx(100.0) and telemetry.power_mean_w == pytest.approx(
        200
    )
    assert telemetry.samples == 2 and telemetry.sm_clock_mhz == 1500
    assert telemetry.throttle_reasons == 0x44


def test_without_power_readings_the_max_is_the_counters_steepest_stretch():
    samples = [Sample(s.time_ns, s.energy_j) for s in SAMPLES]
    telemetry = window(samples, int(0.5 * S), int(3 * S))
    assert telemetry.energy_j == 350.0 and telemetry.power_max_w == 200.0
    assert telemetry.throttle_reasons is None and telemetry.sm_clock_mhz is None


def test_a_window_the_samples_do_not_span_is_refused():
    with pytest.raises(ValueError, match="do not span the window"):
        window(SAMPLES, int(2.5 * S), int(3.5 * S))
    with pytest.raises(ValueError, match="must end after it starts"):
        window(SAMPLES, 2 * S, 2 * S)


def violation_sample(t_s: float, bits: int, **held_s: float) -> Sample:
    """A reading at ``t_s`` with the clock-event ``bits`` and, per slowdown, its violation
    counter (seconds held, one GPU)."""
    return Sample(
        int(t_s * S),
        0.0,
        throttle_reasons=bits,
        violation_ns={name: (int(v * S),) for name, v in held_s.items()},
    )


def test_a_slowdown_is_its_counters_share_of_the_window_not_the_bits():
    # the thermal counter advances 0.1 s a second; the sampled bits catch it in none of the
    # readings, the power cap's in all
    samples = [
        violation_sample(t, 0x4, **{"sw thermal slowdown": 0.1 * t, "sw power cap": 0.0})
        for t in (0, 1, 2, 3)
    ]
    telemetry = window(samples, int(0.5 * S), int(2.5 * S))
    assert telemetry.slowdowns["sw thermal slowdown"] == pytest.approx(0.1)
    assert telemetry.slowdowns["sw power cap"] == 0  # its counter, not its bit
    assert telemetry.slowdown_sources["sw thermal slowdown"] == BY_COUNTERS
    # what no counter covers falls back to the readings inside the window: 0x8 in none
    assert telemetry.slowdowns["hw slowdown"] == 0
    assert telemetry.slowdown_sources["hw slowdown"] == BY_SAMPLES
    assert "board limit" not in telemetry.slowdowns  # no counter, no bit: not measured


def test_without_counters_a_slowdown_is_the_share_of_readings_with_its_bit():
    samples = [violation_sample(t, 0x20 if t == 1 else 0x4) for t in (0, 1, 2, 3, 4)]
    telemetry = window(samples, int(0.5 * S), int(3.5 * S))  # the readings at 1, 2 and 3 s
    assert telemetry.slowdowns["sw thermal slowdown"] == pytest.approx(1 / 3)
    assert telemetry.slowdowns["sw power cap"] == pytest.approx(2 / 3)
    assert set(telemetry.slowdown_sources.values()) == {BY_SAMPLES}


# --- RAPL -----------------------------------------------------------------------------------


def zone(root: Path, name: str, label: str, energy: int, max_uj: int = 1000) -> Path:
    path = root / name
    path.mkdir(parents=True)
    (path / "name").write_text(f"{label}\n")
    (path / "energy_uj").write_text(f"{energy}\n")
    (path / "max_energy_range_uj").write_text(f"{max_uj}\n")
    return path


def test_rapl_sums_the_packages_and_undoes_a_wrap(tmp_path):
    root = tmp_path / "powercap"
    pkg0 = zone(root, "intel-rapl:0", "package-0", 900)
    pkg1 = zone(root, "intel-rapl:1", "package-1", 100)
    dram = zone(root, "intel-rapl:0:0", "dram", 500)  # a subzone: not added
    zone(root, "intel-rapl:2", "psys", 50)  # the platform, packages included: not added
    zone(root, "intel-rapl-mmio:0", "package-0", 50)  # the same package through MMIO
    with open_meter("rapl", powercap_root=root) as meter:
        first = meter.read()
        (pkg0 / "energy_uj").write_text("50\n")  # 900 → 1000 (its range), wrapped, → 50: +150
        (pkg1 / "energy_uj").write_text("400\n")  # +300
        (dram / "energy_uj").write_text("999\n")
        second = meter.read()
        (pkg0 / "energy_uj").write_text("60\n")  # +10
        third = meter.read()
        facts = meter.facts()
    assert first.energy_j == pytest.approx(1000e-6)
    assert second.energy_j - first.energy_j == pytest.approx(450e-6)
    assert third.energy_j - second.energy_j == pytest.approx(10e-6)
    assert first.power_w is None and first.throttle_reasons is None
    assert [d["zone"] for d in facts["domains"]] == ["intel-rapl:0", "intel-rapl:1"]
    assert facts["meter"] == "rapl" and describe(meter) == "rapl"


def test_no_powercap_tree_is_not_measured(tmp_path):
    with pytest.raises(NotMeasured) as raised:
        open_meter("rapl", powercap_root=tmp_path / "powercap")
    assert raised.value.reason.startswith(f"no RAPL: {tmp_path / 'powercap'} does not exist")
    assert "AMD" in raised.value.reason


def test_a_tree_without_packages_is_not_measured(tmp_path):
    zone(tmp_path, "intel-rapl:0:0", "core", 5)
    with pytest.raises(NotMeasured, match="no RAPL: .* has no readable intel-rapl:<N>/energy_uj"):
        open_meter("rapl", powercap_root=tmp_path)


def test_an_unreadable_counter_is_not_measured_naming_it(tmp_path, monkeypatch):
    energy = zone(tmp_path, "intel-rapl:0", "package-0", 5) / "energy_uj"
    # root-only, as Linux 5.10+ makes it (a chmod would not stop a test run as root)
    read_text = Path.read_text

    def refuse(path: Path, *args: object, **kwargs: object) -> str:
        if path == energy:
            raise PermissionError(13, "Permission denied", str(path))
        return read_text(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Path, "read_text", refuse)
    with pytest.raises(NotMeasured) as raised:
        open_meter("rapl", powercap_root=tmp_path)
    assert raised.value.reason.startswith(f"no RAPL: {energy} is not readable by this user")
    assert "root-only" in raised.value.reason


def test_a_counter_that_is_not_a_number_is_not_measured_naming_it(tmp_path):
    energy = zone(tmp_path, "intel-rapl:0", "package-0", 5) / "energy_uj"
    energy.write_text("n/a\n")
    with pytest.raises(NotMeasured, match=f"no RAPL: {energy} cannot be read"):
        open_meter("rapl", powercap_root=tmp_path)


# --- the sampler ----------------------------------------------------------------------------


class Counting(Meter):
    """A meter of a steady 10 W that fails after ``fail_after`` readings."""

    name = "counting"

    def __init__(self, fail_after: int | None = None) -> None:
        self.reads = 0
        self.fail_after = fail_after
        self.start = time.time_ns()

    def read(self) -> Sample:
        self.reads += 1
        if self.fail_after is not None and self.reads > self.fail_after:
            raise OSError("the counter went away")
        now = time.time_ns()
        return Sample(now, 10 * (now - self.start) / S)

    def facts(self) -> dict[str, object]:
        return {}


def test_the_sampler_reads_on_entry_every_interval_and_on_exit():
    meter = Counting()
    with Sampler(meter, 0.05) as sampler:
        assert len(sampler.samples) == 1  # on entry, before the block
        time.sleep(0.5)
    times = [s.time_ns for s in sampler.samples]
    assert times == sorted(times)
    # entry, ticks, exit: a tick waits the interval after the last (a loaded machine ticks
    # late, never early), so at most one a 0.05 s of the span and at least a few in 0.5 s
    span = (times[-1] - times[0]) / S
    assert 4 <= len(times) <= 2 + span / 0.05 + 1
    gaps = [(b - a) / S for a, b in itertools.pairwise(times[1:-1])]
    assert min(gaps) >= 0.05 - 1e-3 and sum(gaps) / len(gaps) < 0.25


def test_an_error_in_the_sampler_thread_is_raised_on_exit():
    with pytest.raises(OSError, match="the counter went away"), Sampler(Counting(2), 0.01):
        time.sleep(0.2)


def test_the_blocks_own_error_wins_over_the_samplers():
    with pytest.raises(KeyError), Sampler(Counting(fail_after=1), 0.01):
        time.sleep(0.1)
        raise KeyError("perf_analyzer")


def test_a_sampling_interval_must_be_positive():
    with pytest.raises(ConfigError, match="must be > 0 s, not 0"):
        Sampler(Counting(), 0)
