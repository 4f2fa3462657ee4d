"""Energy on a shared multi-GPU node (issue 50): the meter reads exactly the GPUs the server
computes on, named by UUID, and refuses what it cannot attribute to the server.

The node is the stand-in libnvidia-ml.so.1 (tests/fixtures/fake_libnvidia_ml.c): FAKE_NVML_GPUS
GPUs in PCI order, of which the job's cgroup lets it open FAKE_NVML_ALLOWED (the others answer
NVML_ERROR_NO_PERMISSION), compute processes, MIG, a counter that updates in steps. CUDA is the
stand-in libcuda.so.1 (tests/fixtures/fake_libcuda.c): the devices the job may open
(FAKE_CUDA_UUIDS) renumbered from 0 and selected by the server's CUDA_VISIBLE_DEVICES, as on a
SLURM node with ConstrainDevices=yes."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from deploybench import perf
from deploybench.gpu_identity import SERVER_GPUS, ServerGpus, instance_group_gpus
from deploybench.instruments import TrialEnergy
from deploybench.jobs.measure import energy_meter, server_gpus
from deploybench.meters import MIG_INSTANCE, open_meter
from deploybench.nvml import ERROR_NO_PERMISSION, Nvml, NvmlError
from deploybench.telemetry import (
    MIN_COUNTER_PERIODS,
    NotMeasured,
    Sampler,
    counter_period_s,
    read_idle,
    window,
    window_refusal,
)
from deploybench.tensors import TensorSpec
from deploybench.triton_config import build_model_config, to_pbtxt
from tests.nvml_standin import UUID, build_fake_libcuda, build_fake_nvml, gpu_uuid, mig_uuid
from tests.test_units import measure, stand_in

S = 1_000_000_000  # ns


@pytest.fixture(scope="module")
def fake_nvml(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_fake_nvml(tmp_path_factory.mktemp("nvml"))


@pytest.fixture(scope="module")
def fake_cuda(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_fake_libcuda(tmp_path_factory.mktemp("cuda"))


@pytest.fixture(autouse=True)
def _no_fake_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith(("FAKE_NVML_", "FAKE_CUDA_", "DEPLOYBENCH_NVML_GPU")):
            monkeypatch.delenv(name)


def node(monkeypatch: pytest.MonkeyPatch, gpus: int = 8, allowed: str | None = None, **more: str):
    """The stand-in NVML as a node of ``gpus`` GPUs, the job allowed ``allowed`` of them."""
    monkeypatch.setenv("FAKE_NVML_GPUS", str(gpus))
    if allowed is not None:
        monkeypatch.setenv("FAKE_NVML_ALLOWED", allowed)
    for key, value in more.items():
        monkeypatch.setenv(f"FAKE_NVML_{key.upper()}", value)


class Server:
    """What the energy meter asks of a running TritonServer: its process's environment."""

    def __init__(self, environ: dict[str, str]) -> None:
        self.environ = environ

    def process_environment(self) -> tuple[dict[str, str], str]:
        return dict(self.environ), "a test's"


def repository(tmp_path: Path, gpus: tuple[int, ...] = SERVER_GPUS) -> Path:
    """A repository of one KIND_GPU model "m" whose instances are placed on ``gpus``."""
    config = build_model_config(
        name="m",
        max_batch_size=1,
        inputs=[TensorSpec("x", "float32", (1,))],
        outputs=[TensorSpec("y", "float32", (1,))],
        instance_count=1,
        instance_kind="KIND_GPU",
        preferred_batch_sizes=[],
        max_queue_delay_us=0,
        platform="onnxruntime_onnx",
        gpus=gpus,
    )
    (tmp_path / "repo" / "m").mkdir(parents=True)
    (tmp_path / "repo" / "m" / "config.pbtxt").write_text(to_pbtxt(config))
    return tmp_path / "repo"


def server_env(fake_cuda: Path, visible: str | None, *uuids: str) -> dict[str, str]:
    """The server's environment: its CUDA_VISIBLE_DEVICES, and the devices its cgroup lets it
    open (the stand-in libcuda's FAKE_CUDA_UUIDS), the stand-in first on the library path."""
    env = {"FAKE_CUDA_UUIDS": ",".join(uuids), "LD_LIBRARY_PATH": str(fake_cuda.parent)}
    if visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible
    return env


def settings(library: Path) -> dict[str, Any]:
    return {"meter": "nvml", "nvml_library": str(library)}


# --- which GPUs ------------------------------------------------------------------------------


def test_on_an_8_gpu_node_the_job_meters_its_own_gpu_at_pci_index_3(
    tmp_path, monkeypatch, fake_nvml, fake_cuda
):
    # SLURM gave the job the GPU at PCI index 3 and renumbered it: CUDA_VISIBLE_DEVICES=0
    node(monkeypatch, 8, allowed="3")
    env = server_env(fake_cuda, "0", gpu_uuid(3))
    gpus = server_gpus(Server(env), str(repository(tmp_path)), ["m"])
    assert gpus is not None and gpus.ordinals == SERVER_GPUS
    with energy_meter(settings(fake_nvml), gpus) as (meter, status):
        assert status == "nvml", status
        facts = meter.facts()
    assert facts["uuid"] == gpu_uuid(3) and facts["uuids"] == [gpu_uuid(3)]
    assert facts["nvml_index"] == 3  # NVML's index is the PCI order's, not CUDA's 0
    assert "CUDA_VISIBLE_DEVICES '0'" in facts["how_chosen"]
    assert facts["counter_period_ms"] is not None
    # the trap: the job's "0" read as NVML's index 0 is another job's GPU, here unreadable
    nvml = Nvml(str(fake_nvml))
    try:
        assert nvml.device_count() == 8
        with pytest.raises(NvmlError) as refused:
            nvml.handle_by_index(0)
        assert refused.value.code == ERROR_NO_PERMISSION
    finally:
        nvml.shutdown()


def test_a_cuda_index_is_not_nvmls_index_even_where_every_gpu_is_readable(
    tmp_path, monkeypatch, fake_nvml, fake_cuda
):
    # no cgroup: the job may open all 8, and CUDA orders them otherwise than the PCI bus
    # (fastest first): the server's CUDA GPU 0 is NVML's 7, which a meter reading NVML's
    # index 0 would miss for another job's GPU
    node(monkeypatch, 8)
    env = server_env(fake_cuda, "0", *(gpu_uuid(i) for i in reversed(range(8))))
    gpus = server_gpus(Server(env), str(repository(tmp_path)), ["m"])
    with energy_meter(settings(fake_nvml), gpus) as (meter, status):
        assert status == "nvml" and meter.uuids == [gpu_uuid(7)]
        assert meter.facts()["nvml_index"] == 7


def test_without_server_gpus_the_meter_reads_the_first_gpu_the_job_may_read(monkeypatch, fake_nvml):
    # a server on the CPU (the tests' smoke run) has no GPU of its own: NVML's first readable
    node(monkeypatch, 8, allowed="3")
    with open_meter("nvml", nvml_library=str(fake_nvml), environ={}) as meter:
        assert meter.uuids == [gpu_uuid(3)]
        assert "first GPU this job may read, index 3" in meter.facts()["how_chosen"]


def test_two_gpus_the_server_sees_are_both_metered_and_summed(
    tmp_path, monkeypatch, fake_nvml, fake_cuda
):
    node(monkeypatch, 8, allowed="2,5", power_mw_2="100000", power_mw_5="200000")
    env = server_env(fake_cuda, "0,1", gpu_uuid(2), gpu_uuid(5))
    # a repository whose instance group names no GPUs: Triton places instances on both
    unpinned = server_gpus(Server(env), str(repository(tmp_path / "a", gpus=())), ["m"])
    assert unpinned is not None and unpinned.ordinals is None
    with energy_meter(settings(fake_nvml), unpinned) as (meter, status):
        assert status == "nvml" and meter.uuids == [gpu_uuid(2), gpu_uuid(5)]
        assert meter.power_limit_w() == 700.0  # both GPUs' limits
        with Sampler(meter, 0.05) as sampler:
            time.sleep(0.5)
    samples = sampler.samples
    telemetry = window(samples, samples[0].time_ns + S // 20, samples[-1].time_ns - S // 20)
    assert samples[1].power_w == 300.0
    assert telemetry.energy_j == pytest.approx(300 * telemetry.seconds, rel=0.02)
    # deploybench's own repository pins the group to the run's GPU: that one alone is metered
    pinned = server_gpus(Server(env), str(repository(tmp_path / "b")), ["m"])
    assert "gpus: [0]" in (tmp_path / "b" / "repo" / "m" / "config.pbtxt").read_text()
    with energy_meter(settings(fake_nvml), pinned) as (meter, status):
        assert meter.uuids == [gpu_uuid(2)] and meter.read().power_w == 100.0


def test_instance_groups_say_which_gpus_the_server_uses():
    def config(*groups: tuple[str, tuple[int, ...]]) -> Any:
        from tritonclient.grpc import model_config_pb2

        message = model_config_pb2.ModelConfig(name="m")
        for kind, gpus in groups:
            message.instance_group.add(
                kind=model_config_pb2.ModelInstanceGroup.Kind.Value(kind), gpus=gpus
            )
        return message

    assert instance_group_gpus([config(("KIND_CPU", ()))]) == ()
    assert instance_group_gpus([config(("KIND_GPU", (0,))), config(("KIND_GPU", (1, 0)))]) == (
        0,
        1,
    )
    assert instance_group_gpus([config(("KIND_GPU", ()))]) is None  # every GPU it sees
    assert instance_group_gpus([config(("KIND_AUTO", ()))]) is None


@pytest.mark.parametrize(
    ("allowed", "cuda", "visible", "reason"),
    [
        # the server's GPU is a MIG device: its counter is the whole GPU's
        (None, [mig_uuid(1)], "0", MIG_INSTANCE),
        # the server names a GPU its cgroup does not hold: no permission, never another GPU
        ("3", [gpu_uuid(5)], "0", f"is {gpu_uuid(5)}, which this job has no permission"),
        # a UUID NVML does not know
        (None, ["GPU-0badc0de-0000-4000-8000-000000000000"], "0", "which NVML does not know"),
        # the instance group names a GPU the server does not see
        (None, [], None, "CUDA shows the server no GPU"),
    ],
)
def test_a_server_gpu_that_cannot_be_identified_is_not_measured(
    tmp_path, monkeypatch, fake_nvml, fake_cuda, allowed, cuda, visible, reason
):
    node(monkeypatch, 8, allowed=allowed, mig="1" if cuda and cuda[0].startswith("MIG") else "0")
    env = server_env(fake_cuda, visible, *cuda)
    gpus = server_gpus(Server(env), str(repository(tmp_path)), ["m"])
    with energy_meter(settings(fake_nvml), gpus) as (meter, status):
        assert meter is None and status.startswith("not measured: ")
        assert reason in status, status


def test_without_cuda_the_servers_gpus_are_named_by_the_uuids_it_is_given(
    monkeypatch, fake_nvml, tmp_path
):
    node(monkeypatch, 8, allowed="4")
    absent = str(tmp_path / "no" / "libcuda.so.1")
    by_uuid = ServerGpus((0,), {"CUDA_VISIBLE_DEVICES": gpu_uuid(4)}, "a test", absent)
    with open_meter("nvml", nvml_library=str(fake_nvml), environ={}, gpus=by_uuid) as meter:
        assert meter.uuids == [gpu_uuid(4)]
        assert (
            "the server's CUDA_VISIBLE_DEVICES (CUDA's driver API: " in meter.facts()["how_chosen"]
        )
    by_index = ServerGpus((0,), {"CUDA_VISIBLE_DEVICES": "0"}, "a test", absent)
    with pytest.raises(NotMeasured, match="cannot be named by UUID: .*does not load"):
        open_meter("nvml", nvml_library=str(fake_nvml), environ={}, gpus=by_index)


# --- co-tenants -------------------------------------------------------------------------------


def trial_energy(library: Path, period_s: float | None = None) -> TrialEnergy:
    meter = open_meter("nvml", nvml_library=str(library), environ={})
    return TrialEnergy("nvml", meter, 0.02, 150.0, meter.power_limit_w(), counter_period_s=period_s)


def test_a_co_tenant_on_the_gpu_leaves_the_trial_without_energy_saying_so(
    tmp_path, monkeypatch, fake_nvml
):
    # pid 1 (init, or a container's first process) is no process of this job
    monkeypatch.setenv("FAKE_NVML_PROCESSES", "0:1")
    stand_in(tmp_path, monkeypatch)
    row = measure(
        tmp_path,
        perf.MeasureSettings(request_count=50, warmup_factor=0),
        energy=trial_energy(fake_nvml),
    )
    assert row["energy_status"].startswith("not measured: shared GPU: pid 1 (")
    assert row["energy_status"].endswith(f") on {UUID}")
    assert row["energy_per_inference_j"] is None and row["power_mean_w"] is None
    # the throughput is measured as ever
    assert row["throughput"] > 0


def test_the_jobs_own_processes_are_not_co_tenants(tmp_path, monkeypatch, fake_nvml):
    # this job's process and its descendants (the server, its python backend stubs,
    # perf_analyzer with CUDA shared memory) compute on the GPU as the measurement wants
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        monkeypatch.setenv("FAKE_NVML_PROCESSES", f"0:{os.getpid()},0:{child.pid}")
        stand_in(tmp_path, monkeypatch)
        row = measure(
            tmp_path,
            perf.MeasureSettings(request_count=50, warmup_factor=0),
            energy=trial_energy(fake_nvml),
        )
    finally:
        child.kill()
        child.wait()
    assert row["energy_status"] == "nvml" and row["energy_per_inference_j"] > 0


def test_a_co_tenant_during_the_idle_baseline_leaves_it_unmeasured(monkeypatch, fake_nvml):
    monkeypatch.setenv("FAKE_NVML_PROCESSES", "0:1")
    with open_meter("nvml", nvml_library=str(fake_nvml), environ={}) as meter:
        with pytest.raises(NotMeasured, match="^shared GPU: pid 1 "):
            read_idle(meter, 0.2, 2, 0.05)
        assert meter.facts()["processes_listed"] is True


# --- the counter's update period ------------------------------------------------------------


def test_the_counters_update_period_is_measured(monkeypatch, fake_nvml):
    monkeypatch.setenv("FAKE_NVML_COUNTER_PERIOD_MS", "100")
    with open_meter("nvml", nvml_library=str(fake_nvml), environ={}) as meter:
        period = meter.measure_counter_period()
        assert meter.facts()["counter_period_ms"] == pytest.approx(100, abs=15)
    # the time between changes, polled every 2 ms (a loaded machine polls late, never early)
    assert 0.095 <= period <= 0.13


def test_a_counter_that_does_not_advance_is_not_measured():
    with pytest.raises(NotMeasured, match=r"energy counter \(GPU-x\) did not advance in 0.2 s"):
        counter_period_s(lambda: [("GPU-x", 5.0)], timeout_s=0.2)


def test_a_stepping_counter_gives_a_window_within_one_step(monkeypatch, fake_nvml):
    # the counter holds its value for 100 ms at a time; a window of 15 steps, and the same
    # window shifted by one step: each within one step's energy (150 W x 0.1 s) of the truth
    monkeypatch.setenv("FAKE_NVML_COUNTER_PERIOD_MS", "100")
    with open_meter("nvml", nvml_library=str(fake_nvml), environ={}) as meter:
        period = meter.measure_counter_period()
        with Sampler(meter, 0.02) as sampler:
            time.sleep(1.9)
    samples = sampler.samples
    start = samples[0].time_ns + S // 20
    for shift in (0, S // 10):
        telemetry = window(samples, start + shift, start + shift + 3 * S // 2)
        assert abs(telemetry.energy_j - 150 * 1.5) <= 150 * 0.1 + 1e-6
        assert window_refusal(telemetry, period) is None
    # a window of a few steps: the steps could be most of it
    short = window(samples, start, start + S // 2)
    why = window_refusal(short, period)
    assert why is not None and f"shorter than {MIN_COUNTER_PERIODS} updates" in why


def test_a_trial_window_too_short_for_the_counters_steps_is_not_measured(
    tmp_path, monkeypatch, fake_nvml
):
    # the stand-in perf_analyzer's windows last 60 ms: under one step of a 100 ms counter,
    # whose difference over them is 0 J or a whole step (15 J) instead of 9 J
    monkeypatch.setenv("FAKE_NVML_COUNTER_PERIOD_MS", "100")
    stand_in(tmp_path, monkeypatch)
    row = measure(
        tmp_path,
        perf.MeasureSettings(request_count=50, warmup_factor=0),
        energy=trial_energy(fake_nvml, period_s=0.1),
    )
    assert row["energy_status"].startswith("not measured: ")
    assert "shorter than 10 updates of the energy counter (100 ms each)" in row["energy_status"]
    assert row["energy_per_inference_j"] is None


def test_a_window_over_which_the_counter_did_not_advance_is_not_measured():
    from deploybench.telemetry import Sample

    flat = [Sample(0, 7.0), Sample(S, 7.0), Sample(2 * S, 7.0)]
    why = window_refusal(window(flat, S // 2, 3 * S // 2), period_s=0.05)
    assert why == "the energy counter did not advance over the 1 s window"


# --- the preflight's energy check -------------------------------------------------------------


def _energy_check(monkeypatch, fake_nvml: Path, fake_cuda: Path, visible: str, *uuids: str):
    """The preflight's ``energy`` check in a job whose environment is ``server_env``'s."""
    from deploybench.preflight.energy import check_energy

    for key, value in server_env(fake_cuda, visible, *uuids).items():
        monkeypatch.setenv(key, value)
    spec: Any = {"gpu": "A100", "energy": settings(fake_nvml)}
    return check_energy(spec)


def test_the_preflight_names_the_gpu_the_runs_will_meter(monkeypatch, fake_nvml, fake_cuda):
    node(monkeypatch, 8, allowed="3")
    check = _energy_check(monkeypatch, fake_nvml, fake_cuda, "0", gpu_uuid(3))
    assert check.status == "pass", check
    assert check.detail.startswith(f"nvml meters {gpu_uuid(3)}, its counter updating every ")
    assert check.facts["nvml_index"] == 3 and check.facts["counter_period_ms"] > 0


def test_the_preflight_warns_of_a_co_tenant_and_of_a_gpu_it_cannot_open(
    monkeypatch, fake_nvml, fake_cuda
):
    node(monkeypatch, 8, allowed="3", processes="3:1")
    check = _energy_check(monkeypatch, fake_nvml, fake_cuda, "0", gpu_uuid(3))
    assert check.status == "warn" and "another process computes on it (pid 1 (" in check.detail
    assert "one whole GPU per job" in check.fix
    # NVML refuses the GPU CUDA names (NO_PERMISSION): never another, readable, job's GPU
    node(monkeypatch, 8, allowed="5", processes="")
    check = _energy_check(monkeypatch, fake_nvml, fake_cuda, "0", gpu_uuid(3))
    assert check.status == "warn" and check.detail.startswith("energy would not be measured: ")
    assert "gpus.<gpu>.meter" in check.fix
    # energy not read on the GPU at all: nothing to check
    from deploybench.preflight.energy import check_energy

    none: Any = {"gpu": "A100", "energy": {"meter": "none"}}
    assert check_energy(none).status == "skip"
