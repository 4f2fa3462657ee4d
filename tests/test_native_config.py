"""Native-backend config.pbtxt for every GPU run the config allows, parsed back with Triton's own
ModelConfig protobuf and checked against the seed pages' deployment parameters; every run's config
(CPU and GPU) round-trips through protobuf's text format to the message built; the inputs a native
backend serves are the artifact's; the CPU (python backend) config is unchanged."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from deploybench import jobs
from deploybench.gpu_identity import SERVER_GPUS
from deploybench.io import sha256_of
from deploybench.model_repository import model_config
from deploybench.models import load_family
from deploybench.planning import workflow_config as dbc
from deploybench.planning.serving_plan import container_free, serving
from deploybench.tensors import TensorSpec
from deploybench.triton_client import served_feeds
from deploybench.triton_config import build_model_config, to_pbtxt
from tests.conftest import REPO, base_config, seed_models, smoke_config

SEEDS = REPO.parent / "shared" / "seeds"
pytestmark = pytest.mark.skipif(not SEEDS.exists(), reason=f"{SEEDS} not present")


def _page(prefix: str) -> str:
    (path,) = SEEDS.glob(f"{prefix}_*.txt")
    return path.read_text()


def _one(values: list[str], what: str) -> str:
    assert len(set(values)) == 1, (what, set(values))
    return values[0]


def _table(text: str, name: str) -> str:
    """A "| name | value |" row of the page's parameter tables (one value everywhere)."""
    return _one(
        re.findall(rf"^\|\s*{name}\s*\|\s*([^|]+?)\s*\|", text, re.MULTILINE | re.IGNORECASE), name
    )


def _var(text: str, name: str) -> str:
    return _one(re.findall(rf'{name}="\s*([^"]*?)\s*"', text), name)


def _ints(value: str) -> list[int]:
    return [int(float(v)) for v in value.split()]


def seed_parameters() -> dict[str, dict[str, list[int]]]:
    """max batch, model instances, preferred batch sizes, queue delay (µs) per model entry."""
    params = {}
    for model, prefix in (("nnunet", "000"), ("resnet50", "001"), ("fastpitch", "002")):
        text = _page(prefix)
        params[model] = {
            "max_batch": _ints(_table(text, "Max Batch Size")),
            "instances": _ints(_table(text, "Number of model instances")),
            "preferred": _ints(_table(text, "Triton Preferred Batch Sizes")),
            "delay": _ints(_table(text, "Triton Max Queue Delay")),
        }
    bert = _page("003")
    params["bert"] = {
        "max_batch": _ints(_table(bert, "Max batch size")),
        "instances": _ints(_table(bert, "Number of model instances")),
        "preferred": _ints(_var(bert, "TRITON_PREFERRED_BATCH_SIZES")),
        "delay": _ints(_var(bert, "TRITON_MAX_QUEUE_DELAY")),
    }
    tft = _page("004")  # flattened: one table cell per line
    params["tft"] = params["tft_traffic"] = {
        "max_batch": _ints(
            _one(re.findall(r"^Max batch size\n(\d+)$", tft, re.MULTILINE), "max batch")
        ),
        "instances": _ints(
            _one(re.findall(r"^Number of model instances\n(\d+)$", tft, re.MULTILINE), "n")
        ),
        "preferred": _ints(_var(tft, "TRITON_PREFERRED_BATCH_SIZES")),
        "delay": _ints(_var(tft, "TRITON_MAX_QUEUE_DELAY")),
    }
    return params


PLATFORMS = {
    "trt": "tensorrt_plan",
    "onnx": "onnxruntime_onnx",
    "onnx-trt": "onnxruntime_onnx",
    "ts-trace": "pytorch_libtorch",
    "ts-script": "pytorch_libtorch",
    "tf-savedmodel": "tensorflow_savedmodel",
    "tf-trt": "tensorflow_savedmodel",
}


def all_configs():
    config = base_config()
    for path in dbc.all_runs(config):
        yield dbc.resolve(config, *path.split("/"))


def native_configs():
    for run in all_configs():
        if run.device == "gpu" and not container_free(run.gpu_settings):
            yield run


def built(run) -> model_config_pb2.ModelConfig:
    family = load_family(run.settings["module"], run.settings["hparams"])
    return model_config(
        name=run.model,
        serving=serving(run),
        triton=run.settings["triton"],
        device=run.device,
        inputs=family.inputs,
        outputs=family.outputs,
        artifact_name=run.format_settings["artifact"],
        # onnx-trt builds its engine at load, into a cache beside the repository
        engine_cache=Path("/results", run.path, "trt_engine_cache"),
    )


def parsed(run) -> model_config_pb2.ModelConfig:
    """The run's config.pbtxt as Triton reads it: the text written, parsed back; it is exactly
    the message built."""
    config = built(run)
    text = to_pbtxt(config)
    back = text_format.Parse(text, model_config_pb2.ModelConfig())
    assert back == config, run.path
    return back


def test_every_config_round_trips_through_the_text_format():
    runs = list(all_configs())
    assert {r.device for r in runs} == {"cpu", "gpu"}
    for run in runs:
        config = built(run)
        text = to_pbtxt(config)
        back = text_format.Parse(text, model_config_pb2.ModelConfig())
        assert back == config, run.path
        assert to_pbtxt(back) == text, run.path
        # what the python backend reads on CPU, what a native backend is named by on a GPU
        if run.device == "cpu":
            assert back.backend == "python" and not back.platform, run.path
            assert set(back.parameters) == {"runtime", "artifact", "intra_op_threads"}, run.path
        elif container_free(run.gpu_settings):  # the python backend on the GPU (test_pip_gpu)
            assert back.backend == "python" and not back.platform, run.path
            assert back.parameters["entry"].string_value == run.gpu, run.path
        else:
            assert back.platform == PLATFORMS[run.format] and not back.backend, run.path


def test_every_native_config_element_round_trips():
    """The options no default GPU run sets (CUDA graphs, both accelerator parameters, retyped
    tensors, several preferred batch sizes) survive the text format too."""
    config = build_model_config(
        name="tft",
        platform="tensorrt_plan",
        max_batch_size=1024,
        inputs=[TensorSpec("s_cat__0", "int32", (192, 1)), TensorSpec("x", "float16", (-1, 3))],
        outputs=[TensorSpec("target__0", "float32", (24, 3))],
        instance_count=2,
        instance_kind="KIND_GPU",
        preferred_batch_sizes=[512, 1024],
        max_queue_delay_us=100,
        cuda_graphs=True,
        gpu_accelerators=[
            {"name": "tensorrt", "parameters": {"precision_mode": "FP16", "x": "1"}},
            {"name": "other"},
        ],
    )
    back = text_format.Parse(to_pbtxt(config), model_config_pb2.ModelConfig())
    assert back == config
    assert (
        list(back.input[1].dims) == [-1, 3]
        and back.input[1].data_type == model_config_pb2.TYPE_FP16
    )
    assert list(back.dynamic_batching.preferred_batch_size) == [512, 1024]
    accelerators = back.optimization.execution_accelerators.gpu_execution_accelerator
    assert [a.name for a in accelerators] == ["tensorrt", "other"]


def test_model_config_names_bad_values():
    common = {
        "name": "tft",
        "max_batch_size": 8,
        "outputs": [],
        "instance_count": 1,
        "preferred_batch_sizes": [],
        "max_queue_delay_us": 0,
    }
    good = [TensorSpec("x", "float32", (1,))]
    with pytest.raises(ValueError, match="exactly one of backend"):
        build_model_config(**common, inputs=good, instance_kind="KIND_GPU")
    with pytest.raises(ValueError, match="'KIND_TPU'; valid choices: KIND_CPU, KIND_GPU"):
        build_model_config(**common, inputs=good, instance_kind="KIND_TPU", backend="python")
    with pytest.raises(ValueError, match="dtype 'complex64'.*valid choices: float32"):
        build_model_config(
            **common,
            inputs=[TensorSpec("x", "complex64", (1,))],
            instance_kind="KIND_CPU",
            backend="python",
        )
    # nothing at its default is lost: the dynamic batcher stays on with no preferred sizes
    config = build_model_config(**common, inputs=good, instance_kind="KIND_CPU", backend="python")
    back = text_format.Parse(to_pbtxt(config), model_config_pb2.ModelConfig())
    assert back == config and back.HasField("dynamic_batching")


def test_every_native_config_has_the_seed_pages_parameters():
    seeds = seed_parameters()
    # every model of a seed page has its parameters here; a model added without one has none
    assert set(seeds) == seed_models(base_config())
    runs = [run for run in native_configs() if run.model in seeds]
    assert {r.format for r in runs} == set(PLATFORMS)
    # the seed's --tensorrt-max-workspace-size (8 GiB) sizes its trt conversion; its deploy step
    # gives ONNX Runtime's accelerator none: Model Navigator's default (tests/test_bert_engines.py)
    seed_convert = re.search(r"--tensorrt-max-workspace-size (\d+)", _page("003")).group(1)
    assert int(seed_convert) == 8 * 2**30
    bert_workspace = 4 * 2**30
    for run in runs:
        cfg, seed = parsed(run), seeds[run.model]
        where = run.path
        assert cfg.platform == PLATFORMS[run.format] and not cfg.backend, where
        assert [cfg.max_batch_size] == seed["max_batch"], where
        # pinned to the run's GPU, the one its energy meter reads: unpinned, Triton would place
        # instances on every GPU the server sees (model_configuration.md "Instance Groups")
        assert [(g.count, g.kind, list(g.gpus)) for g in cfg.instance_group] == [
            (
                seed["instances"][0],
                model_config_pb2.ModelInstanceGroup.KIND_GPU,
                list(SERVER_GPUS),
            )
        ], where
        assert list(cfg.dynamic_batching.preferred_batch_size) == seed["preferred"], where
        assert [cfg.dynamic_batching.max_queue_delay_microseconds] == seed["delay"], where
        assert not cfg.parameters, where  # python-backend parameters only on CPU
        # every seed page: "Capture CUDA Graph: Disabled" / --capture-cuda-graph 0; but TFT's
        # trt rows ran with them (DLE passed --tensorrt-capture-cuda-graph; docs/config-reference.md says why;
        # tests/test_published_labels.py)
        tft_trt = run.model in ("tft", "tft_traffic") and run.format == "trt"
        assert cfg.optimization.cuda.graphs == tft_trt, where
        accelerators = cfg.optimization.execution_accelerators.gpu_execution_accelerator
        if run.format == "onnx-trt":  # BERT: "Backend accelerator: NVIDIA TensorRT", FP16
            (accelerator,) = accelerators
            seeds_own = {"precision_mode", "max_workspace_size_bytes"}
            assert accelerator.name == "tensorrt", where
            assert {k: accelerator.parameters[k] for k in seeds_own} == {
                "precision_mode": run.precision.upper(),
                "max_workspace_size_bytes": str(bert_workspace),
            }, where
            # the rest build the engine at load (tests/test_gpu_engines.py)
            assert set(accelerator.parameters) - seeds_own == {
                "trt_engine_cache_enable",
                "trt_engine_cache_path",
                "trt_profile_min_shapes",
                "trt_profile_opt_shapes",
                "trt_profile_max_shapes",
            }, where
            assert [w.batch_size for w in cfg.model_warmup] == [cfg.max_batch_size], where
        elif run.format == "tf-trt":  # ResNet-50: "Backend Accelerator: TensorRT", as Model
            # Navigator v0.1.0 wrote it (tests/test_resnet50_serving.py)
            assert [(a.name, dict(a.parameters)) for a in accelerators] == [
                ("tensorrt", {"precision_mode": run.precision.upper()})
            ], where
            assert not cfg.model_warmup, where
        else:
            assert not accelerators and not cfg.model_warmup, where


def test_bert_onnx_trt_is_the_seeds_accelerator_precision():
    # the page's sections whose backend accelerator is TensorRT: their precisions
    sections = [s for s in _page("003").split("\n#### ")[1:] if "Backend accelerator" in s]
    with_trt = [s for s in sections if "NVIDIA TensorRT" in _table(s, "Backend accelerator")]
    assert len(with_trt) == 4  # A30, V100, A100, T4
    assert {_table(s, "Accelerator Precision") for s in with_trt} == {"FP16"}
    assert {_table(s, "Precision") for s in with_trt} == {"FP16"}
    run = dbc.resolve(base_config(), "bert", "A30", "onnx-trt", "fp16")
    (acc,) = parsed(run).optimization.execution_accelerators.gpu_execution_accelerator
    assert acc.parameters["precision_mode"] == "FP16"
    with pytest.raises(dbc.ConfigError, match="precision 'fp32' is not available"):
        dbc.resolve(base_config(), "bert", "A30", "onnx-trt", "fp32")


def test_cuda_graphs_and_tensor_types_are_opt_in():
    config = base_config()
    config["models"]["tft"]["triton"]["cuda_graphs"] = True
    config["formats"]["trt"]["tensor_types"] = {"int64": "int32"}
    trt = parsed(dbc.resolve(config, "tft", "A30", "trt", "fp16"))
    assert trt.optimization.cuda.graphs
    assert {i.name: i.data_type for i in trt.input}["s_cat__0"] == model_config_pb2.TYPE_INT32
    # only the TensorRT backend recognises CUDA graphs
    onnx = parsed(dbc.resolve(config, "tft", "A30", "onnx", "fp16"))
    assert not onnx.optimization.cuda.graphs
    assert {i.name: i.data_type for i in onnx.input}["s_cat__0"] == model_config_pb2.TYPE_INT64


def test_tensorflow_tensorrt_accelerator_takes_its_own_workspace_only():
    config = base_config()
    config["formats"]["tf-savedmodel"]["accelerator"] = "tensorrt"
    cfg = parsed(dbc.resolve(config, "resnet50", "A30", "tf-savedmodel", "fp32"))
    (acc,) = cfg.optimization.execution_accelerators.gpu_execution_accelerator
    # not the conversion's workspace_mb (4096): Model Navigator v0.1.0 set precision_mode alone
    assert acc.name == "tensorrt" and dict(acc.parameters) == {"precision_mode": "FP32"}
    config["models"]["resnet50"]["convert"]["tf-trt"]["accelerator_workspace_mb"] = 2048
    cfg = parsed(dbc.resolve(config, "resnet50", "A30", "tf-savedmodel", "fp32"))
    (acc,) = cfg.optimization.execution_accelerators.gpu_execution_accelerator
    assert dict(acc.parameters) == {
        "precision_mode": "FP32",
        "max_workspace_size_bytes": str(2048 * 2**20),
    }


CPU_TFT = """\
name: "tft"
backend: "python"
max_batch_size: 64
input [
  { name: "s_cat__0" data_type: TYPE_INT64 dims: [ 192, 1 ] },
  { name: "s_cont__1" data_type: TYPE_FP32 dims: [ 1 ] },
  { name: "k_cat__2" data_type: TYPE_INT64 dims: [ 1 ] },
  { name: "k_cont__3" data_type: TYPE_FP32 dims: [ 192, 3 ] },
  { name: "o_cat__4" data_type: TYPE_INT64 dims: [ 1 ] },
  { name: "o_cont__5" data_type: TYPE_FP32 dims: [ 1 ] },
  { name: "target__6" data_type: TYPE_FP32 dims: [ 192, 1 ] },
  { name: "id__7" data_type: TYPE_INT64 dims: [ 192, 1 ] }
]
output [
  { name: "target__0" data_type: TYPE_FP32 dims: [ 24, 3 ] }
]
instance_group [ { count: 1 kind: KIND_CPU } ]
dynamic_batching {
  preferred_batch_size: [ 32, 64 ]
  max_queue_delay_microseconds: 1
}
parameters { key: "runtime" value: { string_value: "onnxruntime" } }
parameters { key: "artifact" value: { string_value: "model.onnx" } }
parameters { key: "intra_op_threads" value: { string_value: "0" } }
"""


def test_cpu_default_config_is_unchanged():
    run = dbc.resolve(base_config(), "tft", "cpu", "onnx", "fp32")
    assert serving(run) == {"backend": "python", "runtime": "onnxruntime"}
    family = load_family("tft", run.settings["hparams"])
    config = model_config(
        name="tft",
        serving=serving(run),
        triton=run.settings["triton"],
        device="cpu",
        inputs=family.inputs,
        outputs=family.outputs,
        artifact_name="model.onnx",
    )
    text = to_pbtxt(config)
    # CPU_TFT is the text written before config.pbtxt came from protobuf: the same config
    back = text_format.Parse(text, model_config_pb2.ModelConfig())
    assert back == config == text_format.Parse(CPU_TFT, model_config_pb2.ModelConfig())


@pytest.fixture(scope="module")
def tft_onnx(tmp_path_factory):
    from deploybench.export import export_model

    settings = smoke_config()["models"]["tft"]
    family = load_family("tft", settings["hparams"])
    out = tmp_path_factory.mktemp("tft") / "model.onnx"
    tolerance = settings["export"]["tolerance"]
    export_model(family, family.init_state(0), "onnx", "fp32", out, tolerance=tolerance)
    return settings, out


@pytest.mark.parametrize("fmt", ["onnx", "trt"])
def test_native_repository_serves_the_onnx_graphs_inputs(tft_onnx, tmp_path, fmt):
    settings, onnx_path = tft_onnx
    run = dbc.resolve(smoke_config(), "tft", "A30", fmt, "fp16")
    artifact = tmp_path / run.format_settings["artifact"]
    artifact.write_bytes(onnx_path.read_bytes())  # stands in for the engine: only copied
    sidecar = tmp_path / f"{artifact.name}.provenance.json"
    sidecar.write_text(json.dumps({"sha256": sha256_of(artifact)}))
    out = tmp_path / "repository"
    spec = {
        "model": {"module": "tft", "hparams": settings["hparams"]},
        "model_name": "tft",
        "serving": serving(run),
        "triton": run.settings["triton"],
        "device": "gpu",
        "artifact_name": run.format_settings["artifact"],
    }
    jobs.repository(
        spec,
        artifact=str(artifact),
        artifact_provenance=str(sidecar),
        signature=[str(onnx_path)],
        repository=str(out),
    )
    cfg = text_format.Parse(
        (out / "tft" / "config.pbtxt").read_text(), model_config_pb2.ModelConfig()
    )
    served = [i.name for i in cfg.input]
    assert served == ["s_cat__0", "k_cont__3", "target__6"]
    assert cfg.platform == PLATFORMS[fmt]
    assert sorted(p.name for p in (out / "tft" / "1").iterdir()) == [artifact.name]
    # clients send exactly what the served model takes, in its types
    family = load_family("tft", settings["hparams"])
    metadata = [
        {"name": "s_cat__0", "datatype": "INT32"},
        {"name": "k_cont__3", "datatype": "FP32"},
    ]
    feeds = served_feeds(family.example_inputs(2, 0), metadata)
    assert list(feeds) == ["s_cat__0", "k_cont__3"] and feeds["s_cat__0"].dtype == np.int32
