"""Accuracy comparison, perf_analyzer command/result handling, repository config."""

import math
import os

import numpy as np
import pytest

from deploybench import accuracy, perf
from deploybench.errors import PerfError
from deploybench.instruments import NOT_MEASURED, NOT_READ
from deploybench.model_repository import build_repository, model_config
from deploybench.planning.backends import PLATFORMS
from deploybench.tensors import TENSOR_TYPES, TensorSpec
from deploybench.transport import Transport
from deploybench.triton_config import to_pbtxt
from tests.conftest import REPO
from tests.perf_standin import PROFILE_EXPORT

PA_CSV = (
    "Concurrency,Inferences/Second,Client Send,Network+Server Send/Recv,Server Queue,"
    "Server Compute Input,Server Compute Infer,Server Compute Output,Client Recv,p50 latency,"
    "p90 latency,p95 latency,p99 latency,Avg latency,request/response,response wait\n"
    "1,255.716,15,809,82,51,30133,331,4,31128,36176,37249,40799,31427,19,31379\n"
)


def test_compare_outputs_pass_fail_and_nan():
    ref = {"y": np.array([[1.0, 2.0], [3.0, 4.0]])}
    tol = {"y": {"atol": 0.01, "rtol": 0.0}}
    [ok] = accuracy.compare_outputs(ref, {"y": ref["y"] + 0.005}, tol, 2)
    assert ok["passed"] and ok["mismatched"] == 0 and math.isclose(ok["max_abs_err"], 0.005)
    [bad] = accuracy.compare_outputs(ref, {"y": ref["y"] + np.array([[0, 0], [0, 1.0]])}, tol, 2)
    assert not bad["passed"] and bad["mismatched"] == 1 and bad["max_abs_err"] == 1.0
    assert "1/4 elements outside atol=0.01" in accuracy.format_failure([bad])
    [nan] = accuracy.compare_outputs(ref, {"y": np.full((2, 2), np.nan)}, tol, 2)
    assert not nan["passed"] and nan["mismatched"] == 4


def test_mismatch_fraction_allows_a_share_of_flipped_labels():
    ref = {"labels": np.zeros((1, 100), dtype=np.int64)}
    flipped = ref["labels"].copy()
    flipped[0, :2] = 3  # two near-tie voxels took another class
    exact = {"labels": {"atol": 0, "rtol": 0}}
    [row] = accuracy.compare_outputs(ref, {"labels": flipped}, exact, 1)
    assert not row["passed"] and row["mismatched"] == 2
    share = {"labels": {"atol": 0, "rtol": 0, "mismatch_fraction": 0.02}}
    [row] = accuracy.compare_outputs(ref, {"labels": flipped}, share, 1)
    assert row["passed"] and row["mismatch_fraction"] == 0.02
    flipped[0, 2] = 1
    [row] = accuracy.compare_outputs(ref, {"labels": flipped}, share, 1)
    assert not row["passed"]


def test_compare_outputs_rejects_missing_tolerance_and_shape():
    ref = {"y": np.zeros((2, 3))}
    with pytest.raises(ValueError, match="no tolerance configured for output 'y'"):
        accuracy.compare_outputs(ref, ref, {"z": {"atol": 0, "rtol": 0}}, 2)
    with pytest.raises(accuracy.AccuracyError, match="shape"):
        accuracy.compare_outputs(ref, {"y": np.zeros((2, 2))}, {"y": {"atol": 1, "rtol": 0}}, 2)


def test_parse_result_converts_microseconds(tmp_path):
    path = tmp_path / "pa.csv"
    path.write_text(PA_CSV)
    row = perf.parse_result(path, "Client: \n    Request count: 192\n")
    assert row["throughput"] == 255.716
    assert row["server_compute_infer_ms"] == pytest.approx(30.133)
    assert row["p99_latency_ms"] == pytest.approx(40.799)
    assert row["measured_requests"] == 192


def test_perf_command_follows_the_point_and_transport(tmp_path, monkeypatch):
    monkeypatch.setenv("DEPLOYBENCH_PERF_ANALYZER", "/opt/pa")
    common = {
        "model_name": "tft",
        "url": "127.0.0.1:1",
        "input_data": tmp_path / "d.json",
        "request_count": 500,
        "interval_ms": 5000,
        "result_csv": tmp_path / "r.csv",
    }
    offline = perf.perf_command(
        transport=Transport("grpc", "system"), point=perf.Point(64, 1), **common
    )
    assert offline[0] == "/opt/pa"
    assert offline[offline.index("-b") + 1] == "64"
    assert offline[offline.index("-i") + 1] == "grpc"
    assert (
        "--shared-memory" in offline and offline[offline.index("--shared-memory") + 1] == "system"
    )
    assert offline[offline.index("--concurrency-range") + 1] == "1:1:1"
    assert offline[offline.index("--measurement-request-count") + 1] == "500"
    online = perf.perf_command(
        transport=Transport("http", "none"), point=perf.Point(16, 24), **common
    )
    assert online[online.index("-i") + 1] == "http" and "--shared-memory" not in online
    assert online[online.index("--concurrency-range") + 1] == "24:24:1"
    # perf_analyzer's own window limit only where the config sets one
    assert "--max-trials" not in online
    capped = perf.perf_command(
        transport=Transport("http", "none"), point=perf.Point(1, 2), max_windows=4, **common
    )
    assert capped[capped.index("--max-trials") + 1] == "4"


STAND_IN = """#!/usr/bin/env bash
# stand-in perf_analyzer: reports 3 windows of the requested count; unstable below {ok}
{export}count=0; out=""; stab=""
while [ $# -gt 0 ]; do
  case "$1" in
    --measurement-request-count) count=$2; shift;;
    -f) out=$2; shift;;
    --stability-percentage) stab=$2; shift;;
  esac; shift
done
echo "$count $stab" >> {calls}
if [ "$count" -lt {ok} ] && [ -z "$stab" ]; then
  echo "Failed to obtain stable measurement within 10 measurement windows"; exit 2
fi
printf 'Client: \\n    Request count: %d\\n' $((count * 3))  # 3 windows of the count
write_export $((count * 3))
cat > "$out" <<CSV
{csv}CSV
"""


def _fake_perf_analyzer(tmp_path, monkeypatch, body):
    """A stand-in perf_analyzer (through the documented override) for the retry logic."""
    script = tmp_path / "pa"
    script.write_text(body)
    script.chmod(0o755)
    monkeypatch.setenv("DEPLOYBENCH_PERF_ANALYZER", str(script))


def stand_in(tmp_path, monkeypatch, ok=0, script=STAND_IN):
    """The stand-in perf_analyzer (``script``: STAND_IN, or JUDGED with its window lines);
    returns the file its calls are recorded in."""
    calls = tmp_path / "calls"
    _fake_perf_analyzer(
        tmp_path,
        monkeypatch,
        script.format(ok=ok, calls=calls, csv=PA_CSV, export=PROFILE_EXPORT),
    )
    return calls


def measure(
    tmp_path, settings, *, energy=NOT_MEASURED, triton=NOT_READ, warm_up=True, rate=None, **fields
):
    """One trial of point (batch 1, concurrency 2) through the stand-in: a measurement of
    ``settings`` with these instruments (``energy``, Triton's counter ``triton``) and
    ``fields`` (perf.Measurement's)."""
    measurement = perf.Measurement(
        "m",
        "u",
        Transport("http", "none"),
        tmp_path / "d.json",
        settings,
        instruments=(energy, triton),
        **fields,
    )
    return perf.measure_point(measurement, perf.Point(1, 2), warm_up=warm_up, rate=rate)


def test_unstable_point_is_retried_with_more_requests(tmp_path, monkeypatch):
    calls = stand_in(tmp_path, monkeypatch, ok=150)
    settings = perf.MeasureSettings(request_count=50, max_retries=5, retry_request_step=50)
    row = measure(tmp_path, settings)
    assert row["stable"] is True and row["request_count"] == 150 and row["attempts"] == 3
    # warm-up (2x requests, no stability check), then 50, 100, 150
    assert calls.read_text().split("\n")[:-1] == ["100 1000", "50 ", "100 ", "150 "]


def test_never_stable_point_is_kept_and_flagged(tmp_path, monkeypatch):
    calls = stand_in(tmp_path, monkeypatch, ok=10**6)
    settings = perf.MeasureSettings(
        request_count=50, max_retries=1, retry_request_step=50, warmup_factor=0
    )
    row = measure(tmp_path, settings)
    assert row["stable"] is False and row["throughput"] == 255.716
    assert calls.read_text().split("\n")[:-1] == ["50 ", "100 ", "100 1000"]


# stand-in perf_analyzer with `-v`: 3 windows' lines, as perf_analyzer prints them, that settle
# (throughput and latency within 10 %) from {ok} requests a window on, and do not below
JUDGED = """#!/usr/bin/env bash
{export}count=0; out=""; args="$*"
while [ $# -gt 0 ]; do
  case "$1" in --measurement-request-count) count=$2; shift;; -f) out=$2; shift;; esac; shift
done
echo "$args" >> {calls}
if [ "$count" -lt {ok} ]; then passes="100 7000 150.5 6100 100 7000"; else passes="100 7000 109.9 6400 105 6800"; fi
set -- $passes; n=1
while [ $# -gt 0 ]; do
  echo "  Pass [$n] throughput: $1 infer/sec. Avg latency: $2 usec (std 900 usec). "
  shift 2; n=$((n + 1))
done
printf 'Client: \\n    Request count: %d\\n' $((count * 3))
write_export $((count * 3))
cat > "$out" <<CSV
{csv}CSV
"""


def judged(calls):
    """Each call's request count, and whether it asked for `-v` with the criterion off."""
    lines = calls.read_text().split("\n")[:-1]
    return [
        (int(line.split("--measurement-request-count ")[1].split()[0]), line.endswith(" -v"))
        for line in lines
        if "--stability-percentage 1000" in line
    ], len(lines)


@pytest.mark.parametrize(("ok", "stable"), [(50, True), (10**6, False)])
def test_three_windows_are_measured_once_and_judged_by_perf_analyzers_criterion(
    tmp_path, monkeypatch, ok, stable
):
    """max_windows 3: perf_analyzer would measure these same 3 windows with its criterion on,
    so a trial is one measurement, judged here; an unsettled one is kept, not measured again."""
    calls = stand_in(tmp_path, monkeypatch, ok, script=JUDGED)
    settings = perf.MeasureSettings(request_count=50, max_retries=0, warmup_factor=0, max_windows=3)
    row = measure(tmp_path, settings)
    assert row["stable"] is stable and row["attempts"] == 1
    assert judged(calls) == ([(50, True)], 1)


def test_an_unsettled_judged_trial_is_retried_with_more_requests_first(tmp_path, monkeypatch):
    calls = stand_in(tmp_path, monkeypatch, ok=150, script=JUDGED)
    settings = perf.MeasureSettings(
        request_count=50, max_retries=1, retry_request_step=50, warmup_factor=0, max_windows=3
    )
    row = measure(tmp_path, settings)
    # 50 and 100 do not settle; the one retry spent, the 100's windows are kept
    assert row["stable"] is False and row["attempts"] == 2 and row["request_count"] == 100
    assert judged(calls) == ([(50, True), (100, True)], 2)


@pytest.mark.parametrize(
    ("passes", "settled"),
    [
        ([(100.0, 7000), (110.0, 7000), (105.0, 7700)], True),  # both at the 10 % bound
        ([(100.0, 7000), (110.1, 7000), (105.0, 7000)], False),  # throughput past it
        ([(100.0, 7000), (100.0, 7701), (100.0, 7000)], False),  # latency past it
        ([(100.0, 7000), (0.0, 7000), (100.0, 7000)], False),  # a window with nothing done
        ([(50.0, 9000), (100.0, 7000), (100.0, 7000), (100.0, 7000)], True),  # the last 3
    ],
)
def test_windows_settled_is_perf_analyzers_criterion(passes, settled):
    out = "".join(
        f"  Pass [{n}] throughput: {t:g} infer/sec. Avg latency: {lat} usec (std 1 usec). \n"
        for n, (t, lat) in enumerate(passes, 1)
    )
    assert perf.windows_settled(out) is settled
    p99 = out.replace("Avg latency", "p99 latency").replace(" (std 1 usec). ", "")
    assert perf.windows_settled(p99) is settled


def test_too_few_window_lines_are_an_error_naming_them():
    with pytest.raises(PerfError, match="printed 2 window lines"):
        perf.windows_settled("  Pass [1] throughput: 1 infer/sec. Avg latency: 5 usec\n" * 2)


TIME_WINDOWS = """#!/usr/bin/env bash
# stand-in perf_analyzer in time windows: 40 requests a window of any length
{export}args="$*"; out=""
while [ $# -gt 0 ]; do case "$1" in -f) out=$2; shift;; esac; shift; done
echo "$args" >> {calls}
printf 'Client: \\n    Request count: 120\\n'
write_export 120
cat > "$out" <<CSV
{csv}CSV
"""


def test_time_windows_are_measured_as_perf_clients_p(tmp_path, monkeypatch):
    calls = tmp_path / "calls"
    _fake_perf_analyzer(
        tmp_path, monkeypatch, TIME_WINDOWS.format(calls=calls, csv=PA_CSV, export=PROFILE_EXPORT)
    )
    settings = perf.MeasureSettings(
        request_count=500,
        measurement_interval_ms=10000,
        measurement_mode="time_windows",
        warmup_factor=2,
        min_duration_ms=60000,  # longer than 3 windows: not ours to stretch, so not re-measured
    )
    row = measure(tmp_path, settings)
    warm_up, trial = [line.split() for line in calls.read_text().splitlines()]
    for cmd, interval in ((warm_up, "20000"), (trial, "10000")):  # warm-up: 2 windows' worth
        assert cmd[cmd.index("--measurement-mode") + 1] == "time_windows"
        assert cmd[cmd.index("--measurement-interval") + 1] == interval
        assert "--measurement-request-count" not in cmd
    # the row's requests a window are those its windows held: 120 over 3
    assert row["request_count"] == 40 and row["attempts"] == 1 and row["stable"] is True
    with pytest.raises(PerfError, match="unknown measurement mode 'windows'"):
        perf.perf_command(
            model_name="m", url="u", transport=Transport("http", "none"),
            point=perf.Point(1, 1), input_data=tmp_path / "d", request_count=1,
            interval_ms=1, result_csv=tmp_path / "r", mode="windows",
        )  # fmt: skip


def test_perf_analyzer_failure_is_an_error(tmp_path, monkeypatch):
    _fake_perf_analyzer(
        tmp_path, monkeypatch, "#!/bin/sh\necho 'error: failed to get model metadata'; exit 99\n"
    )
    with pytest.raises(perf.PerfError, match="exit 99"):
        measure(tmp_path, perf.MeasureSettings(request_count=5, warmup_factor=0))


def test_perf_analyzer_hang_is_killed_at_timeout(tmp_path, monkeypatch):
    _fake_perf_analyzer(tmp_path, monkeypatch, "#!/bin/sh\nsleep 60\n")
    with pytest.raises(perf.PerfError, match="hung past its timeout"):
        measure(tmp_path, perf.MeasureSettings(request_count=5, warmup_factor=0, timeout_s=1))


SPECS_IN = [TensorSpec("x__0", "float32", (192, 3)), TensorSpec("c__1", "int64", (1,))]
SPECS_OUT = [TensorSpec("y__0", "float32", (24, 3))]


def _config(backend="python"):
    serving = {"backend": backend, "runtime": "onnxruntime"}
    if backend != "python":  # a native backend is named by the platform the plan gives it
        serving["platform"] = PLATFORMS[backend]
    triton = {
        "max_batch_size": 1024,
        "model_instances": 2,
        "preferred_batch_sizes": [512, 1024],
        "max_queue_delay_us": 1,
        "intra_op_threads": 1,
    }
    return model_config(
        name="tft",
        serving=serving,
        triton=triton,
        device="cpu" if backend == "python" else "gpu",
        inputs=SPECS_IN,
        outputs=SPECS_OUT,
        artifact_name="model.onnx",
    )


def test_config_pbtxt_for_python_backend():
    # protobuf's text format, as Triton's tools write it
    text = to_pbtxt(_config())
    assert 'backend: "python"' in text and "max_batch_size: 1024" in text
    assert 'input {\n  name: "x__0"\n  data_type: TYPE_FP32\n  dims: [192, 3]\n}' in text
    assert 'input {\n  name: "c__1"\n  data_type: TYPE_INT64\n  dims: [1]\n}' in text
    assert "instance_group {\n  kind: KIND_CPU\n  count: 2\n}" in text
    assert "preferred_batch_size: [512, 1024]" in text
    assert "max_queue_delay_microseconds: 1" in text
    assert 'key: "runtime"\n  value {\n    string_value: "onnxruntime"\n  }' in text


def test_config_pbtxt_for_native_gpu_backend():
    text = to_pbtxt(_config("tensorrt"))
    assert 'platform: "tensorrt_plan"' in text and "KIND_GPU" in text and "parameters" not in text


def test_each_tensor_type_is_named_alike_by_numpy_triton_onnx_and_the_schema():
    """The one table (tensors.TENSOR_TYPES) against each library's own names for the types."""
    import onnx.helper
    import yaml
    from tritonclient.grpc import model_config_pb2
    from tritonclient.utils import np_to_triton_dtype

    for t in TENSOR_TYPES:
        assert np_to_triton_dtype(np.dtype(t.numpy)) == t.triton
        assert t.triton_config in model_config_pb2.DataType.DESCRIPTOR.values_by_name
        assert onnx.helper.tensor_dtype_to_np_dtype(t.onnx) == np.dtype(t.numpy)
    schema = yaml.safe_load((REPO / "config" / "schema" / "config.schema.yaml").read_text())
    assert schema["$defs"]["dtype"]["enum"] == [t.numpy for t in TENSOR_TYPES]


def test_repository_layout_and_replacement(tmp_path):
    artifact = tmp_path / "a.onnx"
    artifact.write_bytes(b"onnx")
    out = tmp_path / "repository"
    build_repository(_config(), artifact, "model.onnx", out)
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()) == [
        "tft/1/model.onnx",
        "tft/1/model.py",
        "tft/1/runtime.py",
        "tft/config.pbtxt",
    ]
    (out / "stale").write_text("x")
    build_repository(_config(), artifact, "model.onnx", out)  # rebuilt whole
    assert not (out / "stale").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_output_shared_memory_holds_a_whole_batch(tmp_path):
    common = {
        "model_name": "nnunet",
        "url": "127.0.0.1:1",
        "input_data": tmp_path / "d.json",
        "request_count": 50,
        "interval_ms": 5000,
        "result_csv": tmp_path / "r.csv",
        "transport": Transport("grpc", "system"),
    }
    volume = 3 * 128**3 * 4  # one nnU-Net output sample
    cmd = perf.perf_command(point=perf.Point(4, 1), output_bytes_per_sample=volume, **common)
    assert cmd[cmd.index("--output-shared-memory-size") + 1] == str(4 * volume)
    small = perf.perf_command(point=perf.Point(1, 1), output_bytes_per_sample=10, **common)
    assert small[small.index("--output-shared-memory-size") + 1] == str(perf.MIN_OUTPUT_SHM_BYTES)


def test_instances_share_the_cores_instead_of_each_taking_all(monkeypatch):
    from deploybench import runtime

    monkeypatch.setattr(runtime.os, "sched_getaffinity", lambda _pid: set(range(8)))
    assert runtime.threads_per_instance(0, 1) == 8
    assert runtime.threads_per_instance(0, 2) == 4
    assert runtime.threads_per_instance(0, 16) == 1  # never zero, which means "all" to a runtime
    assert runtime.threads_per_instance(3, 2) == 3  # configured: kept


def test_outputs_are_whole_with_the_umask_mode(tmp_path):
    from deploybench.io import atomic_path, write_text

    old = os.umask(0o022)
    try:
        write_text(tmp_path / "a.txt", "x")
    finally:
        os.umask(old)
    assert (tmp_path / "a.txt").stat().st_mode & 0o777 == 0o644  # not mkstemp's 0600
    with pytest.raises(RuntimeError), atomic_path(tmp_path / "b.txt") as tmp:
        tmp.write_text("half")
        raise RuntimeError("killed mid-write")
    assert list(tmp_path.iterdir()) == [tmp_path / "a.txt"]  # no b.txt, no partial file


def test_directory_digest_sees_content_not_snakemakes_timestamp(tmp_path):
    from deploybench.io import sha256_of

    (tmp_path / "variables").mkdir()
    (tmp_path / "variables" / "v.data").write_bytes(b"weights")
    before = sha256_of(tmp_path)
    (tmp_path / ".snakemake_timestamp").write_text("")
    assert sha256_of(tmp_path) == before
    (tmp_path / "variables" / "v.data").write_bytes(b"weight")
    assert sha256_of(tmp_path) != before


def test_a_servers_bytecode_cache_leaves_a_repositorys_digest_and_fingerprint_as_they_were(
    tmp_path,
):
    """Triton's python backend stub imports `1/model.py` and writes `1/__pycache__/` into the
    repository after the job that made it: kept trials and the recorded digest must still
    match, and a change to `model.py` itself must not."""
    from deploybench.io import sha256_of
    from deploybench.partial import fingerprint

    version = tmp_path / "tft" / "1"
    version.mkdir(parents=True)
    (tmp_path / "tft" / "config.pbtxt").write_text('name: "tft"\nbackend: "python"\n')
    (version / "model.py").write_text("class TritonPythonModel: ...\n")
    spec = {"scenario": "online", "points": [[1, 1]]}
    digest, kept = sha256_of(tmp_path), fingerprint(spec, tmp_path)
    (version / "__pycache__").mkdir()
    (version / "__pycache__" / "model.cpython-312.pyc").write_bytes(b"\x00bytecode")
    assert (sha256_of(tmp_path), fingerprint(spec, tmp_path)) == (digest, kept)
    (version / "model.py").write_text("class TritonPythonModel: pass\n")
    assert sha256_of(tmp_path) != digest
    assert fingerprint(spec, tmp_path) != kept
