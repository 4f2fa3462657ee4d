import csv
from pathlib import Path

import pytest

from deploybench.planning import workflow_config as dbc
from tests.conftest import base_config

PUBLISHED = Path(__file__).resolve().parents[2] / "shared" / "reference" / "published.csv"
# The published rows the config ships (config/reference/README.md).
SHIPPED_PUBLISHED = Path(__file__).resolve().parents[1] / "config" / "reference" / "published.csv"


def test_cpu_default_resolves_with_cpu_sizing(config):
    run = dbc.resolve(config, "tft", "cpu", "onnx", "fp32")
    assert run.device == "cpu"
    assert run.converter is None  # the fp32 ONNX export is served as is
    assert (
        run.settings["triton"]["max_batch_size"]
        == config["sizings"]["cpu"]["tft"]["triton"]["max_batch_size"]
    )
    # untouched keys still come from the model
    assert run.settings["hparams"] == config["models"]["tft"]["hparams"]


def test_gpu_run_keeps_seed_page_values(config):
    run = dbc.resolve(config, "tft", "A30", "trt", "fp16")
    assert run.converter == "tensorrt"
    assert run.export_format == "onnx" and run.export_precision == "fp32"
    triton = run.settings["triton"]
    assert (triton["max_batch_size"], triton["model_instances"]) == (1024, 2)
    assert triton["preferred_batch_sizes"] == [512, 1024]


def test_auto_online_grid_is_dles(config):
    """DLE's grid for TFT on A30: batch 16, concurrency 8..256 by 8 (the published rows)."""
    batch, concurrency = dbc.online_grid(dbc.resolve(config, "tft", "A30", "trt", "fp16"))
    assert batch == 16
    assert concurrency == list(range(8, 257, 8))


@pytest.mark.skipif(not PUBLISHED.exists(), reason="../shared/reference not beside the repo")
def test_auto_online_grid_matches_published_tft_rows(config):
    with PUBLISHED.open() as f:
        rows = [
            r
            for r in csv.DictReader(f)
            if r["model"] == "tft"
            and r["scenario"] == "online"
            and r["gpu"] == "A30"
            and r["format"] == "trt"
            and r["dataset"] == "electricity"
        ]
    batch, concurrency = dbc.online_grid(dbc.resolve(config, "tft", "A30", "trt", "fp16"))
    assert sorted(int(r["concurrency"]) for r in rows) == concurrency
    assert {int(r["batch"]) for r in rows} == {batch}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("bert2", "cpu", "onnx", "fp32"), "unknown model 'bert2'; valid choices: "),
        (
            ("tft", "H100", "onnx", "fp32"),
            f"unknown gpu 'H100'; valid choices: {', '.join(sorted(base_config()['gpus']))}",
        ),
        (
            ("tft", "cpu", "savedmodel", "fp32"),
            f"unknown format 'savedmodel'; valid choices: {', '.join(sorted(base_config()['formats']))}",
        ),
        (
            ("tft", "cpu", "trt", "fp32"),
            "format 'trt' does not run on gpu 'cpu'; valid choices: "
            + ", ".join(sorted(base_config()["gpus"]["cpu"]["formats"])),
        ),
        (
            ("fastpitch", "cpu", "onnx", "fp16"),
            "precision 'fp16' is not available for fastpitch/cpu/onnx; valid choices: fp32",
        ),
        (
            ("tft", "A30", "onnx", "int8"),
            "precision 'int8' is not available for tft/A30/onnx; valid choices: fp16, fp32",
        ),
    ],
)
def test_bad_runs_name_value_and_choices(config, args, message):
    with pytest.raises(dbc.ConfigError) as err:
        dbc.resolve(config, *args)
    assert message in str(err.value)


def test_batch_larger_than_max_batch_is_rejected(config):
    config["sizings"]["cpu"]["tft"]["perf"]["offline"]["batch_sizes"] = [1, 128]
    with pytest.raises(dbc.ConfigError, match="offline batch size 128 exceeds max_batch_size 64"):
        dbc.resolve(config, "tft", "cpu", "onnx", "fp32")


def test_deep_merge_replaces_lists_and_keeps_siblings():
    base = {"a": {"b": [1, 2], "c": 1}, "d": 2}
    merged = dbc.deep_merge(base, {"a": {"b": [3]}})
    assert merged == {"a": {"b": [3], "c": 1}, "d": 2}
    assert base["a"]["b"] == [1, 2]  # the input is not modified


def test_all_runs_cover_published_tft_combinations(config):
    runs = set(dbc.all_runs(config))
    with SHIPPED_PUBLISHED.open() as f:
        published = {
            (r["gpu"], r["format"], r["precision"])
            for r in csv.DictReader(f)
            if r["model"] == "tft"
        }
    assert published  # the GPUs of the seed page's TFT rows, as the config ships them
    for gpu, fmt, precision in sorted(published):
        assert f"tft/{gpu}/{fmt}/{precision}" in runs
    assert "tft/cpu/onnx/fp32" in runs and "tft/cpu/trt/fp32" not in runs


SCHEMA = Path(__file__).resolve().parents[1] / "config" / "schema" / "config.schema.yaml"


def test_shipped_config_passes_sizing_check(config):
    dbc.check_sizings(config, dbc.load_yaml(SCHEMA))


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            {"perf": {"request_count": "many"}},
            "sizings.cpu.tft.perf.request_count: 'many' is not of type 'integer'",
        ),
        (
            {"triton": {"model_instances": 0}},
            "sizings.cpu.tft.triton.model_instances: 0 is less than the minimum of 1",
        ),
        ({"perf": {"offline": {"batch_sizes": []}}}, "sizings.cpu.tft.perf.offline.batch_sizes"),
        (
            {"perf": {"warmup": 2}},
            "sizings.cpu.tft.perf: Additional properties are not allowed ('warmup'",
        ),
    ],
)
def test_bad_sizing_override_names_the_key(config, override, message):
    config["sizings"]["cpu"]["tft"] = override
    with pytest.raises(dbc.ConfigError) as err:
        dbc.check_sizings(config, dbc.load_yaml(SCHEMA))
    assert message in str(err.value)


def test_sizing_for_unknown_model_is_rejected(config):
    config["sizings"]["cpu"]["bert9"] = {}
    with pytest.raises(
        dbc.ConfigError, match="sizings.cpu: unknown model 'bert9'; valid choices: "
    ):
        dbc.check_sizings(config, dbc.load_yaml(SCHEMA))


def test_fp16_runs_are_checked_at_their_own_tolerance(config):
    fp16 = dbc.resolve(config, "bert", "A30", "trt", "fp16").settings["accuracy"]["tolerance"]
    fp32 = dbc.resolve(config, "bert", "A30", "onnx", "fp32").settings["accuracy"]["tolerance"]
    assert fp16["output__0"] == {"atol": 5.0, "rtol": 5.0}  # DLE's navigator check at fp16
    assert fp32 == config["models"]["bert"]["accuracy"]["tolerance"]
    # a model without fp16 tolerances keeps its own at fp16
    del config["models"]["bert"]["accuracy"]["precision_tolerance"]
    same = dbc.resolve(config, "bert", "A30", "trt", "fp16").settings["accuracy"]["tolerance"]
    assert same == fp32
