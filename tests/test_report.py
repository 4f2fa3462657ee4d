"""Reports: measured vs published per point, and the report target on the shared CPU run."""

from __future__ import annotations

import shutil
import xml.etree.ElementTree as ET
import zipfile

import pandas as pd
import pytest

from deploybench.report import published_rows, ratios
from tests.conftest import REPO, base_config, planned_jobs, run_snakemake

PUBLISHED = REPO / "config" / "reference" / "published.csv"
MEASUREMENT_RULES = {"prepare_checkpoint", "export", "repository", "accuracy", "offline", "online"}


def test_published_reference_is_the_shared_copy():
    shared = REPO.parent / "shared" / "reference" / "published.csv"
    if shared.exists():
        assert PUBLISHED.read_bytes() == shared.read_bytes()


def test_published_rows_of_a_run_are_those_it_reproduces():
    published = pd.read_csv(PUBLISHED)
    rows = published_rows(base_config(), published, "tft/A30/trt/fp16")
    assert not rows.empty
    assert set(rows["model"]) == {"tft"} and set(rows["gpu"]) == {"A30"}
    assert set(rows["format"]) == {"trt"} and set(rows["precision"]) == {"fp16"}
    assert set(rows["dataset"]) == {"electricity"}  # traffic rows belong to tft_traffic
    assert published_rows(base_config(), published, "tft/cpu/onnx/fp32").empty


def test_ratio_per_point_joins_scenario_batch_and_concurrency():
    published = pd.read_csv(PUBLISHED)
    rows = published_rows(base_config(), published, "tft/A30/trt/fp16")
    offline = rows[rows["scenario"] == "offline"].head(3)
    measured = offline.copy()
    measured["throughput"] = offline["throughput"] / 2
    measured["p99_latency_ms"] = offline["p99_latency_ms"] * 4
    extra = measured.head(1).assign(batch=999_999)  # a point with no published twin
    table = ratios(pd.concat([measured, extra]), rows)
    assert len(table) == 3
    assert table["throughput_ratio"].tolist() == pytest.approx([0.5] * 3)
    assert table["p99_latency_ratio"].tolist() == pytest.approx([4.0] * 3)


@pytest.fixture(scope="module")
def reported(smoke_run, tmp_path_factory):
    """A copy of the shared CPU run with `snakemake report` run in it."""
    work = tmp_path_factory.mktemp("report") / "work"
    shutil.copytree(smoke_run, work, symlinks=True)
    planned = planned_jobs(run_snakemake(work, "-n", "report"))
    result = run_snakemake(work, "report")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    return work, planned


@pytest.mark.e2e
def test_report_after_the_cpu_run_only_plots_and_writes(reported):
    work, planned = reported
    assert not set(planned) & MEASUREMENT_RULES, planned
    assert planned["plots"] == 12 and planned["model_report"] == 6  # 12 CPU runs, 6 models
    page = (work / "reports" / "cpu" / "tft.md").read_text()
    for heading in ("## Measured vs published", "## tft/cpu/onnx/fp32", "### Configuration"):
        assert heading in page
    assert "| Max batch size | 8 |" in page  # the smoke sizing's Triton settings
    assert "Inferences/Second" in page and "### Provenance" in page
    assert "<table>" in (work / "reports" / "cpu" / "tft.html").read_text()
    for png in (work / "results" / "tft" / "cpu" / "onnx" / "fp32" / "plots").glob("*.png"):
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 2000
    svg = work / "reports" / "cpu" / "tft" / "comparison_offline.svg"
    assert ET.parse(svg).getroot().tag.endswith("svg")


@pytest.mark.e2e
def test_a_plot_option_reruns_plots_and_reports_only(reported, tmp_path):
    work, _ = reported
    overlay = tmp_path / "wider.yaml"
    overlay.write_text("report: {plots: {width: 640, height: 300}}\n")
    jobs = planned_jobs(run_snakemake(work, "-n", "report", "--configfile", str(overlay)))
    assert set(jobs) == {"plots", "model_report", "report"}, jobs


@pytest.mark.e2e
def test_snakemake_report_bundles_the_plots(reported):
    work, _ = reported
    result = run_snakemake(work, "report", "--report", "report.zip")
    assert result.returncode == 0, result.stderr[-3000:]
    names = zipfile.ZipFile(work / "report.zip").namelist()
    assert any(n.endswith("offline_throughput.svg") for n in names)
    assert any(n.endswith("tft.html") for n in names)
