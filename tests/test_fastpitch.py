import math
import warnings

import numpy as np
import pytest
import torch

from deploybench.checkpoint import (
    prepare_checkpoint,
    read_workflow_checkpoint,
    write_seeded_checkpoint,
)
from deploybench.export import export_model
from deploybench.models.fastpitch import FastPitchFamily, regulate_length
from deploybench.models.fastpitch_data import MEL_MAX, text_to_ids
from deploybench.runtime import load_runner
from tests.dle_fixtures import dle_fixture, seeded_values

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
    "energy_predictor_filter_size": 32,
}
OUTPUTS = ["OUTPUT__0", "OUTPUT__1", "OUTPUT__2", "OUTPUT__3"]
VERSIONS = ["1.0", "1.1", "1.1-energy"]


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


def test_text_to_ids_expands_dles_abbreviations():
    """english_cleaners' abbreviations (DLE afe00719 common/text/abbreviations.py): after
    lowercasing, ``\\b<abbr>\\.`` in its list's order; numbers are not expanded."""
    expanded = "misess de mohrenschildt thought that oswald,"
    assert text_to_ids("Mrs. De Mohrenschildt thought that Oswald,") == text_to_ids(expanded)
    # "lt." first: then "col." no longer follows a word boundary
    assert text_to_ids("DR. X, Drs. Y; (St.Louis) Lt.Col. Z") == text_to_ids(
        "doctor x, doctors y; (saintlouis) lieutenantcol. z"
    )
    assert text_to_ids("mrs mr.s hmr. co.") == text_to_ids("mrs misters hmr. company")
    assert text_to_ids("Mrs. 1") == [*text_to_ids("misess"), 11]  # the digit dropped, unspoken


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


# --- DLE versions: FastPitch 1.0, 1.1, 1.1 with energy conditioning ---------------------------


def _dle_state(version: str) -> tuple[FastPitchFamily, dict[str, torch.Tensor]]:
    """The fixture's reference: the family at its small hyper-parameters and the seeded DLE
    state dict (DLE's names, aligner included) that DLE's own code computed its outputs with."""
    ref = dle_fixture(f"fastpitch-{version}")["reference"]
    state = seeded_values(ref["parameters"], ref["seed"])
    for name, value in ref["set"].items():
        state[name] = torch.full_like(state[name], value)
    for name, factor in ref["scale"].items():
        state[name] = state[name] * factor
    return FastPitchFamily(ref["hparams"]), state


def _save_dle_checkpoint(version: str, state: dict, path, *, ddp: bool) -> None:
    """As DLE's training saves it: 1.1's Checkpointer.maybe_save (common/utils.py, unwrapped
    model) or 1.0's save_checkpoint (train.py, the DDP-wrapped model: ``module.`` names)."""
    weights = {f"module.{k}" if ddp else k: v for k, v in state.items()}
    optimizer = {"state": {}, "param_groups": [{"lr": 0.1, "params": list(range(len(state)))}]}
    if version == "1.0":
        container = {"epoch": 1500, "config": {"n_mel_channels": 80}, "state_dict": weights}
        container |= {"ema_state_dict": None, "optimizer": optimizer}
    else:
        container = {"epoch": 1000, "iteration": 56000, "config": {"n_mel_channels": 80}}
        container |= {"train_setup": {"energy_conditioning": version.endswith("energy")}}
        container |= {"state_dict": weights, "optimizer": optimizer, "scaler": {"scale": 1.0}}
    torch.save(container, path)


def _load(family, source, tmp_path):
    out = tmp_path / "workflow.pt"
    prepare_checkpoint(family, str(source), seed=0, out=out)
    return family.serving_module(read_workflow_checkpoint(family, out))


@pytest.mark.parametrize("version", VERSIONS)
def test_dle_parameters_match_at_full_size(version):
    """DLE's names and shapes at its default (full) sizes, on the meta device; only 1.1's
    training-time aligner is not served."""
    params = dle_fixture(f"fastpitch-{version}")["parameters"]
    energy = version.endswith("energy")
    family = FastPitchFamily({"energy_conditioning": energy})
    with torch.device("meta"):
        ours = {k: list(v.shape) for k, v in family.build().state_dict().items()}
    served = family.adapt_state_dict(params)
    assert served == ours
    aligner = sorted(set(params) - set(served))
    assert len(aligner) == (0 if version == "1.0" else 12)
    assert all(k.startswith("attention.") for k in aligner)
    assert sum(k.startswith(("energy_predictor.", "energy_emb.")) for k in ours) == 12 * energy


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("ddp", [True, False])
def test_dle_checkpoint_loads_and_gives_dles_outputs(version, ddp, tmp_path):
    """A checkpoint in DLE's container loads through the workflow: every served tensor is the
    checkpoint's, and the served outputs are those DLE's own infer computed from it."""
    family, state = _dle_state(version)
    _save_dle_checkpoint(version, state, tmp_path / "FastPitch_checkpoint_1000.pt", ddp=ddp)
    model = _load(family, tmp_path / "FastPitch_checkpoint_1000.pt", tmp_path)
    served = model.model.state_dict()
    assert set(served) == {k for k in state if not k.startswith("attention.")}
    for name, tensor in served.items():
        assert torch.equal(tensor, state[name]), name

    ref = dle_fixture(f"fastpitch-{version}")["reference"]
    dle = ref["outputs"]
    expected = [dle["mel_out"], dle["dec_lens"], dle["dur_pred"], dle["pitch_pred"]]
    expected += [dle["energy_pred"]] if "energy_pred" in dle else []
    outputs = run(model, np.array(ref["inputs"], dtype=np.int64))
    assert len(outputs) == len(family.outputs) == 4 + version.endswith("energy")
    # DLE's infer returns lengths [B] (served [B, 1]) and 1.1's pitch [B, 1, L] (served [B, L])
    for got, want in zip(outputs, expected, strict=True):
        np.testing.assert_allclose(got.reshape(want["shape"]), want["values"], atol=1e-5)


def test_checkpoint_record_holds_the_source_files_sha256(tmp_path):
    """prepare_checkpoint records the configured file's sha256 (the file read from a checkpoint
    directory too): what published_needs.checkpoint_sha256 pins (deploybench.report)."""
    import hashlib
    import json

    from deploybench import jobs

    _, state = _dle_state("1.0")
    folder = tmp_path / "ngc"
    folder.mkdir()
    _save_dle_checkpoint("1.0", state, folder / "nvidia_fastpitch_200518.pt", ddp=True)
    digest = hashlib.sha256((folder / "nvidia_fastpitch_200518.pt").read_bytes()).hexdigest()
    hparams = dle_fixture("fastpitch-1.0")["reference"]["hparams"]
    for checkpoint, source in (
        (str(folder), {"file": str(folder / "nvidia_fastpitch_200518.pt"), "sha256": digest}),
        (None, None),  # seeded
    ):
        model = {"module": "fastpitch", "hparams": hparams, "checkpoint": checkpoint, "seed": 0}
        record = tmp_path / "checkpoint.pt.provenance.json"
        jobs.make_checkpoint(
            {"model": model}, checkpoint=str(tmp_path / "checkpoint.pt"), provenance=str(record)
        )
        assert json.loads(record.read_text())["source"] == source


def test_energy_output_follows_the_energy_predictor(tmp_path):
    family, state = _dle_state("1.1-energy")
    assert [s.name for s in family.outputs] == [*OUTPUTS, "OUTPUT__4"]
    assert family.outputs[4].shape == (family.cfg.text_length,)
    ids = np.array(dle_fixture("fastpitch-1.1-energy")["reference"]["inputs"], dtype=np.int64)
    before = run(family.serving_module({"model": family.adapt_state_dict(state)}), ids)
    state["energy_predictor.fc.bias"] = state["energy_predictor.fc.bias"] + 0.5
    after = run(family.serving_module({"model": family.adapt_state_dict(state)}), ids)
    real = ids != 0
    np.testing.assert_allclose(after[4][real], before[4][real] + 0.5, atol=1e-5)
    assert np.all(after[4][~real] == 0)
    assert not np.allclose(after[0], before[0])  # the mel is conditioned on it
    np.testing.assert_array_equal(after[2], before[2])  # durations come before energy


def test_energy_export_serves_five_outputs(tmp_path):
    family = FastPitchFamily({**SMOKE, "energy_conditioning": True})
    names = [*OUTPUTS, "OUTPUT__4"]
    tolerance = {o: {"atol": 1e-4, "rtol": 1e-3} for o in names}
    state = family.init_state(0)
    report = export_model(family, state, "onnx", "fp32", tmp_path / "m.onnx", tolerance=tolerance)
    assert all(c["passed"] for c in report["checks"])
    runner = load_runner(
        "onnxruntime", tmp_path / "m.onnx", input_names=["INPUT__0"], output_names=names
    )
    feeds = family.example_inputs(3, seed=4)
    expected = run(family.serving_module(state), feeds["INPUT__0"])
    for e, g in zip(expected, runner(feeds), strict=True):
        np.testing.assert_allclose(g, e, atol=1e-4, rtol=1e-3)


@pytest.mark.parametrize(
    ("version", "energy", "message"),
    [
        ("1.1-energy", False, "energy_conditioning is false; unexpected \\(12\\): energy_emb.bias"),
        ("1.0", True, "energy_conditioning is true; missing \\(12\\): energy_emb.bias"),
    ],
    ids=["energy-checkpoint-to-1.0-config", "1.0-checkpoint-to-energy-config"],
)
def test_energy_variant_mismatch_names_the_energy_keys(version, energy, message, tmp_path):
    _, state = _dle_state(version)
    hparams = dle_fixture(f"fastpitch-{version}")["reference"]["hparams"]
    family = FastPitchFamily({**hparams, "energy_conditioning": energy})
    _save_dle_checkpoint(version, state, tmp_path / "c.pt", ddp=True)
    with pytest.raises(ValueError, match=message) as err:
        _load(family, tmp_path / "c.pt", tmp_path)
    assert "energy_predictor.fc.weight" in str(err.value)
    assert not (tmp_path / "workflow.pt").exists()


def test_energy_conditioning_must_be_a_boolean():
    with pytest.raises(TypeError, match="energy_conditioning must be true or false, got 'yes'"):
        FastPitchFamily({**SMOKE, "energy_conditioning": "yes"})
