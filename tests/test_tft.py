import hashlib
import pickle
import sys
import types

import numpy as np
import pytest
import torch

from deploybench.checkpoint import load_checkpoint, prepare_checkpoint, write_seeded_checkpoint
from deploybench.export import export_model
from deploybench.models import load_family
from deploybench.runtime import load_runner
from tests.dle_fixtures import (
    dle_fixture,
    seeded_values,
    tft_reference_checkpoint,
    write_tft_train_checkpoint,
)


@pytest.fixture(scope="module")
def family():
    from tests.conftest import base_config

    return load_family("tft", base_config()["models"]["tft"]["hparams"])


def test_electricity_signature_is_dles(family):
    names = [s.name for s in family.inputs]
    assert names == [
        "s_cat__0",
        "s_cont__1",
        "k_cat__2",
        "k_cont__3",
        "o_cat__4",
        "o_cont__5",
        "target__6",
        "id__7",
    ]
    shapes = {s.name: s.shape for s in family.inputs}
    assert shapes["k_cont__3"] == (192, 3) and shapes["target__6"] == (192, 1)
    assert shapes["s_cont__1"] == (1,)  # absent group: one column
    assert [(o.name, o.shape) for o in family.outputs] == [("target__0", (24, 3))]


def test_state_dict_uses_dle_checkpoint_names(family):
    keys = set(family.init_state(0)["model"])
    for key in [
        "embedding.s_cat_embed.0.weight",
        "embedding.t_cont_k_embedding_vectors",
        "embedding.t_tgt_embedding_bias",
        "static_encoder.vsn.joint_grn.lin_a.weight",
        "static_encoder.context_grns.3.glu.lin.weight",
        "history_vsn.var_grns.3.lin_i.weight",
        "history_encoder.weight_ih_l0",
        "future_encoder.weight_hh_l0",
        "attention.qkv_linears.weight",
        "attention._mask",
        "decoder_ln.weight",
        "quantile_proj.bias",
    ]:
        assert key in keys, key
    # joint GRN of a single static variable has no layer norm (width one), as in DLE
    assert not any(k.startswith("static_encoder.vsn.joint_grn.layer_norm") for k in keys)


def test_forward_is_causal_in_the_future_targets(family):
    """Targets after the encoder window must not influence the forecast."""
    model = family.serving_module(family.init_state(0))
    feeds = family.example_inputs(2, seed=3)
    args = [torch.from_numpy(feeds[s.name]) for s in family.inputs]
    with torch.no_grad():
        base = model(*args)
        args[6] = args[6].clone()
        args[6][:, 168:] += 100.0
        changed = model(*args)
    assert base.shape == (2, 24, 3)
    assert torch.allclose(base, changed)


def test_seeded_checkpoint_is_byte_identical(family, tmp_path):
    digests = []
    for name in ("a.pt", "b.pt"):
        write_seeded_checkpoint(family, 0, tmp_path / name)
        digests.append(hashlib.sha256((tmp_path / name).read_bytes()).hexdigest())
    write_seeded_checkpoint(family, 1, tmp_path / "c.pt")
    assert digests[0] == digests[1]
    assert hashlib.sha256((tmp_path / "c.pt").read_bytes()).hexdigest() != digests[0]


def test_dle_checkpoint_with_foreign_config_class_loads(family, tmp_path):
    """DLE pickles its config class; it must load without DLE's source tree."""
    fake = types.ModuleType("configuration")

    class ElectricityConfig:
        def __init__(self):
            self.hidden_size = 128

    ElectricityConfig.__module__ = "configuration"
    ElectricityConfig.__qualname__ = "ElectricityConfig"
    fake.ElectricityConfig = ElectricityConfig
    sys.modules["configuration"] = fake
    try:
        state = family.init_state(5)
        folder = tmp_path / "electricity_bin"
        folder.mkdir()
        torch.save(
            {"model": state["model"], "config": ElectricityConfig()}, folder / "checkpoint.pt"
        )
    finally:
        del sys.modules["configuration"]
    loaded = load_checkpoint(folder)  # a DLE checkpoint directory
    for key, value in state["model"].items():
        assert torch.equal(loaded["model"][key], value)
    origin = prepare_checkpoint(family, str(folder), 0, tmp_path / "out.pt")
    assert str(folder) in origin


def test_checkpoint_errors_are_clear(family, tmp_path):
    with pytest.raises(FileNotFoundError, match="not found"):
        load_checkpoint(tmp_path / "missing")
    small = load_family(
        "tft",
        {
            "static_categorical_inp_lens": [10],
            "temporal_known_continuous_inp_size": 3,
            "hidden_size": 16,
        },
    )
    with pytest.raises(ValueError, match="does not fit the configured TFT hyper-parameters"):
        family.serving_module(small.init_state(0))
    (tmp_path / "junk.pt").write_bytes(pickle.dumps([1, 2]))
    with pytest.raises(ValueError, match="not a readable checkpoint"):
        load_checkpoint(tmp_path / "junk.pt")
    write_seeded_checkpoint(family, 0, tmp_path / "whole.pt")
    data = (tmp_path / "whole.pt").read_bytes()
    (tmp_path / "truncated.pt").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="not a readable checkpoint"):
        load_checkpoint(tmp_path / "truncated.pt")
    torch.save([1, 2], tmp_path / "list.pt")
    with pytest.raises(ValueError, match="not a DLE-layout checkpoint"):
        load_checkpoint(tmp_path / "list.pt")


@pytest.mark.parametrize(("fmt", "runtime"), [("onnx", "onnxruntime"), ("ts-trace", "torchscript")])
def test_export_loads_in_runtime_and_matches(family, tmp_path, fmt, runtime):
    tolerance = {"target__0": {"atol": 1e-4, "rtol": 1e-3}}
    out = tmp_path / f"model.{fmt}"
    report = export_model(family, family.init_state(0), fmt, "fp32", out, tolerance=tolerance)
    assert report["runtime"] == runtime and all(c["passed"] for c in report["checks"])
    runner = load_runner(
        runtime, out, input_names=[s.name for s in family.inputs], output_names=["target__0"]
    )
    feeds = family.example_inputs(5, seed=11)  # a batch size the export never saw
    model = family.serving_module(family.init_state(0))
    with torch.no_grad():
        expected = model(*(torch.from_numpy(feeds[s.name]) for s in family.inputs)).numpy()
    np.testing.assert_allclose(runner(feeds)[0], expected, atol=1e-4, rtol=1e-3)
    assert not list(tmp_path.glob(".*.tmp"))  # no temporary left behind


def test_export_rejects_bad_format_without_output(family, tmp_path):
    with pytest.raises(
        ValueError,
        match="unknown export format 'tflite' for a pytorch model; valid choices: onnx, ts-script, ts-trace",
    ):
        export_model(family, family.init_state(0), "tflite", "fp32", tmp_path / "m", tolerance={})
    assert not any(tmp_path.iterdir())


# --------------------------------------------------------------------------------------------
# Checkpoints as DLE's train.py writes them (names and shapes from DLE's own modeling.py)

DLE_LAYOUTS = ("flat", "TFTpart2")


@pytest.mark.parametrize("model", ["tft", "tft_traffic"])
@pytest.mark.parametrize("layout", DLE_LAYOUTS)
def test_dle_names_and_shapes_map_one_to_one(model, layout):
    from tests.conftest import base_config

    dataset = {"tft": "electricity", "tft_traffic": "traffic"}[model]
    facts = dle_fixture(f"tft-{dataset}")["layouts"][layout]
    dle_shapes = {**facts["parameters"], **facts["buffers"]}
    assert len(dle_shapes) == 174
    assert sum(k.startswith("TFTpart2.") for k in dle_shapes) == (120 if layout != "flat" else 0)
    family = load_family("tft", base_config()["models"][model]["hparams"])
    with torch.device("meta"):
        ours = {k: list(v.shape) for k, v in family.build().state_dict().items()}
    mapped = family.adapt_state_dict(dle_shapes)
    assert mapped == ours


@pytest.mark.parametrize("layout", DLE_LAYOUTS)
def test_dle_checkpoint_gives_dles_outputs(layout, tmp_path):
    """Weights in DLE's names land where the names say: DLE's own forward pass on the same
    weights and inputs (recorded in the fixture) is reproduced through the workflow's path."""
    ref, family, state = tft_reference_checkpoint(layout)
    folder = write_tft_train_checkpoint(tmp_path / "electricity_bin", state)
    origin = prepare_checkpoint(family, str(folder), 0, tmp_path / "out.pt")
    assert origin == f"checkpoint {folder}"
    written = load_checkpoint(tmp_path / "out.pt")["model"]
    for name, value in state.items():
        assert torch.equal(written[name.removeprefix("TFTpart2.")], value), name
    module = family.serving_module({"model": written})
    feeds = {k: np.asarray(v["values"], dtype=v["dtype"]) for k, v in ref["inputs"].items()}
    out = family.framework_outputs(module, feeds)["target__0"]
    np.testing.assert_allclose(out, np.asarray(ref["output"]["values"]), rtol=1e-5, atol=1e-6)


def test_dle_checkpoint_of_another_architecture_names_its_keys(tmp_path):
    _, family, state = tft_reference_checkpoint("TFTpart2")
    traffic_like = {**state, "TFTpart2.history_vsn.var_grns.4.lin_a.weight": torch.zeros(16, 16)}
    del traffic_like["TFTpart2.quantile_proj.bias"]
    folder = write_tft_train_checkpoint(tmp_path / "x", traffic_like)
    with pytest.raises(ValueError) as err:
        prepare_checkpoint(family, str(folder), 0, tmp_path / "out.pt")
    message = str(err.value)
    assert "does not fit the configured TFT hyper-parameters" in message
    assert "missing (1): quantile_proj.bias" in message
    assert "unexpected (1): history_vsn.var_grns.4.lin_a.weight" in message
    assert not (tmp_path / "out.pt").exists()


@pytest.mark.parametrize("model", ["tft", "tft_traffic"])
def test_full_size_dle_checkpoint_lands_name_by_name(model, tmp_path):
    """Electricity and traffic at their full sizes, in DLE 23.04+'s layout: every tensor of the
    checkpoint is read back from the served module under the name it had in DLE."""
    from tests.conftest import base_config

    dataset = {"tft": "electricity", "tft_traffic": "traffic"}[model]
    facts = dle_fixture(f"tft-{dataset}")["layouts"]["TFTpart2"]
    family = load_family("tft", base_config()["models"][model]["hparams"])
    state = seeded_values(facts["parameters"], 3)
    [mask] = facts["buffers"]
    state[mask] = family.init_state(0)["model"][mask.removeprefix("TFTpart2.")]
    folder = write_tft_train_checkpoint(tmp_path / f"{dataset}_bin", state)
    prepare_checkpoint(family, str(folder), 0, tmp_path / "out.pt")
    served = family.serving_module(load_checkpoint(tmp_path / "out.pt"))
    weights = served.model.state_dict()
    for name, value in state.items():
        assert torch.equal(weights[name.removeprefix("TFTpart2.")], value), name
