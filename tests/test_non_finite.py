"""Non-finite numbers are named where they start: a checkpoint holding NaN or Inf is refused when
it is read, and weights that fp16 cannot hold are named by the conversion."""

from __future__ import annotations

import json
import textwrap

import numpy as np
import pytest
import torch

from deploybench.checkpoint import prepare_checkpoint
from deploybench.convert import onnx_fp16, torchscript_fp16
from deploybench.errors import CheckpointError, ConversionError
from tests.conftest import REPO, run_snakemake
from tests.dle_fixtures import tft_reference_checkpoint, write_tft_train_checkpoint


def test_a_diverged_dle_checkpoint_is_refused_naming_its_tensors(tmp_path):
    """A DLE-layout TFT checkpoint (train.py's checkpoint.pt) with NaN and Inf weights fails in
    prepare_checkpoint, not later in export as an accuracy mismatch."""
    _, family, state = tft_reference_checkpoint("TFTpart2")
    nan_name, inf_name = sorted(k for k in state if k.endswith(".weight"))[:2]
    state[nan_name] = state[nan_name].clone()
    state[nan_name].view(-1)[:3] = float("nan")
    state[inf_name] = state[inf_name].clone()
    state[inf_name].view(-1)[0] = float("inf")
    folder = write_tft_train_checkpoint(tmp_path / "electricity_bin", state)
    with pytest.raises(CheckpointError) as err:
        prepare_checkpoint(family, str(folder), 0, tmp_path / "out.pt")
    message = str(err.value)
    assert "2 tensor(s) hold NaN or Inf" in message
    assert f"{nan_name.removeprefix('TFTpart2.')} (3 NaN, 0 Inf)" in message
    assert f"{inf_name.removeprefix('TFTpart2.')} (0 NaN, 1 Inf)" in message
    assert "attention._mask" not in message  # its -inf is the causal mask's, by design
    assert not (tmp_path / "out.pt").exists()


def test_nan_in_a_tensor_that_may_hold_inf_is_still_refused(tmp_path):
    _, family, state = tft_reference_checkpoint("TFTpart2")
    mask = "TFTpart2.attention._mask"
    state[mask] = state[mask].clone()
    state[mask].view(-1)[0] = float("nan")
    folder = write_tft_train_checkpoint(tmp_path / "electricity_bin", state)
    with pytest.raises(CheckpointError, match=r"attention\._mask \(1 NaN, 0 Inf\)"):
        prepare_checkpoint(family, str(folder), 0, tmp_path / "out.pt")


def _onnx_with_weights(path, **weights: float) -> None:
    """y = x + w1 + w2 ...: one float32 initializer of 4 values per weight."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    inits, nodes, previous = [], [], "x"
    for i, (name, value) in enumerate(weights.items()):
        inits.append(numpy_helper.from_array(np.full(4, value, np.float32), name))
        nodes.append(helper.make_node("Add", [previous, name], [f"s{i}"]))
        previous = f"s{i}"
    nodes.append(helper.make_node("Identity", [previous], ["y"]))
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
        inits,
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(path))


def test_onnx_fp16_names_the_weights_it_clips(tmp_path, caplog):
    source = tmp_path / "model.onnx"
    _onnx_with_weights(source, small=0.5, large=2.0e4, huge=7.0e4)
    with caplog.at_level("WARNING", logger="deploybench.convert"):
        clipped = onnx_fp16(source, tmp_path / "fp16.onnx")
    assert clipped == ["large (4 values, max |x| 2e+04)", "huge (4 values, max |x| 7e+04)"]
    assert "huge" in caplog.text and "beyond float16's range" in caplog.text
    assert (tmp_path / "fp16.onnx").is_file()


def test_torchscript_fp16_refuses_weights_that_overflow_naming_them(tmp_path):
    class Scaled(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ok = torch.nn.Parameter(torch.ones(3))
            self.big = torch.nn.Parameter(torch.tensor([1.0, 1.0e5, -7.0e4]))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * self.ok * self.big

    feeds = {"x": np.ones((1, 3), np.float32)}
    with pytest.raises(ConversionError, match=r"big \(2 values, max \|x\| 1e\+05\)") as err:
        torchscript_fp16(Scaled(), tmp_path / "fp16.pt", feeds, script=False, device="cpu")
    assert "ok" not in str(err.value).split("infinite:")[1]
    assert not (tmp_path / "fp16.pt").exists()


def test_a_job_refusing_a_diverged_checkpoint_says_why_in_its_log_file(tmp_path):
    """Snakemake sends the reader of a failed job to its log file: the job's error is there (its
    traceback too), as well as on stderr, and the job fails as before."""
    ref, _, state = tft_reference_checkpoint("TFTpart2")
    nan_name = min(k for k in state if k.endswith(".weight"))
    state[nan_name] = state[nan_name].clone()
    state[nan_name].view(-1)[0] = float("nan")
    folder = write_tft_train_checkpoint(tmp_path / "electricity_bin", state)
    model = {"module": "tft", "hparams": ref["hparams"], "checkpoint": str(folder), "seed": 0}
    (tmp_path / "spec.json").write_text(json.dumps({"model": model}))
    (tmp_path / "Snakefile").write_text(
        textwrap.dedent(
            f"""
            import json

            rule prepare_checkpoint:
                output:
                    checkpoint="out/model.pt",
                    provenance="out/model.pt.provenance.json",
                log:
                    "logs/checkpoint.log",
                params:
                    spec=json.loads(open("spec.json").read()),
                script:
                    "{REPO / "scripts" / "checkpoint.py"}"
            """
        )
    )
    result = run_snakemake(
        tmp_path, "--cores", "1", "out/model.pt", snakefile=tmp_path / "Snakefile", timeout=300
    )
    assert result.returncode != 0
    assert "check log file(s) for error details" in result.stderr
    log_text = (tmp_path / "logs" / "checkpoint.log").read_text()
    assert log_text.count("rule prepare_checkpoint failed") == 1
    assert "Traceback" in log_text
    assert "CheckpointError: " in log_text and "1 tensor(s) hold NaN or Inf" in log_text
    assert "1 tensor(s) hold NaN or Inf" in result.stderr  # the job's own stderr, as before
