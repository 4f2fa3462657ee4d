"""Where DLE's published label and what it ran differ (``models.<m>.published_ran``): TFT's
ts-trace "fp16" rows served the fp32 export (Model Navigator 0.2.7 passes TorchScript through),
so they are compared with our ts-trace fp32 run, with a note, and our ts-trace fp16 run stays its
own. And TFT's trt rows ran with CUDA graphs (DLE passed --tensorrt-capture-cuda-graph), so our
tft trt config.pbtxt captures them. Fast: config, published rows and generated configs only."""

from __future__ import annotations

import copy
from pathlib import Path

import pandas as pd
import pytest
from snakemake.exceptions import WorkflowError

from deploybench.cli import published_label_notes
from deploybench.model_repository import model_config
from deploybench.models import load_family
from deploybench.planning import serving_plan
from deploybench.planning import workflow_config as dbc
from deploybench.report_published import published_notes, published_rows, ratios, summary_section
from deploybench.triton_config import parse_pbtxt, to_pbtxt
from tests.conftest import REPO, base_config, validated
from tests.test_compare import run_cli, write_run

PUBLISHED = REPO / "config" / "reference" / "published.csv"
TFT_MODELS = ("tft", "tft_traffic")


@pytest.fixture(scope="module")
def published() -> pd.DataFrame:
    return pd.read_csv(PUBLISHED)


def row(dataset: str = "electricity", fmt: str = "ts-trace", precision: str = "fp16") -> dict:
    return {
        "model": "tft",
        "dataset": dataset,
        "gpu": "A30",
        "format": fmt,
        "precision": precision,
        "accelerator": "none",
    }


# --- the mapping: data in the config, checked ---------------------------------------------


def test_the_mapping_is_config_data_for_both_tft_entries():
    config = validated(base_config())
    for model in TFT_MODELS:
        (entry,) = config["models"][model]["published_ran"]["ts-trace"].values()
        assert dbc.published_ran(config, model) == {"ts-trace": {"fp16": entry}}
        assert entry["precision"] == "fp32" and "Model Navigator 0.2.7" in entry["note"]
    dbc.check_published_ran(config)
    # no other model's label is doubted
    assert not any(dbc.published_ran(config, m) for m in config["models"] if m not in TFT_MODELS)


@pytest.mark.parametrize(
    "entry",
    [
        {"precision": "fp32"},  # no note
        {"precision": "fp64", "note": "x"},  # not a precision
        {"precision": "fp32", "note": ""},  # an empty note
        {"precision": "fp32", "note": "x", "why": "y"},  # an unknown key
    ],
)
def test_schema_rejects_a_bad_entry(entry):
    config = base_config()
    config["models"]["tft"]["published_ran"] = {"ts-trace": {"fp16": entry}}
    with pytest.raises(WorkflowError):
        validated(config)


def test_schema_rejects_a_label_that_is_not_a_precision():
    config = base_config()
    config["models"]["tft"]["published_ran"] = {
        "ts-trace": {"half": {"precision": "fp32", "note": "x"}}
    }
    with pytest.raises(WorkflowError):
        validated(config)


@pytest.mark.parametrize(
    ("mapping", "message"),
    [
        ({"ts-script": {"fp16": {"precision": "fp32", "note": "x"}}}, "unknown format 'ts-script'"),
        ({"ts-trace": {"int8": {"precision": "fp32", "note": "x"}}}, "unknown precision 'int8'"),
        ({"ts-trace": {"fp16": {"precision": "fp16", "note": "x"}}}, "ran the precision it is"),
    ],
)
def test_check_names_an_entry_the_model_cannot_run(mapping, message):
    config = base_config()
    config["models"]["tft"]["published_ran"] = mapping
    validated(copy.deepcopy(config))  # the shape is right: the check is the config's
    with pytest.raises(dbc.ConfigError, match=message):
        dbc.check_published_ran(config)


# --- applied: which run a published row is compared with ----------------------------------


def test_published_ts_trace_fp16_rows_map_to_the_fp32_runs():
    config = base_config()
    assert dbc.reference_run(config, row()).path == "tft/A30/ts-trace/fp32"
    assert dbc.reference_run(config, row("traffic")).path == "tft_traffic/A30/ts-trace/fp32"
    # a label that holds is kept: trt fp16 is a real fp16 engine
    assert dbc.reference_run(config, row(fmt="trt")).path == "tft/A30/trt/fp16"
    # without the mapping, the label is taken at its word
    del config["models"]["tft"]["published_ran"]
    assert dbc.reference_run(config, row()).path == "tft/A30/ts-trace/fp16"


@pytest.mark.parametrize("model", TFT_MODELS)
def test_fp32_run_gets_the_fp16_labelled_rows_and_the_fp16_run_none(published, model):
    config = base_config()
    dataset = "electricity" if model == "tft" else "traffic"
    for gpu in ("A30", "A100", "T4"):
        fp32 = published_rows(config, published, f"{model}/{gpu}/ts-trace/fp32")
        assert len(fp32) == 43, gpu  # the page's 11 offline and 32 online points
        assert set(fp32["format"]) == {"ts-trace"} and set(fp32["precision"]) == {"fp16"}
        assert set(fp32["dataset"]) == {dataset} and set(fp32["gpu"]) == {gpu}
        assert published_rows(config, published, f"{model}/{gpu}/ts-trace/fp16").empty
        # the trt rows stay with the trt fp16 run
        assert len(published_rows(config, published, f"{model}/{gpu}/trt/fp16")) == 43


def test_notes_say_it_beside_each_run(published):
    config = base_config()
    (fp32_note,) = published_notes(config, published, "tft/A30/ts-trace/fp32")
    assert fp32_note.startswith(
        "Compared with the published rows labelled ts-trace fp16, which ran fp32: DLE exported"
    )
    (fp16_note,) = published_notes(config, published, "tft/A30/ts-trace/fp16")
    assert fp16_note.startswith("Not compared with the published rows labelled ts-trace fp16")
    assert fp16_note.endswith(
        "They are compared with tft/A30/ts-trace/fp32; this run has no published figures."
    )
    # nothing where the labels hold or no such row was published (trt; a CPU; an H100)
    for run in ("tft/A30/trt/fp16", "tft/cpu/ts-trace/fp32", "tft/H100-SXM/ts-trace/fp16"):
        assert published_notes(config, published, run) == [], run


def test_report_summary_sets_fp16_apart_and_notes_the_fp32_comparison(published):
    """A page with both runs: the fp32 run's table holds the published "fp16" figures with the
    note beside it; the fp16 run's has none, and its note says where they went."""
    config = base_config()
    runs = ("tft/A30/ts-trace/fp32", "tft/A30/ts-trace/fp16")
    labelled = published[
        (published["model"] == "tft")
        & (published["dataset"] == "electricity")
        & (published["gpu"] == "A30")
        & (published["format"] == "ts-trace")
    ]
    comparisons, notes = {}, {}
    for run in runs:
        # our points: the published ones measured again (fp16 twice as fast)
        factor = 2.0 if run.endswith("fp16") else 1.0
        ours = labelled.assign(throughput=labelled["throughput"] * factor)
        comparisons[run] = ratios(ours, published_rows(config, published, run))
        notes[run] = published_notes(config, published, run)
    assert len(comparisons[runs[0]]) == 43 and comparisons[runs[1]].empty
    assert comparisons[runs[0]]["throughput_ratio"].tolist() == pytest.approx([1.0] * 43)
    page = summary_section(comparisons, notes)
    fp32_part, fp16_part = page.split(f"### {runs[1]}")
    assert f"*Note:* {notes[runs[0]][0]}" in fp32_part
    assert "| Published inferences/s |" in fp32_part
    assert f"*Note:* {notes[runs[1]][0]}" in fp16_part
    assert "No published figures for this configuration." in fp16_part
    # a page without notes reads as before
    assert "*Note:*" not in summary_section(comparisons)


def test_compare_prints_the_note_beside_the_run(tmp_path: Path, capsys):
    for side in ("a", "b"):
        for run in ("tft/A30/ts-trace/fp16", "tft/A30/ts-trace/fp32", "tft/A30/trt/fp16"):
            write_run(tmp_path / side, run=run)
    code, out, _ = run_cli(
        tmp_path / "a",
        tmp_path / "b",
        "--configfile",
        REPO / "config" / "config.yaml",
        capsys=capsys,
    )
    assert code == 0
    notes = [line for line in out.splitlines() if "published rows labelled" in line]
    assert len(notes) == 2
    assert notes[0].startswith("Note: tft/A30/ts-trace/fp16: Not compared with the published")
    assert notes[1].startswith("Note: tft/A30/ts-trace/fp32: Compared with the published")
    # two run directories compared whatever their names: both names' notes
    points = pd.DataFrame({"run": ["tft/A30/ts-trace/fp16 → tft/A30/ts-trace/fp32"]})
    both = published_label_notes(base_config(), points)
    assert [n.split(":")[0] for n in both] == ["tft/A30/ts-trace/fp16", "tft/A30/ts-trace/fp32"]


# --- CUDA graphs: on for TFT's trt, as DLE's deploy step wrote them ------------------------


def _config_pbtxt(run: dbc.Run) -> str:
    family = load_family(run.settings["module"], run.settings["hparams"])
    built = model_config(
        name=run.model,
        serving=serving_plan.serving(run),
        triton=run.settings["triton"],
        device=run.device,
        inputs=family.inputs,
        outputs=family.outputs,
        artifact_name=run.format_settings["artifact"],
        engine_cache=Path("/results", run.path, "trt_engine_cache"),
    )
    return to_pbtxt(built)


@pytest.mark.parametrize("model", TFT_MODELS)
def test_tft_trt_config_captures_cuda_graphs(model):
    config = base_config()
    text = _config_pbtxt(dbc.resolve(config, model, "A30", "trt", "fp16"))
    parsed = parse_pbtxt(text)
    assert parsed.platform == "tensorrt_plan" and parsed.optimization.cuda.graphs
    assert "cuda {\n    graphs: true\n  }" in text
    # as DLE's: the dynamic batcher's preferred sizes, which Triton's TensorRT backend captures
    # (with batch 1 and max_batch_size) when no graph_spec is given
    assert list(parsed.dynamic_batching.preferred_batch_size) == [512, 1024]
    assert not parsed.optimization.cuda.graph_spec
    # only the TensorRT backend: Model Navigator's PyTorch configurator writes no optimization
    for fmt in ("ts-trace", "onnx"):
        other = parse_pbtxt(_config_pbtxt(dbc.resolve(config, model, "A30", fmt, "fp16")))
        assert not other.HasField("optimization"), fmt
    # and nowhere on the CPU default (python backend)
    cpu = parse_pbtxt(_config_pbtxt(dbc.resolve(config, model, "cpu", "onnx", "fp32")))
    assert cpu.backend == "python" and not cpu.optimization.cuda.graphs
