"""Triton's GPU metrics as perf_analyzer 2.41's ``--collect-metrics`` writes them: the per-GPU
cells of its ``--verbose-csv`` row, read into the CSV's columns, and the instrument's flags.

The row below is the real binary's (tritonclient 2.41's perf_analyzer = client r23.12) against
a metrics endpoint serving two GPUs' ``nv_gpu_*`` samples: its cells are ``<uuid>:<value>;``
per GPU in UUID order (report_writer.cc), utilisation a 0-1 fraction, power in W, memory in
bytes. A CPU server's row has the headings with empty cells."""

from __future__ import annotations

from pathlib import Path

import pytest

from deploybench import columns, perf
from deploybench.collectors import (
    NO_GPU_VALUE,
    TRITON_GPU_METRICS,
    GpuMetricsOutput,
    collect_trial,
)
from deploybench.errors import PerfError
from deploybench.instruments import METRICS_POLL_MS, NO_GPU_METRICS, TritonGpuMetrics
from deploybench.transport import Transport

HEADER = (
    "Concurrency,Inferences/Second,Client Send,Network+Server Send/Recv,Server Queue,"
    "Server Compute Input,Server Compute Infer,Server Compute Output,Client Recv,p50 latency,"
    "p90 latency,p95 latency,p99 latency,Avg latency,request/response,response wait,"
    "Avg GPU Utilization,Avg GPU Power Usage,Max GPU Memory Usage,Total GPU Memory"
)
TWO_GPUS = (
    "1,2423.68,43,132,18,17,192,32,0,379,584,700,1417,437,43,354,"
    "GPU-aaaa:0.25;GPU-bbbb:0;,GPU-aaaa:71.394;GPU-bbbb:123.457;,"
    "GPU-aaaa:1234567890;GPU-bbbb:5;,GPU-aaaa:150754820096;GPU-bbbb:8;"
)
CPU_SERVER = "1,2272.04,43,132,18,17,192,32,0,379,584,700,1417,437,43,389,,,,"
MEASURED = "triton nv_gpu_* via perf_analyzer --collect-metrics (2 GPUs, every 1000 ms)"
GPU_COLUMNS = [c for c in columns.PERF_COLUMNS if c.source == TRITON_GPU_METRICS]


def csv_file(tmp_path: Path, row: str, header: str = HEADER) -> Path:
    path = tmp_path / "point.csv"
    path.write_text(f"{header}\n{row}\n")
    return path


def collected(path: Path | None, status: str = MEASURED) -> dict:
    return collect_trial({TRITON_GPU_METRICS: GpuMetricsOutput(status, path)}, GPU_COLUMNS)


def test_per_gpu_cells_are_read_by_uuid():
    assert columns.gpu_cells("GPU-aaaa:0.25;GPU-bbbb:0;") == {"GPU-aaaa": 0.25, "GPU-bbbb": 0.0}
    assert columns.gpu_cells("") == {}
    with pytest.raises(ValueError, match="not a per-GPU cell"):
        columns.gpu_cells("0.25;")


def test_two_gpus_cells_become_one_value_each(tmp_path):
    values = collected(csv_file(tmp_path, TWO_GPUS))
    # utilisation: the GPUs' mean, as %; power and memory used: summed, memory in MiB
    assert values["triton_gpu_util_pct"] == pytest.approx(12.5)
    assert values["triton_gpu_power_w"] == pytest.approx(71.394 + 123.457)
    assert values["triton_gpu_memory_used_mib"] == pytest.approx((1234567890 + 5) / 2**20)
    assert values["triton_gpu_status"] == MEASURED


def test_a_cpu_servers_empty_cells_are_not_measured_and_say_why(tmp_path):
    path = csv_file(tmp_path, CPU_SERVER)
    why = "not measured: the server's metrics have no nv_gpu_utilization (a CPU server)"
    values = collected(path, why)
    assert [values[c.name] for c in GPU_COLUMNS[:-1]] == [None, None, None]
    assert values["triton_gpu_status"] == why
    # a server with GPU metrics whose cells came back empty: the status says so
    assert collected(path)["triton_gpu_status"] == NO_GPU_VALUE


def test_an_optional_heading_may_be_missing_a_required_one_may_not(tmp_path):
    plain = HEADER.rsplit(",Avg GPU Utilization", 1)[0]
    path = csv_file(tmp_path, CPU_SERVER.rsplit(",,,,", 1)[0], plain)
    assert collected(path)["triton_gpu_util_pct"] is None  # the flag not passed
    required = [c for c in columns.PERF_COLUMNS if c.name == "throughput"]
    from deploybench.collectors import PERF_ANALYZER, PerfAnalyzerOutput

    missing = csv_file(tmp_path, "1", "Concurrency")
    with pytest.raises(PerfError, match="perf_analyzer wrote no 'Inferences/Second'"):
        collect_trial({PERF_ANALYZER: PerfAnalyzerOutput(missing, "")}, required)


def test_the_instrument_passes_the_servers_metrics_url():
    url = "http://127.0.0.1:40123/metrics"
    metrics = TritonGpuMetrics(MEASURED, url, 1000)
    command = perf.perf_command(
        model_name="m",
        url="127.0.0.1:40121",
        transport=Transport("http", "none"),
        point=perf.Point(1, 1),
        input_data=Path("d.json"),
        request_count=50,
        interval_ms=1000,
        result_csv=Path("r.csv"),
        extra=metrics.flags(),
    )
    # perf_analyzer's own default would be the -u host's port 8002, not the server's
    assert command[-5:] == ["--collect-metrics", "--metrics-url", url, "--metrics-interval", "1000"]
    assert NO_GPU_METRICS.flags() == [] and METRICS_POLL_MS == 1000


def test_a_parse_rule_and_a_divisor_do_not_go_together():
    bad = columns.Column(
        "x", "metric", "triton_gpu_metrics", "k", divisor=2.0, parse=columns.gpu_cells
    )
    with pytest.raises(ValueError, match="sets the unit"):
        columns.check([bad])


def test_the_summary_says_the_gpu_metrics_or_why_not():
    from deploybench.summary import gpu_metrics_line

    why = "not measured: the server's metrics have no nv_gpu_utilization (a CPU server)"
    cpu = [{"triton_gpu_util_pct": "", "triton_gpu_status": why}] * 2
    assert gpu_metrics_line(cpu) == f"Triton GPU metrics: {why}"
    gpu = [
        {"triton_gpu_util_pct": "40.0", "triton_gpu_power_w": "150", "triton_gpu_status": MEASURED},
        {"triton_gpu_util_pct": "90.5", "triton_gpu_power_w": "150", "triton_gpu_status": MEASURED},
    ]
    assert gpu_metrics_line(gpu) == (
        f"Triton GPU metrics: utilization 40.0-90.5 %, power 150.0 W ({MEASURED})"
    )
    assert gpu_metrics_line([{"throughput": "1"}]) is None  # a CSV from before the columns
