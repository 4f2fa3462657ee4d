"""How perf_analyzer reaches Triton, per model and scenario, as DLE's runners did (issue 27):
the planned transport, the exact perf_analyzer command line it gives on a GPU, the CPU
default's stand-in for CUDA shared memory, what the perf job records, and the schema's checks.
Fast: no server, no perf_analyzer."""

from __future__ import annotations

import contextlib
import csv
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from snakemake_interface_common.exceptions import WorkflowError

from deploybench import jobs, perf, triton_client
from deploybench.columns import CSV_COLUMNS, TRIAL_COLUMNS
from deploybench.instruments import TritonCounter
from deploybench.jobs import measure as measure_jobs
from deploybench.planning import run_plan as dbplan
from deploybench.planning.workflow_config import ConfigError, check_sizings, load_yaml
from deploybench.transport import Transport, of_spec, planned
from tests.conftest import REPO, base_config, seed_models, smoke_config, validated

# DLE's transport per model and scenario (protocol, shared memory) and the runner it comes from
# (NVIDIA/DeepLearningExamples at 729963dd47e7c8bd462ad10bfac7a7b0b604e6dd).
TFT = "PyTorch/Forecasting/TFT/triton/runner/pipeline_impl.py"
DLE: dict[tuple[str, str], tuple[str, str]] = {
    # run_performance_on_triton.py at its default http:// URL; offline --shared-memory system
    ("tft", "offline"): ("http", "system"),
    ("tft", "online"): ("http", "none"),
    ("tft_traffic", "offline"): ("http", "system"),
    ("tft_traffic", "online"): ("http", "none"),
    # run_{offline,online}_performance_test_on_triton.py: -i http, --shared-memory=cuda
    ("nnunet", "offline"): ("http", "cuda"),
    ("nnunet", "online"): ("http", "cuda"),
    # the same scripts, run without --shared-memory
    ("resnet50", "offline"): ("http", "none"),
    ("resnet50", "online"): ("http", "none"),
    ("fastpitch", "offline"): ("http", "none"),
    ("fastpitch", "online"): ("http", "none"),
    # large/runner/pipeline_impl.py: run_performance_on_triton.py at its default grpc:// URL;
    # no online rows published (the script's online mode: no shared memory)
    ("bert", "offline"): ("grpc", "system"),
    ("bert", "online"): ("grpc", "none"),
}
# DLE's measurement per model (the same in both scenarios): perf_analyzer's mode and window, as
# the runner that made the model's page measured (read at the commits the pages match).
MEASUREMENT: dict[str, tuple[str, int, int | None]] = {
    # (mode, window interval ms, requests a window); run_performance_on_triton.py (BERT, TFT):
    # perf_analyzer count_windows for a tritonclient >= 2.11.0 (BERT: 21.10 SDK, 2.15)
    "tft": ("count_windows", 5000, 500),
    "tft_traffic": ("count_windows", 5000, 500),
    "bert": ("count_windows", 5000, 50),
    # run_{offline,online}_performance_test_on_triton.py: perf_client -p 10000 (time windows;
    # ConvNets 169b0818 with the 20.12 SDK, FastPitch ba8f04bf 21.02, nnU-Net 905e9e50 21.02)
    "nnunet": ("time_windows", 10000, None),
    "resnet50": ("time_windows", 10000, None),
    "fastpitch": ("time_windows", 10000, None),
}
# A published GPU format of each model, as planned on a GPU of the config.
GPU_RUNS = {
    "tft": ("A30", "trt", "fp16"),
    "tft_traffic": ("A100", "trt", "fp16"),
    "nnunet": ("A100", "ts-script", "fp16"),
    "resnet50": ("A100", "tf-trt", "fp16"),
    "fastpitch": ("A30", "ts-trace", "fp16"),
    "bert": ("A30", "onnx", "fp16"),
}
# A CPU format of each model on the embedded default.
CPU_FORMATS = {
    "tft": "onnx",
    "tft_traffic": "onnx",
    "nnunet": "ts-script",
    "resnet50": "tf-savedmodel",
    "fastpitch": "ts-trace",
    "bert": "onnx",
}
SCENARIOS = dbplan.SCENARIOS


@pytest.fixture(scope="module")
def config() -> dict[str, Any]:
    return validated(base_config())


def command(spec: dict[str, Any], tmp_path: Path, output_bytes: int = 0) -> list[str]:
    """The perf_analyzer command line of the spec's first point, as the perf job builds it."""
    point = spec["points"][0]
    return perf.perf_command(
        model_name=spec["model_name"],
        url="127.0.0.1:8000",
        transport=of_spec(spec["transport"]),
        point=perf.Point(point["batch"], point["concurrency"]),
        input_data=tmp_path / "data.json",
        request_count=spec["measure"]["request_count"],
        interval_ms=spec["measure"]["measurement_interval_ms"],
        result_csv=tmp_path / "point.csv",
        output_bytes_per_sample=output_bytes,
        mode=spec["measure"]["measurement_mode"],
    )


def test_every_model_measures_in_its_runners_mode_on_a_gpu_and_in_requests_on_the_cpu(config):
    assert set(MEASUREMENT) == seed_models(config)
    for model, (mode, interval_ms, requests) in MEASUREMENT.items():
        measure = dbplan.plan_run(config, model, *GPU_RUNS[model]).measure
        assert measure["measurement_mode"] == mode, model
        assert measure["measurement_interval_ms"] == interval_ms, model
        if requests is not None:
            assert measure["request_count"] == requests, model
        # on 2 cores a 10 s window may hold no nnU-Net request: the cpu sizing counts requests
        cpu = dbplan.plan_run(config, model, "cpu", CPU_FORMATS[model], "fp32").measure
        assert cpu["measurement_mode"] == "count_windows", model


def test_every_configured_model_has_its_dle_transport(config):
    assert {model for model, _ in DLE} == seed_models(config) == set(GPU_RUNS)
    for (model, scenario), (protocol, shared_memory) in DLE.items():
        configured = config["models"][model]["perf"][scenario]["transport"]
        assert configured == {"protocol": protocol, "shared_memory": shared_memory}, model


@pytest.mark.parametrize(("model", "scenario"), sorted(DLE))
def test_gpu_command_line_is_dles(config, tmp_path, monkeypatch, model, scenario):
    monkeypatch.setenv("DEPLOYBENCH_PERF_ANALYZER", "/opt/pa")
    protocol, shared_memory = DLE[model, scenario]
    plan = dbplan.plan_run(config, model, *GPU_RUNS[model])
    spec = plan.spec(scenario)
    assert spec["transport"] == {
        "protocol": protocol,
        "shared_memory": shared_memory,
        "configured": {"protocol": protocol, "shared_memory": shared_memory},
        "fallback": None,
    }
    point = spec["points"][0]
    batch, concurrency = point["batch"], point["concurrency"]
    output_bytes = 300_000  # one sample's outputs (x2 margin), as the job measures it
    shm = (
        []
        if shared_memory == "none"
        else [
            "--shared-memory", shared_memory,
            "--output-shared-memory-size", str(max(perf.MIN_OUTPUT_SHM_BYTES, 300_000 * batch)),
        ]
    )  # fmt: skip
    mode, interval_ms, requests = MEASUREMENT[model]
    counted = [] if requests is None else ["--measurement-request-count", str(requests)]
    assert command(spec, tmp_path, output_bytes) == [
        "/opt/pa",
        "-m", model,
        "-x", "1",
        "-b", str(batch),
        "-u", "127.0.0.1:8000",
        "-i", protocol,
        "--input-data", str(tmp_path / "data.json"),
        "--measurement-interval", str(interval_ms),
        "--concurrency-range", f"{concurrency}:{concurrency}:1",
        "--measurement-mode", mode,
        *counted,
        "-f", str(tmp_path / "point.csv"),
        "--verbose-csv",
        *shm,
    ]  # fmt: skip


@pytest.mark.parametrize("model", sorted(CPU_FORMATS))
def test_cpu_default_measures_cuda_shared_memory_as_system(config, tmp_path, monkeypatch, model):
    monkeypatch.setenv("DEPLOYBENCH_PERF_ANALYZER", "/opt/pa")
    plan = dbplan.plan_run(config, model, "cpu", CPU_FORMATS[model], "fp32")
    for scenario in SCENARIOS:
        protocol, configured = DLE[model, scenario]
        transport = plan.spec(scenario)["transport"]
        assert transport["configured"] == {"protocol": protocol, "shared_memory": configured}
        assert transport["protocol"] == protocol
        cmd = command(plan.spec(scenario), tmp_path)
        assert cmd[cmd.index("-i") + 1] == protocol
        if configured == "cuda":  # nnU-Net: no CUDA here, system shared memory instead
            assert transport["shared_memory"] == "system"
            assert transport["fallback"] == (
                f"{plan.path} {scenario}: CUDA shared memory needs a GPU and this is a cpu "
                "device; measured with system shared memory instead"
            )
            assert cmd[cmd.index("--shared-memory") + 1] == "system"
        else:  # as on a GPU
            assert transport["shared_memory"] == configured and transport["fallback"] is None
            assert ("--shared-memory" in cmd) == (configured != "none")


def test_planned_transport_keeps_cuda_on_a_gpu_only():
    cuda = {"protocol": "http", "shared_memory": "cuda"}
    assert planned(cuda, "gpu", "r")["shared_memory"] == "cuda"
    on_cpu = planned(cuda, "cpu", "r")
    assert (on_cpu["protocol"], on_cpu["shared_memory"]) == ("http", "system")
    assert on_cpu["configured"] == cuda and "needs a GPU" in on_cpu["fallback"]
    for kept in ("none", "system"):
        wanted = {"protocol": "grpc", "shared_memory": kept}
        assert planned(wanted, "cpu", "r")["shared_memory"] == kept


def test_transport_names_the_valid_choices():
    with pytest.raises(ValueError, match=r"unknown protocol 'udp'; valid choices: http, grpc"):
        Transport("udp", "none")
    with pytest.raises(
        ValueError, match=r"unknown shared memory 'posix'; valid choices: none, system, cuda"
    ):
        Transport("http", "posix")


@pytest.mark.parametrize(
    ("transport", "message"),
    [
        ({"protocol": "udp", "shared_memory": "none"}, "'udp' is not one of ['http', 'grpc']"),
        (
            {"protocol": "http", "shared_memory": "gpu"},
            "'gpu' is not one of ['none', 'system', 'cuda']",
        ),
        ({"protocol": "http"}, "'shared_memory' is a required property"),
    ],
)
def test_schema_rejects_a_bad_transport_naming_the_choices(transport, message):
    config = base_config()
    config["models"]["nnunet"]["perf"]["online"]["transport"] = transport
    with pytest.raises(WorkflowError) as err:
        validated(config)
    assert message in str(err.value)


def test_a_sizing_with_a_bad_transport_fails_naming_its_key():
    config = validated(smoke_config())
    config["sizings"]["cpu"]["bert"] = {
        "perf": {"offline": {"transport": {"protocol": "grpc", "shared_memory": "cuda-ipc"}}}
    }
    schema = load_yaml(REPO / "config" / "schema" / "config.schema.yaml")
    with pytest.raises(
        ConfigError,
        match=r"sizings.cpu.bert.perf.offline.transport.shared_memory: 'cuda-ipc' is not one of",
    ):
        check_sizings(config, schema)


def test_schema_defaults_are_the_former_fixed_transports():
    config = base_config()
    for scenario in SCENARIOS:
        del config["models"]["tft"]["perf"][scenario]["transport"]
    perf_settings = validated(config)["models"]["tft"]["perf"]
    assert perf_settings["offline"]["transport"] == {"protocol": "grpc", "shared_memory": "system"}
    assert perf_settings["online"]["transport"] == {"protocol": "http", "shared_memory": "none"}


def test_a_changed_transport_reruns_that_scenario_only(config):
    path = ("nnunet", "A100", "ts-script", "fp16")
    before = dbplan.plan_run(config, *path)
    changed = validated(base_config())
    changed["models"]["nnunet"]["perf"]["online"]["transport"] = {
        "protocol": "grpc",
        "shared_memory": "system",
    }
    after = dbplan.plan_run(changed, *path)
    assert before.spec("offline") == after.spec("offline")
    assert before.spec("online") != after.spec("online")
    assert after.spec("online")["transport"]["protocol"] == "grpc"


# ---------------------------------------------------------------------------- shared memory


@pytest.fixture
def shm(tmp_path, monkeypatch) -> Path:
    """A stand-in /dev/shm holding a region a killed perf_analyzer left (input x)."""
    directory = tmp_path / "shm"
    directory.mkdir()
    monkeypatch.setattr(perf, "SHM_DIR", directory)
    (directory / "x_0_0").write_bytes(b"left")
    return directory


def test_system_shared_memory_is_locked_and_cleaned(shm):
    with perf.shared_memory_guard(Transport("http", "system"), ["x"], ["y"]):
        (shm / "y").write_bytes(b"out")
        assert [p.name for p in shm.glob("deploybench-perf-*.lock")]
    assert sorted(p.name for p in shm.iterdir() if not p.name.endswith(".lock")) == []


@pytest.mark.parametrize("kind", ["cuda", "none"])
def test_cuda_or_no_shared_memory_holds_nothing_in_dev_shm(shm, kind):
    with perf.shared_memory_guard(Transport("http", kind), ["x"], ["y"]):
        pass
    # no lock taken, nothing removed: these regions are not perf_analyzer's
    assert sorted(p.name for p in shm.iterdir()) == ["x_0_0"]


# ---------------------------------------------------------------------------- the perf job


class FakeServer:
    http_url = "127.0.0.1:8000"
    metrics_port = 0  # nothing answers there: Triton's energy counter is not measured
    extra_args = ()

    def metadata(self) -> dict[str, str]:
        return {"version": "2.51.0"}

    def url(self, protocol: str) -> str:
        return {"http": "127.0.0.1:8000", "grpc": "127.0.0.1:8001"}[protocol]

    def check_alive(self) -> None:
        pass

    environment: dict[str, str] = {}  # noqa: RUF012 - the run's `server.environment`: none

    def process_environment(self) -> tuple[dict[str, str], str]:
        return {}, "the stand-in's (no process)"


def write_served_configs(repository: Path, models: list[str], on_gpu: bool) -> None:
    """The served models' config.pbtxt as the repository job writes them, reduced to what the
    perf job reads back: their instance groups (the GPUs an NVML meter reads)."""
    kind = "KIND_GPU\n    gpus: [0]" if on_gpu else "KIND_CPU"
    for model in models:
        served = repository / model / "config.pbtxt"
        served.parent.mkdir(parents=True, exist_ok=True)
        served.write_text(f'name: "{model}"\ninstance_group {{\n    kind: {kind}\n}}\n')


def fake_job(monkeypatch, shm_dir: Path) -> list[dict[str, Any]]:
    """The perf job with its server, client and perf_analyzer stood in; returns the calls to
    measure_point."""
    calls: list[dict[str, Any]] = []
    family = SimpleNamespace(
        outputs=[SimpleNamespace(name="y")],
        perf_inputs=lambda seed, dataset=None: {"x": np.zeros((1, 4), np.float32)},
        perf_input_source=lambda seed, dataset=None: "zeros",
    )
    monkeypatch.setattr(measure_jobs, "load_family", lambda module, hparams: family)
    monkeypatch.setattr(
        measure_jobs, "ready_server", lambda *args: contextlib.nullcontext(FakeServer())
    )
    monkeypatch.setattr(triton_client, "served_inputs", lambda *args: None)
    monkeypatch.setattr(triton_client, "served_feeds", lambda sample, served: sample)
    monkeypatch.setattr(
        triton_client, "infer_triton", lambda *args: {"y": np.zeros((1, 4), np.float32)}
    )
    monkeypatch.setattr(perf, "SHM_DIR", shm_dir)

    def measure_point(measurement: Any, point: Any, **kwargs: Any) -> dict[str, Any]:
        calls.append({"measurement": measurement, "point": point, **kwargs})
        return {
            "batch": point.batch,
            "concurrency": point.concurrency,
            **dict.fromkeys(perf.MEASURED, 1.0),
            "measured_requests": 10,
            "request_count": 10,
            "measured_s": 1.0,
            "duration_capped": False,
            "stable": True,
            "attempts": 1,
        }

    monkeypatch.setattr(perf, "measure_point", measure_point)
    return calls


@pytest.mark.parametrize(
    ("path", "used", "fallback"),
    [
        (("nnunet", "A100", "ts-script", "fp16"), ("http", "cuda"), False),
        (("nnunet", "cpu", "ts-script", "fp32"), ("http", "system"), True),
        (("bert", "A30", "onnx", "fp16"), ("grpc", "system"), False),
    ],
)
def test_perf_job_measures_and_records_the_transport_used(
    tmp_path, monkeypatch, caplog, path, used, fallback
):
    config = validated(smoke_config())
    spec = dbplan.plan_run(config, *path).spec("offline")
    shm_dir = tmp_path / "shm"
    shm_dir.mkdir()
    calls = fake_job(monkeypatch, shm_dir)
    write_served_configs(tmp_path / "repository", [path[0]], on_gpu=path[1] != "cpu")
    out = {
        name: str(tmp_path / name)
        for name in ("offline.csv", "trials.csv", "prov.json", "server.log", "perf.log")
    }
    jobs.perf(
        spec,
        repository=str(tmp_path / "repository"),
        csv=out["offline.csv"],
        trials=out["trials.csv"],
        provenance=out["prov.json"],
        server_log=out["server.log"],
        perf_log=out["perf.log"],
    )
    protocol, shared_memory = used
    measurements = [c["measurement"] for c in calls]
    assert calls and all(m.transport == Transport(protocol, shared_memory) for m in measurements)
    assert {m.url for m in measurements} == {FakeServer().url(protocol)}
    for name in ("offline.csv", "trials.csv"):
        with Path(out[name]).open() as f:
            rows = list(csv.DictReader(f))
        assert rows and all(
            (row["protocol"], row["shared_memory"]) == (protocol, shared_memory) for row in rows
        )
    provenance = json.loads(Path(out["prov.json"]).read_text())["config"]
    recorded = provenance["transport"]
    assert recorded == spec["transport"]
    # the second energy meter: the stand-in server has no metrics endpoint, and says so
    triton = provenance["energy"]["triton"]
    assert triton["status"].startswith("not measured: Triton's metrics endpoint")
    assert triton["metrics_interval_ms"] == 2000
    counter = next(i for i in measurements[0].instruments if isinstance(i, TritonCounter))
    assert counter.triton is not None and counter.triton.url is None
    assert (recorded["fallback"] is not None) == fallback
    assert ("CUDA shared memory needs a GPU" in caplog.text) == fallback
    # system shared memory took the machine's lock on the tensors' regions; CUDA none
    locked = bool(list(shm_dir.glob("deploybench-perf-*.lock")))
    assert locked == (shared_memory == "system")


def test_transport_columns_come_after_the_earlier_ones():
    """Added after `attempts` (the last column before them): an older CSV keeps every column
    of its own in the same place."""
    for columns in (CSV_COLUMNS, TRIAL_COLUMNS):
        at = columns.index("attempts")
        assert columns[at + 1 : at + 3] == ["protocol", "shared_memory"]
    assert CSV_COLUMNS[:5] == ["model", "gpu", "format", "precision", "scenario"]


def _transport_table_rows() -> dict[tuple[str, str], tuple[str, str]]:
    """(model, scenario) -> (protocol, shared memory on a GPU) from the transport table of
    docs/comparability.md."""
    text = (REPO / "docs" / "comparability.md").read_text()
    table = text.split("## Transport: how perf_analyzer reaches Triton", 1)[1].split("\n## ")[0]
    rows = {}
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 4 or not cells[0].startswith("`"):
            continue
        models = [m.strip(" `") for m in cells[0].split(",")]
        scenarios = [s.strip() for s in cells[1].split(",")]
        protocol = {"HTTP": "http", "gRPC": "grpc"}[cells[2]]
        shared = cells[3].strip("*").lower()
        for model in models:
            for scenario in scenarios:
                rows[model, scenario] = (protocol, shared)
    return rows


def test_readme_table_is_the_command_line(config, tmp_path, monkeypatch):
    """Every row of the transport table (docs/comparability.md) is what perf_analyzer is given
    on a GPU."""
    monkeypatch.setenv("DEPLOYBENCH_PERF_ANALYZER", "/opt/pa")
    rows = _transport_table_rows()
    assert set(rows) == set(DLE)
    for (model, scenario), (protocol, shared_memory) in rows.items():
        spec = dbplan.plan_run(config, model, *GPU_RUNS[model]).spec(scenario)
        line = command(spec, tmp_path, 1000)
        assert line[line.index("-i") + 1] == protocol, (model, scenario)
        given = line[line.index("--shared-memory") + 1] if "--shared-memory" in line else "none"
        assert given == shared_memory, (model, scenario)


def test_report_configuration_table_says_the_transport_and_a_fallback():
    """Each run's configuration table on its report page names how perf_analyzer reached
    Triton per scenario (from the CSV rows) and, on a CPU nnU-Net run, why it differs."""
    import pandas as pd

    from deploybench.report import configuration_table, transport_text

    offline = pd.DataFrame([{"protocol": "http", "shared_memory": "system"}])
    online = pd.DataFrame([{"protocol": "grpc", "shared_memory": "none"}])
    assert transport_text(offline) == "HTTP, system shared memory"
    assert transport_text(online) == "gRPC, no shared memory"
    assert transport_text(pd.DataFrame([{"batch": 1}])) is None  # a CSV from before
    spec = dbplan.plan_run(validated(smoke_config()), "nnunet", "cpu", "ts-script", "fp32")
    provenance = {"config": {"transport": spec.spec("offline")["transport"]}}
    table = configuration_table(
        provenance, {"offline": transport_text(offline), "online": transport_text(online)}
    )
    assert "| Transport, offline | HTTP, system shared memory |" in table
    assert "| Transport, online | gRPC, no shared memory |" in table
    assert "| Transport differs | nnunet/cpu/ts-script/fp32" in table
    assert "measured with system shared memory instead |" in table
