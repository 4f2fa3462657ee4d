import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
import tensorflow as tf

from deploybench.checkpoint import prepare_checkpoint, read_workflow_checkpoint
from deploybench.export import export_model
from deploybench.export_tf import convert_savedmodel_to_onnx
from deploybench.models.resnet50 import (
    ResNet50Family,
    dle_variable,
    is_dle_training_state,
    top_k_accuracy,
)
from deploybench.runtime import load_runner
from tests.dle_fixtures import dle_fixture

SMOKE = {"image_size": 32, "blocks": [1, 1, 1, 1], "width": 8}
TOLERANCE = {
    "classes": {"atol": 0.0, "rtol": 0.0},
    "probabilities": {"atol": 1.0e-5, "rtol": 1.0e-4},
}
NAMES = {"input_names": ["input"], "output_names": ["classes", "probabilities"]}


@pytest.fixture(scope="module")
def smoke():
    return ResNet50Family(SMOKE)


@pytest.fixture(scope="module")
def full_model():
    return ResNet50Family({}).build()


@pytest.fixture(scope="module")
def savedmodel(smoke, tmp_path_factory):
    out = tmp_path_factory.mktemp("export") / "model.savedmodel"
    report = export_model(
        smoke, smoke.init_state(0), "tf-savedmodel", "fp32", out, tolerance=TOLERANCE
    )
    assert report["runtime"] == "tensorflow" and all(c["passed"] for c in report["checks"])
    return out


def test_signature_is_dles(smoke):
    full = ResNet50Family({})
    assert [(s.name, s.dtype, s.shape) for s in full.inputs] == [
        ("input", "float32", (224, 224, 3))
    ]
    assert [(s.name, s.dtype, s.shape) for s in full.outputs] == [
        ("classes", "int32", (1,)),
        ("probabilities", "float32", (1001,)),
    ]
    assert smoke.metric_name == "top1" and smoke.higher_is_better


def test_unknown_hparam_is_rejected():
    with pytest.raises(ValueError, match=r"unknown ResNet-50 hyper-parameters \['depth'\]"):
        ResNet50Family({"depth": 50})


def test_full_size_is_resnet50_v1_5(full_model):
    trainable = sum(int(np.prod(w.shape)) for w in full_model.trainable_weights)
    # torchvision's ResNet-50 (25,557,032) with DLE's 1001st class: + 2048 weights + 1 bias
    assert trainable == 25_559_081
    layer = full_model.get_layer
    assert layer("stem_conv").get_config()["strides"] == (2, 2)
    for stage in range(4):
        first = f"stage{stage}_block0"
        stride = (1, 1) if stage == 0 else (2, 2)
        # v1.5: the 3x3 convolution carries the stride, the first 1x1 does not
        assert layer(f"{first}_1_conv").get_config()["strides"] == (1, 1)
        assert layer(f"{first}_2_conv").get_config()["kernel_size"] == (3, 3)
        assert layer(f"{first}_2_conv").get_config()["strides"] == stride
        assert layer(f"{first}_shortcut_conv").get_config()["strides"] == stride
    assert not any(
        w.path.endswith("_conv/bias") for w in full_model.weights
    )  # batch norm follows every convolution
    assert layer("stage3_block2_out").output.shape == (None, 7, 7, 2048)
    assert layer("stem_bn").get_config()["epsilon"] == 1e-5


def test_normalisation_is_in_the_graph(full_model):
    normalize = full_model.get_layer("normalize")
    mean = np.array([123.68, 116.28, 103.53], dtype=np.float32)
    std = np.array([58.395, 57.120, 57.385], dtype=np.float32)
    pixels = np.stack([np.broadcast_to(mean, (2, 2, 3)), np.broadcast_to(mean + std, (2, 2, 3))])
    out = np.asarray(normalize(pixels))
    np.testing.assert_allclose(out[0], 0.0, atol=1e-5)
    np.testing.assert_allclose(out[1], 1.0, atol=1e-5)


def test_init_is_deterministic_with_stable_paths(smoke):
    first, again, other = smoke.init_state(0), smoke.init_state(0), smoke.init_state(1)
    assert list(first["model"]) == list(again["model"])
    assert "stage1_block0_2_conv/kernel" in first["model"]
    for path, value in first["model"].items():
        np.testing.assert_array_equal(value, again["model"][path])
    assert not np.array_equal(
        first["model"]["stem_conv/kernel"], other["model"]["stem_conv/kernel"]
    )


def test_init_measures_batch_norm_statistics(smoke):
    """The seeded network must not saturate: the export checks compare its outputs."""
    state = smoke.init_state(0)["model"]
    assert not np.allclose(state["stage3_block0_3_bn/moving_variance"], 1.0)
    model = smoke.serving_module(smoke.init_state(0))
    out = smoke.framework_outputs(model, smoke.example_inputs(8, seed=5))
    assert out["probabilities"].max() < 0.9
    assert len(np.unique(out["classes"])) > 1


def test_outputs_are_consistent(smoke):
    model = smoke.serving_module(smoke.init_state(0))
    out = smoke.framework_outputs(model, smoke.example_inputs(4, seed=3))
    assert out["classes"].shape == (4, 1) and out["classes"].dtype == np.int32
    assert out["probabilities"].shape == (4, 1001)
    np.testing.assert_allclose(out["probabilities"].sum(axis=1), 1.0, rtol=1e-5)
    np.testing.assert_array_equal(out["classes"][:, 0], out["probabilities"].argmax(axis=1))


def test_savedmodel_signature_and_runner_match_keras(smoke, savedmodel):
    signature = tf.saved_model.load(str(savedmodel)).signatures["serving_default"]
    assert list(signature.structured_input_signature[1]) == ["input"]
    assert sorted(signature.structured_outputs) == ["classes", "probabilities"]
    runner = load_runner("tensorflow", savedmodel, threads=1, **NAMES)
    feeds = smoke.example_inputs(5, seed=11)  # a batch size the export never saw
    expected = smoke.framework_outputs(smoke.serving_module(smoke.init_state(0)), feeds)
    classes, probabilities = runner(feeds)
    np.testing.assert_array_equal(classes, expected["classes"])
    np.testing.assert_allclose(probabilities, expected["probabilities"], atol=1e-6, rtol=1e-5)


def test_runner_rejects_outputs_the_signature_lacks(savedmodel):
    with pytest.raises(ValueError, match=r"has no outputs \['logits'\]"):
        load_runner("tensorflow", savedmodel, input_names=["input"], output_names=["logits"])


def test_onnx_from_savedmodel_matches_keras(smoke, savedmodel, tmp_path):
    out = tmp_path / "model.onnx"
    report = export_model(
        smoke,
        smoke.init_state(0),
        "onnx",
        "fp32",
        out,
        opset=12,
        tolerance=TOLERANCE,
        source=savedmodel,
    )
    assert report["runtime"] == "onnxruntime" and all(c["passed"] for c in report["checks"])
    runner = load_runner("onnxruntime", out, **NAMES)
    assert runner.input_names == ["input"] and runner.output_names == NAMES["output_names"]
    assert not list(tmp_path.glob(".*.tmp"))


def test_onnx_conversion_errors_are_clear(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a SavedModel directory"):
        convert_savedmodel_to_onnx(tmp_path, tmp_path / "m.onnx", 12)
    (tmp_path / "saved_model.pb").write_bytes(b"not a protobuf")
    with pytest.raises(RuntimeError, match=r"tf2onnx failed \(exit status [1-9]"):
        convert_savedmodel_to_onnx(tmp_path, tmp_path / "m.onnx", 12)


def test_tf2onnx_dies_with_the_job(savedmodel, tmp_path):
    """A job killed outright (out of memory, SIGKILL) must not leave a 7 GB converter behind."""
    code = (
        "from pathlib import Path; from deploybench.export_tf import convert_savedmodel_to_onnx; "
        f"convert_savedmodel_to_onnx(Path({str(savedmodel)!r}), Path({str(tmp_path)!r}) / 'm.onnx', 12)"
    )
    job = subprocess.Popen([sys.executable, "-c", code])
    try:
        deadline = time.monotonic() + 60
        while not psutil.Process(job.pid).children() and time.monotonic() < deadline:
            time.sleep(0.05)
        converters = psutil.Process(job.pid).children()
        assert converters, "tf2onnx was not started"
    finally:
        job.kill()
        job.wait()
    _, alive = psutil.wait_procs(converters, timeout=3)  # converting takes longer
    assert not alive


def test_top1_known_answers():
    outputs = [
        {"classes": np.array([[3], [5]], dtype=np.int32)},
        {"classes": np.array([[0], [7]], dtype=np.int32)},
    ]
    # DLE's labels are 0-based class ids, compared with the arg-max as they are
    assert top_k_accuracy(outputs, [np.array([3, 4]), np.array([0, 7])]) == {"top1": 0.75}
    assert top_k_accuracy(outputs, [np.array([4, 6]), np.array([1, 8])]) == {"top1": 0.0}
    with pytest.raises(ValueError, match="4 predictions for 3 labels"):
        top_k_accuracy(outputs, [np.array([3, 4]), np.array([0])])


def test_top5_known_answers():
    probabilities = np.array(
        [
            [0.30, 0.25, 0.20, 0.10, 0.08, 0.07],  # label 4: rank 5, in the top 5
            [0.30, 0.25, 0.20, 0.10, 0.08, 0.07],  # label 5: rank 6, out
        ],
        dtype=np.float32,
    )
    outputs = [{"classes": np.array([[0], [0]]), "probabilities": probabilities}]
    metrics = top_k_accuracy(outputs, [np.array([4, 5])])
    assert list(metrics) == ["top1", "top5"] and metrics == {"top1": 0.0, "top5": 0.5}


def _image(height, width, value):
    pixels = np.zeros((height, width, 3), dtype=np.uint8)
    pixels[..., 0] = value
    pixels[..., 1] = np.arange(width, dtype=np.uint8)[None, :]
    return pixels


def _png(height, width, value):
    return tf.io.encode_png(_image(height, width, value)).numpy()


def test_dataset_class_folders_in_dle_triton_layout(smoke, tmp_path):
    """``<class id>/<image>`` as DLE's process_dataset.py writes it, numeric class order."""
    for label, value in [(10, 30), (2, 20), (2, 21)]:
        folder = tmp_path / str(label)
        folder.mkdir(exist_ok=True)
        (folder / f"ILSVRC2012_val_{value:08d}.png").write_bytes(_png(32, 32, value))
    batches = list(smoke.dataset_batches(tmp_path, batch_size=2, limit=None))
    assert [b[0]["input"].shape for b in batches] == [(2, 32, 32, 3), (1, 32, 32, 3)]
    assert np.concatenate([b[1] for b in batches]).tolist() == [2, 2, 10]
    first = batches[0][0]["input"]
    assert first.dtype == np.float32
    np.testing.assert_array_equal(first[0], _image(32, 32, 20).astype(np.float32))  # raw pixels
    assert len(list(smoke.dataset_batches(tmp_path, batch_size=1, limit=2))) == 2  # images


def test_dataset_label_file_and_eval_crop(smoke, tmp_path):
    """``val.txt`` of ``<file> <class id>``; a larger image is resized (shorter side to
    256/224 of the size) and centrally cropped, as DLE's eval pre-processing does."""
    (tmp_path / "images").mkdir()
    (tmp_path / "images" / "a.jpg").write_bytes(tf.io.encode_jpeg(_image(48, 96, 200)).numpy())
    (tmp_path / "images" / "b.png").write_bytes(_png(32, 32, 7))
    (tmp_path / "val.txt").write_text("images/a.jpg 5\nimages/b.png 999\n")
    ((feeds, labels),) = smoke.dataset_batches(tmp_path, batch_size=4, limit=None)
    assert labels.tolist() == [5, 999]
    crop = feeds["input"][0]
    assert crop.shape == (32, 32, 3)
    # 48x96 → 36x73 (shorter side 32*256/224), central 32x32 crop: columns 20..51 of 73,
    # where the green ramp (0..95 over 96 columns) reads about 26..67
    assert 20 < crop[16, 0, 1] < 32 and 60 < crop[16, -1, 1] < 72
    np.testing.assert_allclose(crop[..., 0], 200, atol=4)  # JPEG is lossy


def test_dataset_dle_tfrecords_have_one_based_labels(smoke, tmp_path):
    def example(label, value):
        features = {
            "image/encoded": tf.train.Feature(
                bytes_list=tf.train.BytesList(value=[_png(32, 32, value)])
            ),
            "image/class/label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
        }
        return tf.train.Example(features=tf.train.Features(feature=features)).SerializeToString()

    with tf.io.TFRecordWriter(str(tmp_path / "validation-00000-of-00128")) as writer:
        writer.write(example(1, 10))
        writer.write(example(1000, 11))
    ((feeds, labels),) = smoke.dataset_batches(tmp_path, batch_size=8, limit=None)
    assert labels.tolist() == [0, 999]  # DLE's reader subtracts one
    assert feeds["input"][1, 0, 0, 0] == 11


def test_dataset_errors_are_clear(smoke, tmp_path):
    with pytest.raises(FileNotFoundError, match="not found"):
        list(smoke.dataset_batches(tmp_path / "missing", 2, None))
    with pytest.raises(ValueError, match="no images under"):
        list(smoke.dataset_batches(tmp_path, 2, None))
    (tmp_path / "val.txt").write_text("a.jpg\n")
    with pytest.raises(ValueError, match=r"val.txt:1: expected '<image file> <class id>'"):
        list(smoke.dataset_batches(tmp_path, 2, None))


# DLE's TF1 ConvNets variables (tests/fixtures/dle/resnet50-v1.5-tf1.json: listed from DLE's code).
DLE = dle_fixture("resnet50-v1.5-tf1")
# A trained DLE checkpoint also holds AMP's dynamic loss scale (TF's DynamicLossScale variables).
AMP_STATE = {"current_loss_scale": np.float32(32768.0), "good_steps": np.int64(117)}


def dle_values(shapes, seed):
    """The fixture reference's values: float32 normals × 0.1 drawn in sorted-name order, batch
    norm's gamma around 1 and its moving variance positive (``reference.values``)."""
    rng = np.random.default_rng(seed)
    values = {}
    for name in sorted(shapes):
        x = (rng.standard_normal(shapes[name]) * 0.1).astype(np.float32)
        leaf = name.rsplit("/", 1)[-1]
        if leaf == "gamma":
            x = x + np.float32(1)
        elif leaf == "moving_variance":
            x = np.abs(x) + np.float32(1)
        values[name] = x
    return values


def write_dle_checkpoint(model_dir: Path, variables, step):
    """``model.ckpt-<step>`` as DLE's estimator saves it: a TF1 Saver (sharded, relative paths
    in the ``checkpoint`` state file, which names it the latest) with ``global_step``."""
    v1 = tf.compat.v1
    model_dir.mkdir(parents=True, exist_ok=True)
    with tf.Graph().as_default():
        global_step = v1.train.get_or_create_global_step()
        saved = {
            name: v1.Variable(value, name=f"v{i}")
            for i, (name, value) in enumerate(variables.items())
        }
        saver = v1.train.Saver(
            var_list={**saved, "global_step": global_step}, sharded=True, save_relative_paths=True
        )
        with v1.Session() as session:
            session.run(v1.global_variables_initializer())
            session.run(global_step.assign(step))
            saver.save(session, str(model_dir / "model.ckpt"), global_step=step)


def with_training_state(network):
    """DLE's training checkpoint: the network, a Momentum slot per trainable variable (the
    fixture's ``training_only`` names) and AMP's loss scale."""
    slots = {
        f"{name}/Momentum": np.full_like(value, 7.0)
        for name, value in network.items()
        if f"{name}/Momentum" in DLE["training_only"]
    }
    return {**network, **slots, **AMP_STATE}


@pytest.fixture(scope="module")
def dle_model_dir(tmp_path_factory):
    """A DLE ``--model_dir`` at the reference's smoke size: an older checkpoint (step 500) and
    the latest (step 1000) holding the reference's values."""
    ref = DLE["reference"]
    model_dir = tmp_path_factory.mktemp("dle") / "model_dir"
    write_dle_checkpoint(model_dir, with_training_state(dle_values(ref["parameters"], 1)), 500)
    write_dle_checkpoint(
        model_dir, with_training_state(dle_values(ref["parameters"], ref["seed"])), 1000
    )
    return model_dir


def test_dle_names_and_shapes_are_the_full_size_networks(full_model):
    ours = {dle_variable(w.path): list(w.shape) for w in full_model.weights}
    assert len(DLE["parameters"]) == 267
    assert ours == DLE["parameters"]
    assert ours["resnet50/btlnck_block_1_0/bottleneck_2/conv2d/kernel"] == [3, 3, 128, 128]
    assert full_model.get_layer("stage1_block0_2_conv").get_config()["strides"] == (2, 2)
    assert len(DLE["training_only"]) == 162  # global_step and 161 Momentum slots
    assert all(is_dle_training_state(n) for n in [*DLE["training_only"], *AMP_STATE])
    assert not any(is_dle_training_state(n) for n in DLE["parameters"])


def test_dle_checkpoint_gives_dles_outputs(smoke, dle_model_dir, tmp_path):
    """Every variable of DLE's latest checkpoint lands where its name says: DLE's own forward
    pass on these weights and inputs (recorded in the fixture) is reproduced."""
    ref = DLE["reference"]
    assert ref["hparams"] == SMOKE
    assert {dle_variable(w.path): list(w.shape) for w in smoke.build().weights} == ref["parameters"]
    values = dle_values(ref["parameters"], ref["seed"])
    out = tmp_path / "checkpoint.npz"
    assert prepare_checkpoint(smoke, str(dle_model_dir), 0, out) == f"checkpoint {dle_model_dir}"
    written = read_workflow_checkpoint(smoke, out)["model"]
    assert len(written) == len(values) == 87
    for path, value in written.items():
        np.testing.assert_array_equal(value, values[dle_variable(path)], err_msg=path)
    known = {
        "stem_conv/kernel": "resnet50/conv2d/conv2d/kernel",
        "stem_bn/moving_mean": "resnet50/conv2d/BatchNorm/moving_mean",
        "stage1_block0_2_conv/kernel": "resnet50/btlnck_block_1_0/bottleneck_2/conv2d/kernel",
        "stage1_block0_3_bn/gamma": "resnet50/btlnck_block_1_0/bottleneck_3/BatchNorm/gamma",
        "stage2_block0_1_bn/beta": "resnet50/btlnck_block_2_0/bottleneck_1/BatchNorm/beta",
        "stage2_block0_shortcut_bn/moving_variance": (
            "resnet50/btlnck_block_2_0/shortcut/conv2d/BatchNorm/moving_variance"
        ),
        "stage3_block0_shortcut_conv/kernel": "resnet50/btlnck_block_3_0/shortcut/conv2d/conv2d/kernel",
        "logits/kernel": "resnet50/output/dense/kernel",
        "logits/bias": "resnet50/output/dense/bias",
    }
    for path, name in known.items():
        np.testing.assert_array_equal(written[path], values[name], err_msg=path)
    module = smoke.serving_module(read_workflow_checkpoint(smoke, out))
    inputs = ref["inputs"]
    pixels = np.random.default_rng(inputs["seed"]).uniform(0.0, 255.0, size=inputs["shape"])
    result = smoke.framework_outputs(module, {"input": pixels.astype(np.float32)})
    assert result["classes"][:, 0].tolist() == ref["output"]["classes"]
    np.testing.assert_allclose(
        result["probabilities"], ref["output"]["probabilities"], rtol=1e-5, atol=1e-9
    )


def test_dle_checkpoint_by_prefix_or_index_file(smoke, dle_model_dir):
    older = dle_values(DLE["reference"]["parameters"], 1)
    name = "resnet50/btlnck_block_0_0/bottleneck_2/conv2d/kernel"
    for path in (dle_model_dir / "model.ckpt-500", dle_model_dir / "model.ckpt-500.index"):
        weights = smoke.read_checkpoint(path)["model"]
        np.testing.assert_array_equal(weights["stage0_block0_2_conv/kernel"], older[name])


def test_dle_checkpoint_of_another_architecture_names_its_keys(dle_model_dir, tmp_path):
    out = tmp_path / "checkpoint.npz"
    deeper = ResNet50Family({**SMOKE, "blocks": [1, 1, 2, 1]})
    with pytest.raises(ValueError) as err:
        prepare_checkpoint(deeper, str(dle_model_dir), 0, out)
    assert "does not fit the configured ResNet-50 hyper-parameters" in str(err.value)
    assert "missing (15): resnet50/btlnck_block_2_1/bottleneck_1/BatchNorm/beta," in str(err.value)
    wider = ResNet50Family({**SMOKE, "width": 16})
    with pytest.raises(ValueError) as err:
        prepare_checkpoint(wider, str(dle_model_dir), 0, out)
    # 4 × 16 = 64 = the stem's width: the first block's shortcut is an identity, as in DLE.
    assert "unexpected (5): resnet50/btlnck_block_0_0/shortcut/conv2d/BatchNorm/beta," in str(
        err.value
    )
    assert (
        "shape checkpoint vs configured (76): "
        "resnet50/btlnck_block_0_0/bottleneck_1/BatchNorm/beta (8,) vs (16,)"
    ) in str(err.value)
    assert not out.exists()


def test_dle_checkpoint_with_unknown_variables_or_none_fails_clearly(smoke, tmp_path):
    ref = DLE["reference"]
    extra = {
        **dle_values(ref["parameters"], 0),
        "resnet50/btlnck_block_0_1/bottleneck_1/conv2d/kernel": np.zeros((1, 1, 32, 8), np.float32),
    }
    write_dle_checkpoint(tmp_path / "deeper", with_training_state(extra), 10)
    with pytest.raises(
        ValueError, match=r"unexpected \(1\): resnet50/btlnck_block_0_1/bottleneck_1/conv2d/kernel$"
    ):
        smoke.read_checkpoint(tmp_path / "deeper")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"no TensorFlow checkpoint .*found: none"):
        smoke.read_checkpoint(tmp_path / "empty")
    with pytest.raises(FileNotFoundError, match="expected a checkpoint directory"):
        smoke.read_checkpoint(tmp_path / "empty" / "model.ckpt-1")
    with pytest.raises(ValueError, match="hold no EMA copy"):
        smoke.read_checkpoint(tmp_path / "deeper", ema=True)
