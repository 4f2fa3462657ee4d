"""The second energy meter (deploybench.triton_metrics): Triton's ``nv_energy_consumption`` parsed
from its Prometheus text, polled beside perf_analyzer from a stand-in metrics endpoint, and taken
over the same measured windows as the energy meter; empty, with its reason, on a CPU server."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from deploybench import perf
from deploybench import triton_metrics as tm
from deploybench.instruments import TrialEnergy, TritonCounter
from tests.test_units import measure, stand_in

WINDOW_S = 0.2  # the stand-in perf_analyzer's windows in the trial read beside it

GPU_A = "GPU-6ab1e1c6-0e6b-7a5f-5c3c-3c9d3f4d2d11"
GPU_B = "GPU-0f2d9e77-51a4-4b1c-9d0e-8e5b7c3a1f42"

# A GPU server's page in the format of Triton's docs (server docs/user_guide/metrics.md, "GPU
# Metrics": the metric names; core src/metrics.cc: the help text, the counter type, the
# gpu_uuid label), two GPUs, beside a model's request counters.
GPU_PAGE = f"""# HELP nv_inference_request_success Number of successful inference requests, all batch sizes
# TYPE nv_inference_request_success counter
nv_inference_request_success{{model="tft",version="1"}} 1200
# HELP nv_energy_consumption GPU energy consumption in joules since the Triton Server started
# TYPE nv_energy_consumption counter
nv_energy_consumption{{gpu_uuid="{GPU_A}"}} 52817.331
nv_energy_consumption{{gpu_uuid="{GPU_B}"}} 4410.5
# HELP nv_gpu_power_usage GPU power usage in watts
# TYPE nv_gpu_power_usage gauge
nv_gpu_power_usage{{gpu_uuid="{GPU_A}"}} 287.116
nv_gpu_power_usage{{gpu_uuid="{GPU_B}"}} 61.2
# HELP nv_gpu_power_limit GPU power management limit in watts
# TYPE nv_gpu_power_limit gauge
nv_gpu_power_limit{{gpu_uuid="{GPU_A}"}} 700
"""

# What this machine's CPU server (pytriton's tritonserver, DCGM unavailable) serves: no GPU
# metric at all (captured from tests/test_server.py's ident model).
CPU_PAGE = """# HELP nv_inference_count Number of inferences performed (does not include cached requests)
# TYPE nv_inference_count counter
nv_inference_count{model="ident",version="1"} 0
# HELP nv_cpu_utilization CPU utilization rate [0.0 - 1.0]
# TYPE nv_cpu_utilization gauge
nv_cpu_utilization 0
"""


def test_parses_each_gpus_energy_by_uuid():
    assert tm.parse_energy(GPU_PAGE) == {GPU_A: 52817.331, GPU_B: 4410.5}
    assert tm.parse_energy(CPU_PAGE) == {}
    # a timestamp after the value, other labels, a metric whose name only starts the same
    text = (
        f'nv_energy_consumption{{gpu_uuid="{GPU_A}",host="n1"}} 12.5 1700000000000\n'
        f'nv_energy_consumption_rate{{gpu_uuid="{GPU_B}"}} 99\n'
    )
    assert tm.parse_energy(text) == {GPU_A: 12.5}


def test_the_interval_is_the_servers_or_tritons_default():
    assert tm.interval_ms(()) == tm.DEFAULT_INTERVAL_MS == 2000
    assert tm.interval_ms(["--metrics-interval-ms=500"]) == 500
    assert tm.interval_ms(["--log-verbose=1", "--metrics-interval-ms", "250"]) == 250


def test_energy_between_interpolates_at_the_windows_ends_and_sums_the_gpus():
    readings = [
        tm.Reading(0, {GPU_A: 100.0, GPU_B: 10.0}),
        tm.Reading(1_000_000_000, {GPU_A: 400.0, GPU_B: 60.0}),
        tm.Reading(2_000_000_000, {GPU_A: 700.0, GPU_B: 110.0}),
    ]
    # 300 W and 50 W over 1 s from 0.5 s on
    joules = tm.energy_between(readings, [GPU_A, GPU_B], 500_000_000, 1_500_000_000)
    assert joules == pytest.approx(350.0)
    assert tm.energy_between(readings, [GPU_B], 0, 2_000_000_000) == pytest.approx(100.0)
    with pytest.raises(ValueError, match="do not span the window"):
        tm.energy_between(readings, [GPU_A], 500_000_000, 2_500_000_000)
    with pytest.raises(ValueError, match="missing"):
        tm.energy_between(readings, ["GPU-other"], 0, 1_000_000_000)


def test_a_staircase_counter_is_off_by_at_most_a_step_at_each_end():
    """Triton's counter steps once a poll (half its interval; DCGM's own period behind it): a
    window between steps sees the steps inside it, whatever the readings between them."""
    step_ns, watts = 1_000_000_000, 300.0  # a step a second of 300 J
    readings = [
        tm.Reading(t, {GPU_A: watts * (t // step_ns)})
        for t in range(0, 10 * step_ns + 1, step_ns // 10)  # read every 100 ms
    ]
    true = watts * 5.0  # 5 s at 300 W
    for shift in range(0, step_ns, step_ns // 4):
        start = 2 * step_ns + shift
        joules = tm.energy_between(readings, [GPU_A], start, start + 5 * step_ns)
        assert abs(joules - true) <= 2 * watts  # one step at each end, at most


@dataclass
class Endpoint:
    """A stand-in Triton metrics endpoint: each GPU's counter rising at its power (W) since it
    started; ``answering`` False: every request fails."""

    port: int
    watts: dict[str, float]
    answering: bool = True


@pytest.fixture
def endpoint() -> Iterator[Endpoint]:
    started = time.time_ns()
    state = Endpoint(0, {GPU_A: 300.0, GPU_B: 50.0})

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if not state.answering:
                self.send_error(503)
                return
            seconds = (time.time_ns() - started) / 1e9
            lines = ["# TYPE nv_energy_consumption counter"]
            lines += [
                f'nv_energy_consumption{{gpu_uuid="{gpu}"}} {watts * seconds:.6f}'
                for gpu, watts in state.watts.items()
            ]
            body = ("\n".join(lines) + "\n").encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()


def test_the_probe_finds_the_servers_gpus_or_says_why_not(endpoint):
    found = tm.probe(endpoint.port, ["--metrics-interval-ms=500"], poll_s=0.005)
    assert found.url is not None and found.gpus == tuple(sorted((GPU_A, GPU_B)))
    assert found.status == "triton nv_energy_consumption (2 GPUs, --metrics-interval-ms 500)"
    assert found.record()["metrics_interval_ms"] == 500
    endpoint.watts = {}  # a CPU server: no GPU metric
    cpu = tm.probe(endpoint.port)
    assert cpu.url is None and cpu.status == tm.NOT_ON_SERVER
    endpoint.answering = False
    down = tm.probe(endpoint.port)
    assert down.url is None and "did not answer" in down.status


def test_a_trial_reads_tritons_counter_over_the_same_windows(tmp_path, monkeypatch, endpoint):
    stand_in(tmp_path, monkeypatch)
    # 0.2 s windows, not 20 ms: a poll stamped a few ms late on a loaded machine (12 % off
    # over 60 ms in one run beside two other test streams) stays within 5 % over 0.6 s
    monkeypatch.setenv("PERF_STANDIN_WINDOW_S", str(WINDOW_S))
    triton = tm.probe(endpoint.port, poll_s=0.005)
    energy = TrialEnergy("not measured: no RAPL: /sys/class/powercap is absent")
    row = measure(
        tmp_path,
        perf.MeasureSettings(request_count=50, warmup_factor=0),
        energy=energy,
        triton=TritonCounter(triton),
    )
    # the stand-in's export: 150 requests over 3 windows of 0.2 s, at 300 + 50 W: 210 J
    joules = 350.0 * 3 * WINDOW_S / 150
    assert row["tail_requests"] == 150
    assert row["energy_per_inference_triton_j"] == pytest.approx(joules, rel=0.05)
    assert row["triton_energy_status"] == triton.status
    # the first meter measured nothing: the second is recorded beside it, not in its place
    assert row["energy_per_inference_j"] is None
    [point] = perf.summarize([row | {"trial": 1}, row | {"trial": 2}], max_ci_pct=50)
    assert point["energy_per_inference_triton_j"] == pytest.approx(joules, rel=0.05)
    assert point["triton_energy_status"] == triton.status


def test_a_failing_endpoint_leaves_the_trial_measured_and_says_why(endpoint):
    triton = tm.probe(endpoint.port, poll_s=0.005)
    with tm.Poller(triton) as poller:
        time.sleep(0.02)
        endpoint.answering = False
        time.sleep(0.02)
    joules, status = tm.trial_energy(triton, poller, (poller.readings[0].time_ns, time.time_ns()))
    assert joules is None and status.startswith("not measured: Triton's metrics endpoint failed")


def test_without_a_counter_the_column_is_empty_and_says_why(tmp_path, monkeypatch):
    stand_in(tmp_path, monkeypatch)
    settings = perf.MeasureSettings(request_count=50, warmup_factor=0)
    cpu = TrialEnergy("not measured: no RAPL")
    row = measure(
        tmp_path, settings, energy=cpu, triton=TritonCounter(tm.TritonEnergy(tm.NOT_ON_SERVER))
    )
    assert row["energy_per_inference_triton_j"] is None
    assert row["triton_energy_status"] == tm.NOT_ON_SERVER
    row = measure(tmp_path, settings)  # no second meter configured at all
    assert row["energy_per_inference_triton_j"] is None
    assert row["triton_energy_status"] == tm.NOT_READ
