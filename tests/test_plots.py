"""The perf charts: their Vega-Lite specs, the Vega they compile to, and the rendered files."""

from __future__ import annotations

import json
import math
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path
from typing import Any

import altair as alt
import pandas as pd
import pytest
import vl_convert as vlc

from deploybench import perf, plots
from deploybench.columns import INTERVAL_COLUMNS
from tests.conftest import REPO

PUBLISHED = REPO.parent / "shared" / "reference" / "published.csv"
CONFIGS = [("cpu", "onnx", "fp32"), ("cpu", "ts-trace", "fp16")]
POINTS = [1, 2, 4]
CI = 0.1  # each half-width: this fraction of its value
SVG = "{http://www.w3.org/2000/svg}"


def perf_rows(configs=CONFIGS, points=POINTS, model="nnunet", ci=CI) -> pd.DataFrame:
    """Both scenarios of each configuration, as concatenated perf CSVs would give them.

    ``ci``: each interval's half-width as a fraction of its value; None: one trial (NaN).
    """
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
                if ci is not None:
                    for value, interval in INTERVAL_COLUMNS.items():
                        row[interval] = row[value] * ci
                rows.append(row)
    return pd.DataFrame(rows, columns=perf.COLUMNS)


def records(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """The rows a (single-dataset) spec carries inline, which all its layers share."""
    (data,) = spec["datasets"].values()
    return data


def layers(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """A layered chart's layers, inside its facet when it has one."""
    return spec.get("spec", spec)["layer"]


def error_layers(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [layer for layer in layers(spec) if layer["mark"]["type"] == "errorbar"]


def unstable_layer(spec: dict[str, Any]) -> dict[str, Any] | None:
    """The layer of unstable marks (the only one encoding stroke), if any."""
    found = [layer for layer in layers(spec) if "stroke" in layer["encoding"]]
    assert len(found) <= 1
    return found[0] if found else None


def selected(rows: list[dict[str, Any]], layer: dict[str, Any]) -> list[dict[str, Any]]:
    """The rows a layer draws: its filters (the two predicates the charts use) applied."""
    for transform in layer.get("transform", []):
        if "filter" not in transform:
            continue
        predicate = transform["filter"]
        if "equal" in predicate:
            rows = [r for r in rows if r.get(predicate["field"]) == predicate["equal"]]
        elif predicate.get("valid") is True:
            rows = [r for r in rows if _valid(r.get(predicate["field"]))]
        else:
            raise AssertionError(f"unexpected filter {predicate}")
    return rows


def _valid(value: Any) -> bool:
    return value is not None and not (isinstance(value, float) and math.isnan(value))


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


def assert_error_bars(
    spec: dict[str, Any], expected: dict[str, tuple[str, str, str]], color: str | None = None
) -> None:
    """One error-bar layer per channel: ``{"yError": (x, y, half-width field)}``, drawing
    exactly the rows whose half-width has a value."""
    bars = error_layers(spec)
    found = {}
    for layer in bars:
        enc = layer["encoding"]
        (channel,) = {"xError", "yError"} & set(enc)
        found[channel] = (enc["x"]["field"], enc["y"]["field"], enc[channel]["field"])
        if color is not None:
            assert enc["color"]["field"] == color
        rows = records(spec)
        field = enc[channel]["field"]
        assert selected(rows, layer) == [r for r in rows if _valid(r.get(field))]
    assert found == expected


def test_offline_throughput_is_one_line_per_configuration_vs_batch():
    rows = perf_rows()
    spec = plots.offline_throughput(rows).to_dict()
    line = layers(spec)[0]
    assert line["mark"] == {"type": "line", "point": True}
    enc = line["encoding"]
    assert_field(enc, "x", "batch", "quantitative")
    assert_field(enc, "y", "throughput", "quantitative")
    assert_field(enc, "color", plots.CONFIG, "nominal")
    assert (enc["x"]["title"], enc["y"]["title"]) == ("Batch size", "Throughput [infer/sec]")
    assert spec["title"] == {"text": "Throughput vs Batch Size", "subtitle": "nnunet"}
    # interactive (pan/zoom bound to the scales) on the layered chart still
    assert [p["bind"] for p in spec["params"]] == ["scales"]
    data = records(spec)
    # online rows are not offline points
    assert len(data) == len(CONFIGS) * len(POINTS)
    assert {r[plots.CONFIG] for r in data} == {"cpu/onnx/fp32", "cpu/ts-trace/fp16"}
    assert series_groupby(plots.offline_throughput(rows)) == [plots.CONFIG]
    assert_error_bars(
        spec, {"yError": ("batch", "throughput", "throughput_ci95")}, color=plots.CONFIG
    )
    first = min(data, key=lambda r: (r[plots.CONFIG], r["batch"]))
    assert first["throughput_ci95"] == pytest.approx(10.0 * CI)
    assert unstable_layer(spec) is None  # every point stable


def test_offline_latency_is_one_line_per_configuration_and_quantile():
    chart = plots.offline_latency(perf_rows())
    spec = chart.to_dict()
    line = layers(spec)[0]
    enc = line["encoding"]
    assert_field(enc, "x", "batch", "quantitative")
    assert_field(enc, "y", "latency_ms", "quantitative")
    assert_field(enc, "color", plots.CONFIG, "nominal")
    assert_field(enc, "strokeDash", "quantile", "nominal")
    assert enc["strokeDash"]["scale"]["domain"] == ["p50", "p90", "p99", "avg"]
    assert enc["y"]["title"] == "Latency [ms]"
    assert [p["bind"] for p in spec["params"]] == ["scales"]
    # each quantile carries its own interval: p90's is p90_latency_ms_ci95, not p50's
    first = {
        r["quantile"]: (r["latency_ms"], round(r["latency_ci95"], 9))
        for r in records(spec)
        if (r[plots.CONFIG], r["batch"]) == ("cpu/onnx/fp32", 1)
    }
    assert first == {"p50": (8.0, 0.8), "p90": (9.0, 0.9), "p99": (11.0, 1.1), "avg": (12.0, 1.2)}
    assert_error_bars(spec, {"yError": ("batch", "latency_ms", "latency_ci95")}, color=plots.CONFIG)
    # 2 configurations x 4 quantiles = 8 lines, not 2 zig-zags
    assert set(series_groupby(chart)) == {plots.CONFIG, "quantile"}


def drawn(root: ET.Element, mark_class: str) -> list[ET.Element]:
    """The rendered items of the mark groups whose class contains ``mark_class``."""
    return [
        item
        for group in root.iter(f"{SVG}g")
        if mark_class in group.get("class", "")
        for item in group
    ]


def legend_entries(svg: str) -> dict[str, dict[str, str]]:
    """A rendered legend's entries: label -> its symbol's SVG attributes."""
    entries = {}
    for group in ET.fromstring(svg).iter(f"{SVG}g"):
        parts = {child.get("class", ""): child for child in group if child.tag == f"{SVG}g"}
        symbol = next((g for c, g in parts.items() if "role-legend-symbol" in c), None)
        label = next((g for c, g in parts.items() if "role-legend-label" in c), None)
        if symbol is not None and label is not None:
            path = symbol.find(f"{SVG}path")
            assert path is not None
            entries["".join(label.itertext())] = dict(path.attrib)
    return entries


def test_offline_latency_legend_draws_each_quantile_dash():
    svg = vlc.vegalite_to_svg(plots.offline_latency(perf_rows()).to_dict())
    entries = legend_entries(svg)
    quantiles = [entries[q] for q in ("p50", "p90", "p99", "avg")]
    for symbol in quantiles:
        # a visible stroke (not filled points, stroke transparent: no dash to see)
        assert symbol.get("stroke") not in (None, "transparent", "none"), symbol
        assert symbol["d"].startswith("M-") and "A" not in symbol["d"], "a stroke, not a circle"
    dashes = [symbol["stroke-dasharray"] for symbol in quantiles]
    assert len(set(dashes)) == 4, dashes
    assert entries["cpu/onnx/fp32"]["fill"] != entries["cpu/ts-trace/fp16"]["fill"]


def test_online_breakdown_stacks_the_seven_components_in_the_seed_order():
    chart = plots.online_latency_breakdown(perf_rows())
    spec = chart.to_dict()
    assert spec["facet"]["column"]["field"] == plots.CONFIG
    assert spec["title"]["text"] == "Latency breakdown vs Concurrency"
    bars = layers(spec)[0]
    assert bars["mark"] == {"type": "bar"}
    enc = bars["encoding"]
    assert_field(enc, "x", "concurrency", "ordinal")
    assert_field(enc, "y", "latency_ms", "quantitative")
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
    assert bars["transform"][0] == {"fold": order, "as": ["component", "latency_ms"]}
    data = records(spec)
    # one row per point: the bars fold its components, the error bar takes its avg latency
    assert len(data) == len(CONFIGS) * len(POINTS)
    # a bar's value is its component's column: Server Queue is the 3rd latency column
    point = [r for r in data if r["concurrency"] == 8]
    assert sorted(r["Server Queue"] for r in point) == [3 * 4.0, 3 * 4.0 * 2]
    compiled = vega(chart)
    # stacked per concurrency (and configuration: the facet's scale domains, then each cell)
    stacks = [t for t in find(compiled, "transform") for t in t if t["type"] == "stack"]
    assert [s["groupby"] for s in stacks] == [["concurrency", plots.CONFIG], ["concurrency"]]
    for stack in stacks:
        assert stack["sort"] == {"field": ["component_order"], "order": ["ascending"]}
    ranks = [t for t in find(compiled, "transform") for t in t if t.get("as") == "component_order"]
    assert ranks and all(f"indexof({json.dumps(order)}" in t["expr"] for t in ranks)
    # the components have no interval: the bar is the average latency's, and says so
    assert_error_bars(spec, {"yError": ("concurrency", "avg_latency_ms", "avg_latency_ms_ci95")})
    (error,) = error_layers(spec)
    assert error["encoding"]["strokeDash"]["scale"]["domain"] == ["avg latency ± 95 % CI"]


def test_online_breakdown_renders_its_bars_and_error_bars():
    rows = perf_rows(configs=CONFIGS[:1])
    spec = plots.sized(plots.online_latency_breakdown(rows), 300, 200).to_dict()
    assert "facet" not in spec
    svg = vlc.vegalite_to_svg(spec)
    assert "avg latency ± 95 % CI" in legend_entries(svg)
    root = ET.fromstring(svg)
    assert len(drawn(root, "mark-rect role-mark layer_0_marks")) == len(POINTS) * 7
    assert len(drawn(root, "mark-rule role-mark")) == len(POINTS)


def test_online_throughput_follows_the_concurrency_sweep_against_p99():
    chart = plots.online_throughput_latency(perf_rows())
    spec = chart.to_dict()
    line = layers(spec)[0]
    enc = line["encoding"]
    assert line["mark"] == {"type": "line", "point": True}
    assert_field(enc, "x", "p99_latency_ms", "quantitative")
    assert_field(enc, "y", "throughput", "quantitative")
    assert_field(enc, "color", plots.CONFIG, "nominal")
    assert_field(enc, "order", "concurrency", "quantitative")
    assert sorted({r["concurrency"] for r in records(spec)}) == [2, 4, 8]
    assert series_groupby(chart) == [plots.CONFIG]
    # intervals on both axes
    assert_error_bars(
        spec,
        {
            "xError": ("p99_latency_ms", "throughput", "p99_latency_ms_ci95"),
            "yError": ("p99_latency_ms", "throughput", "throughput_ci95"),
        },
        color=plots.CONFIG,
    )


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
    enc = layers(spec)[0]["encoding"]
    assert_field(enc, "x", "batch", "quantitative")
    assert_field(enc, "y", "throughput", "quantitative")
    assert_field(enc, "color", plots.CONFIG, "nominal")
    assert_field(enc, "shape", plots.SOURCE, "nominal")
    assert_field(enc, "strokeDash", plots.SOURCE, "nominal")
    assert [p["bind"] for p in spec["params"]] == ["scales"]
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
    # measured points carry their interval; published rows have none, so no bar
    assert_error_bars(spec, {"yError": ("batch", "throughput", "throughput_ci95")})
    (error,) = error_layers(spec)
    assert {r[plots.SOURCE] for r in selected(data, error)} == {"measured"}

    online = records(plots.published_overlay(measured, published, "online").to_dict())
    assert [
        (r["concurrency"], r["throughput"]) for r in online if r[plots.SOURCE] == "published"
    ] == [(16, 9.0)]


def with_unstable(rows: pd.DataFrame, points: dict[str, set[int]]) -> pd.DataFrame:
    """``rows`` with the onnx configuration's points in ``points`` (scenario -> batch or
    concurrency) unstable; the ts-trace rows' verdict missing (NaN), as from an older CSV."""
    rows = rows.copy()
    rows["stable"] = rows["stable"].astype(object)
    for scenario, values in points.items():
        x = plots.SCENARIO_X[scenario]
        hit = (rows["format"] == "onnx") & (rows["scenario"] == scenario) & rows[x].isin(values)
        rows.loc[hit, "stable"] = False
    rows.loc[rows["format"] == "ts-trace", "stable"] = math.nan
    return rows


ChartOf = Callable[[pd.DataFrame], alt.TopLevelMixin]
CHARTS: dict[str, tuple[str, ChartOf]] = {
    "offline_throughput": ("offline", plots.offline_throughput),
    "offline_latency": ("offline", plots.offline_latency),
    "online_latency_breakdown": ("online", plots.online_latency_breakdown),
    "online_throughput_latency": ("online", plots.online_throughput_latency),
    "published_offline": (
        "offline",
        lambda rows: plots.published_overlay(rows, published_rows(), "offline"),
    ),
    "published_online": (
        "online",
        lambda rows: plots.published_overlay(rows, published_rows(), "online"),
    ),
}


@pytest.mark.parametrize("as_read", [False, True], ids=["bools", "read_csv"])
@pytest.mark.parametrize("name", list(CHARTS))
def test_unstable_points_are_marked_on_every_chart(name: str, as_read: bool, tmp_path: Path):
    scenario, chart_of = CHARTS[name]
    rows = with_unstable(perf_rows(), {"offline": {2}, "online": {4, 8}})
    if as_read:  # the CSV's "True"/"False"/"" as pandas reads them back
        rows.to_csv(tmp_path / "perf.csv", index=False)
        rows = pd.read_csv(tmp_path / "perf.csv")
    spec = chart_of(rows).to_dict()
    layer = unstable_layer(spec)
    assert layer is not None
    assert layer["mark"]["filled"] is False and layer["mark"]["shape"] == "circle"
    stroke = layer["encoding"]["stroke"]
    assert stroke["scale"] == {"domain": ["unstable (see CSV)"], "range": [plots.UNSTABLE_COLOR]}
    x = plots.SCENARIO_X[scenario]
    marked = {(r[plots.CONFIG], r[x]) for r in selected(records(spec), layer)}
    expected = {"offline": {2}, "online": {4, 8}}[scenario]
    assert marked == {("cpu/onnx/fp32", value) for value in expected}


def test_unstable_marks_are_drawn_once_per_unstable_point():
    rows = with_unstable(perf_rows(), {"online": {4, 8}})
    svg = vlc.vegalite_to_svg(plots.online_throughput_latency(rows).to_dict())
    root = ET.fromstring(svg)
    circles = [
        path
        for group in root.iter(f"{SVG}g")
        if "role-mark" in group.get("class", "") and "role-legend" not in group.get("class", "")
        for path in group.iter(f"{SVG}path")
        if path.get("stroke") == plots.UNSTABLE_COLOR
    ]
    assert len(circles) == 2
    assert legend_entries(svg)["unstable (see CSV)"]["stroke"] == plots.UNSTABLE_COLOR


def test_stable_or_unjudged_rows_get_no_unstable_layer():
    stable = perf_rows()
    strings = stable.assign(stable="True")
    unjudged = stable.drop(columns="stable")
    for rows in (stable, strings, unjudged, stable.assign(stable=math.nan)):
        for _, chart_of in CHARTS.values():
            assert unstable_layer(chart_of(rows).to_dict()) is None
    # the strings pandas reads from a CSV with gaps count like bools
    marked = stable.assign(stable=["False", "false", " True", ""] * (len(stable) // 4))
    spec = plots.offline_throughput(marked).to_dict()
    layer = unstable_layer(spec)
    assert layer is not None
    assert len(selected(records(spec), layer)) == sum(
        1 for r in marked.itertuples() if r.scenario == "offline" and r.stable in ("False", "false")
    )


@pytest.mark.parametrize("name", list(CHARTS))
def test_rows_without_intervals_draw_no_error_bars(name: str):
    _, chart_of = CHARTS[name]
    one_trial = perf_rows(ci=None)
    older = one_trial.drop(columns=list(INTERVAL_COLUMNS.values()))
    for rows in (one_trial, older):
        chart = chart_of(rows)
        assert error_layers(chart.to_dict()) == []
        assert vlc.vegalite_to_svg(chart.to_dict()).lstrip().startswith("<svg")
    # one point without an interval among others: no bar for it, the others keep theirs
    some = perf_rows()
    some.loc[[0, len(POINTS)], list(INTERVAL_COLUMNS.values())] = math.nan  # both scenarios
    spec = chart_of(some).to_dict()
    (first, *_) = error_layers(spec)
    assert 0 < len(selected(records(spec), first)) < len(records(spec))


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
    # a missing quantile is no point of its own line; the others stay
    spec = charts[1].to_dict()
    assert [(r["quantile"], r["latency_ms"]) for r in records(spec)] == [("p50", 3.0)]
    # no p99 -> no point on the throughput/latency chart
    assert records(charts[3].to_dict()) == []
    # no components -> no bars, and no average latency -> no error bar either
    root = ET.fromstring(vlc.vegalite_to_svg(charts[2].to_dict()))
    assert drawn(root, "role-mark") == []


def test_bad_rows_are_named():
    rows = perf_rows()
    with pytest.raises(ValueError, match=r"lack columns \['throughput'\]"):
        plots.offline_throughput(rows.drop(columns="throughput"))
    mixed = pd.concat([rows, perf_rows(model="bert")])
    with pytest.raises(ValueError, match=r"several models \['bert', 'nnunet'\]"):
        plots.offline_throughput(mixed)
    with pytest.raises(ValueError, match="unknown scenario 'both'"):
        plots.published_overlay(rows, rows, "both")


def test_sized_sets_a_facet_s_cells_and_a_layer_s_view():
    faceted = plots.sized(plots.online_latency_breakdown(perf_rows()), 210, 170).to_dict()
    assert (faceted["spec"]["width"], faceted["spec"]["height"]) == (210, 170)
    assert "width" not in faceted
    layered = plots.sized(plots.offline_throughput(perf_rows()), 210, 170).to_dict()
    assert (layered["width"], layered["height"]) == (210, 170)
    for spec in (faceted, layered):
        root = ET.fromstring(vlc.vegalite_to_svg(spec))
        assert float(root.get("width", 0)) > 210


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


def reference_rows(scenario: str = "offline") -> pd.DataFrame:
    """The seed page's rows of another device: two GPUs, one of them with two accelerators."""
    rows = published_rows()
    rows = rows[(rows["model"] == "nnunet") & (rows["scenario"] == "offline")].dropna(
        subset=["batch", "throughput"]
    )
    a100 = rows[rows["accelerator"] == "none"].assign(gpu="A100")
    a100["throughput"] = 1000.0 * a100["batch"]
    return pd.concat([rows, a100], ignore_index=True).assign(scenario=scenario)


def test_published_reference_stands_beside_the_run_on_axes_of_its_own():
    """A run nothing was published for: its points in one panel, the reference rows in a
    second with its own y scale, one color scale across both, each panel zoomed on its own."""
    measured = perf_rows(configs=[("cpu", "onnx", "fp32")])
    chart = plots.published_reference(
        measured, reference_rows(), "offline", "the seed pages measured GPUs only"
    )
    spec = chart.to_dict()
    left, right = spec["hconcat"]
    assert [p["title"]["text"] for p in (left, right)] == [
        plots.MEASURED_PANEL,
        plots.REFERENCE_PANEL,
    ]
    subtitle = spec["title"]["subtitle"]
    assert subtitle[0] == "nnunet"
    assert subtitle[1].startswith(
        "Nothing was published for cpu/onnx/fp32 (the seed pages measured GPUs only): "
        "the seed page's nnunet onnx rows on A100, T4 stand beside it"
    )
    ours = {r[plots.CONFIG] for r in spec["datasets"][left["data"]["name"]]}
    theirs = {r[plots.CONFIG] for r in spec["datasets"][right["data"]["name"]]}
    assert ours == {"cpu/onnx/fp32"}
    # T4's two accelerators are two lines: the accelerator, which varies in the reference,
    # is in every label
    assert theirs == {"A100/onnx/fp16 none", "T4/onnx/fp16 none", "T4/onnx/fp16 trt"}
    domains = [
        layer["encoding"]["color"]["scale"]["domain"]
        for panel in (left, right)
        for layer in panel["layer"]
        if "color" in layer["encoding"]
    ]
    assert domains and all(d == ["cpu/onnx/fp32", *sorted(theirs)] for d in domains)
    assert sorted(p["name"] for p in spec["params"]) == ["zoom_measured", "zoom_published"]
    # its own y scale each (Vega-Lite's default for concatenated views): two y axes drawn
    root = ET.fromstring(vlc.vegalite_to_svg(plots.sized(chart, 200, 150).to_dict()))
    assert "Published (seed page), for reference" in "".join(root.itertext())


def test_published_reference_without_rows_of_the_scenario_is_the_run_alone():
    measured = perf_rows(configs=[("cpu", "onnx", "fp32")])
    chart = plots.published_reference(measured, reference_rows("offline"), "online")
    assert isinstance(chart, alt.LayerChart)
    spec = chart.to_dict()
    assert spec["title"]["subtitle"][1] == (
        "Nothing was published for cpu/onnx/fp32, and the seed page has no online nnunet rows "
        "to show beside it"
    )
    assert {r[plots.CONFIG] for r in records(spec)} == {"cpu/onnx/fp32"}


def test_published_chart_overlays_the_run_s_own_rows_else_sets_the_reference_beside():
    measured = perf_rows(configs=[("T4", "onnx", "fp16")])
    own = published_rows()
    overlay = plots.published_chart(measured, own, own.iloc[:0], "offline")
    assert isinstance(overlay, alt.LayerChart)
    assert {r[plots.SOURCE] for r in records(overlay.to_dict())} == {"measured", "published"}
    beside = plots.published_chart(measured, own.iloc[:0], reference_rows(), "offline")
    assert isinstance(beside, alt.HConcatChart)


def test_sized_sets_each_panel_of_a_concatenation():
    measured = perf_rows(configs=[("cpu", "onnx", "fp32")])
    chart = plots.published_reference(measured, reference_rows(), "offline")
    spec = plots.sized(chart, 210, 170).to_dict()
    assert "width" not in spec
    assert [(p["width"], p["height"]) for p in spec["hconcat"]] == [(210, 170)] * 2
    assert "width" not in chart.to_dict()["hconcat"][0]  # a copy: the chart is left as it was


def test_a_chart_with_nothing_to_draw_is_not_drawn_its_files_and_page_say_why(tmp_path: Path):
    """A CPU run without an energy meter: jobs.plots writes every file of energy_throughput
    (Snakemake expects them) as a chart-sized "not drawn: <why>", and jobs.report's page says
    the sentence in the chart's place, and leaves the energy columns out of its tables."""
    from deploybench import jobs
    from tests.conftest import base_config

    run_path, status = "tft/cpu/onnx/fp32", "not measured: no RAPL: /sys/class/powercap is absent"
    why = "energy not measured: no RAPL: /sys/class/powercap is absent"
    run = tmp_path / "results" / run_path
    run.mkdir(parents=True)
    rows = perf_rows(configs=[("cpu", "onnx", "fp32")], model="tft").assign(energy_status=status)
    csvs = {s: str(run / f"{s}.csv") for s in ("offline", "online")}
    for scenario, path in csvs.items():
        rows[rows["scenario"] == scenario].to_csv(path, index=False)
    published, config = str(REPO / "config" / "reference" / "published.csv"), base_config()
    stems = {
        name: str(run / "plots" / name) for name in ("offline_throughput", "energy_throughput")
    }
    options = {"width": 300, "height": 200}
    jobs.plots(
        {"run_path": run_path, "stems": stems, "options": options},
        **csvs, published=published, config=config,
    )  # fmt: skip
    assert "vega-lite" in (run / "plots" / "offline_throughput.html").read_text()  # drawn
    page = (run / "plots" / "energy_throughput.html").read_text()
    assert f"not drawn: {why}" in page and "<script" not in page
    png = (run / "plots" / "energy_throughput.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    svg = ET.parse(run / "plots" / "energy_throughput.svg").getroot()
    assert (
        float(svg.get("width", "inf")) < 350
    )  # a chart's width (the options' 300 px), not a line's
    text = " ".join(svg.itertext())
    assert "energy_throughput" in text and "not drawn: energy not measured:" in text

    provenance = run / "offline.provenance.json"
    provenance.write_text(json.dumps({"config": {"gpu_name": "CPU"}}))
    report_run = {
        "path": run_path, **csvs, "plots": [f"{stem}.png" for stem in stems.values()],
        "provenance": str(provenance), "accelerator": None, "search": None,
    }  # fmt: skip
    comparisons = {s: str(tmp_path / "reports" / f"comparison_{s}") for s in ("offline", "online")}
    spec = {"model": "tft", "runs": [report_run], "stems": comparisons, "options": options}
    markdown = tmp_path / "reports" / "tft.md"
    jobs.report(
        spec, published=published, markdown=str(markdown),
        html=str(markdown.with_suffix(".html")), config=config,
    )  # fmt: skip
    text = markdown.read_text()
    assert f"*energy_throughput: not drawn:* {why}." in text
    assert "energy_throughput.png" not in text and "plots/offline_throughput.png)" in text
    assert (
        f"Energy per inference (J), Energy above idle (J), Mean power (W), Throttled ({status})"
        in text
    )
