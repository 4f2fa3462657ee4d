import argparse

import numpy as np
import pytest
import torch

from deploybench.checkpoint import (
    load_checkpoint,
    prepare_checkpoint,
    write_seeded_checkpoint,
)
from deploybench.export import ExportOptions, export_model, export_torch_onnx
from deploybench.models.nnunet import (
    NnUNetConfig,
    NnUNetFamily,
    dice_scores,
    kfold_validation_indices,
    validation_cases,
)
from deploybench.runtime import load_runner

# A four-level network on 32³ patches: exports in about a second.
SMOKE = {
    "kernels": [3, 3, 3, 3],
    "strides": [1, 2, 2, 2],
    "filters": [8, 16, 32, 64],
    "patch_size": [32, 32, 32],
}


@pytest.fixture(scope="module")
def family():
    return NnUNetFamily(SMOKE)


def test_defaults_are_dles_task01_network():
    cfg = NnUNetConfig()
    assert cfg.in_channels == 4 and cfg.out_channels == 4
    assert cfg.kernels == ((3, 3, 3),) * 6
    assert cfg.strides == ((1, 1, 1),) + ((2, 2, 2),) * 5
    assert cfg.filters == (32, 64, 128, 256, 320, 320)
    with torch.device("meta"):
        model = NnUNetFamily({}).build()
    assert sum(p.numel() for p in model.parameters()) == 31_192_868


def test_config_normalises_yaml_and_rejects_bad_values():
    cfg = NnUNetConfig.from_mapping(
        {"kernels": [3, [1, 3, 3]], "strides": [[1, 1, 1], 2], "filters": [8, 16],
         "patch_size": 16}
    )  # fmt: skip
    assert cfg.kernels == ((3, 3, 3), (1, 3, 3)) and cfg.strides == ((1, 1, 1), (2, 2, 2))
    assert cfg.patch_size == (16, 16, 16)
    with pytest.raises(ValueError, match=r"unknown nnU-Net hyper-parameters \['depth'\]"):
        NnUNetConfig.from_mapping({"depth": 5})
    with pytest.raises(ValueError, match="one entry per level"):
        NnUNetConfig.from_mapping({**SMOKE, "filters": [8, 16, 32]})
    with pytest.raises(ValueError, match="not divisible by the total stride"):
        NnUNetConfig.from_mapping({**SMOKE, "patch_size": [32, 30, 32]})
    with pytest.raises(ValueError, match="three ints per level"):
        NnUNetConfig.from_mapping({**SMOKE, "kernels": [3, 3, [3, 3], 3]})
    with pytest.raises(ValueError, match="norm_name 'layer'"):
        NnUNetConfig.from_mapping({"norm_name": "layer"})


def test_signature_is_dles(family):
    full = NnUNetFamily({})
    assert [(s.name, s.dtype, s.shape) for s in full.inputs] == [
        ("INPUT__0", "float32", (4, 128, 128, 128))
    ]
    assert [(s.name, s.dtype, s.shape) for s in full.outputs] == [
        ("OUTPUT__0", "int64", (128, 128, 128))
    ]
    logits = NnUNetFamily({**SMOKE, "output": "logits"})
    assert [(s.dtype, s.shape) for s in logits.outputs] == [("float32", (4, 32, 32, 32))]


def test_init_is_deterministic_per_seed(family):
    a, b, c = (family.init_state(s)["model"] for s in (0, 0, 1))
    assert a.keys() == b.keys() == c.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["input_block.conv1.conv.weight"], c["input_block.conv1.conv.weight"])


def test_seeded_checkpoint_is_byte_identical_and_stores_aliases_once(family, tmp_path):
    for name in ("a.pt", "b.pt"):
        write_seeded_checkpoint(family, 0, tmp_path / name)
    assert (tmp_path / "a.pt").read_bytes() == (tmp_path / "b.pt").read_bytes()
    params = sum(p.numel() for p in family.build().parameters())
    # DynUNet names every block twice (skip_layers); the file holds each tensor once.
    assert (tmp_path / "a.pt").stat().st_size < 1.5 * 4 * params


def test_example_inputs_are_standardised_volumes(family):
    feeds = family.example_inputs(2, seed=3)
    x = feeds["INPUT__0"]
    assert x.shape == (2, 4, 32, 32, 32) and x.dtype == np.float32
    np.testing.assert_array_equal(x, family.example_inputs(2, seed=3)["INPUT__0"])
    assert x[:, :, 0, 0, 0].tolist() == [[0.0] * 4] * 2  # background outside the head
    inside = x[:, :, 16, 16, 16]
    assert np.all(inside != 0)
    foreground = x[x != 0]
    assert abs(foreground.mean()) < 0.05 and abs(foreground.std() - 1) < 0.05


def test_forward_gives_argmax_labels(family):
    state = family.init_state(0)
    labels_model = family.serving_module(state)
    logits_model = NnUNetFamily({**SMOKE, "output": "logits"}).serving_module(state)
    x = torch.from_numpy(family.example_inputs(2, seed=1)["INPUT__0"])
    with torch.no_grad():
        labels, logits = labels_model(x), logits_model(x)
    assert labels.shape == (2, 32, 32, 32) and labels.dtype == torch.int64
    assert logits.shape == (2, 4, 32, 32, 32)
    assert torch.equal(labels, logits.argmax(1))
    assert len(labels.unique()) > 1  # a random network is not constant


# ts-script runs torch's own kernels: labels match exactly. onnxruntime's scores differ from
# torch's by ~2e-4, which flips the arg-max of near-ties, so its export is checked on scores.
@pytest.mark.parametrize(
    ("fmt", "output", "runtime", "tolerance"),
    [
        ("ts-script", "labels", "torchscript", {"atol": 0.0, "rtol": 0.0}),
        ("onnx", "logits", "onnxruntime", {"atol": 1e-3, "rtol": 1e-3}),
    ],
)
def test_export_loads_in_runtime_and_matches(tmp_path, fmt, output, runtime, tolerance):
    family = NnUNetFamily({**SMOKE, "output": output})
    out = tmp_path / f"model.{fmt}"
    report = export_model(
        family, family.init_state(0), fmt, "fp32", out, opset=12,
        tolerance={"OUTPUT__0": tolerance},
    )  # fmt: skip
    assert report["runtime"] == runtime and all(c["passed"] for c in report["checks"])
    runner = load_runner(runtime, out, input_names=["INPUT__0"], output_names=["OUTPUT__0"])
    feeds = family.example_inputs(1, seed=11)  # a batch size the export never saw
    with torch.no_grad():
        expected = family.serving_module(family.init_state(0))(
            torch.from_numpy(feeds["INPUT__0"])
        ).numpy()
    np.testing.assert_allclose(runner(feeds)[0], expected, **tolerance)


def test_onnx_export_serves_dles_argmax_labels(family, tmp_path):
    out = tmp_path / "model.onnx"
    module = family.serving_module(family.init_state(0))
    export_torch_onnx(module, family, out, ExportOptions(opset=12))
    runner = load_runner("onnxruntime", out, input_names=["INPUT__0"], output_names=["OUTPUT__0"])
    feeds = family.example_inputs(3, seed=5)
    served = runner(feeds)[0]
    with torch.no_grad():
        expected = module(torch.from_numpy(feeds["INPUT__0"])).numpy()
    assert served.dtype == np.int64 and served.shape == (3, 32, 32, 32)
    assert (served == expected).mean() > 0.999


def _dle_2021_name(name: str) -> str:
    """DynUNet name → DLE's April-2021 ``models/unet.py`` name (the inverse of the adapter)."""
    for block in ("norm1", "norm2"):
        if f".{block}." in name:
            return name.replace(f".{block}.", f".conv{block[-1]}.norm.")
    return name.replace("transp_conv.conv.", "transp_conv.").replace(
        "output_block.conv.conv.", "output_block.conv."
    )


def _model_outputs(family, state):
    x = torch.from_numpy(family.example_inputs(1, seed=2)["INPUT__0"])
    with torch.no_grad():
        return NnUNetFamily({**SMOKE, "output": "logits"}).serving_module({"model": state})(x)


def test_lightning_checkpoint_of_dle_dynunet_loads(family, tmp_path):
    state = family.init_state(4)["model"]
    ckpt = {
        "epoch": 7,
        "state_dict": {
            **{f"model.{k}": v for k, v in state.items()},
            "model.deep_supervision_heads.0.conv.conv.weight": torch.zeros(4, 16, 1, 1, 1),
            "loss.weight": torch.ones(1),  # another member of the Lightning module
        },
        "hyper_parameters": {"args": argparse.Namespace(dim=3, task="01")},
    }
    torch.save(ckpt, tmp_path / "nvidia_nnunet_pyt_ckpt_amp_3d_fold2.ckpt")
    loaded = family.read_checkpoint(tmp_path)  # a folder holding one .ckpt
    assert loaded["model"].keys() == state.keys()
    assert all(torch.equal(loaded["model"][k], v) for k, v in state.items())
    origin = prepare_checkpoint(family, str(tmp_path), 0, tmp_path / "out.pt")
    assert str(tmp_path) in origin
    written = load_checkpoint(tmp_path / "out.pt")["model"]
    assert all(torch.equal(written[k], v) for k, v in state.items())


def test_lightning_checkpoint_of_dle_2021_unet_loads(family, tmp_path):
    state = family.init_state(5)["model"]
    old = {
        f"model.{_dle_2021_name(k)}": v for k, v in state.items() if not k.startswith("skip_layers")
    }
    assert "model.input_block.conv1.norm.weight" in old
    assert "model.upsamples.0.transp_conv.bias" in old
    assert "model.output_block.conv.weight" in old
    old["model.deep_supervision_heads.1.conv.weight"] = torch.zeros(4, 32, 1, 1, 1)
    torch.save({"state_dict": old}, tmp_path / "old.ckpt")
    loaded = family.read_checkpoint(tmp_path / "old.ckpt")
    assert loaded["model"].keys() == state.keys()  # skip_layers aliases filled in
    torch.testing.assert_close(
        _model_outputs(family, loaded["model"]), _model_outputs(family, state)
    )


def test_checkpoint_that_does_not_fit_is_rejected(family, tmp_path):
    other = NnUNetFamily({**SMOKE, "filters": [8, 16, 32, 48]})
    torch.save({"state_dict": other.init_state(0)["model"]}, tmp_path / "x.ckpt")
    with pytest.raises(ValueError, match="does not fit the configured nnU-Net"):
        family.serving_module(family.read_checkpoint(tmp_path / "x.ckpt"))
    torch.save({"weights": 1}, tmp_path / "y.ckpt")
    with pytest.raises(ValueError, match="not a DLE nnU-Net checkpoint"):
        family.read_checkpoint(tmp_path / "y.ckpt")


def test_dice_known_answers():
    truth = np.array([[0, 1, 1, 2], [0, 0, 3, 3]])
    pred = np.array([[0, 1, 2, 2], [0, 3, 3, 0]])
    # case 0: class 1: TP 1, FN 1 → 2/3; class 2: TP 1, FP 1 → 2/3; class 3 absent from both → 1
    # case 1: classes 1, 2 absent from both → 1; class 3: TP 1, FP 1, FN 1 → 2/4
    np.testing.assert_allclose(
        dice_scores(pred, truth, [1, 2, 3]), [[2 / 3, 2 / 3, 1.0], [1.0, 1.0, 0.5]]
    )
    # predicted but absent from the truth → 0; present but missed → 0
    np.testing.assert_array_equal(dice_scores(np.array([[1, 0]]), np.array([[0, 0]]), [1]), [[0]])
    np.testing.assert_array_equal(dice_scores(np.array([[0, 0]]), np.array([[1, 0]]), [1]), [[0]])
    with pytest.raises(ValueError, match="shape"):
        dice_scores(pred, truth[:1], [1])


def test_task_metric_averages_cases_then_classes(family):
    truth = np.zeros((1, 2, 2, 2), dtype=np.int64)
    truth[0, 0] = 1  # class 1 fills the first slice; classes 2, 3 absent
    exact = truth.copy()
    wrong = np.full_like(truth, 2)  # misses class 1, predicts absent class 2
    metric = family.task_metric([{"OUTPUT__0": exact}, {"OUTPUT__0": wrong}], [truth, truth])
    # class 1: (1 + 0) / 2; class 2: (1 + 0) / 2; class 3: (1 + 1) / 2
    assert list(metric) == ["dice_mean", "dice_1", "dice_2", "dice_3"]
    assert metric["dice_1"] == 0.5 and metric["dice_2"] == 0.5 and metric["dice_3"] == 1.0
    assert metric["dice_mean"] == pytest.approx(2 / 3)
    scores = np.zeros((1, 4, 2, 2, 2), dtype=np.float32)
    scores[0, 1][truth[0] == 1] = 5.0  # served scores are reduced by arg-max
    assert family.task_metric([{"OUTPUT__0": scores}], [truth])["dice_mean"] == 1.0


def _write_case(folder, name, shape, seed):
    rng = np.random.default_rng(seed)
    image = rng.standard_normal((4, *shape)).astype(np.float32)
    label = rng.integers(0, 4, size=(1, *shape)).astype(np.uint8)
    np.save(folder / f"{name}_x.npy", image)
    np.save(folder / f"{name}_y.npy", label)
    return image, label


def test_dataset_reader_crops_and_pads_to_the_patch(family, tmp_path):
    image, label = _write_case(tmp_path, "BRATS_001", (30, 35, 32), seed=0)
    _write_case(tmp_path, "BRATS_002", (32, 32, 32), seed=1)
    batches = list(family.dataset_batches(tmp_path, batch_size=2, limit=None))
    assert len(batches) == 1
    feeds, labels = batches[0]
    x = feeds["INPUT__0"]
    assert x.shape == (2, 4, 32, 32, 32) and x.dtype == np.float32
    assert labels.shape == (2, 32, 32, 32) and labels.dtype == np.int64
    # depth 30 → padded by 1 each side; height 35 → cropped from offset 1; width kept
    np.testing.assert_array_equal(x[0, :, 1:31, :, :], image[:, :, 1:33, :])
    assert not x[0, :, 0].any() and not x[0, :, 31].any()
    np.testing.assert_array_equal(labels[0, 1:31], label[0, :, 1:33, :])
    assert not labels[0, 0].any()


def test_dataset_reader_takes_dles_validation_fold_and_limits(family, tmp_path):
    for i in range(7):
        _write_case(tmp_path, f"BRATS_{i:03d}", (32, 32, 32), seed=i)
    chosen = [p.name for p, _ in validation_cases(tmp_path)]
    expected = [f"BRATS_{i:03d}_x.npy" for i in kfold_validation_indices(7, 2, 5, 12345)]
    assert chosen == expected
    batches = list(family.dataset_batches(tmp_path, batch_size=1, limit=1))
    assert len(batches) == 1 and batches[0][1].shape == (1, 32, 32, 32)
    (tmp_path / "BRATS_003_y.npy").unlink()
    with pytest.raises(FileNotFoundError, match="BRATS_003_y.npy"):
        validation_cases(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"no pre-processed nnU-Net cases"):
        list(family.dataset_batches(tmp_path / "empty", 1, None))


def test_kfold_folds_partition_the_cases():
    folds = [kfold_validation_indices(23, f, 5, 12345) for f in range(5)]
    assert [len(f) for f in folds] == [5, 5, 5, 4, 4]
    assert sorted(i for f in folds for i in f) == list(range(23))
    assert all(f == sorted(f) for f in folds)
    assert folds[2] != list(range(10, 15))  # shuffled
