"""The pooled tail against perf_analyzer's own, end to end on the CPU default: a real
tritonserver (tests/test_server.py's ident model, 10 ms a request) measured by the real
perf_analyzer, one trial a point. Both percentiles come from the same requests: perf_analyzer's
p99 over the latencies of the last 3 windows it merged (client r23.12 inference_profiler.cc
MergePerfStatusReports, SummarizeLatency), deploybench's over the requests its profile export
holds in those windows (deploybench.tails). So with one trial they must agree to the microsecond
perf_analyzer's CSV is written in (report_writer.cc: ``percentile.second / 1000``, truncated).

The server has no GPU: Triton's energy counter, the second meter, is absent and says so."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from deploybench import perf, tails
from deploybench import server as srv
from deploybench import triton_metrics as tm
from deploybench.instruments import TrialEnergy, TritonCounter, probe_gpu_metrics
from deploybench.perf_inputs import write_input_data
from deploybench.transport import Transport
from tests.test_server import make_repository


def microseconds(ms: float) -> int:
    """A latency in ms as perf_analyzer's CSV has it: whole µs, truncated."""
    return math.floor(ms * 1000 + 1e-6)


@pytest.fixture(scope="module")
def rows(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    """One trial at concurrency 1 and one at 4 (requests queue: their latencies spread)."""
    tmp = tmp_path_factory.mktemp("tails_run")
    data = tmp / "data.json"
    write_input_data({"x": np.ones((1, 4), np.float32)}, data)
    measured = []
    with srv.TritonServer(make_repository(tmp, "busy"), tmp / "server.log") as server:
        triton = tm.probe(server.metrics_port, server.extra_args, poll_s=0.1)
        gpu_metrics = probe_gpu_metrics(server.metrics_port, server.extra_args)
        instruments = (TrialEnergy("not measured: no RAPL"), TritonCounter(triton), gpu_metrics)
        for concurrency in (1, 4):
            measurement = perf.Measurement(
                "ident",
                server.http_url,
                Transport("http", "none"),
                data,
                perf.MeasureSettings(request_count=50, warmup_factor=0, max_retries=0, trials=1),
                instruments=instruments,
                log_file=Path(tmp) / "perf.log",
                check_server=server.check_alive,
            )
            row = perf.measure_point(measurement, perf.Point(1, concurrency))
            measured.append(row | {"trial": 1, "perf_log": Path(tmp) / "perf.log"})
    return measured


def test_one_trials_pooled_p99_is_perf_analyzers_p99(rows):
    for row in rows:
        [point] = perf.summarize([row], max_ci_pct=5)
        # the same requests: as many as perf_analyzer's client counted in its merged windows
        assert row["tail_requests"] == row["measured_requests"] > 0
        assert microseconds(point["p99_pooled_ms"]) == round(row["p99_latency_ms"] * 1000)
        # and every percentile perf_analyzer reports, by the same rule
        latencies = row["latencies_ms"]
        for q, column in (
            (0.5, "p50_latency_ms"),
            (0.9, "p90_latency_ms"),
            (0.95, "p95_latency_ms"),
        ):
            assert microseconds(tails.percentile(latencies, q)) == round(row[column] * 1000)


def test_a_cpu_server_has_no_second_meter_and_says_why(rows):
    for row in rows:
        assert row["energy_per_inference_triton_j"] is None
        assert row["triton_energy_status"] == tm.NOT_ON_SERVER


def test_perf_analyzer_collects_a_cpu_servers_metrics_with_no_gpu_in_them(rows):
    """--collect-metrics reaches the server's own metrics port (the real perf_analyzer 2.41 and
    tritonserver): its CSV has the per-GPU headings, empty on a CPU server, and the status
    says why."""
    for row in rows:
        for column in ("triton_gpu_util_pct", "triton_gpu_power_w", "triton_gpu_memory_used_mib"):
            assert row[column] is None
        assert row["triton_gpu_status"].startswith(
            "not measured: the server's metrics have no nv_gpu_utilization"
        )
    # perf_analyzer was asked, and wrote the per-GPU headings (empty cells, not missing ones)
    log = rows[0]["perf_log"].read_text()
    assert "--collect-metrics --metrics-url http://127.0.0.1:" in log
    assert "WARNING: Unable to parse 'nv_gpu_utilization' metric." in log
