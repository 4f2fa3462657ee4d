import math
import warnings

import numpy as np
import pytest
import torch

from deploybench.checkpoint import write_seeded_checkpoint
from deploybench.export import export_model
from deploybench.models.fastpitch import (
    MEL_MAX,
    FastPitchFamily,
    regulate_length,
    text_to_ids,
)
from deploybench.runtime import load_runner

SMOKE = {
    "symbols_embedding_dim": 32,
    "in_fft_n_layers": 1,
    "in_fft_d_head": 16,
    "in_fft_conv1d_filter_size": 64,
    "in_fft_output_size": 32,
    "out_fft_n_layers": 1,
    "out_fft_d_head": 16,
    "out_fft_conv1d_filter_size": 64,
    "out_fft_output_size": 32,
    "dur_predictor_filter_size": 32,
    "pitch_predictor_filter_size": 32,
}
OUTPUTS = ["OUTPUT__0", "OUTPUT__1", "OUTPUT__2", "OUTPUT__3"]


@pytest.fixture(scope="module")
def family():
    return FastPitchFamily(SMOKE)


@pytest.fixture(scope="module")
def model(family):
    return family.serving_module(family.init_state(0))


def run(model, ids: np.ndarray) -> list[np.ndarray]:
    with torch.no_grad():
        return [t.numpy() for t in model(torch.from_numpy(ids))]


def test_signature_is_dles(family):
    assert [(s.name, s.dtype, s.shape) for s in family.inputs] == [("INPUT__0", "int64", (128,))]
    assert [(s.name, s.dtype, s.shape) for s in family.outputs] == [
        ("OUTPUT__0", "float32", (80, -1)),
        ("OUTPUT__1", "int64", (1,)),
        ("OUTPUT__2", "float32", (128,)),
        ("OUTPUT__3", "float32", (128,)),
    ]
    assert family.metric_name == "mel_mae" and not family.higher_is_better


def test_state_dict_uses_dle_names_and_full_size_defaults(family):
    keys = set(family.init_state(0)["model"])
    for key in [
        "encoder.word_emb.weight",
        "encoder.pos_emb.inv_freq",
        "encoder.layers.0.dec_attn.qkv_net.weight",
        "encoder.layers.0.dec_attn.o_net.weight",
        "encoder.layers.0.dec_attn.layer_norm.bias",
        "encoder.layers.0.pos_ff.CoreNet.0.weight",
        "encoder.layers.0.pos_ff.CoreNet.2.bias",
        "encoder.layers.0.pos_ff.layer_norm.weight",
        "duration_predictor.layers.1.conv.weight",
        "duration_predictor.layers.1.norm.weight",
        "duration_predictor.fc.bias",
        "pitch_predictor.fc.weight",
        "decoder.layers.0.pos_ff.CoreNet.0.weight",
        "pitch_emb.weight",
        "pitch_mean",
        "pitch_std",
        "proj.weight",
    ]:
        assert key in keys, key
    assert "encoder.layers.0.dec_attn.o_net.bias" not in keys  # DLE: no bias
    assert not any(k.startswith("decoder.word_emb") for k in keys)
    full = FastPitchFamily({}).build().state_dict()
    assert full["encoder.word_emb.weight"].shape == (148, 384)
    assert full["encoder.layers.5.dec_attn.qkv_net.weight"].shape == (192, 384)
    assert full["decoder.layers.5.pos_ff.CoreNet.0.weight"].shape == (1536, 384, 3)
    assert full["duration_predictor.layers.0.conv.weight"].shape == (256, 384, 3)
    assert full["proj.weight"].shape == (80, 384)


def test_seeded_init_is_deterministic_and_round_trips(family, tmp_path):
    a, b, c = (family.init_state(s)["model"] for s in (0, 0, 1))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["proj.weight"], c["proj.weight"])
    write_seeded_checkpoint(family, 0, tmp_path / "a.pt")
    write_seeded_checkpoint(family, 0, tmp_path / "b.pt")
    assert (tmp_path / "a.pt").read_bytes() == (tmp_path / "b.pt").read_bytes()
    loaded = family.read_checkpoint(tmp_path / "a.pt")["model"]
    assert all(torch.equal(loaded[k], a[k]) for k in a)


def test_hyper_parameters_are_checked():
    with pytest.raises(ValueError, match="unknown FastPitch hyper-parameters"):
        FastPitchFamily({"d_model": 32})
    with pytest.raises(ValueError, match="must be odd"):
        FastPitchFamily({**SMOKE, "in_fft_conv1d_kernel_size": 4})
    with pytest.raises(ValueError, match="must equal symbols_embedding_dim"):
        FastPitchFamily({**SMOKE, "in_fft_output_size": 64})


def test_regulate_length_repeats_each_symbol_by_its_rounded_duration():
    encoded = torch.tensor([[[1.0], [2.0], [3.0]], [[4.0], [5.0], [0.0]]])
    durations = torch.tensor([[2.0, 0.4, 1.6], [1.0, 0.6, 0.0]])
    frames, lengths = regulate_length(encoded, durations, pace=1.0, max_frames=100)
    assert lengths.tolist() == [4, 2]
    assert frames[..., 0].tolist() == [[1, 1, 3, 3], [4, 5, 0, 0]]
    frames, lengths = regulate_length(encoded, durations, pace=0.5, max_frames=5)
    assert lengths.tolist() == [5, 3]  # pace 0.5 doubles: [4, 1, 3] cut at 5; [2, 1, 0]
    assert frames[..., 0].tolist() == [[1, 1, 1, 1, 2], [4, 4, 5, 0, 0]]


def test_example_inputs_are_deterministic_padded_text(family):
    a, b = (family.example_inputs(6, seed=5)["INPUT__0"] for _ in range(2))
    np.testing.assert_array_equal(a, b)
    assert a.shape == (6, 128) and a.dtype == np.int64
    lengths = (a != 0).sum(1)
    assert lengths.min() >= 32 and len(set(lengths)) > 1
    for row, n in zip(a, lengths, strict=True):
        assert not row[n:].any() and (row[:n] > 0).all()  # a prefix, then padding
    full = family.example_inputs(3, seed=5, full_length=True)["INPUT__0"]
    assert (full > 0).all()


def test_outputs_shapes_and_padding(family, model):
    ids = family.example_inputs(3, seed=1)["INPUT__0"]
    mel, lengths, durations, pitch = run(model, ids)
    assert mel.shape[:2] == (3, 80) and mel.dtype == np.float32
    assert lengths.shape == (3, 1) and lengths.dtype == np.int64
    assert durations.shape == pitch.shape == (3, 128)
    assert mel.shape[2] == lengths.max()
    # lengths are the rounded durations; padded symbols have none
    np.testing.assert_array_equal(lengths[:, 0], np.round(durations).sum(1))
    assert np.all(durations[ids == 0] == 0) and np.all(pitch[ids == 0] == 0)
    # a frame past an utterance's end decodes from zeros: the projection's bias
    bias = model.model.proj.bias.detach().numpy()
    short = int(np.argmin(lengths[:, 0]))
    past_end = mel[short, :, lengths[short, 0] :]
    assert past_end.shape[1] > 0
    np.testing.assert_allclose(past_end, np.broadcast_to(bias[:, None], past_end.shape), atol=1e-6)
    assert np.isfinite(mel).all()


def test_utterance_depends_on_its_batch_only_at_its_last_frame(family, model):
    """Triton batches requests together. Trimmed to its own length, a row is the same as
    alone except where DLE's decoder lets padding in: its second feed-forward convolution sees
    the first one's activations one frame past the end (one frame with one decoder layer)."""
    ids = family.example_inputs(4, seed=2)["INPUT__0"]
    together = run(model, ids)
    longest = int(together[1].max())
    for row in range(4):
        alone = run(model, ids[row : row + 1])
        n = int(alone[1][0, 0])
        assert int(together[1][row, 0]) == n and alone[0].shape[2] == n
        np.testing.assert_allclose(together[2][row], alone[2][0], atol=1e-4, rtol=1e-5)
        np.testing.assert_allclose(together[3][row], alone[3][0], atol=1e-4, rtol=1e-5)
        last = n if n == longest else n - 1
        np.testing.assert_allclose(together[0][row, :, :last], alone[0][0, :, :last], atol=1e-4)


def test_empty_text_row_gives_finite_outputs(family, model):
    ids = family.example_inputs(2, seed=3)["INPUT__0"]
    ids[1] = 0
    mel, lengths, durations, _ = run(model, ids)
    assert lengths[1, 0] == 0 and np.isfinite(mel).all() and np.isfinite(durations).all()


def test_trace_generalises_to_other_batches_lengths_and_durations(family, model):
    example = torch.from_numpy(family.example_inputs(2, seed=0)["INPUT__0"])
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(model, (example,), check_trace=False)
        traced_frames = traced(example)[0].shape[2]
    for batch, seed, length in [(3, 11, 128), (5, 12, 70), (1, 13, 128)]:
        ids = family.example_inputs(batch, seed=seed)["INPUT__0"][:, :length]
        expected = run(model, ids)
        got = run(traced, ids)
        assert expected[0].shape[2] != traced_frames
        for e, g in zip(expected, got, strict=True):
            assert e.shape == g.shape
            np.testing.assert_allclose(g, e, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(("fmt", "runtime"), [("ts-trace", "torchscript"), ("onnx", "onnxruntime")])
def test_export_loads_in_runtime_and_matches(family, model, tmp_path, fmt, runtime):
    tolerance = {o: {"atol": 1e-4, "rtol": 1e-3} for o in OUTPUTS}
    out = tmp_path / f"model.{fmt}"
    report = export_model(family, family.init_state(0), fmt, "fp32", out, tolerance=tolerance)
    assert report["runtime"] == runtime and all(c["passed"] for c in report["checks"])
    runner = load_runner(runtime, out, input_names=["INPUT__0"], output_names=OUTPUTS)
    feeds = family.example_inputs(5, seed=21)  # a batch size the export never saw
    for e, g in zip(run(model, feeds["INPUT__0"]), runner(feeds), strict=True):
        assert e.shape == g.shape
        np.testing.assert_allclose(g, e, atol=1e-4, rtol=1e-3)


def test_text_to_ids_uses_english_basic():
    # '_'=0 '-'=1 '!'=2 "'"=3 ... ' '=11, 'A'..'Z'=12..37, 'a'..'z'=38..63
    assert text_to_ids("Hi,  there!") == [45, 46, 6, 11, 57, 45, 42, 55, 42, 2]
    assert text_to_ids('a-b_c"z\n') == [38, 1, 39, 40, 63]  # pad and unknowns dropped
    assert text_to_ids("  ") == []


def test_metric_known_answers(family):
    ones = np.ones((1, 80, 4), np.float32)
    outputs = [
        {"OUTPUT__0": ones, "OUTPUT__1": np.array([[3]])},
        {"OUTPUT__0": 5 * ones, "OUTPUT__1": np.array([[2]])},
    ]
    labels = [
        {"mel": np.zeros((1, 80, 5), np.float32), "mel_lengths": np.array([2])},
        {"mel": np.full((1, 80, 2), 3.0, np.float32), "mel_lengths": np.array([2])},
    ]
    got = family.task_metric(outputs, labels)
    assert next(iter(got)) == "mel_mae"
    # 160 values off by 1, then 160 values off by 2
    assert math.isclose(got["mel_mae"], 1.5) and math.isclose(got["mel_mse"], 2.5)
    assert math.isclose(got["mel_length_mae"], 0.5)
    assert math.isclose(got["mel_out_of_range_fraction"], 0.5)  # 5 > MEL_MAX
    assert MEL_MAX == 3.0


def test_reader_on_dle_layout(family, tmp_path):
    root = tmp_path / "LJSpeech-1.1_fastpitch"
    (root / "mels").mkdir(parents=True)
    (root / "filelists").mkdir()
    mel_a = np.arange(80 * 3, dtype=np.float32).reshape(80, 3)
    mel_b = -np.ones((80, 5), np.float32)
    torch.save(torch.from_numpy(mel_a), root / "mels" / "LJ001-0001.pt")
    np.save(root / "mels" / "LJ001-0002.npy", mel_b)  # .npy beside a .pt name
    (root / "filelists" / "test.txt").write_text(
        "mels|pitch|text\n"
        "wavs/LJ001-0001.wav|pitch/LJ001-0001.pt|Hi there.\n"
        "mels/LJ001-0002.pt|durations/x.pt|pitch_char/x.pt|" + "a" * 200 + "\n"
    )
    [(feeds, label)] = list(family.dataset_batches(root, batch_size=4, limit=None))
    ids = feeds["INPUT__0"]
    assert ids.shape == (2, 128) and ids.dtype == np.int64
    assert ids[0, :9].tolist() == text_to_ids("hi there.") and not ids[0, 9:].any()
    assert (ids[1] == 38).all()  # cut at text_length
    assert label["mel_lengths"].tolist() == [3, 5]
    np.testing.assert_array_equal(label["mel"][0, :, :3], mel_a)
    np.testing.assert_array_equal(label["mel"][1], mel_b)
    batches = list(family.dataset_batches(root / "filelists" / "test.txt", 1, limit=1))
    assert len(batches) == 1
    (root / "filelists" / "other.txt").write_text("")
    with pytest.raises(FileNotFoundError, match="exactly one"):
        list(family.dataset_batches(root, 1, None))


def test_dle_checkpoint_with_ddp_prefix_loads(family, tmp_path):
    state = family.init_state(4)["model"]
    dle = {f"module.{k}": v for k, v in state.items()}
    dle["module.attention.key_proj.0.weight"] = torch.zeros(1)  # FastPitch 1.1 aligner
    torch.save({"epoch": 1, "state_dict": dle, "config": {"n_mel_channels": 80}}, tmp_path / "c.pt")
    loaded = family.read_checkpoint(tmp_path / "c.pt")
    assert set(loaded["model"]) == set(state)
    assert all(torch.equal(loaded["model"][k], state[k]) for k in state)
    family.serving_module(loaded)
