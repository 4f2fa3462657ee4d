"""ResNet-50's tf-trt run served as DLE served it: the TensorFlow backend's TensorRT accelerator
as Model Navigator v0.1.0 (DLE's pin) wrote it, only on the runs the published rows say TensorRT;
and a TF-TRT conversion that left most of the network in TensorFlow fails, naming what it left."""

from __future__ import annotations

import csv
import struct
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from deploybench import convert as cv
from deploybench.errors import ConversionError
from deploybench.model_repository import model_config
from deploybench.models import load_family
from deploybench.planning import workflow_config as dbc
from deploybench.planning.conversion_plan import conversion_settings
from deploybench.planning.serving_plan import serving
from deploybench.tensors import TensorSpec
from deploybench.triton_config import to_pbtxt
from tests.conftest import REPO, base_config

# What Model Navigator v0.1.0 writes for `--backend-accelerator trt --precision fp16`
# (triton-inference-server/model_navigator, tag v0.1.0 = 060e9904,
# model_navigator/triton/model_config.py L111-114: one gpu_execution_accelerator "tensorrt",
# parameters["precision_mode"] = self.precision.value.upper()), nothing else under optimization.
MODEL_NAVIGATOR_V010_TRT_FP16 = """\
execution_accelerators {
  gpu_execution_accelerator {
    name: "tensorrt"
    parameters { key: "precision_mode" value: "FP16" }
  }
}
"""


def pbtxt_config(run: dbc.Run) -> model_config_pb2.ModelConfig:
    """The run's config.pbtxt as written, parsed back as Triton reads it."""
    family = load_family(run.settings["module"], run.settings["hparams"])
    built = model_config(
        name=run.model,
        serving=serving(run),
        triton=run.settings["triton"],
        device=run.device,
        inputs=family.inputs,
        outputs=family.outputs,
        artifact_name=run.format_settings["artifact"],
    )
    return text_format.Parse(to_pbtxt(built), model_config_pb2.ModelConfig())


def published_resnet50() -> list[dict[str, str]]:
    with (REPO / "config" / "reference" / "published.csv").open() as f:
        return [row for row in csv.DictReader(f) if row["model"] == "resnet50"]


def test_resnet50_tf_trt_config_has_model_navigator_v010s_tensorrt_accelerator():
    """DLE's ResNet-50 page (TensorFlow/Classification/ConvNets/triton/README.md at 58b7aa3d,
    the parent of 4a312bf2): BACKEND_ACCELERATOR="trt", passed by step 9 to
    triton/config_model_on_triton.py --backend-accelerator (L135-141), which hands it to Model
    Navigator's ModelConfig.create (L169-183), pinned at v0.1.0 (triton/requirements.txt). Its
    generate_prototxt_payload (model_navigator/triton/model_config.py L111-114) writes the block
    above: precision_mode "FP16" from --precision fp16, no other parameter."""
    rows = published_resnet50()
    assert {(r["format"], r["precision"]) for r in rows} == {("tf-trt", "fp16")}
    # the offline tables' "Backend Accelerator: TensorRT"; the online tables have no such column
    assert {r["accelerator"] for r in rows if r["scenario"] == "offline"} == {"trt"}
    expected = text_format.Parse(
        MODEL_NAVIGATOR_V010_TRT_FP16, model_config_pb2.ModelOptimizationPolicy()
    )
    config = base_config()
    for gpu in sorted({r["gpu"] for r in rows}):
        run = dbc.resolve(config, "resnet50", gpu, "tf-trt", "fp16")
        cfg = pbtxt_config(run)
        assert cfg.platform == "tensorflow_savedmodel", run.path
        assert cfg.optimization == expected, run.path
    # from the config's data: the format's accelerator, nothing else
    assert config["formats"]["tf-trt"]["accelerator"] == "tensorrt"
    config["formats"]["tf-trt"]["accelerator"] = "none"
    run = dbc.resolve(config, "resnet50", "A100", "tf-trt", "fp16")
    assert not pbtxt_config(run).HasField("optimization")
    # the conversion's workspace (DLE's 4 GiB) stays the conversion's: not the accelerator's
    assert conversion_settings(run)["workspace_mb"] == 4096


def test_cpu_runs_and_other_formats_get_no_accelerator():
    config = base_config()
    for fmt in ("tf-savedmodel", "onnx", "trt"):
        for precision in config["models"]["resnet50"]["formats"][fmt]:
            run = dbc.resolve(config, "resnet50", "A100", fmt, precision)
            cfg = pbtxt_config(run)
            assert not cfg.optimization.execution_accelerators.gpu_execution_accelerator, run.path
    # the CPU default: the python backend, no accelerator; tf-trt does not run there at all
    for fmt in ("tf-savedmodel", "onnx"):
        run = dbc.resolve(config, "resnet50", "cpu", fmt, "fp32")
        how = serving(run)
        assert how["backend"] == "python" and "gpu_accelerators" not in how, run.path
        assert not pbtxt_config(run).HasField("optimization"), run.path
    with pytest.raises(dbc.ConfigError, match="format 'tf-trt' does not run on gpu 'cpu'"):
        dbc.resolve(config, "resnet50", "cpu", "tf-trt", "fp16")


# ---------------------------------------------------------------------------- ops left in TF

COUNTS = {
    "trt_engine_ops": 2,
    "ops_with_engine": 2,
    "engines": 2,
    "tf_op_types": {"ArgMax": 1, "Conv2D": 30, "FusedBatchNormV3": 20},
    "tf_ops": 51,
}


def test_the_gate_fails_where_most_compute_stayed_in_tensorflow(tmp_path):
    key = "models.<m>.convert.tf-trt.max_tf_op_fraction"
    with pytest.raises(ConversionError) as caught:
        cv.check_tf_op_fraction({**COUNTS, "trt_ops": 49}, 0.5, tmp_path / "out")
    message = str(caught.value)
    assert "left 51 of the serving signature's 100 compute ops in TensorFlow (51%" in message
    assert "49 in its TRTEngineOps" in message
    assert "Conv2D 30, FusedBatchNormV3 20, ArgMax 1" in message  # most first
    assert message.count(key) == 2 and f"{key} 0.5" in message
    # at or below the limit, unset, or nothing to count: it passes
    cv.check_tf_op_fraction({**COUNTS, "trt_ops": 51}, 0.5, tmp_path / "out")
    cv.check_tf_op_fraction({**COUNTS, "trt_ops": 0}, None, tmp_path / "out")
    cv.check_tf_op_fraction({"tf_ops": 0, "trt_ops": 0}, 0.0, tmp_path / "out")
    with pytest.raises(ConversionError, match=r"left 1 of .* 1001 .* \(0%"):
        cv.check_tf_op_fraction({"tf_ops": 1, "trt_ops": 1000}, 0.0, tmp_path / "out")


def _tfrecord(path: Path, records: int) -> None:
    """``records`` records in TFRecord framing (CRCs not checked by the counter)."""
    with path.open("wb") as f:
        for _ in range(records):
            f.write(struct.pack("<Q", 1) + b"\0" * 4 + b"x" + b"\0" * 4)


def test_compute_in_the_engines_is_counted_from_their_native_segments(tmp_path):
    pytest.importorskip("tensorflow")
    from tensorflow.core.protobuf import saved_model_pb2

    saved = saved_model_pb2.SavedModel()
    meta = saved.meta_graphs.add()
    call = meta.graph_def.node.add(name="StatefulPartitionedCall", op="StatefulPartitionedCall")
    call.attr["f"].func.name = "serve"
    meta.signature_def["serving_default"].outputs["classes"].name = "StatefulPartitionedCall:0"
    library = meta.graph_def.library
    serve = library.function.add()
    serve.signature.name = "serve"
    engine = serve.node_def.add(name="TRTEngineOp_000_000", op="TRTEngineOp")
    engine.attr["segment_func"].func.name = "TRTEngineOp_000_000_native_segment"
    for op in ("Identity", "ArgMax", "Softmax"):
        serve.node_def.add(name=op.lower(), op=op)
    segment = library.function.add()
    segment.signature.name = "TRTEngineOp_000_000_native_segment"
    for i, op in enumerate(("Conv2D", "Relu", "Conv2D", "AddV2", "Const", "Identity")):
        segment.node_def.add(name=f"n{i}", op=op)
    (tmp_path / "assets").mkdir()
    (tmp_path / "saved_model.pb").write_bytes(saved.SerializeToString())
    _tfrecord(tmp_path / "assets" / "trt-serialized-engine.TRTEngineOp_000_000", 1)
    counts = cv.trt_engine_counts(tmp_path)
    assert counts == {
        "trt_engine_ops": 1,
        "ops_with_engine": 1,
        "engines": 1,
        "tf_ops": 2,
        "tf_op_types": {"ArgMax": 1, "Softmax": 1},
        "trt_ops": 4,  # the segment's compute; its Const and Identity move tensors
    }
    cv.check_tf_op_fraction(counts, 0.5, tmp_path)  # 2 of 6
    with pytest.raises(ConversionError, match=r"left 2 of .* 6 compute ops.*ArgMax 1, Softmax 1"):
        cv.check_tf_op_fraction(counts, 0.25, tmp_path)


def test_resnet50s_threshold_is_config_data_that_reaches_the_conversion(tmp_path, monkeypatch):
    run = dbc.resolve(base_config(), "resnet50", "A100", "tf-trt", "fp16")
    settings = conversion_settings(run)
    assert settings["max_tf_op_fraction"] == 0.5
    # the converter's keyword arguments stay TF-TRT's own
    assert "max_tf_op_fraction" not in cv.tf_trt_parameters("fp16", settings)
    seen: dict[str, Any] = {}

    def fake_tf_trt(source, out, parameters, feeds, max_tf_op_fraction=None):
        seen["limit"] = max_tf_op_fraction
        return {**COUNTS, "trt_ops": 500}

    monkeypatch.setattr(cv, "tf_trt", fake_tf_trt)
    monkeypatch.setattr(cv, "gpu_visible", lambda: True)
    monkeypatch.setattr(cv, "tf_trt_loaded_version", lambda: None)
    record = cv.convert(
        "tf-trt",
        source=tmp_path / "model.savedmodel",
        out=tmp_path / "out.savedmodel",
        precision="fp16",
        settings=settings,
        inputs=[TensorSpec("input", "float32", (224, 224, 3))],
        example_inputs=lambda b: {},
    )
    assert seen == {"limit": 0.5}
    assert record["trt_engines"]["tf_op_types"] == COUNTS["tf_op_types"]  # for the report
    # the schema holds it to a fraction
    schema = yaml.safe_load((REPO / "config" / "schema" / "config.schema.yaml").read_text())
    config = base_config()
    config["models"]["resnet50"]["convert"]["tf-trt"]["max_tf_op_fraction"] = 1.5
    with pytest.raises(jsonschema.ValidationError, match="1.5 is greater than the maximum of 1"):
        jsonschema.Draft202012Validator(schema).validate(config)


def test_report_names_the_ops_left_and_the_engines_share():
    from deploybench.report import trt_engines_text

    text = trt_engines_text({**COUNTS, "tf_op_types": {"ArgMax": 1}, "tf_ops": 1, "trt_ops": 120})
    assert text.endswith("; 1 ops left to TensorFlow (ArgMax 1), 120 in the engines")
