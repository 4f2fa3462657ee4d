"""Open pages in headless Chromium as a reader's browser would, and say what it saw.

Chromium is driven over the DevTools protocol on a pipe (``--remote-debugging-pipe``: JSON
messages, each ended by a NUL byte, written to its fd 3 and read from its fd 4), standard
library only. Not the command line's ``--dump-dom --enable-logging=stderr``: its log gives every
console message the same level (``INFO:CONSOLE``), so an error cannot be told from a log line,
and a resource that fails to load is not logged there at all. Over the protocol every console
message comes with its level (``Runtime.consoleAPICalled``), every uncaught exception
(``Runtime.exceptionThrown``) and every failed load (``Log.entryAdded``) with its own.

    python -m tests.browser screenshot PAGE.html OUT.png [--width 1280 --height 2000 --scale 0.5]

writes a screenshot of a page (the README's ``docs/report-screenshot.png``).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import fcntl
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

# Debian's package is `chromium`; other distributions and Google's builds name it otherwise.
NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
# How long a page may take to load and draw its charts (vega-embed renders asynchronously).
SETTLE_S = 15.0

# In the page: its chart containers (Altair's `vega-visualization` div, which vega-embed marks
# `vega-embed` once it embedded), what each drew, and its images. A drawn mark is an item of a
# data mark (Vega's SVG renderer: `g.role-mark` of a non-group mark, one child per item): axes,
# legends and titles have other roles, and a mark with no data has no items.
PROBE = """(() => {
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
})()"""


class BrowserError(RuntimeError):
    """Chromium did not start, answer or load a page in time."""


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
    # "<kind>: <text>", kind: console.error, console.assert, exception or the Log entry's source
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
    """One headless Chromium; :meth:`open` loads a page in a tab of its own."""

    def __init__(self, executable: str | None = None, timeout_s: float = 30.0) -> None:
        executable = executable or find_chromium()
        if executable is None:
            raise BrowserError(f"no Chromium on PATH (looked for {', '.join(NAMES)})")
        self.timeout_s = timeout_s
        self._profile = tempfile.TemporaryDirectory(prefix="deploybench-chromium-")
        # fd 3: our commands to Chromium; fd 4: its answers and events to us. The child's
        # ends are moved above 9 first, so that bash's redirections onto 3 and 4 cannot
        # overwrite one of them.
        to_child, self._to_chromium = os.pipe()
        self._from_chromium, from_child = os.pipe()
        ends = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in (to_child, from_child)]
        for fd in (to_child, from_child):
            os.close(fd)
        to_child, from_child = ends
        redirect = f"3<&{to_child} 4>&{from_child} {to_child}<&- {from_child}>&-"
        self._process = subprocess.Popen(
            [
                "bash",
                "-c",
                f'exec "$0" "$@" {redirect}',
                executable,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--remote-debugging-pipe",
                f"--user-data-dir={self._profile.name}",
                "--no-first-run",
                "--no-default-browser-check",
                "--disable-extensions",
                "--hide-scrollbars",
                "--mute-audio",
                "about:blank",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            pass_fds=(to_child, from_child),
            start_new_session=True,  # its helper processes in a group of their own: killed with it
        )
        os.close(to_child)
        os.close(from_child)
        self._messages: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self._next_id = 0
        self._events: list[dict[str, Any]] = []
        self.version = self.call("Browser.getVersion").get("product", "")

    def _read(self) -> None:
        buffer = b""
        with open(self._from_chromium, "rb", buffering=0) as pipe:
            while chunk := pipe.read(1 << 16):
                buffer += chunk
                *messages, buffer = buffer.split(b"\0")
                for message in messages:
                    self._messages.put(json.loads(message))
        self._messages.put(None)  # Chromium closed its end: it exited

    def call(
        self, method: str, params: dict[str, Any] | None = None, session: str | None = None
    ) -> dict[str, Any]:
        """Send a command and wait for its answer; events meanwhile are kept for :meth:`events`."""
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._to_chromium, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + self.timeout_s
        while True:
            answer = self._receive(deadline, method)
            if answer.get("id") == self._next_id:
                if "error" in answer:
                    raise BrowserError(f"{method}: {answer['error']}")
                return dict(answer.get("result", {}))
            self._events.append(answer)

    def _receive(self, deadline: float, waiting_for: str) -> dict[str, Any]:
        try:
            message = self._messages.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise BrowserError(f"no answer to {waiting_for} in {self.timeout_s:g} s") from None
        if message is None:
            raise BrowserError(f"Chromium exited (status {self._process.poll()})")
        return message

    def _pump(self, wait_s: float = 0.0) -> None:
        """Keep the events received so far, and within ``wait_s``."""
        deadline = time.monotonic() + wait_s
        while True:
            try:
                message = self._messages.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                return
            if message is None:
                raise BrowserError(f"Chromium exited (status {self._process.poll()})")
            self._events.append(message)

    def events(self, wait_s: float = 0.0) -> list[dict[str, Any]]:
        """The events received so far (and within ``wait_s``), taken."""
        self._pump(wait_s)
        taken, self._events = self._events, []
        return taken

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
        """Load ``path`` in a new ``width`` x ``height`` tab, wait until its charts drew (or
        ``settle_s`` passed), and report it; with ``screenshot``, save the viewport as PNG,
        ``scale`` times its size in pixels."""
        url = Path(path).resolve().as_uri()
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})[
            "sessionId"
        ]
        page = Page(url=url)
        try:
            for domain in ("Runtime", "Log", "Page"):
                self.call(f"{domain}.enable", session=session)
            self.call(
                "Emulation.setDeviceMetricsOverride",
                {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
                session=session,
            )
            self.events()  # about:blank's, if any
            self.call("Page.navigate", {"url": url}, session=session)
            seen = self._settle(session, settle_s)
            self._collect(page, session)
            page.title = seen.get("title", "")
            page.charts = [Chart(**c) for c in seen.get("charts", [])]
            page.images = list(seen.get("images", []))
            page.items = dict(seen.get("items", {}))
            if screenshot is not None:
                clip = {"x": 0, "y": 0, "width": width, "height": height, "scale": scale}
                shot = self.call(
                    "Page.captureScreenshot", {"format": "png", "clip": clip}, session=session
                )
                Path(screenshot).write_bytes(base64.b64decode(shot["data"]))
        finally:
            self.call("Target.closeTarget", {"targetId": target})
        return page

    def _settle(self, session: str, settle_s: float) -> dict[str, Any]:
        """Wait for the load event, then until every chart container drew or ``settle_s``
        passed; the page's state (:data:`PROBE`) at the end."""
        deadline = time.monotonic() + settle_s
        loaded = False
        seen: dict[str, Any] = {}
        while time.monotonic() < deadline:
            if not loaded:
                self._pump(wait_s=0.1)
                loaded = any(
                    e.get("method") == "Page.loadEventFired" and e.get("sessionId") == session
                    for e in self._events
                )
                continue
            seen = self.evaluate(session, PROBE)
            charts = [Chart(**c) for c in seen.get("charts", [])]
            if seen.get("ready") == "complete" and all(c.drawn for c in charts):
                self._pump(wait_s=0.1)  # a moment for a late console message
                return self.evaluate(session, PROBE)
            time.sleep(0.1)
        if not loaded:
            raise BrowserError(f"the page did not load in {settle_s:g} s")
        return seen or self.evaluate(session, PROBE)

    def evaluate(self, session: str, expression: str) -> dict[str, Any]:
        result = self.call(
            "Runtime.evaluate",
            {"expression": expression, "returnByValue": True},
            session=session,
        )
        if "exceptionDetails" in result:
            raise BrowserError(f"probe failed: {result['exceptionDetails']}")
        return dict(result["result"].get("value") or {})

    def _collect(self, page: Page, session: str) -> None:
        """The page's console messages, exceptions and log entries, as errors or warnings."""
        for event in self.events():
            if event.get("sessionId") != session:
                continue
            method, params = event.get("method"), event.get("params", {})
            if method == "Runtime.consoleAPICalled":
                text = " ".join(_console_text(a) for a in params.get("args", []))
                kind = params.get("type")
                if kind in ("error", "assert"):
                    page.errors.append(f"console.{kind}: {text}")
                elif kind == "warning":
                    page.warnings.append(f"console.warn: {text}")
            elif method == "Runtime.exceptionThrown":
                details = params.get("exceptionDetails", {})
                description = details.get("exception", {}).get("description") or details.get("text")
                page.errors.append(f"exception: {description}")
            elif method == "Log.entryAdded":
                entry = params.get("entry", {})
                line = f"{entry.get('source')}: {entry.get('text')} {entry.get('url', '')}".strip()
                if entry.get("level") == "error":
                    page.errors.append(line)
                elif entry.get("level") == "warning":
                    page.warnings.append(line)

    def close(self) -> None:
        with contextlib.suppress(BrowserError, OSError):
            self.call("Browser.close")
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._process.pid, signal.SIGKILL)  # the group we started
            self._process.wait(timeout=10)
        with contextlib.suppress(OSError):
            os.close(self._to_chromium)
        self._profile.cleanup()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _console_text(arg: dict[str, Any]) -> str:
    if "value" in arg:
        return str(arg["value"])
    return str(arg.get("description") or arg.get("type"))


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
