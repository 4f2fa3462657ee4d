import argparse

import numpy as np
import pytest
import torch

from deploybench.checkpoint import (
    load_checkpoint,
    prepare_checkpoint,
    read_workflow_checkpoint,
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
from tests.conftest import base_config
from tests.dle_fixtures import dle_fixture, seeded_values

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
    with pytest.raises(ValueError, match=r"not a nnU-Net checkpoint .*found keys: \['weights'\]"):
        family.read_checkpoint(tmp_path / "y.ckpt")


# DLE's nnU-Net checkpoints (tests/fixtures/dle/, listed from DLE's own code; `renamed`: DLE's
# 2021 UNet names): DLE's current code without and with its 3-D training recipe (deep
# supervision, channels-last), the seed page's 21.02 UNet, and DLE 21.11-22.03 (MONAI 0.8.0)
# with deep supervision.
DLE_CHECKPOINTS = [
    ("nnunet-3d-task01", False),
    ("nnunet-3d-task01-deep-supervision", False),
    ("nnunet-3d-task01-2021", True),
    ("nnunet-3d-task01-monai080-deep-supervision", False),
]
# DLE's Task01 depth (six levels: every fixture name exists) at 1/16 of its widths.
TINY = {
    "kernels": [3] * 6,
    "strides": [1, 2, 2, 2, 2, 2],
    "filters": [2, 4, 8, 16, 20, 20],
    "patch_size": [32, 32, 32],
}


def _tiny(shape):
    """A full-size shape at TINY: channel counts (32…320, and 512/640 where the decoder
    concatenates two levels) scaled by 1/16; kernels, the 4 modalities and classes and the
    metric states stay."""
    return [d // 16 if d >= 32 else d for d in shape]


def _dle_to_served(facts, served, renamed):
    """Where each tensor of DLE's Lightning state dict lands in the served DynUNet (None: not
    served), stated from the facts: the network is the LightningModule's ``model``; its
    deep-supervision heads (``deep_supervision_heads.*`` and their ``skip_layers…super_head``
    aliases) are training-only; DLE's 2021 names are ``_dle_2021_name`` of DynUNet's."""
    from_2021 = {_dle_2021_name(name): name for name in served}
    targets = {}
    for name in facts["parameters"]:
        network = name.removeprefix("model.")
        other_member = network == name  # of the LightningModule, e.g. 21.02's Dice states
        head = network.startswith("deep_supervision_heads.") or ".super_head." in network
        if other_member or head:
            targets[name] = None
        else:
            targets[name] = from_2021[network] if renamed else network
    return targets


def _dle_state(facts, shapes, seed):
    """DLE's Lightning state dict with seeded values: its aliases the same tensor as their
    first name (as DLE's module holds them), its channels-last tensors in that memory order."""
    state = seeded_values({n: s for n, s in shapes.items() if n not in facts["aliases"]}, seed)
    for name in facts["channels_last_3d"]:
        if name in state:
            state[name] = state[name].to(memory_format=torch.channels_last_3d)
    for alias, canonical in facts["aliases"].items():
        state[alias] = state[canonical]
    return {name: state[name] for name in facts["parameters"]}  # DLE's order


def _main_py_namespace(flags):
    """The ``argparse.Namespace`` DLE's NNUnet saves as hyper-parameters, from main.py flags."""
    tokens, values = flags.split(), {}
    for i, token in enumerate(tokens):
        if token.startswith("--"):
            following = tokens[i + 1] if i + 1 < len(tokens) else "--"
            values[token[2:]] = True if following.startswith("--") else following
    return argparse.Namespace(**values)


def _write_lightning_checkpoint(file, state, facts):
    """A ``.ckpt`` as DLE's ModelCheckpoint saves it: the LightningModule's state dict beside
    Lightning's bookkeeping and NNUnet's ``save_hyperparameters()`` (main.py's namespace)."""
    init_args = {"args": _main_py_namespace(facts["main_py_args"]), "triton": False}
    hparams = {k: init_args.get(k) for k in facts["hyper_parameters"]}
    file.parent.mkdir(parents=True, exist_ok=True)
    torch.save(
        {
            "epoch": 0,
            "global_step": 0,
            "pytorch-lightning_version": facts["pytorch_lightning"],
            "state_dict": state,
            "optimizer_states": [],
            "lr_schedulers": [],
            "hyper_parameters": hparams,
        },
        file,
    )
    return file


@pytest.mark.parametrize(("fixture", "renamed"), DLE_CHECKPOINTS)
def test_dle_names_and_shapes_fit_the_full_size_network(fixture, renamed):
    facts = dle_fixture(fixture)
    family = NnUNetFamily(base_config()["models"]["nnunet"]["hparams"])
    with torch.device("meta"):
        expected = family.build().state_dict()
        state = {name: torch.empty(shape) for name, shape in facts["parameters"].items()}
    for alias, canonical in facts["aliases"].items():
        state[alias] = state[canonical]
    targets = _dle_to_served(facts, expected, renamed)
    # As the Lightning checkpoint holds it, and as the generic reader passes it on (the
    # LightningModule's `model.` prefix stripped, its other members dropped).
    network = {k.removeprefix("model."): v for k, v in state.items() if k.startswith("model.")}
    for given in (state, network):
        adapted = family.adapt_state_dict(given)
        assert adapted.keys() == expected.keys()
        assert all(adapted[k].shape == expected[k].shape for k in expected)
        for name, target in targets.items():
            assert target is None or adapted[target] is state[name], name


def test_dle_recipe_saves_the_deep_supervision_heads_twice():
    # The four keys: MONAI's DynUNet registers DLE's two heads (deep_supr_num 2)
    # again inside skip_layers; the recipe's 5-D weights are saved channels-last.
    facts = dle_fixture("nnunet-3d-task01-deep-supervision")
    assert {a: c for a, c in facts["aliases"].items() if "super_head" in a} == {
        f"model.skip_layers.{'next_layer.' * (i + 1)}super_head.conv.conv.{p}": (
            f"model.deep_supervision_heads.{i}.conv.conv.{p}"
        )
        for i in (0, 1)
        for p in ("weight", "bias")
    }
    assert "model.input_block.conv1.conv.weight" in facts["channels_last_3d"]


@pytest.mark.parametrize(("fixture", "renamed"), DLE_CHECKPOINTS)
def test_dle_lightning_checkpoint_lands_every_tensor(fixture, renamed, tmp_path):
    facts = dle_fixture(fixture)
    family = NnUNetFamily(TINY)
    shapes = {name: _tiny(shape) for name, shape in facts["parameters"].items()}
    state = _dle_state(facts, shapes, seed=7)
    if renamed:  # the seed page's NGC file, in a folder of its own
        source = tmp_path / "ngc" / "nvidia_nnunet_pyt_ckpt_amp_3d_fold2.ckpt"
        _write_lightning_checkpoint(source, state, facts)
        source = source.parent
    else:  # DLE's ModelCheckpoint(filename="{epoch}-{dice:.2f}")
        source = _write_lightning_checkpoint(tmp_path / "epoch=0-dice=0.00.ckpt", state, facts)
    if facts["channels_last_3d"]:  # the file really holds channels-last strides
        saved = torch.load(next(tmp_path.rglob("*.ckpt")), weights_only=False)["state_dict"][
            facts["channels_last_3d"][0]
        ]
        assert not saved.is_contiguous()
        assert saved.is_contiguous(memory_format=torch.channels_last_3d)

    origin = prepare_checkpoint(family, str(source), 0, tmp_path / "out.pt")
    assert origin == f"checkpoint {source}"
    written = read_workflow_checkpoint(family, tmp_path / "out.pt")["model"]
    model = family.serving_module({"model": written}).model
    served = model.state_dict()
    targets = _dle_to_served(facts, served, renamed)
    # Every tensor of the network is given (DynUNet's skip_layers aliases: the same tensors).
    canonical = {n for n, _ in model.named_parameters()} | {n for n, _ in model.named_buffers()}
    assert canonical <= set(targets.values()) <= set(served) | {None}
    for name, target in targets.items():
        if target is not None:
            assert torch.equal(served[target], state[name]), f"{name} → {target}"
    # The workflow's checkpoint: standard layout, each aliased tensor stored once.
    assert all(t.is_contiguous() for t in written.values())
    assert (
        written["skip_layers.next_layer.downsample.conv1.conv.weight"].data_ptr()
        == written["downsamples.0.conv1.conv.weight"].data_ptr()
    )


def _dle_dynunet(deep_supervision, res_block=False):
    """MONAI's DynUNet at the smoke size with the arguments DLE's ``nnunet/nn_unet.py``
    (729963dd) passes, ``deep_supr_num`` its default 2: DLE's network."""
    from monai.networks.nets import DynUNet

    strides = [[s] * 3 for s in SMOKE["strides"]]
    return DynUNet(
        3, 4, 4, [[k] * 3 for k in SMOKE["kernels"]], strides, strides[1:],
        filters=SMOKE["filters"], norm_name=("INSTANCE", {"affine": True}),
        act_name=("leakyrelu", {"inplace": False, "negative_slope": 0.01}),
        deep_supervision=deep_supervision, deep_supr_num=2, res_block=res_block, trans_bias=True,
    )  # fmt: skip


@pytest.mark.parametrize("channels_last", [False, True])
def test_dle_deep_supervision_network_serves_dles_outputs(channels_last, tmp_path):
    torch.manual_seed(3)
    dle = _dle_dynunet(deep_supervision=True)
    with torch.no_grad():  # every tensor away from its init, so each one matters
        for p in dle.parameters():
            p.add_(0.1 * torch.randn_like(p))
    if channels_last:  # DLE's --layout NDHWC
        dle.to(memory_format=torch.channels_last_3d)
    state = {f"model.{k}": v for k, v in dle.state_dict().items()}
    assert sum("super_head" in k for k in state) == 4
    assert state["model.input_block.conv1.conv.weight"].is_contiguous() != channels_last
    torch.save({"state_dict": state, "pytorch-lightning_version": "1.7.7"}, tmp_path / "a.ckpt")
    family = NnUNetFamily({**SMOKE, "output": "logits"})
    prepare_checkpoint(family, str(tmp_path / "a.ckpt"), 0, tmp_path / "out.pt")
    served = family.serving_module(read_workflow_checkpoint(family, tmp_path / "out.pt"))
    x = torch.from_numpy(family.example_inputs(1, seed=4)["INPUT__0"])
    with torch.no_grad():
        expected = dle.eval()(x)  # DLE serves in eval mode: the main output only
        torch.testing.assert_close(served(x), expected, rtol=1e-4, atol=1e-5)


def test_dle_checkpoint_of_another_architecture_is_rejected_naming_keys(family, tmp_path):
    # DLE's recipe at Task01's six levels into the four-level smoke network.
    facts = dle_fixture("nnunet-3d-task01-deep-supervision")
    shapes = {name: _tiny(shape) for name, shape in facts["parameters"].items()}
    _write_lightning_checkpoint(tmp_path / "a.ckpt", _dle_state(facts, shapes, 0), facts)
    with pytest.raises(ValueError, match="does not fit the configured nnU-Net") as err:
        prepare_checkpoint(family, str(tmp_path / "a.ckpt"), 0, tmp_path / "out.pt")
    assert "unexpected (" in str(err.value) and "downsamples.2.conv1.conv.weight" in str(err.value)
    assert "super_head" not in str(err.value)  # training-only heads are not the problem
    # DLE's --res_block network (UnetResBlock: a third conv and norm per level).
    res = _dle_dynunet(deep_supervision=False, res_block=True)
    torch.save({"state_dict": {f"model.{k}": v for k, v in res.state_dict().items()}},
               tmp_path / "b.ckpt")  # fmt: skip
    with pytest.raises(ValueError, match=r"unexpected \(\d+\): bottleneck\.conv3\.conv\.weight"):
        prepare_checkpoint(family, str(tmp_path / "b.ckpt"), 0, tmp_path / "out.pt")
    assert not (tmp_path / "out.pt").exists()


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
