"""Open pages in headless Chromium as a reader's browser would, and say what it saw.

Playwright drives Debian's ``chromium`` (``executable_path``; Playwright's own browser download
is not needed). Not the command line's ``--dump-dom --enable-logging=stderr``: its log gives
every console message the same level, so an error cannot be told from a log line, and a
resource that fails to load is not logged there at all. Playwright's events give each console
message its level (``console``, Chromium's log entries too), each uncaught exception
(``pageerror``) and each failed load (``requestfailed``).

    python -m tests.browser screenshot PAGE.html OUT.png [--width 1280 --height 2000 --scale 0.5]

writes a screenshot of a page (the README's ``docs/report-screenshot.png``).
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

from playwright.sync_api import ConsoleMessage, Error, Request, sync_playwright
from playwright.sync_api import Page as Tab
from playwright.sync_api import TimeoutError as PlaywrightTimeout

# Debian's package is `chromium`; other distributions and Google's builds name it otherwise.
NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
# How long a page may take to load and draw its charts (vega-embed renders asynchronously).
SETTLE_S = 15.0
# Console levels that fail a page, and those kept as its warnings (Vega's "WARN ..." lines).
ERROR_LEVELS = ("error", "assert")
WARNING_LEVELS = ("warning",)

# In the page: its chart containers (Altair's `vega-visualization` div, which vega-embed marks
# `vega-embed` once it embedded), what each drew, and its images. A drawn mark is an item of a
# data mark (Vega's SVG renderer: `g.role-mark` of a non-group mark, one child per item): axes,
# legends and titles have other roles, and a mark with no data has no items.
PROBE = """() => {
  const containers = [...new Set(document.querySelectorAll('.vega-visualization, .vega-embed'))];
  const charts = containers.map((c) => ({
    id: c.id || c.className,
    embedded: c.classList.contains('vega-embed'),
    svg: c.querySelector('svg.marks') !== null,
    marks: c.querySelectorAll('svg.marks g.role-mark:not(.mark-group) > *').length,
    canvas: c.querySelector('canvas') !== null,
  }));
  const images = [...document.images].map((i) => ({
    src: i.getAttribute('src'), loaded: i.complete && i.naturalWidth > 0,
  }));
  const items = {};
  for (const g of document.querySelectorAll('svg.marks g.role-mark:not(.mark-group)')) {
    const kind = [...g.classList].find((c) => c.startsWith('mark-')).slice(5);
    items[kind] = (items[kind] || 0) + g.childElementCount;
  }
  return {ready: document.readyState, title: document.title, charts, images, items};
}"""


class BrowserError(RuntimeError):
    """Chromium did not start, or a page did not load in time."""


def find_chromium() -> str | None:
    """The Chromium executable on PATH, or None."""
    for name in NAMES:
        path = shutil.which(name)
        if path:
            return path
    return None


@dataclass
class Chart:
    """One chart container of a page and what vega-embed drew in it."""

    id: str
    embedded: bool
    svg: bool
    marks: int
    canvas: bool

    @property
    def drawn(self) -> bool:
        """An SVG with drawn data marks, or a canvas."""
        return (self.svg and self.marks > 0) or self.canvas


@dataclass
class Page:
    """What a page did in the browser: its console and load errors, charts and images."""

    url: str
    title: str = ""
    # "<kind>: <text>", kind: console.error, console.assert, exception or failed load
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    charts: list[Chart] = field(default_factory=list)
    images: list[dict[str, Any]] = field(default_factory=list)
    # drawn items per mark type over all its charts ({"line": 3, "symbol": 12, ...})
    items: dict[str, int] = field(default_factory=dict)

    @property
    def undrawn(self) -> list[Chart]:
        return [c for c in self.charts if not c.drawn]

    @property
    def broken_images(self) -> list[str]:
        return [str(i["src"]) for i in self.images if not i["loaded"]]


class Browser:
    """One headless Chromium; :meth:`open` loads pages one after another in a tab per viewport.

    The tab is reused, not opened anew per page: a new tab is a new renderer process (0.2-0.4 s
    on a CI machine), and a reused one keeps V8's compiled copy of the ~0.9 MB of Vega every
    chart page carries inline (the same bundle on every page): half the time of a chart page.
    Between two pages the tab goes to ``about:blank``, so that whatever the last page said
    before it unloaded is its own. A page that fails to load takes its tab with it."""

    def __init__(self, executable: str | None = None, timeout_s: float = 30.0) -> None:
        executable = executable or find_chromium()
        if executable is None:
            raise BrowserError(f"no Chromium on PATH (looked for {', '.join(NAMES)})")
        self.timeout_s = timeout_s
        self._playwright = sync_playwright().start()
        try:
            self._browser = self._playwright.chromium.launch(
                executable_path=executable, args=["--disable-gpu"], timeout=timeout_s * 1000
            )
        except Error as error:
            self._playwright.stop()
            raise BrowserError(f"{executable} did not start: {error}") from error
        self.version = self._browser.version
        # (width, height, scale) → its tab; the page its events are recorded in (None: none)
        self._tabs: dict[tuple[int, int, float], Tab] = {}
        self._page: Page | None = None

    def _tab(self, width: int, height: int, scale: float) -> Tab:
        """The tab of a ``width`` x ``height`` viewport at ``scale``, recording its console
        messages, uncaught exceptions and failed loads in the page now open."""
        key = (width, height, scale)
        if key not in self._tabs:
            context = self._browser.new_context(
                viewport={"width": width, "height": height}, device_scale_factor=scale
            )
            tab = context.new_page()
            tab.set_default_timeout(self.timeout_s * 1000)
            tab.on("console", lambda message: self._record(_console, message))
            tab.on("pageerror", lambda e: self._record(_exception, e))
            tab.on("requestfailed", lambda request: self._record(_failed_load, request))
            self._tabs[key] = tab
        return self._tabs[key]

    def _record(self, record: Callable[[Page, Any], None], event: Any) -> None:
        if self._page is not None:
            record(self._page, event)

    def open(
        self,
        path: Path,
        *,
        width: int = 1280,
        height: int = 2000,
        settle_s: float = SETTLE_S,
        screenshot: Path | None = None,
        scale: float = 1.0,
    ) -> Page:
        """Load ``path`` in a ``width`` x ``height`` tab, wait until its charts drew (or
        ``settle_s`` passed), and report it; with ``screenshot``, save the viewport as PNG,
        ``scale`` times its size in pixels."""
        url = Path(path).resolve().as_uri()
        page = Page(url=url)
        tab = self._tab(width, height, scale)
        try:
            # the last page unloads: what it said until then is recorded in its own Page
            tab.goto("about:blank", timeout=self.timeout_s * 1000)
            self._page = page
            try:  # loading may take long on a loaded machine; settling is then settle_s
                tab.goto(url, timeout=self.timeout_s * 1000)
            except PlaywrightTimeout:
                raise BrowserError(f"the page did not load in {self.timeout_s:g} s") from None
            seen = _settle(tab, settle_s)
            page.title = seen.get("title", "")
            page.charts = [Chart(**c) for c in seen.get("charts", [])]
            page.images = list(seen.get("images", []))
            page.items = dict(seen.get("items", {}))
            if screenshot is not None:
                tab.screenshot(
                    path=screenshot, clip={"x": 0, "y": 0, "width": width, "height": height}
                )
        except BaseException:
            # a tab in an unknown state (a page that did not load, a crash): the next page
            # gets a new one
            del self._tabs[(width, height, scale)]
            with contextlib.suppress(Error):
                tab.context.close()
            raise
        finally:
            self._page = None
        return page

    def close(self) -> None:
        try:
            self._browser.close()
        finally:
            self._playwright.stop()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _settle(tab: Tab, settle_s: float) -> dict[str, Any]:
    """Once loaded: wait until every chart container drew or ``settle_s`` passed; the page's
    state (:data:`PROBE`) at the end."""
    deadline = time.monotonic() + settle_s
    while True:
        seen: dict[str, Any] = tab.evaluate(PROBE)
        drawn = all(Chart(**c).drawn for c in seen.get("charts", []))
        if seen.get("ready") == "complete" and drawn:
            tab.wait_for_timeout(100)  # a moment for a late console message
            return dict(tab.evaluate(PROBE))
        if time.monotonic() >= deadline:
            return seen
        tab.wait_for_timeout(100)


def _console(page: Page, message: ConsoleMessage) -> None:
    """A console message (Chromium's own log entries among them: a failed load's) as an error
    or a warning, by its level."""
    if message.type in ERROR_LEVELS:
        page.errors.append(f"console.{message.type}: {message.text}")
    elif message.type in WARNING_LEVELS:
        page.warnings.append(f"console.warn: {message.text}")


def _exception(page: Page, error: Error) -> None:
    page.errors.append(f"exception: {error.name}: {error.message}")


def _failed_load(page: Page, request: Request) -> None:
    page.errors.append(f"failed load: {request.url} ({request.failure})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    shot = commands.add_parser("screenshot", help="a PNG of a page as the browser shows it")
    shot.add_argument("page", type=Path)
    shot.add_argument("out", type=Path)
    shot.add_argument("--width", type=int, default=1280)
    shot.add_argument("--height", type=int, default=2000)
    shot.add_argument("--scale", type=float, default=1.0, help="of the PNG's pixels (0.5: half)")
    args = parser.parse_args(argv)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with Browser() as b:
        page = b.open(
            args.page, width=args.width, height=args.height, screenshot=args.out, scale=args.scale
        )
    for line in page.errors:
        print(f"error: {line}", file=sys.stderr)
    size = args.out.stat().st_size // 1024
    print(
        f"{args.out}: {size} KB, {len(page.charts)} charts, {len(page.images)} images; {b.version}"
    )
    return 1 if page.errors or page.undrawn or page.broken_images else 0


if __name__ == "__main__":
    sys.exit(main())
