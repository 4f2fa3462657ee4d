"""Reports: measured vs published per point, and the report target on the shared CPU run."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
import zipfile
from pathlib import Path

import pandas as pd
import pytest

from deploybench import jobs, plots, report_render
from deploybench.columns import TABLE_LABELS
from deploybench.report import between_runs, between_runs_section, chart_image
from deploybench.report_cells import markdown_table
from deploybench.report_published import (
    published_rows,
    ratios,
    reference_note,
    reference_rows,
    summary_section,
)
from tests.conftest import REPO, base_config, planned_jobs, run_snakemake, validated
from tests.test_compare import write_run
from tests.test_plots import perf_rows

PUBLISHED = REPO / "config" / "reference" / "published.csv"
# A clip path's id in Vega's SVG ("clip12"): numbered per process.
CLIP_ID = re.compile(rb"\bclip\d+\b")
MEASUREMENT_RULES = {
    *("prepare_checkpoint", "export", "repository", "accuracy", "offline", "online"),
    *("search_repository", "search_online"),
}


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


def test_a_cpu_run_s_reference_is_its_model_and_format_on_the_gpus_published():
    """Nothing was published for a CPU: the seed page's rows of the run's model and format (all
    GPUs and precisions), or of its model where its format was not published; none for a run
    with published rows of its own."""
    config, published = base_config(), pd.read_csv(PUBLISHED)

    def shown(run: str) -> set[tuple[str, str, str, str]]:
        rows = reference_rows(config, published, run)
        return set(zip(rows["gpu"], rows["format"], rows["precision"], rows["accelerator"]))

    nnunet = shown("nnunet/cpu/ts-script/fp32")
    assert {(g, p) for g, _, p, _ in nnunet} == {
        (g, p) for g in ("A100", "A40", "T4", "V100") for p in ("fp16", "fp32")
    }
    assert shown("nnunet/cpu/onnx/fp32") == nnunet  # no onnx published: the model's ts-script
    assert {f for _, f, _, _ in shown("tft/cpu/onnx/fp32")} == {"trt", "ts-trace"}
    assert {f for _, f, _, _ in shown("tft/cpu/ts-trace/fp32")} == {"ts-trace"}
    # BERT's onnx rows with the TensorRT accelerator are onnx-trt's, not onnx's
    assert {(f, a) for _, f, _, a in shown("bert/cpu/onnx/fp32")} == {("onnx", "none")}
    # the data set picks the model entry
    traffic = reference_rows(config, published, "tft_traffic/cpu/onnx/fp32")
    assert set(traffic["dataset"]) == {"traffic"} and len(traffic) == 344
    assert reference_rows(config, published, "tft/A30/trt/fp16").empty


def test_the_page_says_what_a_cpu_run_s_published_charts_show():
    config, published = base_config(), pd.read_csv(PUBLISHED)
    assert reference_note(config, published, "tft/cpu/onnx/fp32") == (
        "Nothing was published for tft/cpu/onnx/fp32 (the seed pages measured GPUs only). Its "
        "charts published_offline and published_online show the seed page's tft trt, ts-trace "
        "rows (it published no onnx) on A100, A30, T4, V100 in a panel of their own beside it, "
        "for reference only: another device or configuration, so no ratio."
    )
    # BERT's page published offline figures only: one chart shows them
    bert = reference_note(config, published, "bert/cpu/ts-trace/fp32")
    assert bert is not None and "Its chart published_offline shows the seed page's bert " in bert
    assert reference_note(config, published, "tft/A30/trt/fp16") is None


def test_a_chart_on_a_page_links_its_interactive_page():
    assert chart_image("../../results/r/plots/offline_latency.png") == (
        "[![offline_latency](../../results/r/plots/offline_latency.png)]"
        "(../../results/r/plots/offline_latency.html)"
    )
    assert chart_image("search/pareto.png", "search pareto").startswith("[![search pareto](")


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


def test_ratio_to_published_carries_the_measured_interval():
    published = pd.read_csv(PUBLISHED)
    rows = published_rows(base_config(), published, "tft/A30/trt/fp16")
    point = rows[rows["scenario"] == "offline"].head(1)
    reference = float(point["throughput"].iloc[0])
    measured = point.assign(
        throughput=0.93 * reference,
        throughput_ci95=0.04 * reference,
        p99_latency_ms_ci95=float("nan"),
        trials=5,
    )
    table = ratios(measured, rows)
    assert table["throughput_ratio"].tolist() == pytest.approx([0.93])
    assert table["throughput_ratio_ci95"].tolist() == pytest.approx([0.04])
    assert table["p99_latency_ratio_ci95"].isna().all()  # no interval: the ratio alone
    page = summary_section({"tft/A30/trt/fp16": table})
    assert "| 0.930 ± 0.040 | 1 |" in page  # throughput ratio ± h, p99 ratio alone
    # one trial (or an older CSV without the columns): no interval
    single = ratios(point.assign(throughput=0.5 * reference), rows)
    assert single["throughput_ratio_ci95"].isna().all()
    assert single["throughput_ratio"].tolist() == pytest.approx([0.5])


def test_table_cells_hold_a_value_and_its_interval():
    frame = pd.DataFrame(
        [
            {"batch": 1, "throughput": 123.44, "throughput_ci95": 5.6, "p99_latency_ms": 2.5,
             "p99_latency_ms_ci95": float("nan"), "trials": 3},
        ]
    )  # fmt: skip
    table = markdown_table(frame, TABLE_LABELS)
    assert table.splitlines()[0] == "| Batch | Inferences/Second | p99 latency (ms) | Trials |"
    assert table.splitlines()[2] == "| 1 | 123.4 ± 5.6 | 2.5 | 3 |"


def _run(throughput: float, ci: float, points: list[tuple[str, int, int]]) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {"scenario": s, "batch": b, "concurrency": c, "throughput": throughput * b,
             "throughput_ci95": ci * b, "p99_latency_ms": 10.0, "p99_latency_ms_ci95": 0.2,
             "trials": 3}
            for s, b, c in points
        ]
    )  # fmt: skip


def test_runs_of_a_page_against_the_first_listed_run_that_measured_the_point():
    frames = {
        "tft/cpu/onnx/fp32": _run(100.0, 2.0, [("offline", 1, 1), ("offline", 8, 1)]),
        "tft/cpu/ts-trace/fp32": _run(50.0, 1.0, [("offline", 1, 1), ("online", 1, 4)]),
        "tft/cpu/ts-script/fp32": _run(98.0, 2.0, [("offline", 8, 1), ("online", 1, 4)]),
    }
    table = between_runs(frames)
    pairs = [(r.run, r.against, r.scenario, r.batch) for r in table.itertuples()]
    assert pairs == [
        ("tft/cpu/ts-trace/fp32", "tft/cpu/onnx/fp32", "offline", 1),
        ("tft/cpu/ts-script/fp32", "tft/cpu/onnx/fp32", "offline", 8),
        # online batch 1 concurrency 4: the first listed run has no such point
        ("tft/cpu/ts-script/fp32", "tft/cpu/ts-trace/fp32", "online", 1),
    ]
    assert table["throughput_verdict"].tolist() == ["slower", "no significant change", "faster"]
    assert table["throughput_ratio"].tolist() == pytest.approx([0.5, 0.98, 1.96])
    page = between_runs_section(frames)
    assert "## Between runs" in page
    assert "| tft/cpu/ts-trace/fp32 | tft/cpu/onnx/fp32 | offline | 1 | 1 | 0.500 ± 0.014 |" in page
    assert between_runs_section({"tft/cpu/onnx/fp32": frames["tft/cpu/onnx/fp32"]}).endswith(
        "nothing to compare."
    )


def test_report_page_compares_its_runs_with_intervals(tmp_path):
    """jobs.report on two small runs (no measurement): the between-runs section, and values
    with their intervals in the run tables."""
    runs = []
    for name, throughput in (("tft/cpu/onnx/fp32", 100.0), ("tft/cpu/ts-trace/fp32", 60.0)):
        directory = write_run(tmp_path / "results", throughput=throughput, ci=1.0, run=name)
        provenance = directory / "offline.provenance.json"
        provenance.write_text(json.dumps({"config": {"gpu_name": "CPU"}}))
        runs.append(
            {"path": name, "offline": str(directory / "offline.csv"),
             "online": str(directory / "online.csv"), "plots": [],
             "provenance": str(provenance), "accelerator": None, "search": None}
        )  # fmt: skip
    stems = {s: str(tmp_path / "reports" / f"comparison_{s}") for s in ("offline", "online")}
    spec = {"model": "tft", "runs": runs, "stems": stems, "options": {"width": 300, "height": 200}}
    page = tmp_path / "reports" / "tft.md"
    jobs.report(
        spec,
        published=str(PUBLISHED),
        markdown=str(page),
        html=str(page.with_suffix(".html")),
        config=base_config(),
    )
    text = page.read_text()
    assert text.index("## Measured vs published") < text.index("## Between runs")
    assert (
        "| tft/cpu/ts-trace/fp32 | tft/cpu/onnx/fp32 | offline | 8 | 1 | 0.600 ± 0.012 | slower |"
        in text
    )
    assert "| 8 | 1 | 800.0 ± 8.0 |" in text  # the offline table: throughput ± its half-width


@pytest.mark.parametrize("name", ["breakdown", "reference"])
def test_a_chart_s_files_are_those_altair_writes(tmp_path, name):
    """plots.save writes from one spec what Altair's chart.save writes from three, byte for
    byte: the SVG, the PNG and the HTML page; a faceted chart, and the published reference's
    two zoomable panels. But for the numbers of the SVG's clip paths: Vega counts them per
    process, over every chart it drew. (The inline page's bundle: the next test.)"""
    rows = perf_rows(configs=[("cpu", "onnx", "fp32"), ("cpu", "ts-trace", "fp32")])
    reference = perf_rows(configs=[("A100", "ts-script", "fp16")])
    chart = {
        "breakdown": lambda: plots.online_latency_breakdown(rows),
        "reference": lambda: plots.published_reference(rows, reference, "online", "no GPU"),
    }[name]()
    chart = plots.sized(chart, 300, 200)
    saved = plots.save(chart, tmp_path / "ours", inline_html=False)
    assert [p.suffix for p in saved] == [".svg", ".png", ".html"]
    chart.save(tmp_path / "altair.svg", format="svg")
    chart.save(tmp_path / "altair.png", format="png", scale_factor=2)
    chart.save(tmp_path / "altair.html", format="html")
    for path in saved:
        ours, altairs = (p.read_bytes() for p in (path, tmp_path / f"altair{path.suffix}"))
        assert CLIP_ID.sub(b"clip", ours) == CLIP_ID.sub(b"clip", altairs), path


def test_vl_convert_s_bundle_is_made_once_and_kept(tmp_path, monkeypatch):
    """The JavaScript an inline page carries is bundled once per vl-convert version and read
    from the user's cache after; a cache that cannot be written is bundled around."""
    import vl_convert

    made: list[str | None] = []

    def bundle(vl_version: str | None = None) -> str:
        made.append(vl_version)
        return "/* the bundle */"

    monkeypatch.setattr(vl_convert, "javascript_bundle", bundle)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    report_render.javascript_bundle.cache_clear()
    try:
        assert report_render.javascript_bundle() == "/* the bundle */"
        report_render.javascript_bundle.cache_clear()  # another process
        assert report_render.javascript_bundle() == "/* the bundle */"
        assert made == [report_render.vl_version()]
        (kept,) = (tmp_path / "cache" / "deploybench").iterdir()
        assert kept.read_text() == "/* the bundle */"
        html = plots.save(plots.offline_throughput(perf_rows()), tmp_path / "chart")[-1]
        assert "/* the bundle */" in html.read_text()
        # a cache that cannot be written: bundled each time, never an error
        (tmp_path / "cache").rename(tmp_path / "moved")
        (tmp_path / "cache").write_text("not a folder")
        report_render.javascript_bundle.cache_clear()
        assert report_render.javascript_bundle() == "/* the bundle */"
        assert len(made) == 2
    finally:
        report_render.javascript_bundle.cache_clear()


@pytest.mark.e2e
def test_report_after_the_cpu_run_only_plots_and_writes(reported):
    work, planned = reported
    assert not set(planned) & MEASUREMENT_RULES, planned
    # 12 CPU runs, 6 models; the default target (run by the smoke run) drew its run's charts
    assert planned["plots"] == 12 - 1 and planned["model_report"] == 6
    page = (work / "reports" / "cpu" / "tft.md").read_text()
    for heading in ("## Measured vs published", "## tft/cpu/onnx/fp32", "### Configuration"):
        assert heading in page
    # 2 CPU runs of TFT, 3 trials a point: values with their intervals, the runs compared
    assert "## Between runs" in page and "| tft/cpu/ts-trace/fp32 | tft/cpu/onnx/fp32 |" in page
    assert " ± " in page
    assert "| Max batch size | 8 |" in page  # the smoke sizing's Triton settings
    assert "Inferences/Second" in page and "### Provenance" in page
    assert "<table>" in (work / "reports" / "cpu" / "tft.html").read_text()
    # the smoke config's search_targets: TFT's search, its choice and chart, on TFT's page
    assert "### Serving-configuration search" in page and "(baseline" in page
    assert "](../../results/tft/cpu/onnx/fp32/search/pareto.png)" in page
    # each chart's PNG links its interactive page; nothing was published for a CPU: the note
    assert "(../../results/tft/cpu/onnx/fp32/plots/published_online.html)" in page
    assert "*Note:* Nothing was published for tft/cpu/onnx/fp32 (the seed pages" in page
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
    assert set(jobs) == {"plots", "search_plots", "model_report", "report"}, jobs


@pytest.mark.e2e
def test_snakemake_report_bundles_the_plots(reported):
    work, _ = reported
    result = run_snakemake(work, "report", "--report", "report.zip")
    assert result.returncode == 0, result.stderr[-3000:]
    names = zipfile.ZipFile(work / "report.zip").namelist()
    assert any(n.endswith("offline_throughput.svg") for n in names)
    assert any(n.endswith("tft.html") for n in names)


def _gpu_page(tmp_path: Path, preflight: list[str]) -> str:
    """jobs.report on one A30 TFT trt fp16 run (published offline batch 1 and 8)."""
    name = "tft/A30/trt/fp16"
    directory = write_run(tmp_path / "results", run=name)
    provenance = directory / "offline.provenance.json"
    provenance.write_text(json.dumps({"config": {"gpu_name": "NVIDIA A30"}}))
    run = {
        "path": name, "offline": str(directory / "offline.csv"),
        "online": str(directory / "online.csv"), "plots": [], "provenance": str(provenance),
        "accelerator": "none", "search": None, "preflight": preflight,
    }  # fmt: skip
    stems = {s: str(tmp_path / "reports" / f"comparison_{s}") for s in ("offline", "online")}
    spec = {"model": "tft", "runs": [run], "stems": stems, "options": {"width": 300, "height": 200}}
    page = tmp_path / "reports" / "tft.md"
    jobs.report(
        spec, published=str(PUBLISHED), markdown=str(page), html=str(page.with_suffix(".html")),
        config=validated(base_config()),  # as the workflow hands it: with the schema's defaults
    )  # fmt: skip
    return page.read_text().split("## Measured vs published", 1)[1].split("## Between runs")[0]


def test_a_gpu_run_is_set_beside_the_published_rows_only_after_its_preflight_passed(tmp_path):
    reports = [tmp_path / "preflight" / f"{image}.json" for image in ("pytorch-25.01", "x")]
    # no report: the preflight failed (a failed one writes none) or never ran
    section = _gpu_page(tmp_path / "a", [str(p) for p in reports])
    assert "Not set beside its" in section and "has not passed (`snakemake preflight`)" in section
    assert "No published figures for this configuration." in section
    for path, image in zip(reports, ("pytorch-25.01", "triton-25.01"), strict=True):
        path.parent.mkdir(parents=True, exist_ok=True)
        record = {"ok": True, "image": image, "gpu": "A30", "created": "2026-11-27T10:00:00"}
        path.write_text(json.dumps(record))
    section = _gpu_page(tmp_path / "b", [str(p) for p in reports])
    assert "Preflight passed: pytorch-25.01 on A30 (2026-11-27T10:00:00), triton-25.01" in section
    assert "Throughput ratio" in section and "Not set beside" not in section


def test_fastpitch_rows_need_its_trained_weights_and_dles_input_to_be_compared():
    from deploybench.report_published import publication_gate

    config = base_config()
    run = {"path": "fastpitch/A30/ts-trace/fp16", "preflight": []}
    letters = {"source": "seeded letters", "files": None, "raw_sha256": {"INPUT__0": "8" * 64}}
    seeded = {"config": {"checkpoint": None, "inputs": letters}}
    blockers, _ = publication_gate(config, run, seeded)
    assert len(blockers) == 2
    assert blockers[0].startswith("its weights are seeded, not trained (the decoder's length")
    assert blockers[1].startswith(
        f"its perf input is not DLE's: INPUT__0 (seeded letters) has sha256 {'8' * 64}, not the "
        f"pinned {DLE_INPUT_SHA256}"
    )
    needs = config["models"]["fastpitch"]["published_needs"]
    needs["checkpoint_sha256"] = NGC_SHA256  # as a user sets it (null in config.yaml)
    assert publication_gate(config, run, dles_provenance()) == ([], [])
    # the same values made here from DLE's filelist (no file of DLE's): compared too
    made = dles_provenance()
    made["config"]["inputs"] |= {"files": None, "source": "the first utterance of a filelist"}
    assert publication_gate(config, run, made) == ([], [])
    # a dense network's work does not depend on them: seeded TFT is compared
    assert publication_gate(config, {"path": "tft/A30/trt/fp16"}, seeded) == ([], [])


# A stand-in for the sha256 of NGC's nvidia_fastpitch_200518.pt (published nowhere: the config
# leaves it null), and DLE's input file's, as config.yaml pins it.
NGC_SHA256 = "5" * 64
DLE_INPUT_SHA256 = "e2cac0dc21d51f237e5710918fd5111f2f5beec1176ce4f43bec7da512b846dc"


def dles_provenance(checkpoint_sha256=NGC_SHA256, input_sha256=DLE_INPUT_SHA256):
    """A FastPitch run's provenance as the page reads it: the measurement's, with the
    checkpoint's record (``checkpoint_source``, from the prepare_checkpoint sidecar)."""
    return {
        "config": {
            "checkpoint": "/ckpt/nvidia_fastpitch_200518.pt",
            "checkpoint_source": {
                "file": "/ckpt/nvidia_fastpitch_200518.pt",
                "sha256": checkpoint_sha256,
            },
            "inputs": {
                "source": "/data/fastpitch_input: raw input files (perf.input_data)",
                "files": "/data/fastpitch_input",
                "raw_sha256": {"INPUT__0": input_sha256},
            },
        }
    }


def _fastpitch_page(tmp_path: Path, checkpoint_sha256: str) -> str:
    """jobs.report on one A100 FastPitch ts-trace fp16 run measured with DLE's input file,
    whose checkpoint's record (prepare_checkpoint's sidecar) holds ``checkpoint_sha256``; the
    config pins NGC_SHA256."""
    name = "fastpitch/A100/ts-trace/fp16"
    directory = write_run(tmp_path / "results", run=name)
    provenance = directory / "offline.provenance.json"
    recorded = dles_provenance()["config"]
    del recorded["checkpoint_source"]  # the page reads it from the checkpoint's record
    provenance.write_text(json.dumps({"config": {"gpu_name": "NVIDIA A100"} | recorded}))
    checkpoint = tmp_path / "results" / "fastpitch" / "checkpoint" / "checkpoint.pt.provenance.json"
    checkpoint.parent.mkdir(parents=True)
    source = {"file": "/ckpt/nvidia_fastpitch_200518.pt", "sha256": checkpoint_sha256}
    checkpoint.write_text(json.dumps({"config": {}, "source": source}))
    run = {
        "path": name, "offline": str(directory / "offline.csv"),
        "online": str(directory / "online.csv"), "plots": [], "provenance": str(provenance),
        "accelerator": "none", "search": None, "preflight": [], "checkpoint": str(checkpoint),
    }  # fmt: skip
    stems = {s: str(tmp_path / "reports" / f"comparison_{s}") for s in ("offline", "online")}
    spec = {"model": "fastpitch", "runs": [run], "stems": stems}
    spec["options"] = {"width": 300, "height": 200}
    config = validated(base_config())
    config["models"]["fastpitch"]["published_needs"]["checkpoint_sha256"] = NGC_SHA256
    page = tmp_path / "reports" / "fastpitch.md"
    jobs.report(
        spec, published=str(PUBLISHED), markdown=str(page), html=str(page.with_suffix(".html")),
        config=config,
    )  # fmt: skip
    return page.read_text().split("## Measured vs published", 1)[1].split("## Between runs")[0]


def test_the_page_compares_fastpitch_only_with_the_pinned_checkpoint(tmp_path):
    """The page reads the checkpoint's record (``run["checkpoint"]``: its source file's sha256)
    for the gate: the pinned file is compared, another one is not, named with its sha256."""
    section = _fastpitch_page(tmp_path / "a", "7" * 64)
    assert "Not set beside its" in section and "No published figures" in section
    assert (
        f"its checkpoint /ckpt/nvidia_fastpitch_200518.pt has sha256 {'7' * 64}, not the pinned "
        f"{NGC_SHA256} (models.fastpitch.published_needs.checkpoint_sha256)"
    ) in section
    section = _fastpitch_page(tmp_path / "b", NGC_SHA256)
    assert "Throughput ratio" in section and "Not set beside" not in section


def test_fastpitch_rows_need_the_pinned_checkpoint_and_input_files():
    """published_needs pins the files by sha256: another checkpoint or input file, or a pin left
    null, keeps the rows apart, and the blocker names the file, its sha256 and the pinned one."""
    from deploybench.report_published import publication_gate

    config = validated(base_config())
    needs = config["models"]["fastpitch"]["published_needs"]
    assert needs["input_sha256"] == {"INPUT__0": DLE_INPUT_SHA256}
    assert needs["checkpoint_sha256"] is None  # NGC publishes no checksum: not pinned
    run = {"path": "fastpitch/A30/ts-trace/fp16", "preflight": []}
    (blocker,) = publication_gate(config, run, dles_provenance())[0]
    assert blocker == (
        "its checkpoint is not pinned: /ckpt/nvidia_fastpitch_200518.pt (sha256 "
        f"{NGC_SHA256}) is not known to be the one the published rows used (set "
        "models.fastpitch.published_needs.checkpoint_sha256 to the sha256 of NGC's file)"
    )
    needs["checkpoint_sha256"] = NGC_SHA256
    assert publication_gate(config, run, dles_provenance()) == ([], [])
    other = "6" * 64
    (blocker,) = publication_gate(config, run, dles_provenance(checkpoint_sha256=other))[0]
    assert blocker == (
        f"its checkpoint /ckpt/nvidia_fastpitch_200518.pt has sha256 {other}, not the pinned "
        f"{NGC_SHA256} (models.fastpitch.published_needs.checkpoint_sha256)"
    )
    (blocker,) = publication_gate(config, run, dles_provenance(input_sha256=other))[0]
    assert blocker.startswith(
        f"its perf input is not DLE's: INPUT__0 (/data/fastpitch_input) has sha256 {other}, not "
        f"the pinned {DLE_INPUT_SHA256} (models.fastpitch.published_needs.input_sha256.INPUT__0:"
    )
    # recorded before the workflow hashed them: not known to be the pinned files
    older = dles_provenance()
    del older["config"]["checkpoint_source"], older["config"]["inputs"]["raw_sha256"]
    checkpoint, inputs = publication_gate(config, run, older)[0]
    assert "has no sha256 recorded" in checkpoint and "rerun prepare_checkpoint" in checkpoint
    assert inputs.startswith("its perf input INPUT__0 (/data/fastpitch_input) has no sha256")
    # the input not pinned (null): any directory would pass, so it blocks
    needs["input_sha256"] = None
    (blocker,) = publication_gate(config, run, dles_provenance())[0]
    assert blocker.startswith("its perf input is not pinned: /data/fastpitch_input is not known")


def test_a_table_says_what_its_intervals_are_for_its_trials():
    """Under a results table, what "± x" is, with Student's t for the trials its points had
    (the demo's 3: 4.30); a table of single trials says it has no interval."""
    from deploybench.report import results_table

    three = results_table(pd.DataFrame({"batch": [1, 8], "throughput": [10.0, 20.0], "trials": 3}))
    assert "95 % confidence interval" in three and "t = 4.30 for 3 trials" in three
    mixed = pd.DataFrame({"batch": [1, 8], "throughput": [10.0, 20.0], "trials": [3, 5]})
    assert "t = 4.30 for 3 trials, t = 2.78 for 5 trials" in results_table(mixed)
    one = results_table(pd.DataFrame({"batch": [1], "throughput": [10.0], "trials": [1]}))
    assert "One trial a point: no interval" in one and "Student" not in one
