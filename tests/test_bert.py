import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from deploybench.checkpoint import load_checkpoint, prepare_checkpoint, read_workflow_checkpoint
from deploybench.export import export_model
from deploybench.models.bert import (
    BertFamily,
    BertQAConfig,
    DLEGelu,
    SquadExample,
    SquadFeature,
    best_span,
    dle_to_hf_names,
    exact_match_score,
    f1_score,
    max_context_flags,
    normalize_answer,
    read_vocab,
    sliding_windows,
    squad_scores,
)
from deploybench.runtime import load_runner
from tests.dle_fixtures import dle_fixture, seeded_values

FIXTURES = Path(__file__).parent / "fixtures" / "bert"
TINY = {
    "vocab_size": 128,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "intermediate_size": 64,
    "max_seq_length": 48,
    "max_query_length": 16,
}
# Windows small enough that the fixture's longer paragraph is split in several.
WINDOWED = {**TINY, "max_seq_length": 24, "max_query_length": 8, "doc_stride": 4}
TOLERANCE = {"output__0": {"atol": 1e-4, "rtol": 1e-3}, "output__1": {"atol": 1e-4, "rtol": 1e-3}}
OUTPUTS = ["output__0", "output__1"]


@pytest.fixture(scope="module")
def family():
    return BertFamily(TINY)


@pytest.fixture(scope="module")
def state(family):
    return family.init_state(0)


def test_signature_is_dles(family):
    assert [(s.name, s.dtype, s.shape) for s in BertFamily({}).inputs] == [
        ("input__0", "int32", (384,)),
        ("input__1", "int32", (384,)),
        ("input__2", "int32", (384,)),
    ]
    assert [(s.name, s.dtype, s.shape) for s in BertFamily({}).outputs] == [
        ("output__0", "float32", (384,)),
        ("output__1", "float32", (384,)),
    ]
    assert family.metric_name == "f1" and family.higher_is_better


def test_config_is_checked_and_vocab_padded_as_dle():
    assert BertQAConfig().padded_vocab_size == 30528  # DLE's large.json
    assert BertQAConfig(vocab_size=30522).padded_vocab_size == 30528
    with pytest.raises(ValueError, match="unknown BERT hyper-parameters"):
        BertFamily({"hidden": 8})
    with pytest.raises(ValueError, match="not divisible"):
        BertFamily({**TINY, "num_attention_heads": 3})
    with pytest.raises(ValueError, match="exceeds max_position_embeddings"):
        BertFamily({**TINY, "max_seq_length": 1024})
    model = BertFamily({**TINY, "vocab_size": 130}).build()
    assert model.bert.embeddings.word_embeddings.weight.shape == (136, 32)


def test_init_is_deterministic(family, state):
    again, other = family.init_state(0)["model"], family.init_state(1)["model"]
    assert state["model"].keys() == again.keys()
    assert all(torch.equal(v, again[k]) for k, v in state["model"].items())
    key = "bert.encoder.layer.1.attention.self.query.weight"
    assert not torch.equal(state["model"][key], other[key])


def test_example_inputs_look_like_squad_features(family):
    feeds = family.example_inputs(6, seed=3)
    assert set(feeds) == {"input__0", "input__1", "input__2"}
    ids, segments, mask = feeds["input__0"], feeds["input__1"], feeds["input__2"]
    assert all(a.dtype == np.int32 and a.shape == (6, 48) for a in feeds.values())
    assert (ids[:, 0] == 101).all() and ids.max() < 128
    for row in range(6):
        used = int(mask[row].sum())
        assert (mask[row, :used] == 1).all() and (mask[row, used:] == 0).all()
        assert (ids[row, used:] == 0).all() and ids[row, used - 1] == 102
        context = np.flatnonzero(segments[row])
        # one contiguous context segment ending at the last [SEP], after the question's [SEP]
        assert context[-1] == used - 1 and (np.diff(context) == 1).all()
        assert ids[row, context[0] - 1] == 102
    assert len({int(m.sum()) for m in mask}) > 1  # rows differ in length
    np.testing.assert_array_equal(ids, family.example_inputs(6, seed=3)["input__0"])
    assert not np.array_equal(ids, family.example_inputs(6, seed=4)["input__0"])


def test_logits_shapes_and_padding_is_ignored(family, state):
    model = family.serving_module(state)
    feeds = family.example_inputs(3, seed=5)
    out = family.framework_outputs(model, feeds)
    assert [(k, v.shape, v.dtype) for k, v in out.items()] == [
        ("output__0", (3, 48), np.float32),
        ("output__1", (3, 48), np.float32),
    ]
    changed = {k: v.copy() for k, v in feeds.items()}
    changed["input__0"][feeds["input__2"] == 0] = 77  # other tokens behind the mask
    again = family.framework_outputs(model, changed)
    valid = feeds["input__2"] == 1
    for name in OUTPUTS:
        np.testing.assert_allclose(again[name][valid], out[name][valid], atol=1e-5)


def test_serving_module_holds_the_checkpoint_weights_once(family, state):
    """The memory design: parameters are the checkpoint's tensors, not copies."""
    model = family.serving_module(state)
    params = dict(model.model.named_parameters())
    assert all(p.data_ptr() == state["model"][k].data_ptr() for k, p in params.items())
    assert not any(p.requires_grad for p in params.values())


def _as_dle(hf_state: dict[str, torch.Tensor], hidden: int) -> dict[str, torch.Tensor]:
    """The state dict DLE's modeling.py writes for the same network (AMP-trained: fp16)."""
    dle = {
        k.replace(".intermediate.dense.", ".intermediate.dense_act."): v.half()
        for k, v in hf_state.items()
    }
    dle["bert.pooler.dense_act.weight"] = torch.zeros(hidden, hidden, dtype=torch.half)
    dle["bert.pooler.dense_act.bias"] = torch.zeros(hidden, dtype=torch.half)
    return dle


def test_dle_checkpoint_names_load(family, state, tmp_path):
    dle = _as_dle(state["model"], 32)
    assert "bert.encoder.layer.0.intermediate.dense_act.weight" in dle
    torch.save({"model": {f"module.{k}": v for k, v in dle.items()}}, tmp_path / "qa.pt")
    loaded = family.read_checkpoint(tmp_path / "qa.pt")
    assert loaded["model"].keys() == state["model"].keys()
    assert all(v.dtype == torch.float32 for v in loaded["model"].values())
    feeds = family.example_inputs(2, seed=1)
    expected = family.framework_outputs(
        family.serving_module({"model": {k: v.half().float() for k, v in state["model"].items()}}),
        feeds,
    )
    actual = family.framework_outputs(family.serving_module(loaded), feeds)
    for name in OUTPUTS:
        np.testing.assert_array_equal(actual[name], expected[name])
    wrong = BertFamily({**TINY, "num_hidden_layers": 3})
    with pytest.raises(ValueError, match="does not fit the configured BERT hyper-parameters"):
        wrong.serving_module(loaded)


@pytest.mark.parametrize(("fmt", "runtime"), [("onnx", "onnxruntime"), ("ts-trace", "torchscript")])
def test_export_loads_in_runtime_and_matches(family, state, tmp_path, fmt, runtime):
    out = tmp_path / f"model.{fmt}"
    report = export_model(family, state, fmt, "fp32", out, tolerance=TOLERANCE)
    assert report["runtime"] == runtime and all(c["passed"] for c in report["checks"])
    runner = load_runner(
        runtime, out, input_names=[s.name for s in family.inputs], output_names=OUTPUTS
    )
    feeds = family.example_inputs(5, seed=11)  # a batch size the export never saw
    expected = family.framework_outputs(family.serving_module(state), feeds)
    for name, got in zip(OUTPUTS, runner(feeds), strict=True):
        np.testing.assert_allclose(got, expected[name], atol=1e-4, rtol=1e-3)


# ----------------------------------------------------------------------------- SQuAD metric


def test_official_normalisation_and_scores():
    assert normalize_answer("The  Cat, sat!") == "cat sat"
    assert normalize_answer("an apple a day") == "apple day"
    assert normalize_answer("Theory") == "theory"  # articles only as whole words
    assert exact_match_score("the Eiffel Tower.", "Eiffel tower") == 1.0
    # pred {cat, sat, on, mat} vs truth {cat, sat, on, hat}: precision = recall = 3/4
    assert f1_score("the cat sat on the mat", "a cat sat on a hat") == pytest.approx(0.75)
    # repeated tokens count as often as they occur in both
    assert f1_score("paris paris", "paris") == pytest.approx(2 * 0.5 * 1 / 1.5)
    assert f1_score("", "paris") == 0.0 and f1_score("the", "a") == 0.0
    examples = [
        SquadExample("a", "q", "c", ("in 1889", "1889")),
        SquadExample("b", "q", "c", ("Warsaw",)),
        SquadExample("c", "q", "c", ("x",)),  # unanswered: scores 0
    ]
    scores = squad_scores({"a": "1889", "b": "born in Warsaw"}, examples)
    assert list(scores) == ["f1", "exact_match"]
    assert scores["exact_match"] == pytest.approx(100 / 3)
    assert scores["f1"] == pytest.approx(100 * (1 + 2 * (1 / 3) / (1 / 3 + 1)) / 3)


def test_windows_and_max_context_follow_run_squad():
    assert sliding_windows(10, 4, 2) == [(0, 4), (2, 4), (4, 4), (6, 4)]
    assert sliding_windows(3, 4, 2) == [(0, 3)]
    assert sliding_windows(0, 4, 2) == [(0, 0)]
    # run_squad's docstring example: "bought" (token 7) has most context in span C
    windows = [(0, 5), (3, 5), (6, 5)]
    flags = max_context_flags(windows, 11)
    assert not flags[1][7 - 3] and flags[2][7 - 6]
    # every token is claimed by exactly one window
    claimed = np.zeros(11, dtype=int)
    for (start, length), f in zip(windows, flags, strict=True):
        claimed[start : start + length] += f
    assert (claimed == 1).all()


def test_best_span_applies_run_squads_rules():
    cfg = BertQAConfig(**{**TINY, "max_answer_length": 2, "n_best_size": 3})
    example = SquadExample("q", "?", "ab cd ef gh ij", ("cd",))
    spans = np.array([[0, 2], [3, 5], [6, 8], [9, 11], [12, 14]], dtype=np.int32)
    feature = SquadFeature(example, 3, spans, np.array([1, 1, 0, 1, 1], dtype=bool))
    start, end = np.zeros(10, np.float32), np.zeros(10, np.float32)
    start[1] = 9.0  # a question token: never an answer
    start[5], end[5] = 8.0, 6.0  # context token 2: another window's (not max context)
    start[4], end[4] = 5.0, 5.0  # context token 1
    end[7] = 7.0  # context token 4: 1..4 would be 4 tokens, over max_answer_length
    assert best_span(start, end, feature, cfg) == (11.0, 1, 2)
    start[7] = 6.0  # pushes token 1 out of the 3 best starts; 4..4 wins, 4..2 is backwards
    assert best_span(start, end, feature, cfg) == (13.0, 4, 4)
    end[7] = 0.0  # left: only spans ending before token 4 starts
    assert best_span(start, end, feature, cfg) is None
    start[:] = end[:] = 0.0
    start[3:8], end[3:8] = -1.0, -1.0  # top logits all outside the context
    assert best_span(start, end, feature, cfg) is None


def _answer_logits(feature: SquadFeature, seq: int) -> tuple[np.ndarray, np.ndarray]:
    """Logits that point at the first ground truth where this window holds it with the most
    context; elsewhere small noise."""
    rng = np.random.default_rng(0)
    start, end = rng.normal(0, 0.1, seq), rng.normal(0, 0.1, seq)
    example = feature.example
    first_char = example.context.find(example.answers[0])
    last_char = first_char + len(example.answers[0])
    first = np.flatnonzero(feature.spans[:, 0] == first_char)
    last = np.flatnonzero(feature.spans[:, 1] == last_char)
    if len(first) and len(last) and feature.max_context[first[0]]:
        start[feature.context_start + first[0]] = 10.0
        end[feature.context_start + last[0]] = 10.0
    return start.astype(np.float32), end.astype(np.float32)


def test_reader_and_decoding_on_the_fixture():
    family = BertFamily(WINDOWED)
    batches = list(family.dataset_batches(FIXTURES, batch_size=4, limit=None))
    features = [f for _, labels in batches for f in labels]
    assert [len(labels) for _, labels in batches] == [4, 4]  # 1 + 1 + 6 windows
    assert [f.example.qas_id for f in features[:3]] == ["q-when", "q-what", "q-born"]
    feeds = batches[0][0]
    assert all(v.dtype == np.int32 and v.shape == (4, 24) for v in feeds.values())
    ids = feeds["input__0"][0]
    assert ids[0] == 2 and ids[-3] == 3 and (ids[-2:] == 0).all()  # [CLS] … [SEP] [PAD] [PAD]
    assert features[0].context_start == 9  # [CLS] + 7 question tokens + [SEP]
    assert (feeds["input__1"][0, 9:22] == 1).all() and (feeds["input__1"][0, :9] == 0).all()

    labels = [batch_labels for _, batch_labels in batches]
    outputs = []
    for batch_labels in labels:
        starts, ends = zip(*(_answer_logits(f, 24) for f in batch_labels), strict=True)
        outputs.append({"output__0": np.stack(starts), "output__1": np.stack(ends)})
    # "Eiffel" is [UNK] in the fixture vocabulary: offsets still give the original text
    assert family.task_metric(outputs, labels) == {"f1": 100.0, "exact_match": 100.0}
    # one answer off by a word: "The Eiffel Tower was" vs "The Eiffel Tower" → F1 = 0.8
    what = next(i for i, f in enumerate(labels[0]) if f.example.qas_id == "q-what")
    end = outputs[0]["output__1"][what]
    end[int(np.argmax(end)) + 1] = 20.0
    scores = family.task_metric(outputs, labels)
    assert scores["exact_match"] == pytest.approx(200 / 3)
    assert scores["f1"] == pytest.approx(100 * (2 + 0.8) / 3)


def test_reader_limit_layouts_and_errors(tmp_path):
    family = BertFamily(WINDOWED)
    [(_, labels)] = family.dataset_batches(FIXTURES, batch_size=8, limit=2)
    assert [f.example.qas_id for f in labels] == ["q-when", "q-what"]
    # DLE's datasets directory layout
    squad = tmp_path / "data" / "squad" / "v1.1"
    vocab = tmp_path / "data" / "google_pretrained_weights" / "uncased_L-24_H-1024_A-16"
    squad.mkdir(parents=True)
    vocab.mkdir(parents=True)
    shutil.copy(FIXTURES / "dev-v1.1.json", squad)
    shutil.copy(FIXTURES / "vocab.txt", vocab)
    assert len(list(family.dataset_batches(tmp_path, batch_size=8, limit=None))) == 1
    with pytest.raises(FileNotFoundError, match="expected dev-v1.1.json and vocab.txt"):
        next(family.dataset_batches(tmp_path / "data", batch_size=8, limit=None))
    # a vocabulary larger than the network's embedding
    big = tmp_path / "big"
    big.mkdir()
    shutil.copy(FIXTURES / "dev-v1.1.json", big)
    (big / "vocab.txt").write_text("\n".join(f"w{i}" for i in range(200)) + "\n")
    with pytest.raises(ValueError, match="200 tokens but the network's vocabulary has 128"):
        next(family.dataset_batches(big, batch_size=8, limit=None))


def test_vocab_ids_are_line_numbers(tmp_path):
    # U+0085 is a line break to str.splitlines, not to vocab.txt
    (tmp_path / "vocab.txt").write_text("[PAD]\n\u0085\n##x\r\n", encoding="utf-8")
    assert read_vocab(tmp_path / "vocab.txt") == {"[PAD]": 0, "\u0085": 1, "##x": 2}
    (tmp_path / "dup.txt").write_text("a\nb\na\n")
    with pytest.raises(ValueError, match="repeated word pieces"):
        read_vocab(tmp_path / "dup.txt")


def test_task_metric_on_served_logits(family, state):
    """End to end at smoke size: a random network answers something, scored in [0, 100]."""
    model = family.serving_module(state)
    outputs, labels = [], []
    for feeds, batch_labels in family.dataset_batches(FIXTURES, batch_size=2, limit=None):
        outputs.append(family.framework_outputs(model, feeds))
        labels.append(batch_labels)
    scores = family.task_metric(outputs, labels)
    assert list(scores) == ["f1", "exact_match"]
    assert all(0.0 <= v <= 100.0 for v in scores.values())


def test_fixture_answers_are_in_their_contexts():
    data = json.loads((FIXTURES / "dev-v1.1.json").read_text())["data"]
    for article in data:
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                for answer in qa["answers"]:
                    start, text = answer["answer_start"], answer["text"]
                    assert paragraph["context"][start : start + len(text)] == text


def test_dle_checkpoint_file_loads_through_the_workflow_loader(family, state, tmp_path):
    """A DLE-style checkpoint file (``{"model": state_dict}``) reads with the shared loader."""
    torch.save({"model": _as_dle(state["model"], 32)}, tmp_path / "bert_large_qa.pt")
    raw = load_checkpoint(tmp_path / "bert_large_qa.pt")
    assert "bert.pooler.dense_act.weight" in raw["model"]
    assert "bert.pooler.dense.weight" not in family.adapt_state_dict(raw["model"])


# ----------------------------------------------------------------------------- DLE checkpoints
# tests/fixtures/dle/bert-large-qa.json: DLE's BertForQuestionAnswering names and shapes at
# large.json, and DLE's own logits at TINY for seeded weights, per GELU release (its "source").

DLE = dle_fixture("bert-large-qa")
DLE_REF = DLE["reference"]
DLE_POOLER = {"bert.pooler.dense_act.weight", "bert.pooler.dense_act.bias"}


def _dle_weights() -> dict[str, torch.Tensor]:
    """The reference's weights, by DLE's names at the reference's (smoke) size."""
    values = seeded_values(DLE_REF["parameters"], DLE_REF["seed"])
    return {k: v * DLE_REF["scale"] for k, v in values.items()}


def test_gelu_is_a_dle_release_choice():
    assert BertQAConfig().gelu == "tanh"  # the seed page's release
    with pytest.raises(
        ValueError, match=r"gelu 'exact' is not a DLE BERT GELU; valid: \['erf', 'tanh'\]"
    ):
        BertQAConfig(gelu="exact")
    x = torch.linspace(-6.0, 6.0, 241)
    # tanh: DLE's F.gelu(x, approximate=True); erf: DLE's x * 0.5 * (1 + erf(x / 1.41421))
    assert torch.equal(DLEGelu("tanh")(x), torch.nn.functional.gelu(x, approximate="tanh"))
    assert torch.equal(DLEGelu("erf")(x), x * 0.5 * (1.0 + torch.erf(x / 1.41421)))
    assert (DLEGelu("tanh")(x) - DLEGelu("erf")(x)).abs().max() > 1e-4
    for gelu in ("erf", "tanh"):
        model = BertFamily({**TINY, "gelu": gelu}).build()
        acts = [layer.intermediate.intermediate_act_fn for layer in model.bert.encoder.layer]
        assert [(type(a), a.variant) for a in acts] == [(DLEGelu, gelu)] * TINY["num_hidden_layers"]


def test_dle_names_and_shapes_map_one_to_one_at_full_size():
    """Every parameter of DLE's BERT-large QA model lands on one of ours, same shape, and every
    one of ours is given (DLE's pooler, unused by the QA logits, is the only one dropped)."""
    from tests.conftest import base_config

    family = BertFamily(base_config()["models"]["bert"]["hparams"])
    assert DLE["parameters"]["bert.embeddings.word_embeddings.weight"] == [30528, 1024]
    with torch.device("meta"):
        dle = {k: torch.empty(shape) for k, shape in DLE["parameters"].items()}
        mapped = family.adapt_state_dict(dle)
        ours = {k: list(v.shape) for k, v in family.build().state_dict().items()}
        family.serving_module({"model": mapped})  # the workflow's own fit check, at full size
    assert {k: list(v.shape) for k, v in mapped.items()} == ours
    assert len(mapped) == len(dle) - len(DLE_POOLER) == 391


@pytest.mark.parametrize(
    ("container", "dtype", "prefix"),
    [
        ("model", torch.float16, "module."),  # run_squad.py since a7089640, AMP, from DDP
        ("model", torch.float32, ""),
        ("bare", torch.float32, ""),  # run_squad.py before a7089640 (2019-11)
    ],
)
def test_dle_checkpoint_lands_through_the_workflow(tmp_path, container, dtype, prefix):
    family = BertFamily(DLE_REF["hparams"])
    dle = {k: v.to(dtype) for k, v in _dle_weights().items()}
    state = {prefix + k: v for k, v in dle.items()}
    torch.save({"model": state} if container == "model" else state, tmp_path / "qa.pt")
    origin = prepare_checkpoint(family, str(tmp_path / "qa.pt"), 0, tmp_path / "out.pt")
    assert origin == f"checkpoint {tmp_path / 'qa.pt'}"
    served = family.serving_module(read_workflow_checkpoint(family, tmp_path / "out.pt"))
    weights = served.model.state_dict()
    assert len(weights) == len(dle) - len(DLE_POOLER)
    for name, value in dle.items():
        if name in DLE_POOLER:
            continue
        [(ours, _)] = dle_to_hf_names({name: value}).items()
        assert weights[ours].dtype == torch.float32
        assert torch.equal(weights[ours], value.float()), name


@pytest.mark.parametrize("gelu", ["tanh", "erf"])
def test_dle_checkpoint_gives_dles_logits(tmp_path, gelu):
    """DLE's own logits (fixture, per release) for the same weights and inputs, reproduced
    through the workflow's path; the other release's GELU misses them by more than 1e-4."""
    family = BertFamily({**DLE_REF["hparams"], "gelu": gelu})
    torch.save({"model": _dle_weights()}, tmp_path / "qa.pt")
    prepare_checkpoint(family, str(tmp_path / "qa.pt"), 0, tmp_path / "out.pt")
    served = family.serving_module(read_workflow_checkpoint(family, tmp_path / "out.pt"))
    feeds = {k: np.asarray(v["values"], dtype=v["dtype"]) for k, v in DLE_REF["inputs"].items()}
    out = family.framework_outputs(served, feeds)
    other = "erf" if gelu == "tanh" else "tanh"
    for name in OUTPUTS:
        expected = np.asarray(DLE_REF["outputs"][gelu][name], dtype=np.float32)
        np.testing.assert_allclose(out[name], expected, rtol=0, atol=1e-5)  # measured 7e-7
        assert np.abs(out[name] - np.asarray(DLE_REF["outputs"][other][name])).max() > 1e-4


def test_dle_checkpoint_of_another_architecture_names_its_keys(tmp_path):
    torch.save({"model": _dle_weights()}, tmp_path / "qa.pt")
    deeper = BertFamily({**DLE_REF["hparams"], "num_hidden_layers": 3})
    with pytest.raises(ValueError) as err:
        prepare_checkpoint(deeper, str(tmp_path / "qa.pt"), 0, tmp_path / "out.pt")
    assert "does not fit the configured BERT hyper-parameters" in str(err.value)
    assert "missing (16): bert.encoder.layer.2.attention.output.LayerNorm.bias" in str(err.value)
    wider = BertFamily({**DLE_REF["hparams"], "intermediate_size": 128})
    with pytest.raises(
        ValueError, match=r"bert\.encoder\.layer\.0\.intermediate\.dense\.bias \(64,\) vs \(128,\)"
    ):
        prepare_checkpoint(wider, str(tmp_path / "qa.pt"), 0, tmp_path / "out.pt")
    assert not (tmp_path / "out.pt").exists()


def test_the_fp16_export_is_the_halved_module_exported_as_dles(family, state, tmp_path):
    """DLE's BERT runner exported ONNX from model.half() (export_precision: fp16): float16
    logits, checked against the fp32 framework at the fp16 tolerance."""
    import onnx

    out = tmp_path / "model.onnx"
    fp16 = {name: {"atol": 5.0, "rtol": 5.0} for name in OUTPUTS}
    report = export_model(family, state, "onnx", "fp16", out, tolerance=fp16)
    assert all(c["passed"] for c in report["checks"])
    graph = onnx.load(str(out)).graph
    types = {v.name: v.type.tensor_type.elem_type for v in [*graph.input, *graph.output]}
    assert types == {
        "input__0": onnx.TensorProto.INT32, "input__1": onnx.TensorProto.INT32,
        "input__2": onnx.TensorProto.INT32,
        "output__0": onnx.TensorProto.FLOAT16, "output__1": onnx.TensorProto.FLOAT16,
    }  # fmt: skip
    weights = {t.data_type for t in graph.initializer if t.data_type != onnx.TensorProto.INT64}
    assert weights == {onnx.TensorProto.FLOAT16}
    # only ONNX is exported at fp16: fp16 TorchScript comes from its converter
    with pytest.raises(ValueError, match="not made by an export"):
        export_model(family, state, "ts-trace", "fp16", tmp_path / "m.pt", tolerance=fp16)
