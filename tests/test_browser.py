"""The report pages and charts as people read them: opened in headless Chromium, driven by
Playwright (tests/browser.py).

Every page must open with no console error, no uncaught exception and no failed load, and every
chart must draw: vega-embed's SVG with data marks in it, or a canvas. The chart pages carry
their JavaScript (Altair's ``inline=True``: vl-convert's bundle of Vega, Vega-Lite and
vega-embed), so they open offline; the browser here has no network either way.

Chromium comes from Debian (``envs/test-packages.sh`` installs it). Without it these tests
skip, except under CI (``CI=true``), where its absence is a failure.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest

from deploybench import plots
from tests.browser import Browser, Page, find_chromium
from tests.conftest import REPO
from tests.test_plots import perf_rows

PUBLISHED = REPO / "config" / "reference" / "published.csv"
# A PNG's first bytes.
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    executable = find_chromium()
    if executable is None:
        reason = "no Chromium on PATH: `bash envs/test-packages.sh` installs Debian's chromium"
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    with Browser(executable) as b:
        yield b


def read_cleanly(page: Page) -> None:
    """No console error, exception or failed load; no Vega warning; every image loaded and
    every chart drawn."""
    assert page.errors == [], page.url
    # Vega and Vega-Lite warn on the console ("WARN ...") about specs they had to fix up
    assert [w for w in page.warnings if "WARN" in w] == [], page.url
    assert page.broken_images == [], page.url
    assert page.undrawn == [], page.url


def test_the_check_sees_what_a_reader_would(browser: Browser, tmp_path: Path):
    """The negative control: a console error, a script from a CDN that does not load, the
    exception that follows, a missing image and a chart that never drew are all seen."""
    page = tmp_path / "broken.html"
    page.write_text(
        "<!DOCTYPE html><html><body>"
        '<div class="vega-visualization" id="vis"></div><img src="missing.png">'
        '<script>console.error("boom"); console.log("all well");</script>'
        # .invalid never resolves (RFC 2606): the CDN case, with or without a network
        '<script src="https://cdn.invalid/vega-embed.js"></script>'
        "<script>vegaEmbed('#vis', {});</script>"
        "</body></html>"
    )
    seen = browser.open(page, settle_s=3)
    text = "\n".join(seen.errors)
    assert "console.error: boom" in text and "all well" not in text
    assert "cdn.invalid/vega-embed.js" in text
    assert "vegaEmbed is not defined" in text
    assert seen.broken_images == ["missing.png"]
    assert [c.id for c in seen.undrawn] == ["vis"]


def test_a_chart_page_draws_offline(browser: Browser, tmp_path: Path):
    """plots.save's HTML carries Vega itself (no <script src>) and draws in the browser: a
    single chart, a faceted one and the published reference's two panels."""
    rows = perf_rows(configs=[("cpu", "onnx", "fp32"), ("cpu", "ts-trace", "fp32")])
    reference = perf_rows(configs=[("A100", "ts-script", "fp16")])
    built = {
        "throughput": plots.offline_throughput(rows),
        "breakdown": plots.online_latency_breakdown(rows),
        "reference": plots.published_reference(
            rows[rows["format"] == "onnx"], reference, "online", "the seed pages measured GPUs only"
        ),
    }
    for name, chart in built.items():
        (html,) = [p for p in plots.save(chart, tmp_path / name) if p.suffix == ".html"]
        assert not re.search(r"<script[^>]*\bsrc=", html.read_text()), name
        page = browser.open(html)
        read_cleanly(page)
        assert len(page.charts) == 1 and page.charts[0].marks > 0, name


@pytest.mark.skipif(not PUBLISHED.exists(), reason=f"{PUBLISHED} not present")
def test_the_published_charts_of_a_cpu_run_draw_the_reference(browser: Browser, tmp_path: Path):
    """A CPU run's published chart draws two panels: its points, and the seed page's rows
    of its model and format beside them on their own axes."""
    rows = perf_rows(configs=[("cpu", "ts-script", "fp32")])
    reference = pd.read_csv(PUBLISHED)
    reference = reference[(reference["model"] == "nnunet") & (reference["format"] == "ts-script")]
    chart = plots.published_reference(rows, reference, "offline", "the seed pages measured GPUs")
    (html,) = [p for p in plots.save(chart, tmp_path / "published") if p.suffix == ".html"]
    page = browser.open(html)
    read_cleanly(page)
    # a line each: ours, and the published ones on four GPUs in two precisions
    assert page.items["line"] == 1 + 8


@pytest.mark.e2e
def test_report_pages_and_their_charts_open_in_a_browser(reported, browser, tmp_path):
    """Every page of the CPU report set on the shared smoke run, and every chart page it links
    (each plot's PNG links its interactive HTML): no errors, every image loaded, every chart
    drawn. A screenshot of TFT's page is kept under tmp (the README's is docs/)."""
    work, _ = reported
    pages = sorted((work / "reports" / "cpu").glob("*.html"))
    assert {p.stem for p in pages} >= {"tft", "tft_traffic", "nnunet", "resnet50", "bert"}
    charts: set[Path] = set()
    for path in pages:
        shot = tmp_path / f"{path.stem}.png"
        page = browser.open(path, screenshot=shot if path.stem == "tft" else None)
        read_cleanly(page)
        assert page.title == f"{path.stem} performance"
        # the comparison charts and each run's six, as PNGs that loaded
        assert len(page.images) >= 2 + 6, path
        links = re.findall(r'<a href="([^"]+\.html)"', path.read_text())
        assert len(links) == len(page.images), path
        charts |= {(path.parent / link).resolve() for link in links}
    assert (tmp_path / "tft.png").read_bytes()[:8] == PNG
    assert (tmp_path / "tft.png").stat().st_size > 20_000  # a drawn page, not a blank one
    names = {p.stem for p in charts}
    assert names >= {"published_offline", "published_online", "comparison_online", "pareto"}
    for chart in sorted(charts):
        assert chart.exists(), chart
        page = browser.open(chart)
        read_cleanly(page)
        assert len(page.charts) == 1, chart
