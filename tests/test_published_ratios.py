"""The published table as the report's oracle: every row of config/reference/published.csv is
reproduced by a run whose plan measures that row's point with the seed's settings, and the
report gives it a ratio and shows it in its page's table.

Generated from the table, never a hand list. Each run's measured CSVs are written by the
measurement's own writer (``perf.summarize`` over made-up trials, ``io.write_csv`` in
``perf.COLUMNS``) at its plan's points, joined with the published rows the report matches to it
(``report_published.published_rows``, ``report_published.ratios``) and drawn into each model's
page (``jobs.report``). A row without a ratio fails the test by its source page and values.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from deploybench import jobs
from deploybench.compare import POINT
from deploybench.io import write_csv
from deploybench.perf import COLUMNS, WINDOWS, summarize
from deploybench.planning.run_plan import RunPlan, plan_run
from deploybench.planning.workflow_config import reference_run
from deploybench.report_cells import cell_text
from deploybench.report_published import published_rows, ratios
from tests.conftest import REPO, base_config, validated

PUBLISHED = REPO / "config" / "reference" / "published.csv"
TABLE = pd.read_csv(PUBLISHED)
CONFIG = validated(base_config())
# NGC publishes no sha256 of FastPitch's checkpoint (config.yaml leaves its pin null): a stand-in
CONFIG["models"]["fastpitch"]["published_needs"]["checkpoint_sha256"] = "0" * 64
REQUESTS = 2000  # made up: a trial's measured requests


def runs_of_rows() -> dict[str, list[int]]:
    """Run path → the published rows (by index) it reproduces."""
    runs: dict[str, list[int]] = defaultdict(list)
    for index, row in TABLE.iterrows():
        runs[reference_run(CONFIG, row.to_dict()).path].append(int(index))
    return dict(runs)


RUNS = runs_of_rows()
MODELS = sorted({path.split("/")[0] for path in RUNS})


def plan_of(run_path: str) -> RunPlan:
    return plan_run(CONFIG, *run_path.split("/"))


def write_measured(plan: RunPlan, directory: Path) -> dict[str, str]:
    """The run's offline and online CSVs as its measurement jobs write them (its plan's points,
    its trials), with made-up figures; scenario → path."""
    trials = int(plan.measure["trials"])
    written = {}
    for scenario, points in plan.points.items():
        trial_rows = [
            {"batch": int(p["batch"]), "concurrency": int(p["concurrency"]),
             "throughput": 100.0 + i + t, "p99_latency_ms": 10.0 + i + t / 10,
             "measured_requests": REQUESTS, "stable": True}
            for i, p in enumerate(points)
            for t in range(trials)
        ]  # fmt: skip
        identity = {"model": plan.model, "gpu": plan.gpu, "format": plan.format}
        identity |= {"precision": plan.precision, "scenario": scenario}
        rows = [identity | r for r in summarize(trial_rows, float(plan.measure["max_ci_pct"]))]
        path = directory / f"{scenario}.csv"
        path.parent.mkdir(parents=True, exist_ok=True)
        write_csv(path, rows, COLUMNS)
        written[scenario] = str(path)
    return written


def describe(index: int) -> str:
    row = TABLE.loc[index]
    return (
        f"{row['source']}: {row['model']} {row['gpu']} {row['format']} {row['precision']} "
        f"{row['scenario']} batch {row['batch']} concurrency {row['concurrency']}"
    )


def test_every_published_row_has_a_run():
    assert sum(len(rows) for rows in RUNS.values()) == len(TABLE) == 1078


@pytest.mark.parametrize("run_path", sorted(RUNS))
def test_every_published_row_is_a_point_its_run_measures_with_the_seeds_settings(run_path):
    plan = plan_of(run_path)
    matched = published_rows(CONFIG, TABLE, run_path)
    assert sorted(matched.index) == sorted(RUNS[run_path])
    measured = {(s, int(p["batch"]), int(p["concurrency"])) for s, ps in plan.points.items() for p in ps}  # fmt: skip
    wrong = []
    for index, row in matched.iterrows():
        point = (row["scenario"], row["batch"], row["concurrency"])
        if pd.isna(row["batch"]) or (point[0], int(point[1]), int(point[2])) not in measured:
            wrong.append(f"{describe(int(index))}: not a point of its plan")
        # the seed's deployment, where its table gives it
        for column, planned in (
            ("max_batch_size", plan.triton["max_batch_size"]),
            ("model_instances", plan.triton["model_instances"]),
        ):
            if not pd.isna(row[column]) and int(row[column]) != int(planned):
                wrong.append(f"{describe(int(index))}: {column} {row[column]} ≠ {planned}")
    assert not wrong, f"{len(wrong)} published rows not measured as published: {wrong[:5]}"


@pytest.mark.parametrize("run_path", sorted(RUNS))
def test_every_published_row_of_a_run_gets_a_ratio(run_path, tmp_path):
    plan = plan_of(run_path)
    matched = published_rows(CONFIG, TABLE, run_path)
    written = write_measured(plan, tmp_path)
    ours = pd.concat([pd.read_csv(p) for p in written.values()], ignore_index=True)
    compared = ratios(ours, matched, plan.measure)
    keys = {tuple(k) for k in compared[POINT].itertuples(index=False, name=None)}
    without = [
        describe(int(i))
        for i, point in matched[POINT].iterrows()
        if (point["scenario"], point["batch"], point["concurrency"]) not in keys
    ]
    assert not without, f"{len(without)} published rows without a ratio: {without[:5]}"
    assert compared["throughput_ratio"].notna().all() and len(compared) == len(matched)
    assert compared["p99_latency_ratio"].notna().all()
    # beside each p99 ratio: the requests each side's p99 comes from (ours: one trial's)
    assert (compared["p99_requests"] == REQUESTS).all()
    assert (compared["p99_requests_published"] >= WINDOWS).all()


def _sample_of_dles(measure: dict[str, Any], rate: float, batch: int) -> float:
    if measure["measurement_mode"] == "count_windows":
        return float(measure["request_count"] * WINDOWS)
    return float(math.ceil(rate / batch * measure["measurement_interval_ms"] / 1000) * WINDOWS)


def test_the_published_p99_is_from_dles_windows(tmp_path):
    """BERT's runner: count windows of 50 requests, so 150 requests behind each published p99;
    ours stretch each trial to its 10-s floor. FastPitch's: 10-s time windows at the published
    rate."""
    sizes = {}
    for run_path in ("bert/A100/trt/fp16", "fastpitch/A100/ts-trace/fp16"):
        plan = plan_of(run_path)
        matched = published_rows(CONFIG, TABLE, run_path)
        written = write_measured(plan, tmp_path / run_path)
        ours = pd.concat([pd.read_csv(p) for p in written.values()], ignore_index=True)
        compared = ratios(ours, matched, plan.measure)
        row = compared.iloc[0]
        expected = _sample_of_dles(dict(plan.measure), row["throughput_published"], row["batch"])
        assert row["p99_requests_published"] == expected
        sizes[run_path.split("/")[0]] = expected
    assert sizes["bert"] == 150


@pytest.fixture(scope="module")
def pages(tmp_path_factory) -> dict[str, str]:
    """Each model's report page over all its published runs, their CSVs synthesized, its
    images' preflight passed and (where its comparison needs them) its trained weights and
    DLE's input recorded: model → the page's "Measured vs published" section."""
    root = tmp_path_factory.mktemp("pages")
    preflight = root / "preflight.json"
    record = {"ok": True, "image": "all", "gpu": "any", "created": "2026-11-29T00:00:00"}
    preflight.write_text(json.dumps(record))
    sections = {}
    for model in MODELS:
        runs = []
        for run_path in sorted(p for p in RUNS if p.split("/")[0] == model):
            directory = root / "results" / run_path
            written = write_measured(plan_of(run_path), directory)
            provenance = directory / "provenance.json"
            provenance.write_text(json.dumps({"config": comparable_provenance(run_path)}))
            runs.append(
                {"path": run_path, **written, "plots": [], "provenance": str(provenance),
                 "accelerator": plan_of(run_path).accelerator, "search": None,
                 "preflight": [str(preflight)]}
            )  # fmt: skip
        stems = {
            s: str(root / "reports" / model / f"comparison_{s}") for s in ("offline", "online")
        }
        page = root / "reports" / f"{model}.md"
        spec = {
            "model": model,
            "runs": runs,
            "stems": stems,
            "options": {"width": 200, "height": 150},
        }
        jobs.report(
            spec, published=str(PUBLISHED), markdown=str(page), html=str(page.with_suffix(".html")),
            config=CONFIG,
        )  # fmt: skip
        text = page.read_text()
        sections[model] = text.split("## Measured vs published", 1)[1].split("## Between runs")[0]
    return sections


def comparable_provenance(run_path: str) -> dict[str, Any]:
    """What a run's provenance records where its model's comparison needs DLE's checkpoint and
    input (``models.<m>.published_needs``): recorded as the gate wants them."""
    model = run_path.split("/")[0]
    needs = CONFIG["models"][model].get("published_needs") or {}
    recorded: dict[str, Any] = {"gpu_name": run_path.split("/")[1]}
    if "checkpoint" in needs:  # the pinned file (the page copies its record's `source`)
        recorded["checkpoint"] = "nvidia_fastpitch.pt"
        source = {"file": "nvidia_fastpitch.pt", "sha256": needs["checkpoint_sha256"]}
        recorded["checkpoint_source"] = source
    if "input_data" in needs:  # the pinned files
        recorded["inputs"] = {"files": "fastpitch_input", "raw_sha256": needs["input_sha256"]}
    return recorded


@pytest.mark.parametrize("model", MODELS)
def test_the_report_page_shows_every_published_row_of_a_gpu_run_with_its_ratio(model, pages):
    section = pages[model]
    missing = []
    for run_path in sorted(p for p in RUNS if p.split("/")[0] == model):
        table = section.split(f"### {run_path}\n", 1)[1].split("\n### ", 1)[0]
        assert "Not set beside" not in table, table[:500]
        lines = [line for line in table.splitlines() if line.startswith("| ")]
        matched = published_rows(CONFIG, TABLE, run_path)
        for index, row in matched.iterrows():
            start = f"| {row['scenario']} | {int(row['batch'])} | {int(row['concurrency'])} | "
            cells = [line.split(" | ") for line in lines if line.startswith(start)]
            # published inferences/s, then the throughput ratio and the p99 ratio, not empty
            if not any(
                c[4] == cell_text(float(row["throughput"])) and c[5] and c[6] for c in cells
            ):
                missing.append(describe(int(index)))
    assert not missing, f"{len(missing)} published rows not on the page: {missing[:5]}"
