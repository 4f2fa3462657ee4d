"""TorchScript that runs where it is served, and fp16 TorchScript made as DLE made it (issue 27,
items 1 and 2), checked on CPU at the smoke sizing.

1. A trace records the device a tensor was made on as a constant (``torch.arange(...,
   device=x.device)``, ``mask.to(device=...)``): a ``ts-trace`` exported on the CPU then makes
   CPU tensors inside a GPU instance. No TorchScript artifact of any model holds a device
   constant.
2. fp16 TorchScript is the framework module halved (``model.half()``) before it is traced or
   scripted, float tensors in and out in float16, as DLE's ``triton/model.py`` exports did; every
   model's artifact is made and run here, within the model's fp16 tolerance.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from tritonclient.grpc import model_config_pb2

from deploybench.accuracy import compare_outputs
from deploybench.convert import SERVED_TYPES, torchscript_fp16
from deploybench.export import prepare_model
from deploybench.models import load_family
from deploybench.planning import run_plan as dbplan
from tests.conftest import (
    base_config,
    planned_jobs,
    run_snakemake,
    smoke_config,
    validated,
    write_config,
)
from tests.test_pip_gpu import pbtxt

DEVICE_CONSTANT = re.compile(r"Device = prim::Constant|prim::Constant\[value=\"(cpu|cuda)")


def _torchscript_runs(config: dict[str, Any]) -> list[tuple[str, str]]:
    """(model, TorchScript format) of every configured model (one model block per module)."""
    seen, runs = set(), []
    for name, model in config["models"].items():
        for fmt in model["formats"]:
            if fmt.startswith("ts-") and model["module"] not in seen:
                seen.add(model["module"])
                runs.append((name, fmt))
    return runs


SMOKE = validated(smoke_config())
RUNS = _torchscript_runs(SMOKE)


@pytest.fixture(scope="module", params=RUNS, ids=[f"{m}-{f}" for m, f in RUNS])
def made(request, tmp_path_factory) -> dict[str, Any]:
    """The model's checkpoint, serving module and fp32 export, as the workflow's jobs make them
    at the smoke sizing."""
    model, fmt = request.param
    tmp = tmp_path_factory.mktemp(model)
    plan = dbplan.plan_run(SMOKE, model, "cpu", fmt, "fp32")
    prepared = prepare_model(plan.export.model.identity, tmp / plan.export.model.checkpoint_file)
    export = tmp / plan.export.artifact
    prepared.export(plan.export.spec(), export)
    return {
        "model": model,
        "format": fmt,
        "family": prepared.family,
        "checkpoint": prepared.checkpoint,
        "export": export,
        "plan": plan,
        "tmp": tmp,
    }


def _device_constants(path: Path) -> list[str]:
    graph = str(torch.jit.load(str(path), map_location="cpu").inlined_graph)
    return [line.strip() for line in graph.splitlines() if DEVICE_CONSTANT.search(line)]


def test_no_torchscript_export_holds_a_device_constant(made):
    assert _device_constants(made["export"]) == []


def test_fp16_torchscript_is_made_and_runs_within_the_fp16_tolerance(made):
    family, fmt = made["family"], made["format"]
    out = made["tmp"] / "model.fp16.pt"
    gpu = next(
        g
        for g, s in SMOKE["gpus"].items()
        if s.get("device") == "gpu" and fmt in s["formats"] and "fp16" in s["precisions"]
    )
    plan16 = dbplan.plan_run(SMOKE, made["model"], gpu, fmt, "fp16")
    assert plan16.conversion is not None and plan16.converts_from_checkpoint
    accuracy = plan16.accuracy
    feeds = family.example_inputs(int(accuracy["batch_size"]), int(accuracy["seed"]))
    reference = family.framework_outputs(family.serving_module(made["checkpoint"]), feeds)

    module = family.serving_module(made["checkpoint"])  # halved in place by the conversion
    torchscript_fp16(
        module, out, family.example_inputs(1, 0), script=fmt == "ts-script", device="cpu"
    )
    assert _device_constants(out) == []
    served = torch.jit.load(str(out))
    assert {p.dtype for p in served.parameters()} == {torch.float16}

    # the inputs as a client sends them to the served signature (float16 for float32)
    io = SERVED_TYPES["torchscript-fp16"]
    sent = [torch.from_numpy(a.astype(io.get(str(a.dtype), a.dtype))) for a in feeds.values()]
    with torch.no_grad():
        result = served(*sent)
    results = result if isinstance(result, tuple) else (result,)
    actual = {s.name: r.numpy() for s, r in zip(family.outputs, results, strict=False)}
    for spec in family.outputs:
        if spec.name in actual and spec.dtype == "float32":
            assert actual[spec.name].dtype == np.float16, spec.name
    tolerance = {k: dict(v) for k, v in accuracy["tolerance"].items() if k in actual}
    rows = compare_outputs(
        {k: v for k, v in reference.items() if k in actual},
        actual,
        tolerance,
        len(next(iter(feeds.values()))),
        family,
    )
    assert all(r["passed"] for r in rows), rows


def test_fp16_torchscript_serves_float16_where_the_model_has_float32():
    """The generated config of bert/A30/ts-trace/fp16: int32 ids in, float16 logits out (DLE's
    BERT export: model.half(), int32 inputs)."""
    config = validated(base_config())
    run = dbplan.plan_run(config, "bert", "A30", "ts-trace", "fp16")
    assert run.spec("repository")["serving"]["tensor_types"] == {"float32": "float16"}
    parsed = pbtxt("bert/A30/ts-trace/fp16")  # as the repository job writes it, parsed back
    types = {t.name: model_config_pb2.DataType.Name(t.data_type) for t in parsed.input}
    types |= {t.name: model_config_pb2.DataType.Name(t.data_type) for t in parsed.output}
    assert types == {
        "input__0": "TYPE_INT32",
        "input__1": "TYPE_INT32",
        "input__2": "TYPE_INT32",
        "output__0": "TYPE_FP16",
        "output__1": "TYPE_FP16",
    }
    # the fp32 run keeps the model's types, and an fp16 run made by another converter too
    fp32 = dbplan.plan_run(config, "bert", "A30", "ts-trace", "fp32").spec("repository")
    assert fp32["serving"]["tensor_types"] == {}
    onnx16 = dbplan.plan_run(config, "tft", "A30", "onnx", "fp16").spec("repository")
    assert onnx16["serving"]["tensor_types"] == {}  # onnx-fp16: float32 I/O
    # BERT's fp16 onnx serves its fp16 export (the halved module exported): float16 logits
    bert16 = dbplan.plan_run(config, "bert", "A30", "onnx", "fp16").spec("repository")
    assert bert16["serving"]["tensor_types"] == {"float32": "float16"}


def test_dry_run_converts_fp16_torchscript_from_the_checkpoint(tmp_path: Path):
    """The fp16 TorchScript is made from the checkpoint (halved, then traced): its run needs no
    fp32 TorchScript export."""
    write_config(tmp_path, base_config())
    target = "results/bert/A30/ts-trace/fp16/online.csv"
    result = run_snakemake(tmp_path, "-n", target, timeout=180)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-3000:]
    jobs = planned_jobs(result)
    assert jobs.get("convert") == 1 and "export" not in jobs, jobs
    assert "results/bert/checkpoint/" in out.split("rule convert:", 1)[1].split("rule ", 1)[0]


class _Stop(Exception):
    pass


@pytest.mark.parametrize(("gpu", "device"), [("A30", "cuda"), ("cpu", "cpu")])
def test_accuracy_reference_is_computed_on_the_runs_device(monkeypatch, tmp_path, gpu, device):
    """As DLE's run_inference_on_fw.py, the framework reference of a GPU run is computed on the
    GPU: its float32 (cuDNN's TF32 convolutions) moved FastPitch's durations from the CPU's on an
    H100 (benchmarks/gpu/results/2026-11-26-H100_SXM)."""
    from deploybench import jobs
    from deploybench.jobs import measure as measure_jobs

    config = validated(smoke_config())
    spec = dbplan.plan_run(config, "tft", gpu, "ts-trace", "fp32").spec("accuracy")
    family = load_family(spec["model"]["module"], spec["model"]["hparams"])
    asked: list[str] = []

    def framework_outputs(module: Any, feeds: Any, device: str = "cpu") -> Any:
        asked.append(device)
        raise _Stop

    monkeypatch.setattr(family, "framework_outputs", framework_outputs)
    monkeypatch.setattr(measure_jobs, "load_family", lambda *a: family)
    monkeypatch.setattr("deploybench.checkpoint.read_workflow_checkpoint", lambda *a: None)
    monkeypatch.setattr(family, "serving_module", lambda checkpoint: None)
    with pytest.raises(_Stop):
        jobs.accuracy(
            spec,
            repository=str(tmp_path / "repository"),
            checkpoint=str(tmp_path / "checkpoint.pt"),
            csv=str(tmp_path / "accuracy.csv"),
            task_csv=str(tmp_path / "task.csv"),
            provenance=str(tmp_path / "accuracy.csv.provenance.json"),
            server_log=str(tmp_path / "server.log"),
        )
    assert asked == [device]
