"""Conversions: TensorRT commands and profiles against the seed pages, onnx-fp16 for real,
TorchScript fp16 (on CPU up to the CUDA boundary), TF-TRT parameters, and NeedsGPU here."""

from __future__ import annotations

import inspect
import json
import math
import re
from pathlib import Path

import jsonschema
import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from deploybench import convert as cv
from deploybench import jobs
from deploybench import trt_version as tv
from deploybench.io import MIB
from deploybench.models import load_family
from deploybench.planning import workflow_config as dbc
from deploybench.planning.conversion_plan import conversion_settings
from deploybench.tensors import TensorSpec
from tests.conftest import REPO, base_config, smoke_config

SEEDS = REPO.parent / "shared" / "seeds"
# Seed page of each model with a TensorRT format, and how it gives max batch and workspace.
TRT_SEEDS = {
    "tft": ("004_*.txt", r'MAX_BATCH_SIZE="\s*(\d+)"', r"--max-workspace-size (\d+)"),
    "tft_traffic": ("004_*.txt", r'MAX_BATCH_SIZE="\s*(\d+)"', r"--max-workspace-size (\d+)"),
    "bert": ("003_*.txt", r'MAX_BATCH_SIZE="(\d+)"', r"--tensorrt-max-workspace-size (\d+)"),
    "resnet50": ("001_*.txt", r'MAX_BATCH_SIZE="(\d+)"', r"--max-workspace-size (\d+)"),
}
needs_seeds = pytest.mark.skipif(not SEEDS.exists(), reason=f"{SEEDS} not present")


def seed_value(pattern_file: str, regex: str) -> int:
    (page,) = SEEDS.glob(pattern_file)
    values = set(re.findall(regex, page.read_text()))
    assert len(values) == 1, (page.name, regex, values)
    return int(values.pop())


def trt_runs(config):
    return [
        dbc.resolve(config, *path.split("/"))
        for path in dbc.all_runs(config)
        if path.split("/")[2] == "trt"
    ]


@needs_seeds
def test_every_trt_run_has_the_seed_pages_profile_and_workspace():
    config = base_config()
    runs = trt_runs(config)
    assert {r.model for r in runs} == set(TRT_SEEDS)
    for run in runs:
        page, batch_re, workspace_re = TRT_SEEDS[run.model]
        max_batch = seed_value(page, batch_re)
        settings = conversion_settings(run)
        family = load_family(run.settings["module"], run.settings["hparams"])
        profile = cv.tensorrt_profile(family.inputs, settings)
        cmd = cv.tensorrt_command(
            onnx=Path("m.onnx"),
            plan=Path("m.plan"),
            precision=run.precision,
            profile=profile,
            workspace_mb=settings["workspace_mb"],
        )
        # min batch 1 (Triton sends any batch up to the max), opt = max = the seed's max batch
        for spec in family.inputs:
            assert profile[spec.name] == {
                "min": (1, *spec.shape),
                "opt": (max_batch, *spec.shape),
                "max": (max_batch, *spec.shape),
            }, (run.path, spec.name)
        assert cmd[3] == "--minShapes=" + ",".join(
            f"{s.name}:{'x'.join(map(str, (1, *s.shape)))}" for s in family.inputs
        )
        assert cmd[5] == "--maxShapes=" + ",".join(
            f"{s.name}:{'x'.join(map(str, (max_batch, *s.shape)))}" for s in family.inputs
        )
        # the seed's workspace in bytes, as MiB (rounded up)
        workspace = math.ceil(seed_value(page, workspace_re) / MIB)
        assert f"--memPoolSize=workspace:{workspace}M" in cmd
        assert ("--fp16" in cmd) == (run.precision == "fp16")


@needs_seeds
def test_bert_profile_is_sequence_length_384_at_batch_16():
    run = dbc.resolve(base_config(), "bert", "A30", "trt", "fp16")
    family = load_family("bert", run.settings["hparams"])
    profile = cv.tensorrt_profile(family.inputs, conversion_settings(run))
    (page,) = SEEDS.glob("003_*.txt")
    seq = int(re.search(r'MAX_SEQ_LENGTH="(\d+)"', page.read_text()).group(1))
    assert list(profile) == ["input__0", "input__1", "input__2"]
    assert {p["max"] for p in profile.values()} == {(16, seq)}
    assert {p["opt"] for p in profile.values()} == {(16, seq)}


def test_old_tensorrt_gets_its_own_flags():
    profile = {"x": {"min": (1, 3), "opt": (8, 3), "max": (8, 3)}}
    common = {"onnx": Path("m.onnx"), "plan": Path("m.plan"), "precision": "fp32"}
    trt85 = cv.tensorrt_command(**common, profile=profile, workspace_mb=512, trt_version=(8, 5))
    assert "--memPoolSize=workspace:512M" in trt85 and "--skipInference" in trt85
    trt80 = cv.tensorrt_command(**common, profile=profile, workspace_mb=512, trt_version=(8, 0))
    assert "--workspace=512" in trt80 and "--buildOnly" in trt80
    assert "--explicitBatch" not in trt80 and "--fp16" not in trt80
    trt72 = cv.tensorrt_command(**common, profile=profile, workspace_mb=512, trt_version=(7, 2))
    assert "--explicitBatch" in trt72
    assert tv.parse_trt_version("&&&& RUNNING TensorRT.trtexec [TensorRT v8501] # trtexec") == (
        8,
        5,
    )
    assert tv.parse_trt_version("[TensorRT v100700] # trtexec --help") == (10, 7)
    assert tv.parse_trt_version("no banner") is None


def test_dynamic_dimensions_take_configured_shapes():
    inputs = [TensorSpec("tokens", "int32", (-1,)), TensorSpec("mask", "int32", (4,))]
    settings = {
        "min_batch": 1,
        "opt_batch": 8,
        "max_batch": 16,
        "shapes": {"tokens": {"min": [1], "opt": [128], "max": [384]}},
    }
    profile = cv.tensorrt_profile(inputs, settings)
    assert profile["tokens"] == {"min": (1, 1), "opt": (8, 128), "max": (16, 384)}
    assert profile["mask"] == {"min": (1, 4), "opt": (8, 4), "max": (16, 4)}
    with pytest.raises(dbc.ConfigError, match=r"dynamic dimensions \[-1\]: set"):
        cv.tensorrt_profile(inputs, {**settings, "shapes": {}})
    with pytest.raises(dbc.ConfigError, match=r"unknown input\(s\) \['token'\]; valid choices"):
        cv.tensorrt_profile(inputs, {**settings, "shapes": {"token": settings["shapes"]["tokens"]}})
    with pytest.raises(dbc.ConfigError, match=r"mask.min \[5\] does not fit"):
        mask = {"min": [5], "opt": [4], "max": [4]}
        cv.tensorrt_profile(inputs, {**settings, "shapes": {**settings["shapes"], "mask": mask}})


def _with(config, model, convert):
    config["models"][model]["convert"] = convert
    return config


@pytest.mark.parametrize(
    ("convert", "message"),
    [
        ({}, r"models.tft.convert.tensorrt.workspace_mb is not set; format 'trt' at fp16"),
        (
            {"tensorrt": {"workspace_mb": 64, "opt_batch": 2048}},
            r"1 <= min_batch <= opt_batch <= max_batch; got min_batch 1, opt_batch 2048",
        ),
        (
            {"tensorrt": {"workspace_mb": 64, "max_batch": 512}},
            r"batches 1..512 do not cover the batches 1..1024 Triton sends",
        ),
    ],
)
def test_bad_conversion_settings_fail_naming_the_value(convert, message):
    run = dbc.resolve(_with(base_config(), "tft", convert), "tft", "A30", "trt", "fp16")
    with pytest.raises(dbc.ConfigError, match=message):
        conversion_settings(run)


def test_schema_rejects_unknown_conversion_keys():
    schema = dbc.load_yaml(REPO / "config" / "schema" / "config.schema.yaml")
    config = _with(base_config(), "tft", {"tensorrt": {"workspace_mb": 64, "workspace": 1}})
    with pytest.raises(jsonschema.ValidationError, match="'workspace' was unexpected"):
        jsonschema.validate(config, schema)
    config = _with(base_config(), "tft", {"tensorrt": {"workspace_mb": 0}})
    with pytest.raises(jsonschema.ValidationError, match="0 is less than the minimum of 1"):
        jsonschema.validate(config, schema)


# ---------------------------------------------------------------- real exports (smoke sizes)


@pytest.fixture(scope="module")
def tft_onnx(tmp_path_factory):
    """TFT's real ONNX export at smoke size (it keeps 3 of the 8 inputs: s_cat, k_cont, target)."""
    from deploybench.export import export_model

    settings = smoke_config()["models"]["tft"]
    family = load_family("tft", settings["hparams"])
    out = tmp_path_factory.mktemp("tft") / "model.onnx"
    export_model(
        family, family.init_state(0), "onnx", "fp32", out, tolerance=settings["export"]["tolerance"]
    )
    return family, out


def test_artifact_inputs_are_the_onnx_graphs(tft_onnx):
    family, path = tft_onnx
    assert [s.name for s in cv.artifact_inputs(family.inputs, path)] == [
        "s_cat__0",
        "k_cont__3",
        "target__6",
    ]
    renamed = [TensorSpec("x" + s.name, s.dtype, s.shape) for s in family.inputs]
    with pytest.raises(ValueError, match="takes input 's_cat__0', which the model does not"):
        cv.artifact_inputs(renamed, path)


def test_tensorrt_here_needs_a_gpu_and_names_the_command(tft_onnx, tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    family, path = tft_onnx
    settings = {"min_batch": 1, "opt_batch": 8, "max_batch": 8, "workspace_mb": 256}
    with pytest.raises(cv.NeedsGPU, match="needs a GPU node") as error:
        cv.convert(
            "tensorrt",
            source=path,
            out=tmp_path / "model.plan",
            precision="fp16",
            settings=settings,
            inputs=family.inputs,
            example_inputs=lambda b: family.example_inputs(b, 0),
        )
    # only the inputs the ONNX graph takes reach trtexec
    assert "--minShapes=s_cat__0:1x48x1,k_cont__3:1x48x3,target__6:1x48x1 " in str(error.value)
    assert not (tmp_path / "model.plan").exists()


def test_onnx_fp16_keeps_float32_io_and_runs(tft_onnx, tmp_path):
    family, path = tft_onnx
    out = tmp_path / "model.onnx"
    model = {"module": "tft", "hparams": smoke_config()["models"]["tft"]["hparams"]}
    spec = {
        "model": model,
        "converter": "onnx-fp16",
        "precision": "fp16",
        "settings": {"op_block_list": []},
        "export_format": "onnx",
        "device": "cpu",
    }
    jobs.convert(
        spec,
        source=str(path),
        artifact=str(out),
        provenance=str(tmp_path / "model.onnx.provenance.json"),
    )
    converted = onnx.load(str(out))
    floats = {onnx.TensorProto.FLOAT: "float32", onnx.TensorProto.FLOAT16: "float16"}
    io_types = {
        v.type.tensor_type.elem_type for v in [*converted.graph.input, *converted.graph.output]
    }
    assert onnx.TensorProto.FLOAT16 not in io_types  # fp32 in and out
    weights = [floats.get(w.data_type) for w in converted.graph.initializer]
    assert weights.count("float16") > 0 and weights.count("float32") == 0
    feeds = family.example_inputs(4, 1)
    results = []
    for p in (path, out):
        session = ort.InferenceSession(str(p), providers=["CPUExecutionProvider"])
        results.append(session.run(None, {i.name: feeds[i.name] for i in session.get_inputs()})[0])
    fp32, fp16 = results
    assert fp16.dtype == np.float32 and fp16.shape == fp32.shape
    err = np.abs(fp16 - fp32)
    assert 0 < float(np.median(err)) < 0.05 * float(np.abs(fp32).max())
    record = json.loads((tmp_path / "model.onnx.provenance.json").read_text())["conversion"]
    assert record["converter"] == "onnx-fp16" and record["parameters"]["keep_io_types"] is True
    assert record["versions"]["onnxconverter-common"]


class _Tiny(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(6, 3)

    def forward(self, x: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.linear(x), ids + 1


@pytest.mark.parametrize("script", [False, True], ids=["traced", "scripted"])
def test_torchscript_fp16_is_the_halved_module_with_float16_io(tmp_path, script):
    """As DLE's exports: model.half() before tracing or scripting; float tensors in and out are
    float16, integer ones keep their type."""
    torch.manual_seed(0)
    module = _Tiny().eval()
    feeds = {"x__0": np.random.default_rng(0).normal(size=(2, 6)).astype(np.float32)}
    feeds["ids__1"] = np.arange(2, dtype=np.int64)
    with torch.no_grad():
        reference, _ = module(*(torch.from_numpy(a) for a in feeds.values()))
    out = tmp_path / "half.pt"
    # the CUDA step stops at the boundary: the same code on the CPU (torch has fp16 CPU kernels)
    cv.torchscript_fp16(module, out, feeds, script=script, device="cpu")
    served = torch.jit.load(str(out))
    assert {p.dtype for p in served.parameters()} == {torch.float16}
    assert isinstance(served, torch.jit.ScriptModule)
    x, ids = (torch.from_numpy(a) for a in feeds.values())
    y, ids_out = served(x.half(), ids)
    assert y.dtype == torch.float16 and ids_out.dtype == torch.int64
    assert torch.allclose(y.float(), reference, atol=1e-2) and not torch.equal(y.float(), reference)
    assert cv.SERVED_TYPES["torchscript-fp16"] == {"float32": "float16"}


def test_gpu_only_converters_need_a_gpu_here(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    for converter, settings in [
        ("torchscript-fp16", {}),
        (
            "tf-trt",
            {
                "workspace_mb": 4096,
                "minimum_segment_size": 3,
                "maximum_cached_engines": 1,
                "max_batch": 8,
            },
        ),
    ]:
        with pytest.raises(cv.NeedsGPU, match=f"conversion '{converter}' to fp16 needs a GPU node"):
            cv.convert(
                converter,
                source=tmp_path / "missing",
                out=tmp_path / "out",
                precision="fp16",
                settings=settings,
                inputs=[],
                example_inputs=lambda b: {},
                export_format="ts-trace",
                framework_module=lambda: pytest.fail("loaded the module before checking the GPU"),
            )
        assert not (tmp_path / "out").exists()


@needs_seeds
def test_tf_trt_parameters_are_the_converters_and_the_seeds():
    tf = pytest.importorskip("tensorflow")
    run = dbc.resolve(base_config(), "resnet50", "A30", "tf-trt", "fp16")
    settings = conversion_settings(run)
    params = cv.tf_trt_parameters(run.precision, settings)
    # every keyword is one the installed TF-TRT converter takes
    inspect.signature(tf.experimental.tensorrt.Converter).bind(input_saved_model_dir="m", **params)
    assert params["precision_mode"] == "FP16"
    assert params["max_workspace_size_bytes"] == seed_value(
        "001_*.txt", r"--max-workspace-size (\d+)"
    )
    assert settings["max_batch"] == seed_value("001_*.txt", r'MAX_BATCH_SIZE="(\d+)"')
