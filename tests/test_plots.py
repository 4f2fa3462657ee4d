"""The perf charts: their Vega-Lite specs, the Vega they compile to, and the rendered files."""

from __future__ import annotations

import json
import math
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import altair as alt
import pandas as pd
import pytest
import vl_convert as vlc

from deploybench import perf, plots
from tests.conftest import REPO

PUBLISHED = REPO.parent / "shared" / "reference" / "published.csv"
CONFIGS = [("cpu", "onnx", "fp32"), ("cpu", "ts-trace", "fp16")]
POINTS = [1, 2, 4]


def perf_rows(configs=CONFIGS, points=POINTS, model="nnunet") -> pd.DataFrame:
    """Both scenarios of each configuration, as concatenated perf CSVs would give them."""
    rows = []
    for k, (gpu, fmt, precision) in enumerate(configs, start=1):
        for scenario in ("offline", "online"):
            for n in points:
                row: dict[str, Any] = dict.fromkeys(perf.COLUMNS, math.nan)
                row.update(
                    model=model,
                    gpu=gpu,
                    format=fmt,
                    precision=precision,
                    scenario=scenario,
                    batch=n if scenario == "offline" else 1,
                    concurrency=1 if scenario == "offline" else 2 * n,
                    throughput=10.0 * n * k,
                    stable=True,
                )
                for i, column in enumerate(perf.LATENCY_COLUMNS.values(), start=1):
                    row[column] = float(i * n * k)
                rows.append(row)
    return pd.DataFrame(rows, columns=perf.COLUMNS)


def records(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """The rows a (single-dataset) spec carries inline."""
    (data,) = spec["datasets"].values()
    return data


def vega(chart: alt.TopLevelMixin) -> dict[str, Any]:
    return vlc.vegalite_to_vega(chart.to_dict())


def find(node: Any, key: str) -> list[Any]:
    """Every value of ``key`` anywhere in a nested spec."""
    found = []
    if isinstance(node, dict):
        found += [node[key]] if key in node else []
        for value in node.values():
            found += find(value, key)
    elif isinstance(node, list):
        for value in node:
            found += find(value, key)
    return found


def series_groupby(chart: alt.TopLevelMixin) -> list[str]:
    """The fields Vega splits a line mark's rows on: one path per distinct combination."""
    (facet,) = [f for f in find(vega(chart), "facet") if "groupby" in f]
    return facet["groupby"]


def assert_field(encoding: dict[str, Any], channel: str, field: str, type_: str) -> None:
    assert (encoding[channel]["field"], encoding[channel]["type"]) == (field, type_), channel


def test_offline_throughput_is_one_line_per_configuration_vs_batch():
    rows = perf_rows()
    spec = plots.offline_throughput(rows).to_dict()
    assert spec["mark"] == {"type": "line", "point": True}
    enc = spec["encoding"]
    assert_field(enc, "x", "batch", "quantitative")
    assert_field(enc, "y", "throughput", "quantitative")
    assert_field(enc, "color", plots.CONFIG, "nominal")
    assert (enc["x"]["title"], enc["y"]["title"]) == ("Batch size", "Throughput [infer/sec]")
    assert spec["title"] == {"text": "Throughput vs Batch Size", "subtitle": "nnunet"}
    data = records(spec)
    # online rows are not offline points
    assert len(data) == len(CONFIGS) * len(POINTS)
    assert {r[plots.CONFIG] for r in data} == {"cpu/onnx/fp32", "cpu/ts-trace/fp16"}
    assert series_groupby(plots.offline_throughput(rows)) == [plots.CONFIG]


def test_offline_latency_folds_the_quantiles_into_dashed_series():
    chart = plots.offline_latency(perf_rows())
    spec = chart.to_dict()
    (fold,) = spec["transform"]
    assert fold == {"fold": ["p50", "p90", "p99", "avg"], "as": ["quantile", "latency_ms"]}
    enc = spec["encoding"]
    assert_field(enc, "x", "batch", "quantitative")
    assert_field(enc, "y", "latency_ms", "quantitative")
    assert_field(enc, "color", plots.CONFIG, "nominal")
    assert_field(enc, "strokeDash", "quantile", "nominal")
    assert enc["y"]["title"] == "Latency [ms]"
    first = min(records(spec), key=lambda r: (r[plots.CONFIG], r["batch"]))
    assert (first["p50"], first["p90"], first["p99"], first["avg"]) == (8.0, 9.0, 11.0, 12.0)
    # 2 configurations x 4 quantiles = 8 lines, not 2 zig-zags
    assert set(series_groupby(chart)) == {plots.CONFIG, "quantile"}


def test_online_breakdown_stacks_the_seven_components_in_the_seed_order():
    chart = plots.online_latency_breakdown(perf_rows())
    spec = chart.to_dict()
    assert spec["mark"] == {"type": "bar"}
    enc = spec["encoding"]
    assert_field(enc, "x", "concurrency", "ordinal")
    assert_field(enc, "y", "latency_ms", "quantitative")
    assert_field(enc, "column", plots.CONFIG, "nominal")
    order = [
        "Client Send",
        "Network+Server Send/Recv",
        "Server Queue",
        "Server Compute Input",
        "Server Compute Infer",
        "Server Compute Output",
        "Client Recv",
    ]
    assert enc["color"]["scale"]["domain"] == order
    data = records(spec)
    assert len(data) == len(CONFIGS) * len(POINTS) * len(order)
    rank = {r["component"]: r["component_order"] for r in data}
    assert sorted(rank, key=rank.__getitem__) == order
    # a bar's value is its component's column: Server Queue is the 3rd latency column
    bar = [r for r in data if r["component"] == "Server Queue" and r["concurrency"] == 8]
    assert sorted(r["latency_ms"] for r in bar) == [3 * 4.0, 3 * 4.0 * 2]
    (stack,) = [t for t in find(vega(chart), "transform") for t in t if t["type"] == "stack"]
    assert stack["sort"] == {"field": ["component_order"], "order": ["ascending"]}
    assert stack["groupby"] == ["concurrency", plots.CONFIG]


def test_online_breakdown_of_one_configuration_has_no_columns():
    spec = plots.online_latency_breakdown(perf_rows(configs=CONFIGS[:1])).to_dict()
    assert "column" not in spec["encoding"]


def test_online_throughput_follows_the_concurrency_sweep_against_p99():
    chart = plots.online_throughput_latency(perf_rows())
    spec = chart.to_dict()
    enc = spec["encoding"]
    assert spec["mark"] == {"type": "line", "point": True}
    assert_field(enc, "x", "p99_latency_ms", "quantitative")
    assert_field(enc, "y", "throughput", "quantitative")
    assert_field(enc, "color", plots.CONFIG, "nominal")
    assert_field(enc, "order", "concurrency", "quantitative")
    assert sorted({r["concurrency"] for r in records(spec)}) == [2, 4, 8]
    assert series_groupby(chart) == [plots.CONFIG]


def test_comparison_is_the_scenario_throughput_chart():
    rows = perf_rows(
        configs=[("cpu", "onnx", "fp32"), ("cpu", "onnx", "fp16"), ("T4", "trt", "fp16")]
    )
    offline = plots.comparison(rows, "offline").to_dict()
    assert offline == plots.offline_throughput(rows).to_dict()
    assert len({r[plots.CONFIG] for r in records(offline)}) == 3
    assert (
        plots.comparison(rows, "online").to_dict()
        == plots.online_throughput_latency(rows).to_dict()
    )
    with pytest.raises(
        ValueError, match=r"unknown scenario 'batch'; valid: \['offline', 'online'\]"
    ):
        plots.comparison(rows, "batch")


def published_rows() -> pd.DataFrame:
    """Published-table rows: a source column of their own, gaps, another model, two accelerators."""
    rows = []
    for accelerator, factor in (("none", 1.0), ("trt", 2.0)):
        for n in POINTS:
            rows.append(
                {
                    "source": "000_seed.txt",
                    "model": "nnunet",
                    "scenario": "offline",
                    "gpu": "T4",
                    "format": "onnx",
                    "precision": "fp16",
                    "accelerator": accelerator,
                    "batch": n,
                    "concurrency": 1,
                    "throughput": 100.0 * n * factor,
                    "p99_latency_ms": math.nan,
                }
            )
    gaps = [
        {"model": "nnunet", "scenario": "offline", "batch": 8, "throughput": math.nan},
        {"model": "nnunet", "scenario": "offline", "batch": math.nan, "throughput": 5.0},
        {"model": "bert", "scenario": "offline", "batch": 1, "throughput": 7.0},
        # online tables have no batch column: fine for the online overlay (x = concurrency)
        {
            "model": "nnunet",
            "scenario": "online",
            "batch": math.nan,
            "concurrency": 16,
            "throughput": 9.0,
        },
    ]
    for gap in gaps:
        rows.append({**rows[0], "source": "000_seed.txt", "accelerator": "none", **gap})
    return pd.DataFrame(rows)


def test_published_overlay_keeps_the_sources_apart():
    measured, published = perf_rows(), published_rows()
    chart = plots.published_overlay(measured, published, "offline")
    spec = chart.to_dict()
    enc = spec["encoding"]
    assert_field(enc, "x", "batch", "quantitative")
    assert_field(enc, "y", "throughput", "quantitative")
    assert_field(enc, "color", plots.CONFIG, "nominal")
    assert_field(enc, "shape", plots.SOURCE, "nominal")
    assert_field(enc, "strokeDash", plots.SOURCE, "nominal")
    data = records(spec)
    by_source: dict[str, set[str]] = {}
    for r in data:
        by_source.setdefault(r[plots.SOURCE], set()).add(r[plots.CONFIG])
    assert by_source == {
        "measured": {"cpu/onnx/fp32", "cpu/ts-trace/fp16"},
        "published": {"T4/onnx/fp16"},
    }
    # the rows lacking batch or throughput, and the other model's row, are gone
    assert sorted(r["throughput"] for r in data if r[plots.SOURCE] == "published") == [
        100.0,
        200.0,
        200.0,
        400.0,
        400.0,
        800.0,
    ]
    # the two published accelerators of one configuration are two lines, not one zig-zag
    assert {r["series"] for r in data if r[plots.SOURCE] == "published"} == {
        "published T4/onnx/fp16 none",
        "published T4/onnx/fp16 trt",
    }
    assert "series" in series_groupby(chart)

    online = records(plots.published_overlay(measured, published, "online").to_dict())
    assert [
        (r["concurrency"], r["throughput"]) for r in online if r[plots.SOURCE] == "published"
    ] == [(16, 9.0)]


def test_charts_take_a_single_row_and_nan_latencies():
    row = perf_rows(configs=CONFIGS[:1], points=[1])
    latency = list(perf.LATENCY_COLUMNS.values())
    row.loc[:, latency] = math.nan
    row.loc[row["scenario"] == "offline", "p50_latency_ms"] = 3.0
    charts = [
        plots.offline_throughput(row),
        plots.offline_latency(row),
        plots.online_latency_breakdown(row),
        plots.online_throughput_latency(row),
        plots.published_overlay(row, row.iloc[:0], "online"),
    ]
    for chart in charts:
        assert vlc.vegalite_to_svg(chart.to_dict()).lstrip().startswith("<svg")
    spec = charts[1].to_dict()
    assert [(r["p50"], r["p90"]) for r in records(spec)] == [(3.0, None)]
    # no p99 -> no point on the throughput/latency chart, and no bars without components
    assert records(charts[3].to_dict()) == []
    assert records(charts[2].to_dict()) == []


def test_bad_rows_are_named():
    rows = perf_rows()
    with pytest.raises(ValueError, match=r"lack columns \['throughput'\]"):
        plots.offline_throughput(rows.drop(columns="throughput"))
    mixed = pd.concat([rows, perf_rows(model="bert")])
    with pytest.raises(ValueError, match=r"several models \['bert', 'nnunet'\]"):
        plots.offline_throughput(mixed)
    with pytest.raises(ValueError, match="unknown scenario 'both'"):
        plots.published_overlay(rows, rows, "both")


def test_save_writes_svg_png_and_html(tmp_path: Path):
    chart = plots.offline_throughput(perf_rows())
    paths = plots.save(chart, tmp_path / "plots" / "throughput")
    stem = tmp_path / "plots" / "throughput"
    assert paths == [stem.with_suffix(".svg"), stem.with_suffix(".png"), stem.with_suffix(".html")]
    # nothing else: the temporary files were renamed into place
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == sorted(p.name for p in paths)

    png = paths[1].read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    assert len(png) > 10_000

    root = ET.parse(paths[0]).getroot()
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    assert "Throughput vs Batch Size" in "".join(root.itertext())

    html = paths[2].read_text()
    assert "vega-lite" in html
    assert json.dumps(chart.to_dict()["title"]) in html
    assert "cpu/ts-trace/fp16" in html
    # the page carries vega's JavaScript: it displays without the network
    assert "cdn.jsdelivr.net" not in html


@pytest.mark.skipif(not PUBLISHED.exists(), reason=f"{PUBLISHED} not present")
def test_published_overlay_takes_the_reference_table():
    published = pd.read_csv(PUBLISHED)
    measured = perf_rows(configs=[("cpu", "ts-script", "fp32")])
    for scenario in ("offline", "online"):
        spec = plots.published_overlay(measured, published, scenario).to_dict()
        data = records(spec)
        assert {r["model"] for r in data} == {"nnunet"}
        published_configs = {r[plots.CONFIG] for r in data if r[plots.SOURCE] == "published"}
        assert "A100/ts-script/fp16" in published_configs
