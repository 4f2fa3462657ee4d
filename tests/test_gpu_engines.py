"""Engines built for a GPU, checked up to what a CPU can run (issue 26, parts 2 and 3).

onnx-trt: ONNX Runtime's TensorRT accelerator builds its engine while the model loads (explicit
profile, engine cache beside the repository, a ``model_warmup`` sample), so the generated
config carries those fields and a real CPU tritonserver runs a warm-up before it is ready.
tf-trt: a conversion is counted (TRTEngineOp nodes, engines built) and fails when TensorRT took
nothing; TensorRT cannot run here, so its nodes and engine assets are written by hand.
"""

from __future__ import annotations

import fcntl
import json
import shutil
import textwrap
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from deploybench import convert as cv
from deploybench import model_repository as repo_mod
from deploybench.errors import ConversionError, ServerError
from deploybench.models import load_family
from deploybench.planning import run_plan as dbplan
from deploybench.planning import serving_plan as dbserving
from deploybench.planning import workflow_config as dbc
from deploybench.report import configuration_table
from deploybench.tensors import TensorSpec
from deploybench.triton_config import build_model_config, read_config, to_pbtxt, warmup_sample
from tests.conftest import base_config
from tests.test_plan import step_specs, workflow_config

ONNX_TRT = ("bert", "A30", "onnx-trt", "fp16")


# ---------------------------------------------------------------------------- onnx-trt config


def bert_onnx_trt_config(engine_cache: Path | None) -> model_config_pb2.ModelConfig:
    run = dbc.resolve(base_config(), *ONNX_TRT)
    family = load_family(run.settings["module"], run.settings["hparams"])
    return repo_mod.model_config(
        name="bert",
        serving=dbserving.serving(run),
        triton=run.settings["triton"],
        device=run.device,
        inputs=family.inputs,
        outputs=family.outputs,
        artifact_name="model.onnx",
        engine_cache=engine_cache,
    )


def test_onnx_trt_config_caches_and_warms_its_engine(tmp_path):
    cache = repo_mod.engine_cache_dir(tmp_path / "results/bert/A30/onnx-trt/fp16/repository")
    assert cache == (tmp_path / "results/bert/A30/onnx-trt/fp16/trt_engine_cache").resolve()
    assert cache.is_absolute()
    config = bert_onnx_trt_config(cache)
    # what Triton reads: the text written, parsed back by model_config.proto, is the message
    back = text_format.Parse(to_pbtxt(config), model_config_pb2.ModelConfig())
    assert back == config
    (accelerator,) = back.optimization.execution_accelerators.gpu_execution_accelerator
    shapes = ",".join(f"input__{i}:{{}}x384" for i in range(3))
    assert accelerator.name == "tensorrt"
    assert dict(accelerator.parameters) == {
        "precision_mode": "FP16",
        # DLE's deploy step set none: Model Navigator's default, 4 GiB (tests/test_bert_engines.py)
        "max_workspace_size_bytes": str(4096 * 2**20),
        "trt_engine_cache_enable": "true",
        "trt_engine_cache_path": str(cache),
        # one profile over every batch Triton sends (1..max_batch_size 16), opt = opt_batch 16
        "trt_profile_min_shapes": shapes.format(1, 1, 1),
        "trt_profile_opt_shapes": shapes.format(16, 16, 16),
        "trt_profile_max_shapes": shapes.format(16, 16, 16),
    }
    (warmup,) = back.model_warmup
    assert (warmup.batch_size, warmup.count) == (back.max_batch_size, 1) == (16, 1)
    assert set(warmup.inputs) == {i.name for i in back.input}
    for served in back.input:
        sample = warmup.inputs[served.name]
        assert (sample.data_type, list(sample.dims)) == (served.data_type, list(served.dims))
        assert sample.WhichOneof("input_data_type") == "zero_data"
    # no cache directory, no engine build: the repository job always gives one
    with pytest.raises(ValueError, match="engine cache"):
        bert_onnx_trt_config(None)


def test_engine_profile_follows_the_served_batches():
    """A search candidate's repository serves other batches: its profile and warm-up follow."""
    run = dbc.resolve(base_config(), *ONNX_TRT)
    accelerators, (warmup,) = repo_mod.tensorrt_engine_build(
        [{"name": "tensorrt", "parameters": {"precision_mode": "FP16"}}],
        {"opt_batch": 16, "shapes": {"x": {"min": [8], "opt": [32], "max": [64]}}},
        [TensorSpec("x", "float32", (-1,)), TensorSpec("m", "int64", (2,))],
        4,
        Path("/cache"),
    )
    params = accelerators[0]["parameters"]
    assert params["precision_mode"] == "FP16"  # the accelerator's own parameters stay
    assert params["trt_profile_min_shapes"] == "x:1x8,m:1x2"
    assert params["trt_profile_opt_shapes"] == "x:4x32,m:4x2"  # opt_batch capped at 4
    assert params["trt_profile_max_shapes"] == "x:4x64,m:4x2"
    # the warm-up runs the profile's largest shapes (a dynamic dimension at its max)
    assert warmup.batch_size == 4 and list(warmup.inputs["x"].dims) == [64]
    assert run.settings["convert"]["tensorrt"]["opt_batch"] == 16


def test_runs_without_an_engine_build_are_unchanged():
    config = base_config()
    for path in (("tft", "cpu", "onnx", "fp32"), ("bert", "A30", "onnx", "fp16")):
        how = dbserving.serving(dbc.resolve(config, *path))
        assert "engine_build" not in how, path
    run = dbc.resolve(config, "tft", "cpu", "onnx", "fp32")
    family = load_family("tft", run.settings["hparams"])
    cpu = repo_mod.model_config(
        name="tft",
        serving=dbserving.serving(run),
        triton=run.settings["triton"],
        device="cpu",
        inputs=family.inputs,
        outputs=family.outputs,
        artifact_name="model.onnx",
    )
    assert not cpu.model_warmup and not cpu.optimization.execution_accelerators.ListFields()


def test_server_waits_for_the_build_only_in_runs_that_build():
    config = workflow_config()
    build_s = config["server"]["engine_build_timeout_s"]
    trt = dbplan.plan_run(config, *ONNX_TRT).server
    # engines: per_batch: the shared engine and one per offline batch size (1, 8, 16) built
    assert trt == {
        "startup_timeout_s": config["server"]["startup_timeout_s"] + 4 * build_s,
        "shutdown_timeout_s": config["server"]["shutdown_timeout_s"],
        "client_timeout_s": build_s,
    }
    plain = dbplan.plan_run(config, "bert", "A30", "onnx", "fp16").server
    assert plain == {"startup_timeout_s": 120, "shutdown_timeout_s": 30}  # as before
    # the allowance reaches the server-starting jobs of onnx-trt runs, nothing else
    longer = workflow_config({"server": {"engine_build_timeout_s": 3600}})
    for path, changed in (
        ("/".join(ONNX_TRT), {"accuracy", "offline", "online"}),
        ("bert/A30/onnx/fp16", set()),
        ("tft/cpu/onnx/fp32", set()),
    ):
        before, after = step_specs(config, path), step_specs(longer, path)
        assert {step for step in before if before[step] != after[step]} == changed, path


def test_repository_job_writes_and_empties_the_runs_engine_cache(tmp_path, monkeypatch):
    """jobs.repository on an onnx-trt run (TFT, its small ONNX graph): the profile and warm-up
    take the graph's inputs, the cache is results/<run>/trt_engine_cache, emptied."""
    from deploybench import jobs
    from deploybench.export import export_model
    from deploybench.io import sha256_of
    from tests.conftest import smoke_config

    config = smoke_config()
    config["models"]["tft"]["formats"]["onnx-trt"] = ["fp16"]
    config["models"]["tft"].setdefault("convert", {})["tensorrt"] = {"workspace_mb": 1024}
    run = dbc.resolve(config, "tft", "A30", "onnx-trt", "fp16")
    family = load_family("tft", run.settings["hparams"])
    onnx = tmp_path / "export" / "model.onnx"
    tolerance = run.settings["export"]["tolerance"]
    export_model(family, family.init_state(0), "onnx", "fp32", onnx, tolerance=tolerance)
    (tmp_path / "export" / "model.onnx.provenance.json").write_text(
        json.dumps({"sha256": sha256_of(onnx)})
    )
    monkeypatch.chdir(tmp_path)  # the workflow's working directory
    run_dir = Path("results/tft/A30/onnx-trt/fp16")
    stale = run_dir / "trt_engine_cache" / "old_sm80.engine"
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"built from the artifact served before")
    jobs.repository(
        {
            "model": {"module": "tft", "hparams": run.settings["hparams"]},
            "model_name": "tft",
            "serving": dbserving.serving(run),
            "triton": run.settings["triton"],
            "device": "gpu",
            "artifact_name": "model.onnx",
        },
        artifact=str(onnx),
        artifact_provenance=str(onnx) + ".provenance.json",
        signature=[str(onnx)],
        repository=str(run_dir / "repository"),
    )
    cfg = read_config(run_dir / "repository" / "tft" / "config.pbtxt")
    (accelerator,) = cfg.optimization.execution_accelerators.gpu_execution_accelerator
    cache = (tmp_path / run_dir / "trt_engine_cache").resolve()
    assert accelerator.parameters["trt_engine_cache_path"] == str(cache)
    assert cache.is_dir() and not any(cache.iterdir())  # the stale engine is gone
    top = cfg.max_batch_size
    graph = cv.onnx_inputs(onnx)
    assert [name for name, _, _ in graph] == ["s_cat__0", "k_cont__3", "target__6"]
    assert accelerator.parameters["trt_profile_max_shapes"] == ",".join(
        f"{name}:{'x'.join(map(str, (top, *shape)))}" for name, _, shape in graph
    )
    (warmup,) = cfg.model_warmup
    assert sorted(warmup.inputs) == sorted(i.name for i in cfg.input)  # the graph's 3 inputs
    assert warmup.batch_size == top


def write_config(repository: Path, cache: Path) -> None:
    model = repository / "m"
    model.mkdir(parents=True)
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
        gpu_accelerators=[
            {"name": "tensorrt", "parameters": {repo_mod.ENGINE_CACHE_PATH: str(cache)}}
        ],
    )
    (model / "config.pbtxt").write_text(to_pbtxt(config))


def test_engine_cache_is_made_held_while_loading_and_reset(tmp_path):
    cache = tmp_path / "run" / "trt_engine_cache"
    write_config(tmp_path / "repository", cache)
    assert repo_mod.engine_caches(tmp_path / "repository") == [cache]
    assert repo_mod.engine_caches(tmp_path / "elsewhere") == []
    with repo_mod.engine_build_lock(tmp_path / "repository") as held:
        assert held == [cache] and cache.is_dir()  # made by the job that starts the server
        # another job's server waits
        with (
            (cache / repo_mod.ENGINE_CACHE_LOCK).open("a") as other,
            pytest.raises(BlockingIOError),
        ):
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        (cache / "bert_sm80.engine").write_bytes(b"engine")
    with (cache / repo_mod.ENGINE_CACHE_LOCK).open("a") as other:  # free once it is loaded
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
    assert (cache / "bert_sm80.engine").exists()  # kept for the run's next server
    repo_mod.reset_engine_cache(cache)  # a rebuilt repository: the old engine goes
    assert cache.is_dir() and not any(cache.iterdir())


# ---------------------------------------------------------------------------- warm-up on CPU

COUNTING_MODEL = textwrap.dedent(
    """
    import json
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def initialize(self, args):
            params = json.loads(args["model_config"])["parameters"]
            self.record = params["record"]["string_value"]
            self.fail = params["fail"]["string_value"] == "yes"

        def execute(self, requests):
            xs = [pb_utils.get_input_tensor_by_name(r, "x").as_numpy() for r in requests]
            with open(self.record, "a") as out:
                shapes = sorted({tuple(x.shape) for x in xs})
                out.write(json.dumps({"requests": len(xs), "shapes": shapes,
                                      "sum": float(sum(x.sum() for x in xs))}) + "\\n")
            if self.fail:  # an engine that cannot run
                error = pb_utils.TritonError("no engine for this shape")
                return [pb_utils.InferenceResponse(error=error) for _ in requests]
            return [pb_utils.InferenceResponse([pb_utils.Tensor("y", x)]) for x in xs]
    """
)


def counting_repository(root: Path, fail: bool) -> Path:
    """A python-backend model that records every execute call, with a warm-up of two runs at
    batch 8 (as build_model_config and to_pbtxt write it)."""
    spec = TensorSpec("x", "float32", (3,))
    config = build_model_config(
        name="counting",
        max_batch_size=8,
        inputs=[spec],
        outputs=[TensorSpec("y", "float32", (3,))],
        instance_count=1,
        instance_kind="KIND_CPU",
        preferred_batch_sizes=[],
        max_queue_delay_us=0,
        backend="python",
        parameters={"record": str(root / "executions.jsonl"), "fail": "yes" if fail else "no"},
        warmup=[warmup_sample("engine build at max batch", 8, [spec], count=2)],
    )
    model = root / "repository" / "counting"
    (model / "1").mkdir(parents=True)
    (model / "1" / "model.py").write_text(COUNTING_MODEL)
    (model / "config.pbtxt").write_text(to_pbtxt(config))
    assert read_config(model / "config.pbtxt") == config
    return root / "repository"


def test_cpu_server_runs_the_warmup_before_it_is_ready(tmp_path):
    """A real tritonserver (python backend) loads a config that carries a model_warmup and has
    run it when it reports ready; a warm-up that fails fails the load."""
    from deploybench.server import TritonServer

    repository = counting_repository(tmp_path, fail=False)
    with TritonServer(repository, tmp_path / "server.log", startup_timeout_s=60):
        runs = (tmp_path / "executions.jsonl").read_text().splitlines()
    # each run of the sample: one execute of 8 requests of one zero row each (Triton core's
    # GenerateWarmupData/WarmUp); a batching backend (ONNX Runtime) runs them as one batch of 8
    assert [json.loads(r) for r in runs] == [{"requests": 8, "shapes": [[1, 3]], "sum": 0.0}] * 2

    # "failed to load 'counting' version 1: ... failed to run warmup sample", then exit (code 1;
    # pytriton's build at times crashes on that way out instead): never ready, either way
    failing = counting_repository(tmp_path / "failing", fail=True)
    with pytest.raises(ServerError, match="exited with code -?[0-9]+ before it was ready"):
        TritonServer(failing, tmp_path / "failing.log", startup_timeout_s=60).start()
    assert (tmp_path / "failing" / "executions.jsonl").exists()  # the warm-up ran, and failed


# ---------------------------------------------------------------------------- tf-trt counts


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory):
    """A small TF SavedModel (no TRTEngineOp: what TF-TRT leaves when it converts nothing)."""
    tf = pytest.importorskip("tensorflow")

    class Small(tf.Module):
        def __init__(self):
            super().__init__()
            self.w = tf.Variable(tf.ones([4, 4]))

        @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32, name="x")])
        def serve(self, x):
            return {"y": tf.nn.relu(tf.matmul(x, self.w) + 1.0) * 2.0}

    module = Small()
    path = tmp_path_factory.mktemp("tf") / "model.savedmodel"
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.serve})
    return path


def with_trt_nodes(source: Path, out: Path, engines: dict[str, int]) -> Path:
    """``source`` with a TRTEngineOp per name of ``engines`` in its function library (as a
    converted signature holds them; one also in a second function: one op, counted once) and
    ``engines[name]`` engines in its serialized-engine asset (none: no asset, as save() writes
    no file for an op whose resource build() never made)."""
    import tensorflow as tf
    from tensorflow.core.protobuf import saved_model_pb2

    shutil.copytree(source, out)
    saved = saved_model_pb2.SavedModel()
    saved.ParseFromString((out / "saved_model.pb").read_bytes())
    functions = saved.meta_graphs[0].graph_def.library.function
    assert len(functions) >= 2
    for name, count in engines.items():
        for function in functions[:2]:
            node = function.node_def.add(name=f"StatefulPartitionedCall/{name}", op="TRTEngineOp")
            node.attr["segment_func"].func.name = f"{name}_native_segment"
            node.attr["static_engine"].b = False
        if count:
            with tf.io.TFRecordWriter(str(out / "assets" / f"trt-serialized-engine.{name}")) as w:
                for k in range(count):
                    w.write(f"engine {k}".encode())
    (out / "saved_model.pb").write_bytes(saved.SerializeToString())
    return out


def test_trt_engines_are_counted_in_the_saved_model(saved_model, tmp_path):
    # the serving signature's compute: all of it in TensorFlow
    ops = {"AddV2": 1, "MatMul": 1, "Mul": 1, "Relu": 1}
    assert cv.trt_engine_counts(saved_model) == {
        "trt_engine_ops": 0,
        "ops_with_engine": 0,
        "engines": 0,
        "tf_ops": 4,
        "tf_op_types": ops,
        "trt_ops": 0,
    }
    converted = with_trt_nodes(
        saved_model, tmp_path / "converted", {"TRTEngineOp_000_000": 2, "TRTEngineOp_000_001": 0}
    )
    assert cv.trt_engine_counts(converted) == {
        "trt_engine_ops": 2,
        "ops_with_engine": 1,
        "engines": 2,
        "tf_ops": 4,
        "tf_op_types": ops,
        "trt_ops": 0,  # no native segment saved with them: nothing counted in the engines
    }


def test_the_ops_an_engine_took_are_not_counted_as_left_to_tensorflow(saved_model, tmp_path):
    from tensorflow.core.protobuf import saved_model_pb2

    converted = with_trt_nodes(saved_model, tmp_path / "converted", {"TRTEngineOp_000_000": 1})
    saved = saved_model_pb2.SavedModel()
    saved.ParseFromString((converted / "saved_model.pb").read_bytes())
    for function in saved.meta_graphs[0].graph_def.library.function:
        kept = [n for n in function.node_def if n.op not in ("MatMul", "AddV2")]  # in the engine
        del function.node_def[:]
        function.node_def.extend(kept)
    # a native segment (TF-TRT's fallback copy of the engine's ops) is never called: not counted
    segment = saved.meta_graphs[0].graph_def.library.function.add()
    segment.signature.name = "TRTEngineOp_000_000_native_segment"
    segment.node_def.add(name="m", op="MatMul")
    assert cv.tf_ops_outside_engines(saved) == {"Mul": 1, "Relu": 1}


def test_a_conversion_without_engines_fails_naming_the_cause(saved_model, tmp_path):
    settings = {"workspace_mb": 64, "minimum_segment_size": 3, "maximum_cached_engines": 1}
    params = cv.tf_trt_parameters("fp16", settings)
    none = cv.trt_engine_counts(saved_model)
    with pytest.raises(ConversionError, match=r"no subgraph.*minimum_segment_size \(3\).*FP16"):
        cv.check_trt_engines(none, params, tmp_path / "out")
    unbuilt = cv.trt_engine_counts(
        with_trt_nodes(saved_model, tmp_path / "unbuilt", {"TRTEngineOp_000_000": 0})
    )
    with pytest.raises(ConversionError, match="1 TRTEngineOp node.*built no engine"):
        cv.check_trt_engines(unbuilt, params, tmp_path / "out")
    built = {"trt_engine_ops": 1, "ops_with_engine": 1, "engines": 1}
    cv.check_trt_engines(built, params, tmp_path / "out")


class FakeConverter:
    """TrtGraphConverterV2's calls, on CPU: save() writes ``engines`` TRTEngineOps (or none)."""

    engines: ClassVar[dict[str, int]] = {}
    calls: ClassVar[list] = []

    def __init__(self, input_saved_model_dir, **parameters):
        self.source = Path(input_saved_model_dir)
        FakeConverter.calls.append(("init", parameters))

    def convert(self):
        FakeConverter.calls.append(("convert",))

    def build(self, input_fn):
        batches = [{k: tuple(v.shape) for k, v in feeds.items()} for feeds in input_fn()]
        FakeConverter.calls.append(("build", batches))

    def save(self, out):
        with_trt_nodes(self.source, Path(out), FakeConverter.engines)


@pytest.mark.parametrize(
    ("engines", "error"),
    [({"TRTEngineOp_000_000": 1}, None), ({}, "replaced no subgraph")],
)
def test_tf_trt_records_its_engines_or_fails(saved_model, tmp_path, monkeypatch, engines, error):
    tf = pytest.importorskip("tensorflow")
    monkeypatch.setattr(tf.experimental.tensorrt, "Converter", FakeConverter)
    monkeypatch.setattr(cv, "gpu_visible", lambda: True)
    monkeypatch.setattr(FakeConverter, "engines", engines)
    monkeypatch.setattr(FakeConverter, "calls", [])
    settings = {
        "workspace_mb": 64,
        "minimum_segment_size": 3,
        "maximum_cached_engines": 1,
        "max_batch": 8,
    }
    out = tmp_path / "model.savedmodel"

    def convert():
        return cv.convert(
            "tf-trt",
            source=saved_model,
            out=out,
            precision="fp16",
            settings=settings,
            inputs=[TensorSpec("x", "float32", (4,))],
            example_inputs=lambda b: {"x": np.zeros((b, 4), np.float32)},
        )

    if error:
        with pytest.raises(ConversionError, match=error):
            convert()
        assert not out.exists() and not list(tmp_path.glob(".model.savedmodel*"))
        return
    record = convert()
    engines = {
        k: record["trt_engines"][k] for k in ("trt_engine_ops", "ops_with_engine", "engines")
    }
    assert engines == {"trt_engine_ops": 1, "ops_with_engine": 1, "engines": 1}
    assert record["trt_engines"]["tf_ops"] == 4  # the stand-in converter leaves them all
    assert record["parameters"]["build_batches"] == [1, 8]
    init, _, build = FakeConverter.calls
    assert init[1]["use_dynamic_shape"] is True  # explicit batch: TensorRT 10 has no other
    assert init[1]["dynamic_shape_profile_strategy"] == "Range"
    assert build == ("build", [{"x": (1, 4)}, {"x": (8, 4)}])  # the profile spans 1..max
    assert cv.trt_engine_counts(out) == record["trt_engines"]


def test_report_shows_the_tf_trt_engines():
    engines = {"trt_engine_ops": 3, "ops_with_engine": 2, "engines": 2}
    provenance = {"config": {"format": "tf-trt"}, "conversion": {"trt_engines": engines}}
    table = configuration_table(provenance)
    assert "| TF-TRT engines | 3 TRTEngineOp nodes, 2 with an engine (2 engines) |" in table
    engines |= {"tf_ops": 3, "tf_op_types": {"ArgMax": 1, "Softmax": 2}}
    table = configuration_table({**provenance, "conversion": {"trt_engines": engines}})
    assert "(2 engines); 3 ops left to TensorFlow (ArgMax 1, Softmax 2) |" in table
    assert "TF-TRT engines" not in configuration_table({"config": {"format": "onnx"}})
