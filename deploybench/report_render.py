"""A chart's files, as the plots and report jobs write them: ``stem.svg``, ``stem.png`` and a
self-contained, interactive ``stem.html`` (:func:`save`).

The same files Altair's ``chart.save`` writes, format by format, byte for byte (checked in
tests/test_report.py, but for Vega's per-process numbering of SVG clip paths), at a fraction of
the cost:

- the chart's Vega-Lite spec is built, and checked against Vega-Lite's schema, once for the three
  files, not once per file (``chart.save`` does both each time: about 0.2 s of a chart's 0.6);
- the JavaScript every HTML page carries (~0.9 MB: Vega, Vega-Lite and vega-embed, which
  vl-convert bundles on its first ``javascript_bundle`` call in a process, 3-7 s of one core
  on a CI machine) is bundled once per vl-convert version and then read from a file
  (:func:`javascript_bundle`): a run's report is 18 jobs, each a process of its own.
"""

from __future__ import annotations

import functools
import importlib.metadata
import logging
import os
from pathlib import Path
from typing import Any

import altair as alt
from altair.utils.html import TEMPLATES
from altair.utils.mimebundle import spec_to_mimebundle

from .io import atomic_path

log = logging.getLogger("deploybench")

# Where the bundle is kept between processes: ``$XDG_CACHE_HOME`` (``~/.cache``), as pip does.
CACHE_DIR = "deploybench"


def vl_version() -> str:
    """vl-convert's name of the Vega-Lite version Altair writes specs for ("v6_4"), as Altair
    computes it (``altair.utils._importers.vl_version_for_vl_convert``)."""
    return "_".join(alt.SCHEMA_VERSION.split(".")[:2])


def cache_dir() -> Path:
    """This user's cache folder of deploybench (``$XDG_CACHE_HOME/deploybench``)."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / CACHE_DIR


@functools.cache
def javascript_bundle() -> str:
    """vl-convert's JavaScript bundle of Vega, Vega-Lite and vega-embed, which Altair's inline
    HTML pages carry: read from this user's cache where it holds the bundle of this vl-convert
    and Vega-Lite version, else bundled (seconds) and kept there. A cache that cannot be read or
    written is bundled around, never an error."""
    import vl_convert as vlc

    version, release = vl_version(), importlib.metadata.version("vl-convert-python")
    path = cache_dir() / f"vl-convert-{release}-{version}.js"
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        pass
    except (OSError, UnicodeDecodeError) as error:
        log.warning("could not read vl-convert's bundle at %s (%s): bundling it again", path, error)
    # Without a snippet: the libraries alone, as Altair bundles them (its stub says a snippet).
    bundle: str = vlc.javascript_bundle(vl_version=version)  # type: ignore[call-arg]
    try:
        with atomic_path(path) as tmp:  # whole or not at all: another job may read it meanwhile
            tmp.write_text(bundle, encoding="utf-8")
    except OSError as error:
        log.warning("could not keep vl-convert's bundle at %s (%s)", path, error)
    return bundle


class _InlineTemplate:
    """Altair's ``inline`` HTML template (what ``chart.save(..., inline=True)`` renders) with
    :func:`javascript_bundle` in it."""

    def render(self, **kwargs: Any) -> str:
        return str(TEMPLATES["inline"].render(vegaembed_script=javascript_bundle(), **kwargs))


def chart_spec(chart: alt.TopLevelMixin) -> dict[str, Any]:
    """``chart``'s Vega-Lite spec, checked against the schema, its data inline (as
    ``chart.save`` builds it)."""
    with alt.data_transformers.enable("default"), alt.data_transformers.disable_max_rows():
        spec: dict[str, Any] = chart.to_dict(context={"pre_transform": False})
    return spec


def save(chart: alt.TopLevelMixin, stem: Path, inline_html: bool = True) -> list[Path]:
    """Write ``stem.svg``, ``stem.png`` and ``stem.html``; return their paths.

    The HTML page carries its JavaScript (~0.9 MB: Vega, Vega-Lite and vega-embed, the bundle
    vl-convert ships, which Altair's ``inline=True`` writes into the page), so it opens offline
    and loads nothing (tests/test_browser.py opens them in Chromium). ``inline_html`` false
    loads them from a CDN instead: a few kB, but blank without the network; for tests only.
    """
    spec = chart_spec(chart)
    versions: dict[str, Any] = {
        "mode": "vega-lite",
        "vega_version": alt.VEGA_VERSION,
        "vegaembed_version": alt.VEGAEMBED_VERSION,
        "vegalite_version": alt.VEGALITE_VERSION,
    }
    svg = spec_to_mimebundle(spec, format="svg", **versions)
    # scale 2: the PNG stays sharp on high-DPI screens and in slides.
    png, _ = spec_to_mimebundle(spec, format="png", scale_factor=2, **versions)
    template = _InlineTemplate() if inline_html else "standard"
    page = spec_to_mimebundle(spec, format="html", template=template, **versions)
    contents: dict[str, str | bytes] = {
        "svg": svg["image/svg+xml"],
        "png": png["image/png"],
        "html": page["text/html"],
    }
    paths = []
    for suffix, content in contents.items():
        path = Path(f"{stem}.{suffix}")
        with atomic_path(path) as tmp:
            if isinstance(content, bytes):
                tmp.write_bytes(content)
            else:
                tmp.write_text(content, encoding="utf-8")
        paths.append(path)
    return paths
