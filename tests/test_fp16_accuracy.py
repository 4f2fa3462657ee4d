"""fp16 accuracy, measured: the quantities every model reports beside its errors (known inputs,
known flip fractions and frame differences), the accuracy step's rows, and the benchmark that
measures them (at smoke size)."""

import csv
import math
import subprocess
import sys

import numpy as np
import pytest
import torch

from deploybench import accuracy
from deploybench.convert import SERVED_TYPES, torchscript_fp16
from deploybench.errors import AccuracyError
from deploybench.export import prepare_model
from deploybench.models import load_family
from deploybench.models.fastpitch_data import duration_quantities
from deploybench.planning import run_plan as dbplan
from tests.conftest import REPO, SMOKE, smoke_config, validated


def family(model, **hparams):
    settings = smoke_config()["models"][model]
    return load_family(settings["module"], {**settings["hparams"], **hparams})


def test_bert_flips_start_and_end_per_sample():
    rng = np.random.default_rng(0)
    ref = {
        name: rng.standard_normal((4, 128)).astype(np.float32)
        for name in ("output__0", "output__1")
    }
    act = {name: value.copy() for name, value in ref.items()}
    act["output__0"][1, 5] = 100.0  # one of 4 starts moves
    act["output__1"][0, 7] = act["output__1"][3, 9] = 100.0  # two of 4 ends move
    act["output__1"][2] += 0.01  # a small error everywhere moves no arg-max
    assert family("bert").accuracy_quantities(ref, act) == {
        "output__0": {"argmax_flip_fraction": 0.25},
        "output__1": {"argmax_flip_fraction": 0.5},
    }


def test_nnunet_label_mismatch_share_of_labels_and_of_logits():
    ref = {"OUTPUT__0": np.zeros((1, 10, 10), dtype=np.int64)}
    act = {"OUTPUT__0": ref["OUTPUT__0"].copy()}
    act["OUTPUT__0"][0, 0, :3] = 2
    figures = family("nnunet").accuracy_quantities(ref, act)
    assert figures == {"OUTPUT__0": {"label_mismatch_fraction": 0.03}}
    scores = np.zeros((1, 4, 5, 2), dtype=np.float32)
    scores[:, 1] = 1.0  # class 1 everywhere
    moved = scores.copy()
    moved[0, 3, 0, 0] = 2.0  # one voxel of 10 takes class 3
    logits = family("nnunet", output="logits")
    assert logits.accuracy_quantities({"OUTPUT__0": scores}, {"OUTPUT__0": moved}) == {
        "OUTPUT__0": {"label_mismatch_fraction": 0.1}
    }


def test_resnet50_class_flips():
    ref = {"classes": np.array([[1], [2], [3], [4]], dtype=np.int32)}
    act = {"classes": np.array([[1], [2], [7], [4]], dtype=np.int32)}
    assert family("resnet50").accuracy_quantities(ref, act) == {
        "classes": {"class_flip_fraction": 0.25}
    }


def fastpitch_outputs(durations, lengths, frames):
    rng = np.random.default_rng(1)
    return {
        "OUTPUT__0": rng.standard_normal((len(lengths), 2, frames)).astype(np.float32),
        "OUTPUT__1": np.array(lengths, dtype=np.int64).reshape(-1, 1),
        "OUTPUT__2": np.array(durations, dtype=np.float32),
    }


def test_fastpitch_durations_lengths_and_aligned_mel():
    # utterance 0: the first symbol's 2.4 frames becomes 2.6 (2 -> 3 frames); utterance 1 keeps
    # every frame count (2.2 -> 2.4 rounds alike). Padding (0) counts as no symbol.
    ref = fastpitch_outputs([[2.4, 3.6, 0.0], [2.2, 1.0, 0.0]], [6, 3], 6)
    act = fastpitch_outputs([[2.6, 3.6, 0.0], [2.4, 1.0, 0.0]], [7, 3], 7)
    act["OUTPUT__0"][1, :, :3] = ref["OUTPUT__0"][1, :, :3] + 0.5  # the aligned one's error
    figures = duration_quantities(ref, act, pace=1.0)
    assert figures["OUTPUT__2"] == {"max_frames_diff": 1.0, "frames_flip_fraction": 0.25}
    assert figures["OUTPUT__1"] == {"max_length_diff_frames": 1.0, "length_differs_fraction": 0.5}
    assert figures["OUTPUT__0"]["aligned_fraction"] == 0.5
    assert math.isclose(figures["OUTPUT__0"]["aligned_max_abs_err"], 0.5, rel_tol=1e-6)
    # pace 2 halves the frames: 1.2 and 1.3 both round to 1
    assert duration_quantities(ref, act, pace=2.0)["OUTPUT__2"]["max_frames_diff"] == 0.0


def test_measure_gives_compare_outputs_errors_and_the_family_quantities():
    bert = family("bert")
    ref = {"output__0": np.array([[1.0, 3.0], [2.0, 1.0]]), "output__1": np.ones((2, 2))}
    act = {"output__0": np.array([[1.0, 0.5], [2.0, 1.5]]), "output__1": np.ones((2, 2))}
    measured = accuracy.measure(ref, act, bert)
    assert measured["output__0"] == {
        "max_abs_err": 2.5,
        "max_rel_err": 2.5 / 3.0,
        "argmax_flip_fraction": 0.5,
    }
    tolerance = {n: {"atol": 0.1, "rtol": 0.0} for n in ref}
    rows = accuracy.compare_outputs(ref, act, tolerance, 2, bert)
    assert [r["max_abs_err"] for r in rows] == [2.5, 0.0]
    assert rows[0]["quantities"] == "argmax_flip_fraction=0.5"
    assert list(rows[0]) == accuracy.COLUMNS
    assert "argmax_flip_fraction=0.5" in accuracy.format_failure(rows)
    # without a family: errors only, the column empty (the export check's rows)
    assert accuracy.compare_outputs(ref, act, tolerance, 2)[0]["quantities"] == ""


def test_a_moved_frame_count_is_compared_over_the_common_frames():
    fastpitch = family("fastpitch")
    ref = fastpitch_outputs([[2.4, 3.6], [1.0, 1.0]], [6, 2], 6)
    act = fastpitch_outputs([[2.6, 3.6], [1.0, 1.0]], [7, 2], 7)
    ref["OUTPUT__3"] = act["OUTPUT__3"] = np.zeros((2, 2), dtype=np.float32)
    act["OUTPUT__0"][:, :, :6] = ref["OUTPUT__0"] + 0.5
    measured = accuracy.measure(ref, act, fastpitch)
    assert measured["OUTPUT__0"]["shape_differs"] == 1.0
    assert math.isclose(measured["OUTPUT__0"]["max_abs_err"], 0.5, rel_tol=1e-6)
    tolerance = {n: {"atol": 1.0, "rtol": 0.0} for n in ref}
    # the mel's frames are data-dependent (-1 in the signature): the 2 x 2 values of the
    # seventh frame only the fp16 side has count as mismatched
    rows = {r["output"]: r for r in accuracy.compare_outputs(ref, act, tolerance, 2, fastpitch)}
    mel = rows["OUTPUT__0"]
    assert (mel["elements"], mel["mismatched"], mel["passed"]) == (28, 4, False)
    assert "shape_differs=1" in mel["quantities"]
    tolerance["OUTPUT__0"]["mismatch_fraction"] = 0.15
    rows = {r["output"]: r for r in accuracy.compare_outputs(ref, act, tolerance, 2, fastpitch)}
    assert rows["OUTPUT__0"]["passed"]
    assert rows["OUTPUT__1"]["quantities"].startswith("max_length_diff_frames=1")
    # a fixed axis (symbols) or no signature to read: a shape error, naming the quantities
    act["OUTPUT__2"] = np.zeros((2, 3), dtype=np.float32)
    with pytest.raises(AccuracyError, match=r"OUTPUT__2.*shape .* max_length_diff_frames=1"):
        accuracy.compare_outputs(ref, act, tolerance, 2, fastpitch)
    with pytest.raises(AccuracyError, match="OUTPUT__0.*shape"):
        accuracy.compare_outputs(ref, act, tolerance, 2)


def test_benchmark_writes_its_table_at_smoke_size(tmp_path):
    """The benchmark's own command, on TFT at smoke size (a few seconds)."""
    cmd = [sys.executable, "benchmarks/fp16_accuracy.py", "--configfile", str(SMOKE)]
    cmd += ["--models", "tft", "--out", str(tmp_path)]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith("tft: ")  # its timing
    with (tmp_path / "fp16_accuracy.csv").open() as f:
        rows = list(csv.DictReader(f))
    artifacts = {r["artifact"]: r for r in rows}
    assert set(artifacts) == {"onnx fp16", "ts-trace fp16", "framework fp16 (eager)"}
    for row in rows:
        assert row["status"] == "measured" and row["output"] == "target__0"
        assert 0 < float(row["max_abs_err"]) < 0.1 and row["passed"] == "True"
        assert row["batch"] == "4" and row["seed"] == "1234"  # the smoke cpu sizing's accuracy
    assert "kernels" in artifacts["onnx fp16"]["ort_kernels"]  # which ran in fp16
    table = (tmp_path / "fp16_accuracy.md").read_text()
    assert "| tft | onnx fp16 (onnx) | target__0 |" in table
    assert "tft trt fp16 (tensorrt): needs a GPU" in table


# ---------------------------------------------------------------- a gate that can fail (issue 47)

MEASURED = REPO / "benchmarks" / "results" / "fp16" / "fp16_accuracy.csv"
SMOKE_CONFIG = validated(smoke_config())
# the models whose fp16 gate is set from measured errors, DLE's own check kept beside it
GATED = sorted(
    name
    for name, model in SMOKE_CONFIG["models"].items()
    if "fp16" in model["accuracy"].get("dle_tolerance", {})
)


def measured_max_abs_err(model):
    """Per output: the largest max abs error ``benchmarks/fp16_accuracy.py`` measured for the
    model's fp16 artifacts and its framework-fp16 estimate (the committed table)."""
    with MEASURED.open() as f:
        rows = [r for r in csv.DictReader(f) if r["model"] == model and r["max_abs_err"]]
    assert rows, f"{model}: nothing measured in {MEASURED}"
    largest = {}
    for row in rows:
        largest[row["output"]] = max(largest.get(row["output"], 0.0), float(row["max_abs_err"]))
    return largest


def shifted(outputs, by):
    """Every element of every output moved by ``by`` (as float16 holds it, for a float16 one)."""
    return {name: (value + np.asarray(by, dtype=value.dtype)) for name, value in outputs.items()}


def test_tfts_fp16_gate_is_set_from_measurements_not_dles():
    # TFT is the default run and the kit's; a gate that cannot fail would leave it unchecked
    assert {"tft", "tft_traffic"} <= set(GATED), GATED


@pytest.mark.parametrize("model", GATED)
def test_fp16_accuracy_fails_beyond_the_measured_tolerance_where_dles_would_pass(model, tmp_path):
    """The fp16 gate holds the measured errors with margin and fails a real fp16 artifact
    perturbed beyond it; DLE's own tolerance, kept beside it in the job's provenance, would
    have passed the same artifact (it could not fail)."""
    settings = SMOKE_CONFIG["models"][model]
    fmt = next(f for f, p in settings["formats"].items() if f.startswith("ts-") and "fp16" in p)
    plan = dbplan.plan_run(SMOKE_CONFIG, model, "cpu", fmt, "fp16")
    spec = plan.accuracy  # what the accuracy job is given and writes into its provenance
    gate, dle = spec["tolerance"], spec["dle_tolerance"]["fp16"]
    assert gate == spec["precision_tolerance"]["fp16"] != dle
    measured = measured_max_abs_err(model)
    assert set(measured) == set(gate)
    for name, err in measured.items():
        # the documented rule (docs/gpu-engines.md): about 10x the largest measured error
        assert 5 * err <= gate[name]["atol"] <= 20 * err, (name, err, gate[name])

    # the fp32 framework and the fp16 TorchScript as the convert job makes it (here on CPU)
    prepared = prepare_model(plan.export.model.identity, tmp_path / "checkpoint.pt")
    family = prepared.family
    feeds = family.example_inputs(int(spec["batch_size"]), int(spec["seed"]))
    reference = family.framework_outputs(family.serving_module(prepared.checkpoint), feeds)
    out = tmp_path / "model.fp16.pt"
    module = family.serving_module(prepared.checkpoint)  # halved in place by the conversion
    torchscript_fp16(
        module, out, family.example_inputs(1, 0), script=fmt == "ts-script", device="cpu"
    )
    served = torch.jit.load(str(out))
    io = SERVED_TYPES["torchscript-fp16"]
    sent = [torch.from_numpy(a.astype(io.get(str(a.dtype), a.dtype))) for a in feeds.values()]

    def run_artifact():
        with torch.no_grad():
            result = served(*sent)
        results = result if isinstance(result, tuple) else (result,)
        return {s.name: r.numpy() for s, r in zip(family.outputs, results, strict=False)}

    def verdicts(actual, tolerance):
        rows = accuracy.compare_outputs(reference, actual, tolerance, len(sent[0]), family)
        return {r["output"]: r["passed"] for r in rows}

    everywhere = {name: True for name in gate}
    nowhere = {name: False for name in gate}
    fp16 = run_artifact()
    assert verdicts(fp16, gate) == everywhere  # the artifact as made
    # the framework moved by the largest measured error passes; by 1.5x the gate, fails
    largest = max(measured.values())
    beyond = 1.5 * max(float(t["atol"]) for t in gate.values())
    assert verdicts(shifted(reference, largest), gate) == everywhere
    assert verdicts(shifted(reference, beyond), gate) == nowhere
    assert verdicts(shifted(reference, beyond), dle) == everywhere
    # the artifact perturbed: its output layer's bias (TFT's quantile projection) moved by 1.5x
    # the gate moves every output by as much; the gate fails it, DLE's tolerance passes it
    [bias] = [p for n, p in served.named_parameters() if n.endswith("quantile_proj.bias")]
    with torch.no_grad():
        bias += beyond
    perturbed = run_artifact()
    assert verdicts(perturbed, gate) == nowhere
    assert verdicts(perturbed, dle) == everywhere
    rows = accuracy.compare_outputs(reference, perturbed, gate, len(sent[0]), family)
    assert all(r["mismatched"] == r["elements"] for r in rows)
    assert f"atol={gate[rows[0]['output']]['atol']:g}" in accuracy.format_failure(rows)
