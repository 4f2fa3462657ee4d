"""A GPU entry served without containers (`gpus.<g>.serving: python`, the shipped `H100-pip`).

Its runs are served by Triton's python backend of this venv's tritonserver, running the
TorchScript (or ONNX) artifact on the instance's GPU (KIND_GPU), and every job of the run
runs natively. No GPU here: the configs are built and round-tripped, the device the served
model asks for is read from a stand-in for CUDA, and the chain is dry-run.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import types
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from google.protobuf import text_format
from snakemake.utils import validate
from tritonclient.grpc import model_config_pb2

from deploybench import runtime
from deploybench.model_repository import model_config
from deploybench.models import load_family
from deploybench.planning import run_plan as dbplan
from deploybench.planning import serving_plan as dbserving
from deploybench.planning.workflow_config import deep_merge
from deploybench.report_published import no_published_reason, published_rows, reference_note
from deploybench.triton_config import to_pbtxt
from tests.conftest import REPO, base_config, planned_jobs, run_snakemake, write_config

SCHEMA = REPO / "config" / "schema" / "config.schema.yaml"
GPU = "H100-pip"
STANDIN = REPO / "tests" / "bin"  # the apptainer stand-in (test_containers.py)


def workflow_config(overrides: dict | None = None) -> dict:
    config = deep_merge(base_config(), overrides or {})
    validate(config, str(SCHEMA))
    return config


def pbtxt(path: str) -> model_config_pb2.ModelConfig:
    """The run's config.pbtxt as the repository job writes it, parsed back as Triton reads it."""
    plan = dbplan.plan_run(workflow_config(), *path.split("/"))
    spec = plan.repository_spec()
    family = load_family(spec["model"]["module"], spec["model"]["hparams"])
    built = model_config(
        name=spec["model_name"],
        serving=dict(spec["serving"]),
        triton=spec["triton"],
        device=spec["device"],
        inputs=family.inputs,
        outputs=family.outputs,
        artifact_name=spec["artifact_name"],
    )
    back = text_format.Parse(to_pbtxt(built), model_config_pb2.ModelConfig())
    assert back == built and to_pbtxt(back) == to_pbtxt(built)
    return back


def test_the_entry_is_a_schema_checked_python_served_gpu():
    config = workflow_config()
    entry = config["gpus"][GPU]
    assert entry["device"] == "gpu" and entry["serving"] == "python"
    assert entry["compute_capability"] == config["gpus"]["H100_SXM"]["compute_capability"]
    assert dbserving.container_free(entry)
    assert config["gpus"]["H100_SXM"]["serving"] == "native"  # the schema's default
    assert not dbserving.container_free(config["gpus"]["H100_SXM"])
    bad = base_config()
    bad["gpus"][GPU]["serving"] = "pip"
    with pytest.raises(Exception, match="pip"):
        validate(bad, str(SCHEMA))


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_config_is_the_python_backend_on_kind_gpu(precision):
    config = pbtxt(f"tft/{GPU}/ts-trace/{precision}")
    assert config.backend == "python" and not config.platform
    assert [g.kind for g in config.instance_group] == [model_config_pb2.ModelInstanceGroup.KIND_GPU]
    params = {k: v.string_value for k, v in config.parameters.items()}
    assert params == {
        "runtime": "torchscript",
        "artifact": "model.pt",
        "intra_op_threads": "0",
        "entry": GPU,
    }
    # float tensors as the artifact serves them: fp16 TorchScript's float16, as the native
    # pytorch_libtorch config of the same run on H100_SXM declares them
    native = pbtxt(f"tft/H100_SXM/ts-trace/{precision}")
    assert native.platform == "pytorch_libtorch"
    types_of = lambda c: {t.name: t.data_type for t in [*c.input, *c.output]}
    ours = types_of(config)
    assert {n: t for n, t in ours.items() if n in types_of(native)} == types_of(native)
    floats = {
        t for t in ours.values() if t in (model_config_pb2.TYPE_FP16, model_config_pb2.TYPE_FP32)
    }
    want = model_config_pb2.TYPE_FP16 if precision == "fp16" else model_config_pb2.TYPE_FP32
    assert floats == {want}


def test_plan_needs_no_image_and_serves_every_input():
    plan = dbplan.plan_run(workflow_config(), "tft", GPU, "onnx", "fp32")
    assert plan.serving["backend"] == "python" and plan.serving["runtime"] == "onnxruntime"
    assert plan.info["backend"] == "python" and plan.device == "gpu"
    assert not plan.serves_export_inputs  # the python backend takes every input
    assert plan.gpu_request.gpu == 1 and plan.gpu_request.slurm_partition is None


# --- the served model's device (deploybench/triton_model.py over deploybench/runtime.py)


class FakeModule:
    """Stands in for a loaded TorchScript module: records what it was called with."""

    def __init__(self) -> None:
        self.calls: list[tuple[torch.Tensor, ...]] = []

    def eval(self) -> FakeModule:
        return self

    def __call__(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        self.calls.append(inputs)
        return (inputs[0] * 2,)


@pytest.fixture
def fake_cuda(monkeypatch):
    """CUDA present as far as the runner can tell: `torch.cuda.is_available()` true, and
    `torch.jit.load`'s map_location and each tensor's `.to(device)` recorded (the tensors stay
    on the CPU)."""
    seen: dict[str, list] = {"map_location": [], "to": []}
    module = FakeModule()

    def load(path, map_location=None):
        seen["map_location"].append(map_location)
        return module

    def to(self, device, *args, **kwargs):
        seen["to"].append(str(device))
        return self

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.jit, "load", load)
    monkeypatch.setattr(torch.Tensor, "to", to)
    return seen


def served_model(monkeypatch):
    """deploybench/triton_model.py as the python backend loads it (its utils a stand-in)."""
    utils = types.ModuleType("triton_python_backend_utils")
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", utils)
    path = REPO / "deploybench" / "triton_model.py"
    spec = importlib.util.spec_from_file_location("served_model", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.TritonPythonModel()


def initialize_args(tmp_path: Path, kind: str, device_id: str) -> dict[str, str]:
    config = {
        "input": [{"name": "x"}],
        "output": [{"name": "y"}],
        "instance_group": [{"count": 1, "kind": f"KIND_{kind}"}],
        "parameters": {
            "runtime": {"string_value": "torchscript"},
            "artifact": {"string_value": "model.pt"},
            "intra_op_threads": {"string_value": "1"},
            "entry": {"string_value": GPU},
        },
    }
    # the keys the python backend passes to initialize (python_backend README)
    return {
        "model_config": json.dumps(config),
        "model_instance_kind": kind,
        "model_instance_device_id": device_id,
        "model_repository": str(tmp_path),
        "model_version": "1",
        "model_name": "tft",
    }


@pytest.mark.parametrize(
    ("kind", "device_id", "device"), [("GPU", "1", "cuda:1"), ("CPU", "0", "cpu")]
)
def test_served_model_runs_on_its_instance_device(
    tmp_path, monkeypatch, fake_cuda, kind, device_id, device
):
    model = served_model(monkeypatch)
    model.initialize(initialize_args(tmp_path, kind, device_id))
    assert fake_cuda["map_location"] == [device]
    out = model.runner({"x": np.ones((2, 3), np.float32)})
    assert fake_cuda["to"] == [device]  # each input moved to the instance's device
    assert isinstance(out[0], np.ndarray) and out[0].tolist() == [[2.0] * 3] * 2  # back on the host


def test_instance_device_from_the_backend_args():
    assert runtime.instance_device("GPU", "0") == "cuda:0"
    assert runtime.instance_device("GPU", 3) == "cuda:3"
    assert runtime.instance_device("CPU", "0") == "cpu"


def test_a_gpu_instance_without_cuda_fails_naming_the_entry(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    model = served_model(monkeypatch)
    # the served copy of runtime.py is a module of its own: its CudaMissing, by name
    with pytest.raises(RuntimeError, match=r"gpus\.H100-pip \(serving: python\).*cuda:0") as err:
        model.initialize(initialize_args(tmp_path, "GPU", "0"))
    assert type(err.value).__name__ == "CudaMissing"
    assert "torch.cuda.is_available() is false" in str(err.value)


def test_onnx_on_a_gpu_instance_needs_onnxruntime_gpu(tmp_path, monkeypatch):
    import onnxruntime as ort

    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CPUExecutionProvider"])
    with pytest.raises(runtime.CudaMissing, match="CUDAExecutionProvider.*install onnxruntime-gpu"):
        runtime.load_runner(
            "onnxruntime",
            tmp_path / "model.onnx",
            input_names=[],
            output_names=[],
            device="cuda:0",
            entry=GPU,
        )


# --- the report: never the published configuration


def test_its_rows_are_never_matched_to_published_rows():
    config = workflow_config()
    published = pd.read_csv(REPO / "config" / "reference" / "published.csv")
    for path in (f"tft/{GPU}/ts-trace/fp16", f"tft/{GPU}/ts-trace/fp32"):
        assert published_rows(config, published, path).empty
        assert "not the published configuration" in no_published_reason(config, path)
        assert "not the published configuration" in reference_note(config, published, path)
    # where the seed page measured a GPU, its native run is the one compared with them
    assert not published_rows(config, published, "tft/A30/trt/fp16").empty


# --- the workflow: the chain, with no image, preflight or container


TARGET = f"results/tft/{GPU}/ts-trace/fp16/online.csv"


def test_dry_run_plans_the_chain_without_images_or_preflight(tmp_path):
    config = base_config()
    config["preflight"] = {"required": True}  # a native GPU run would wait for its preflight
    write_config(tmp_path, config)
    result = run_snakemake(tmp_path, "-n", TARGET, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert planned_jobs(result) == {
        "prepare_checkpoint": 1,
        "convert": 1,
        "repository": 1,
        "online": 1,
    }


def test_sdm_apptainer_wraps_none_of_the_runs_jobs(tmp_path):
    """Under --sdm apptainer the run's own jobs take no image (no `.sif` input, the Triton image
    not even built); only the model's checkpoint, shared by every run of the model, runs in
    its framework image."""
    write_config(tmp_path, base_config())
    result = run_snakemake(
        tmp_path, TARGET, "-n", "--sdm", "apptainer", timeout=300, path_first=(STANDIN,)
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout + result.stderr
    assert planned_jobs(result) == {
        "container_image": 1,
        "prepare_checkpoint": 1,
        "convert": 1,
        "repository": 1,
        "online": 1,
    }
    assert "triton-25.01.sif" not in out
    for block in out.split("rule ")[1:]:
        if f"gpu={GPU}" in block.split("Shell command")[0]:
            assert ".sif" not in block.split("output:")[0], block[:400]
