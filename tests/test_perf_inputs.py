"""The data perf_analyzer sends, made as each seed page's perf data was (Family.perf_inputs),
in a form perf_analyzer takes for every tensor type (FP16 too, through the real binary).

FastPitch: DLE's ``triton/prepare_input_data.py`` tiles the first utterance of its data loader
to SEQUENCE_LENGTH symbols, with no padding; padding would yield no mel frames, and the
decoder's cost grows with the frames."""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from deploybench import canary
from deploybench.errors import DataError
from deploybench.models import load_family
from deploybench.models.fastpitch import FastPitchFamily
from deploybench.models.fastpitch_data import text_to_ids
from deploybench.models.tft import TFTFamily
from deploybench.perf_inputs import write_input_data
from deploybench.planning import run_plan as dbplan
from tests.conftest import base_config, processes_mentioning, validated

FASTPITCH_RUN = ("fastpitch", "cpu", "onnx", "fp32")


def write_filelist(root: Path, *texts: str) -> Path:
    """A DLE-layout LJSpeech folder whose test filelist holds ``texts`` in order."""
    (root / "filelists").mkdir(parents=True)
    lines = [f"wavs/LJ045-{i:04d}.wav|pitch/LJ045-{i:04d}.pt|{t}" for i, t in enumerate(texts)]
    (root / "filelists" / "ljs_audio_pitch_text_test.txt").write_text("\n".join(lines) + "\n")
    return root


@pytest.mark.parametrize("text_length", [128, 40])
def test_fastpitch_seeded_perf_input_fills_the_length_without_padding(text_length):
    family = FastPitchFamily({"text_length": text_length})
    a, b = (family.perf_inputs(seed=0)["INPUT__0"] for _ in range(2))
    np.testing.assert_array_equal(a, b)  # deterministic for a seed
    assert a.shape == (1, text_length) and a.dtype == np.int64
    assert not (a == family.cfg.padding_idx).any()  # every symbol spoken: no padding
    assert not np.array_equal(a, family.perf_inputs(seed=1)["INPUT__0"])
    # the accuracy step's example inputs stay padded, of varied lengths
    padded = family.example_inputs(8, seed=0)["INPUT__0"]
    assert (padded == family.cfg.padding_idx).any()


def test_fastpitch_perf_input_repeats_the_first_utterance_to_fill(tmp_path):
    """As DLE's prepare_input_data.py: the first utterance (LJ045-0096 in DLE's test filelist),
    repeated back to back and cut at the length."""
    family = FastPitchFamily({})
    root = write_filelist(
        tmp_path / "ljs", "Mrs. De Mohrenschildt thought that Oswald,", "An other utterance."
    )
    ids = family.perf_inputs(seed=0, dataset=str(root))["INPUT__0"]
    utterance = text_to_ids("Mrs. De Mohrenschildt thought that Oswald,")
    assert ids.shape == (1, 128) and ids.dtype == np.int64
    n = len(utterance)
    assert 128 // n >= 2  # the utterance is repeated, not padded
    for start in range(0, 128, n):
        chunk = ids[0, start : start + n].tolist()
        assert chunk == utterance[: len(chunk)]
    assert not (ids == family.cfg.padding_idx).any()
    # the seed does not matter: the data set's text does
    np.testing.assert_array_equal(ids, family.perf_inputs(seed=5, dataset=root)["INPUT__0"])


def test_fastpitch_perf_input_cuts_a_long_first_utterance(tmp_path):
    family = FastPitchFamily({"text_length": 16})
    root = write_filelist(tmp_path / "ljs", "abcdefghijklmnopqrstuvwxyz")
    ids = family.perf_inputs(seed=0, dataset=root)["INPUT__0"]
    assert ids[0].tolist() == text_to_ids("abcdefghijklmnop")


def test_fastpitch_perf_input_needs_a_spoken_first_utterance(tmp_path):
    family = FastPitchFamily({})
    root = write_filelist(tmp_path / "ljs", "1984&%")
    with pytest.raises(DataError, match="no english_basic symbols"):
        family.perf_inputs(seed=0, dataset=root)


def test_other_families_send_their_seeded_example():
    """BERT: DLE sent every SQuAD dev feature; one seeded SQuAD-shaped row here (the table)."""
    config = base_config()
    family = load_family("bert", config["models"]["bert"]["hparams"])
    sent = family.perf_inputs(seed=0, dataset="/not/read")
    expected = family.example_inputs(1, seed=0)
    assert sent.keys() == expected.keys()
    for name, array in expected.items():
        np.testing.assert_array_equal(sent[name], array)


def test_tft_perf_input_is_the_test_splits_first_example(tmp_path):
    """As DLE's TFT prepare_input_data.py: the first example of the test split."""
    family = TFTFamily(
        {
            "static_categorical_inp_lens": [5],
            "temporal_known_continuous_inp_size": 3,
            "example_length": 12,
            "encoder_length": 9,
            "n_head": 2,
            "hidden_size": 8,
        }
    )
    rng = np.random.default_rng(2)
    ids = np.arange(3)[:, None, None].repeat(12, axis=1)
    np.savez(
        tmp_path / "test.npz",
        s_cat=ids,
        k_cont=rng.standard_normal((3, 12, 3)).astype(np.float32),
        target=rng.standard_normal((3, 12, 1)).astype(np.float32),
        id=ids,
        target_scale=np.array([[1.0, 2.0]] * 3),
    )
    sent = family.perf_inputs(seed=0, dataset=tmp_path)
    (first, _), *_ = family.dataset_batches(tmp_path, batch_size=1, limit=None)
    assert [(n, a.shape) for n, a in sent.items()] == [
        (s.name, (1, *s.shape)) for s in family.inputs
    ]
    for name, array in first.items():
        np.testing.assert_array_equal(sent[name], array)
    with np.load(tmp_path / "test.npz") as data:
        np.testing.assert_array_equal(sent["k_cont__3"][0], data["k_cont"][0])


def test_perf_spec_carries_the_task_data_set_only_when_configured(tmp_path):
    plain = dbplan.plan_run(validated(base_config()), *FASTPITCH_RUN)
    assert "dataset_path" not in plain.spec("offline")  # specs of a config without one: unchanged

    root = write_filelist(tmp_path / "ljs", "Hi there.")
    checkpoint = tmp_path / "FastPitch_checkpoint.pt"
    checkpoint.write_bytes(b"")
    config = base_config()
    fastpitch = config["models"]["fastpitch"]
    fastpitch["checkpoint"] = str(checkpoint)
    fastpitch["accuracy"]["task"] = {"path": str(root)}
    plan = dbplan.plan_run(validated(config), *FASTPITCH_RUN)
    assert plan.spec("offline")["dataset_path"] == plan.spec("online")["dataset_path"] == str(root)


def test_input_data_sends_half_precision_as_base64_and_the_rest_as_numbers(tmp_path):
    """perf_analyzer refuses FP16/BF16 as a JSON number list (client r23.12 perf_utils.cc):
    those go as base64 of their little-endian bytes, with the shape; the rest as numbers."""
    half = np.array([[[0.5, -2.0, 65504.0], [1e-3, 0.0, 3.0]]], dtype=">f2")  # big-endian in
    ids = np.array([[7, 8]], dtype=np.int64)
    path = tmp_path / "data.json"
    write_input_data({"x": half, "ids": ids}, path)
    [example] = json.loads(path.read_text())["data"]
    assert example["ids"] == {"content": [7, 8], "shape": [2]}
    assert example["x"]["shape"] == [2, 3] and set(example["x"]["content"]) == {"b64"}
    sent = np.frombuffer(base64.b64decode(example["x"]["content"]["b64"]), dtype="<f2")
    np.testing.assert_array_equal(sent.reshape(2, 3), half[0])


def test_fp16_and_fp32_reach_the_real_perf_analyzer(tmp_path):
    """The canary on the CPU: a real tritonserver serving an FP32 and an FP16 model (the
    workflow's python-backend model.py), one checked request and one perf_analyzer trial each,
    through the workflow's own --input-data file and command. Before the base64 form,
    perf_analyzer 2.41 exited 99 on the FP16 model ("Failed to init manager inputs: Can not use
    explicit tensor description for fp16 datatype")."""
    report = canary.run("cpu", tmp_path / "canary")
    summary = report.as_json()
    assert summary["passed"], summary
    assert [s["step"] for s in summary["steps"]] == list(canary.STEPS)
    assert "float16" in next(s for s in report.steps if s.step == "request_float16").detail
    perf16 = next(s for s in report.steps if s.step == "perf_float16")
    assert "infer/s" in perf16.detail
    assert json.loads((tmp_path / "canary" / "canary.json").read_text()) == summary
    assert processes_mentioning(str(tmp_path)) == []


def test_dles_own_input_files_are_read_as_numbers(tmp_path):
    """perf.input_data: a directory of raw files named after the inputs, as DLE's
    prepare_input_data.py writes them (FastPitch's INPUT__0: 128 int64 ids)."""
    from deploybench.perf_inputs import inputs_digest, read_input_files
    from deploybench.tensors import TensorSpec

    spec = TensorSpec("INPUT__0", "int64", (128,))
    ids = np.arange(128, dtype="<i8") % 40
    ids.tofile(tmp_path / "INPUT__0")
    feeds = read_input_files(tmp_path, [spec])
    assert feeds["INPUT__0"].shape == (1, 128) and (feeds["INPUT__0"][0] == ids).all()
    assert inputs_digest(feeds) == inputs_digest({"INPUT__0": ids.reshape(1, 128).copy()})
    assert inputs_digest(feeds) != inputs_digest({"INPUT__0": (ids + 1).reshape(1, 128)})
    ids[:100].tofile(tmp_path / "INPUT__0")
    with pytest.raises(DataError, match=r"100 int64 values, but INPUT__0 takes 128"):
        read_input_files(tmp_path, [spec])
    with pytest.raises(DataError, match="no input file for OTHER"):
        read_input_files(tmp_path, [TensorSpec("OTHER", "float32", (2,))])


# The first line of DLE's filelists/ljs_mel_dur_pitch_text_test_filelist.txt at afe00719, the
# one its triton/dataloader.py reads first.
DLE_FIRST_LINE = (
    "mels/LJ045-0096.pt|durations/LJ045-0096.pt|pitch_char/LJ045-0096.pt|"
    "Mrs. De Mohrenschildt thought that Oswald,"
)


def test_dles_fastpitch_input_file_is_the_pinned_one(tmp_path):
    """models.fastpitch.published_needs.input_sha256 is the file the published rows measured:
    what DLE's triton/prepare_input_data.py --length 128 writes at afe00719 (the tables are
    byte-identical at ba8f04bf, whose README changes only the commands). Its dataloader.py
    reads LJ045-0096 with TextMelAliLoader(english_basic, ['english_cleaners']), no CMUdict:
    lowercase, "Mrs." → "misess" (common/text/abbreviations.py), 44 letters as a LongTensor,
    tiled to 128 and written as int64 by ``tofile``. Read through perf.input_data, its sha256 is
    what the measurement records and the report compares."""
    from deploybench.models.fastpitch_data import SYMBOL_ID, tile_ids
    from deploybench.perf_inputs import raw_sha256, read_input_files
    from deploybench.tensors import TensorSpec

    cleaned = "misess de mohrenschildt thought that oswald,"
    ids = [SYMBOL_ID[c] for c in cleaned]
    assert len(ids) == 44 and ids[:8] == [50, 46, 56, 42, 56, 56, 11, 41]
    tile_ids(ids, 128).astype("<i8").tofile(tmp_path / "INPUT__0")
    pinned = base_config()["models"]["fastpitch"]["published_needs"]["input_sha256"]
    feeds = read_input_files(tmp_path, [TensorSpec("INPUT__0", "int64", (128,))])
    # what the measurement records of the bytes it sent: the file's own sha256
    file_sha256 = hashlib.sha256((tmp_path / "INPUT__0").read_bytes()).hexdigest()
    assert raw_sha256(feeds) == pinned == {"INPUT__0": file_sha256}
    assert feeds["INPUT__0"].shape == (1, 128) and feeds["INPUT__0"][0, 44] == ids[0]
    assert feeds["INPUT__0"][0, 127] == ids[127 - 88]  # np.tile three times, then cut


def test_fastpitch_perf_input_from_dles_filelist_is_the_pinned_file(tmp_path):
    """The family's own letters path (text_to_ids: english_cleaners' abbreviations) on a
    filelist whose first line is DLE's makes the pinned file's bytes, without DLE's code: the
    sha256 the measurement records of what it sent is the pinned one."""
    from deploybench.perf_inputs import raw_sha256

    (tmp_path / "filelists").mkdir()
    filelist = tmp_path / "filelists" / "ljs_mel_dur_pitch_text_test_filelist.txt"
    filelist.write_text(DLE_FIRST_LINE + "\n" + DLE_FIRST_LINE.replace("0096", "0097") + "\n")
    ids = FastPitchFamily({}).perf_inputs(seed=0, dataset=filelist)["INPUT__0"]
    assert ids.shape == (1, 128) and ids.dtype == np.int64
    pinned = base_config()["models"]["fastpitch"]["published_needs"]["input_sha256"]
    assert raw_sha256({"INPUT__0": ids}) == pinned
