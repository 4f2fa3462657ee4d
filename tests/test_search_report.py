"""The serving-configuration search's Pareto chart and report section, on constructed tables
shaped like its points.csv, search.csv and best/choice.json (no Snakemake)."""

from __future__ import annotations

import io
import math
import xml.etree.ElementTree as ET
from typing import Any

import pandas as pd
import pytest
import vl_convert as vlc

from deploybench import plots, report_search
from deploybench.errors import ConfigError, DeploybenchError, ResultsError
from tests.test_plots import (
    SVG,
    assert_error_bars,
    layers,
    legend_entries,
    records,
    selected,
    unstable_layer,
)

RUN = "tft/cpu/onnx/fp32"
BASELINE = "i1-b1-p1-q0-t1"
CHOSEN = "i2-b8-p4.8-q100-t1"
OTHER = "i1-b8-p8-q1000-t2"
BUDGET = 50.0


def search_points() -> pd.DataFrame:
    """Three candidates x two concurrencies. The chosen one's two points and the baseline's
    first are the frontier; the other candidate's second point is over the budget, unstable,
    and has no intervals (one trial)."""
    # variant: (baseline, chosen, [(concurrency, throughput, p99 ms, frontier)])
    candidates = {
        BASELINE: (True, False, [(1, 100.0, 10.0, True), (4, 200.0, 40.0, False)]),
        CHOSEN: (False, True, [(1, 150.0, 12.0, True), (4, 360.0, 45.0, True)]),
        OTHER: (False, False, [(1, 120.0, 20.0, False), (4, 300.0, 80.0, False)]),
    }
    rows = []
    for variant, (baseline, chosen, points) in candidates.items():
        for concurrency, throughput, p99, frontier in points:
            one_trial = variant == OTHER and concurrency == 4
            rows.append(
                {
                    "variant": variant,
                    "baseline": baseline,
                    "chosen": chosen,
                    "batch": 1,
                    "concurrency": concurrency,
                    "throughput": throughput,
                    "throughput_ci95": math.nan if one_trial else throughput / 20,
                    "p99_latency_ms": p99,
                    "p99_latency_ms_ci95": math.nan if one_trial else p99 / 10,
                    "stable": not one_trial,
                    "in_budget": p99 <= BUDGET,
                    "frontier": frontier,
                }
            )
    return pd.DataFrame(rows)


def layer_of(spec: dict[str, Any], mark: str, **props: Any) -> list[dict[str, Any]]:
    """The layers drawing ``mark`` with the mark properties ``props``."""
    return [
        layer
        for layer in layers(spec)
        if layer["mark"]["type"] == mark
        and all(layer["mark"].get(k) == v for k, v in props.items())
    ]


def test_pareto_chart_draws_every_point_the_frontier_and_the_marked_candidates():
    spec = plots.search_pareto(search_points(), BUDGET, subtitle=RUN).to_dict()
    assert spec["title"] == {"text": plots.SEARCH_TITLE, "subtitle": RUN}
    rows = records(spec)
    assert len(rows) == 6
    (dots,) = layer_of(spec, "point", filled=True)
    enc = dots["encoding"]
    assert (enc["x"]["field"], enc["y"]["field"]) == ("p99_latency_ms", "throughput")
    assert enc["color"]["field"] == "variant"
    # one color per candidate, the baseline's first
    assert enc["color"]["scale"]["domain"] == [BASELINE, CHOSEN, OTHER]
    assert selected(rows, dots) == rows

    (frontier,) = layer_of(spec, "line", interpolate="step-after")
    on_it = selected(rows, frontier)
    assert sorted((r["variant"], r["concurrency"]) for r in on_it) == [
        (BASELINE, 1),
        (CHOSEN, 1),
        (CHOSEN, 4),
    ]
    assert frontier["encoding"]["order"]["field"] == "p99_latency_ms"
    assert frontier["encoding"]["strokeDash"]["scale"]["domain"] == [plots.FRONTIER_LABEL]

    outlines = {
        layer["transform"][-1]["calculate"].strip('"'): layer
        for layer in layers(spec)
        if "shape" in layer["encoding"]
    }
    assert set(outlines) == {"baseline", "chosen"}
    for role, variant in (("baseline", BASELINE), ("chosen", CHOSEN)):
        assert {r["variant"] for r in selected(rows, outlines[role])} == {variant}
        scale = outlines[role]["encoding"]["shape"]["scale"]
        assert scale == {"domain": ["baseline", "chosen"], "range": ["square", "diamond"]}

    (rule,) = layer_of(spec, "rule")
    assert rule["encoding"]["x"]["field"] == "p99_latency_ms"
    assert [v["p99_latency_ms"] for v in rule["data"]["values"]] == [BUDGET]
    (label,) = layer_of(spec, "text")
    assert label["data"]["values"][0]["budget_label"] == "p99 budget 50 ms"

    # intervals on both axes, only where the point has one; the one-trial point is unstable
    assert_error_bars(
        spec,
        {
            "xError": ("p99_latency_ms", "throughput", "p99_latency_ms_ci95"),
            "yError": ("p99_latency_ms", "throughput", "throughput_ci95"),
        },
        color="variant",
    )
    unstable = unstable_layer(spec)
    assert unstable is not None
    assert [(r["variant"], r["concurrency"]) for r in selected(rows, unstable)] == [(OTHER, 4)]
    # over the budget: drawn faint
    assert enc["opacity"]["condition"][0]["test"] == {"field": "in_budget", "equal": True}


def test_pareto_chart_reads_a_csv_with_gaps_and_no_budget():
    points = search_points()
    # a point that lacks its throughput is no dot; its flags read back as strings
    gap = {**points.iloc[0].to_dict(), "throughput": math.nan, "chosen": None, "stable": None}
    points = pd.concat([points, pd.DataFrame([gap])], ignore_index=True)
    csv = io.StringIO()
    points.to_csv(csv, index=False)
    csv.seek(0)
    read = pd.read_csv(csv)
    assert read["chosen"].dtype == object  # "True"/"False" strings beside the gap
    spec = plots.search_pareto(read, None).to_dict()
    rows = records(spec)
    assert len(rows) == 6
    assert all(isinstance(r[flag], bool) for r in rows for flag in plots.SEARCH_FLAGS)
    (chosen,) = [layer for layer in layers(spec) if "chosen" in str(layer.get("transform"))]
    assert {r["variant"] for r in selected(rows, chosen)} == {CHOSEN}
    assert not layer_of(spec, "rule") and not layer_of(spec, "text")
    assert "subtitle" not in spec["title"]


def test_pareto_chart_renders_through_save(tmp_path):
    chart = plots.sized(plots.search_pareto(search_points(), BUDGET), 400, 300)
    paths = plots.save(chart, tmp_path / "pareto", inline_html=False)
    assert [p.suffix for p in paths] == [".svg", ".png", ".html"]
    assert paths[1].read_bytes().startswith(b"\x89PNG")
    svg = paths[0].read_text()
    entries = legend_entries(svg)
    for entry in (BASELINE, CHOSEN, OTHER, "baseline", "chosen", "Pareto frontier"):
        assert entry in entries, sorted(entries)
    assert "unstable (see CSV)" in entries
    texts = ["".join(t.itertext()) for t in ET.fromstring(svg).iter(f"{SVG}text")]
    assert "p99 budget 50 ms" in texts
    # the rule is drawn once, not once per point
    rules = vlc.vegalite_to_svg(chart.to_dict()).count('stroke-dasharray="6,4"')
    assert rules == 1


def test_pareto_chart_names_what_it_lacks():
    with pytest.raises(ResultsError, match=r"lack columns \['frontier'\]; have \[") as error:
        plots.search_pareto(search_points().drop(columns="frontier"), BUDGET)
    assert isinstance(error.value, ValueError) and isinstance(error.value, DeploybenchError)
    with pytest.raises(ConfigError, match="positive number of ms or None, not -1"):
        plots.search_pareto(search_points(), -1)


def candidates(gpu: bool = False) -> pd.DataFrame:
    """search.csv as the report reads it back: one candidate over the budget (no best point),
    one without intervals."""
    common = {"model": "tft", "gpu": "T4" if gpu else "cpu", "format": "onnx", "precision": "fp32"}
    rows = [
        {
            "variant": BASELINE,
            "baseline": True,
            "chosen": False,
            "model_instances": 1,
            "max_batch_size": 1,
            "preferred_batch_sizes": "",
            "max_queue_delay_us": 0,
            "intra_op_threads": 1,
            "verdict": "slower",
            "batch": 1,
            "concurrency": 1,
            "throughput": 100.0,
            "throughput_ci95": 5.0,
            "p99_latency_ms": 10.0,
            "p99_latency_ms_ci95": 1.0,
            "stable": True,
            "trials": 3,
            "gain": 1.0,
            "gain_ci95": 0.07,
        },
        {
            "variant": CHOSEN,
            "baseline": False,
            "chosen": True,
            "model_instances": 2,
            "max_batch_size": 8,
            "preferred_batch_sizes": "4 8",
            "max_queue_delay_us": 100000,
            "intra_op_threads": 1,
            "verdict": "chosen",
            "batch": 1,
            "concurrency": 4,
            "throughput": 360.0,
            "throughput_ci95": math.nan,
            "p99_latency_ms": 45.0,
            "p99_latency_ms_ci95": math.nan,
            "stable": True,
            "trials": 1,
            "gain": 3.6,
            "gain_ci95": math.nan,
        },
        {
            "variant": OTHER,
            "baseline": False,
            "chosen": False,
            "model_instances": 1,
            "max_batch_size": 8,
            "preferred_batch_sizes": "8",
            "max_queue_delay_us": 1000,
            "intra_op_threads": 2,
            "verdict": "over budget",
            **dict.fromkeys(
                ["batch", "concurrency", "throughput", "throughput_ci95", "p99_latency_ms"],
                math.nan,
            ),
            **dict.fromkeys(["p99_latency_ms_ci95", "trials", "gain", "gain_ci95"]),
            "stable": False,
        },
    ]
    frame = pd.DataFrame([{**common, **row} for row in rows])
    if gpu:
        frame["intra_op_threads"] = math.nan
    csv = io.StringIO()
    frame.to_csv(csv, index=False)
    csv.seek(0)
    return pd.read_csv(csv)


def choice(**changes: Any) -> dict[str, Any]:
    record = {
        "run": RUN,
        "variant": CHOSEN,
        "baseline": BASELINE,
        "strategy": "grid",
        "latency_budget_ms": BUDGET,
        "min_throughput": 50.0,
        "candidates": 3,
        "point": {"batch": 1, "concurrency": 4},
        "throughput": {"mean": 360.0, "ci95": 12.0},
        "p99_latency_ms": {"mean": 45.0, "ci95": None},
        "gain": {"ratio": 1.23, "ci95": 0.05, "significant": True},
        "settings": {
            "model_instances": 2,
            "max_batch_size": 8,
            "preferred_batch_sizes": [4, 8],
            "max_queue_delay_us": 100,
        },
    }
    return record | changes


def table_rows(text: str) -> dict[str, list[str]]:
    """The section's table: first cell → the row's cells."""
    rows = [line.strip("|").split("|") for line in text.splitlines() if line.startswith("| ")]
    return {cells[0].strip(): [c.strip() for c in cells] for cells in rows}


def test_search_section_says_what_was_searched_and_chosen():
    text = report_search.search_section(RUN, candidates(), choice(), "search/pareto.png")
    assert text.startswith(f"## Search: {RUN}\n\n")
    assert (
        "Searched 3 serving configurations (grid strategy) for the most throughput with p99 "
        "latency within 50 ms and at least 50 inferences/s."
    ) in text
    assert (
        f"Chosen: `{CHOSEN}` at concurrency 4, batch 1 (360 ± 12 inferences/s, 45 ms p99)" in text
    )
    assert f"over the baseline `{BASELINE}`: x1.230 ± 0.050 (significant)." in text
    assert "![search pareto](search/pareto.png)" in text
    nested = report_search.search_section(RUN, candidates(), choice(), None, nested=True)
    assert nested.startswith("### Serving-configuration search\n\n")
    assert "![" not in nested


@pytest.mark.parametrize(
    ("gain", "expected"),
    [
        ({"ratio": 1.02, "ci95": 0.05, "significant": False}, "x1.020 ± 0.050 (not significant)"),
        ({"ratio": 1.5, "ci95": None, "significant": False}, "x1.5 (no interval)"),
        (
            {"ratio": None, "ci95": None, "significant": False},
            "no gain (the baseline meets no constraint)",
        ),
    ],
)
def test_search_section_gain_without_significance(gain, expected):
    text = report_search.search_section(RUN, candidates(), choice(gain=gain), None)
    assert f"`{BASELINE}`: {expected}." in text


def test_search_section_without_budget_or_floor_and_the_baseline_chosen():
    record = choice(variant=BASELINE, latency_budget_ms=None, min_throughput=None, candidates=1)
    text = report_search.search_section(RUN, candidates(), record, None)
    assert "Searched 1 serving configuration (grid strategy)" in text
    assert "with no p99 latency budget." in text
    assert f"Chosen: `{BASELINE}` at concurrency 4, batch 1" in text
    assert text.count("the baseline itself.") == 1 and "x1.23" not in text


def test_search_section_table_labels_candidates_and_leaves_missing_values_empty():
    text = report_search.search_section(RUN, candidates(), choice(), None)
    rows = table_rows(text)
    header = rows["Variant"]
    assert header[1:7] == [
        "Instances",
        "Max batch",
        "Preferred batch sizes",
        "Queue delay (µs)",
        "Threads",
        "Best point (concurrency)",
    ]
    column = {name: i for i, name in enumerate(header)}
    baseline = rows[f"{BASELINE} (baseline)"]
    assert baseline[column["Inferences/Second"]] == "100.0 ± 5.0"
    assert baseline[column["Gain over baseline (x)"]] == "1.000 ± 0.070"
    chosen = rows[f"{CHOSEN} (chosen)"]
    # integers stay integers (no "1e+05", no "4.0"); no interval: the value alone
    assert chosen[1:7] == ["2", "8", "4 8", "100000", "1", "4"]
    assert chosen[column["Inferences/Second"]] == "360"
    assert chosen[column["Gain over baseline (x)"]] == "3.6"
    over = rows[OTHER]
    assert over[column["Verdict"]] == "over budget"
    # no best point within the budget: every measured cell empty, the settings still there
    assert over[1:6] == ["1", "8", "8", "1000", "2"]
    measured = ["Best point (concurrency)", "Inferences/Second", "p99 latency (ms)", "Stable"]
    assert [over[column[c]] for c in [*measured, "Gain over baseline (x)"]] == [""] * 5
    assert "nan" not in text.lower()


def test_search_section_of_a_gpu_run_has_no_threads_column():
    text = report_search.search_section(RUN, candidates(gpu=True), choice(), None)
    assert "Threads" not in table_rows(text)["Variant"]
    assert "nan" not in text.lower()


def test_search_section_names_what_it_lacks():
    with pytest.raises(ResultsError, match=r"candidates lack columns \['verdict'\]"):
        report_search.search_section(RUN, candidates().drop(columns="verdict"), choice(), None)
    record = choice()
    del record["strategy"]
    with pytest.raises(ResultsError, match=r"choice lacks keys \['strategy'\]"):
        report_search.search_section(RUN, candidates(), record, None)
