"""The pieces every chart of :mod:`deploybench.plots` is drawn with: its configuration label,
its numeric columns and unstable flags (:func:`prepare`), lines with error bars and unstable
marks (:func:`series_chart`), one color per configuration, titles, and ``sized``
(``report_render.save`` writes a chart's files); what a chart with nothing to draw writes
instead (:func:`save_not_drawn`).
"""

from __future__ import annotations

import html
import json
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import altair as alt
import numpy as np
import pandas as pd

from .columns import INTERVAL_COLUMNS
from .io import atomic_path

CONFIG_FIELDS = ("gpu", "format", "precision")
CONFIG = "configuration"
SOURCE = "source"
# True on the rows whose `stable` column says False; rows without a verdict are not marked.
UNSTABLE = "unstable"
UNSTABLE_LABEL = "unstable (see CSV)"
UNSTABLE_COLOR = "#d62728"

THROUGHPUT_TITLE = "Throughput [infer/sec]"
LATENCY_TITLE = "Latency [ms]"
BATCH_TITLE = "Batch size"
CONCURRENCY_TITLE = "Concurrent client requests"
CI_TITLE = "± 95 % CI"
# What tells apart published rows of one configuration (another accelerator, data set, ...).
VARIANT_COLUMNS = ("accelerator", "dataset", "sequence_length")


def sized(chart: alt.TopLevelMixin, width: int, height: int) -> alt.TopLevelMixin:
    """``chart`` drawn ``width`` x ``height`` px; a faceted chart's cells and a concatenated
    chart's panels are that size each."""
    if isinstance(chart, alt.HConcatChart):
        # Nor has a concatenation: its panels do.
        panels = chart.copy(deep=True)
        panels.hconcat = [panel.properties(width=width, height=height) for panel in panels.hconcat]
        return panels
    if isinstance(chart, alt.FacetChart):
        # A facet has no size of its own (Vega-Lite rejects one): its cells do.
        cells = chart.copy(deep=True)
        cells.spec.width, cells.spec.height = width, height
        return cells
    return chart.properties(width=width, height=height)


# What a chart's files hold where its data has nothing to draw (plots.not_drawn says why).
NOT_DRAWN = "not drawn"
# About how many pixels a character of the note's 13 px font takes, to wrap it to the width.
NOTE_CHAR_PX = 7


def not_drawn_chart(name: str, why: str, width: int = 480, height: int = 300) -> alt.Chart:
    """A chart's stand-in where it has nothing to draw: its name over "not drawn: <why>",
    wrapped to ``width`` x ``height`` px (a sentence on one line would be thousands wide)."""
    lines = textwrap.wrap(f"{NOT_DRAWN}: {why}", max(20, width // NOTE_CHAR_PX))
    return (
        alt.Chart(
            alt.Data(values=[{"note": "\n".join(lines)}]),
            title=alt.TitleParams(name, anchor="start"),
            width=width,
            height=height,
        )
        .mark_text(fontSize=13, lineBreak="\n", color=UNSTABLE_COLOR)
        .encode(text="note:N")
        .configure_view(stroke=None)
    )


def save_not_drawn(name: str, why: str, stem: Path, width: int, height: int) -> list[Path]:
    """The files of a chart with nothing to draw (those ``report_render.save`` writes): SVG and
    PNG of :func:`not_drawn_chart`, and a plain HTML page that says it (no script: nothing to zoom)."""
    chart = not_drawn_chart(name, why, width, height)
    paths = []
    for suffix, write in (
        ("svg", lambda tmp: chart.save(tmp, format="svg")),
        # scale 2, as report_render.save's
        ("png", lambda tmp: chart.save(tmp, format="png", scale_factor=2)),
    ):
        path = Path(f"{stem}.{suffix}")
        with atomic_path(path) as tmp:
            write(tmp)
        paths.append(path)
    page = (
        "<!DOCTYPE html>\n<html><head><meta charset='utf-8'>"
        f"<title>{html.escape(name)}: {NOT_DRAWN}</title></head><body>\n"
        f"<p><b>{html.escape(name)}</b>: {NOT_DRAWN}: {html.escape(why)}</p>\n</body></html>\n"
    )
    path = Path(f"{stem}.html")
    with atomic_path(path) as tmp:
        tmp.write_text(page)
    return [*paths, path]


def prepare(
    rows: pd.DataFrame,
    scenario: str,
    needed: Sequence[str],
    optional: Sequence[str] = (),
    check_model: bool = True,
) -> pd.DataFrame:
    """The rows of ``scenario`` with a configuration label, numeric values, none lacking ``needed``.

    Only the columns a chart uses travel into its spec (the HTML page carries the data): those,
    the intervals of the values that have one (NaN where the rows lack them: one trial, older
    CSVs, published tables) and ``UNSTABLE``.
    """
    missing = [c for c in (*CONFIG_FIELDS, *needed, *optional) if c not in rows.columns]
    if missing:
        raise ValueError(f"perf rows lack columns {missing}; have {sorted(map(str, rows.columns))}")
    data = rows
    if "scenario" in data.columns:
        data = data[data["scenario"] == scenario]
    values = [*needed, *optional]
    intervals = [INTERVAL_COLUMNS[c] for c in values if c in INTERVAL_COLUMNS]
    keep = [c for c in ("model", *CONFIG_FIELDS) if c in data.columns]
    keep += [c for c in values if c not in keep]
    keep += [c for c in intervals if c in data.columns]
    keep += [c for c in VARIANT_COLUMNS if c in data.columns]
    unstable = unstable_flags(data)
    data = data[keep].copy()
    for column in (*values, *intervals):
        data[column] = pd.to_numeric(data.get(column, float("nan")), errors="coerce")
    data[UNSTABLE] = unstable
    data = data.dropna(subset=list(needed))
    # Plain string concatenation: works on an empty frame too (agg/apply would not).
    label = data[CONFIG_FIELDS[0]].astype(str)
    for field in CONFIG_FIELDS[1:]:
        label = label + "/" + data[field].astype(str)
    data[CONFIG] = label
    if check_model and "model" in data.columns and data["model"].nunique() > 1:
        raise ValueError(
            f"rows hold several models {sorted(data['model'].unique())}; chart one model at a time"
        )
    return data.sort_values([CONFIG, *needed]).reset_index(drop=True)


def unstable_flags(rows: pd.DataFrame) -> pd.Series:
    """Whether each row's ``stable`` says False: a bool, or the string pandas reads from a CSV
    whose column also has gaps. Missing (published rows, older CSVs) or empty: not marked."""
    if "stable" not in rows.columns:
        return pd.Series(False, index=rows.index, dtype=bool)
    return said(rows["stable"], False)


def said(column: pd.Series, expected: bool) -> pd.Series:
    """Whether each value is ``expected``: a bool, or the string pandas reads from a CSV whose
    column also has gaps ("True", "False"). Missing or empty: False."""

    def said(value: object) -> bool:
        if isinstance(value, str):
            return value.strip().lower() == str(expected).lower()
        # NaN (no verdict) is neither; numpy's bool_ is no bool.
        return isinstance(value, bool | np.bool_) and bool(value) == expected

    return column.map(said).astype(bool)


def series_chart(
    data: pd.DataFrame,
    x: tuple[str, str],
    y: tuple[str, str],
    title: str | alt.TitleParams,
    order: str,
    color: alt.Color | None = None,
    zoom: str | None = None,
) -> alt.LayerChart:
    """Line + points, one series per configuration, joined in ``order``; x, y: (field, title).

    Error bars on each axis whose value has an interval, and the unstable points circled.
    ``title``: a text (the models its subtitle) or the whole title; ``color``: the
    configuration's color when not its own (a scale shared with another panel); ``zoom``: the
    name of its pan-and-zoom parameter, for panels each zoomed on its own.
    """
    color = color or config_color(data)
    fields = dict.fromkeys([CONFIG, order, x[0], y[0]])
    tooltip: list[str | alt.Tooltip] = [f"{f}:N" if f == CONFIG else f"{f}:Q" for f in fields]
    tooltip += [
        alt.Tooltip(f"{INTERVAL_COLUMNS[f]}:Q", title=f"{f} {CI_TITLE}")
        for f in (x[0], y[0])
        if f in INTERVAL_COLUMNS
    ]
    x_enc = alt.X(f"{x[0]}:Q", title=x[1])
    y_enc = alt.Y(f"{y[0]}:Q", title=y[1])
    line = (
        alt.Chart()
        .mark_line(point=True)
        .encode(
            x=x_enc,
            y=y_enc,
            color=color,
            order=alt.Order(f"{order}:Q"),
            tooltip=tooltip,
        )
    )
    error = error_bars(
        data,
        x_enc,
        y_enc,
        x_error=INTERVAL_COLUMNS.get(x[0]),
        y_error=INTERVAL_COLUMNS.get(y[0]),
        color=color,
    )
    layers = [line, *error, *unstable_marks(data, x_enc, y_enc)]
    if isinstance(title, str):
        title = models_title(title, data)
    return layered(layers, data, title).interactive(name=zoom)


def error_bars(
    data: pd.DataFrame,
    x: alt.X,
    y: alt.Y,
    x_error: str | None = None,
    y_error: str | None = None,
    legend: str | None = None,
    **encoding: Any,
) -> list[alt.Chart]:
    """One error-bar layer per axis whose half-width column holds a value in ``data``; with
    ``legend``, a legend entry of that label for them.

    Rows without a half-width (one trial, published rows, older CSVs) or without the value it
    is around get no bar: they are filtered out, not drawn as zero-width or stray bars.
    """
    layers = []
    for channel, field, axis in (("xError", x_error, x), ("yError", y_error, y)):
        center = cast(dict[str, Any], axis.to_dict())["field"]
        if field is None or not data.get(field, pd.Series()).notna().any():
            continue
        chart = alt.Chart()
        for valid in (center, field):
            chart = chart.transform_filter(alt.FieldValidPredicate(field=valid, valid=True))
        if legend is not None:
            chart = chart.transform_calculate(interval_label=json.dumps(legend))
            encoding["strokeDash"] = alt.StrokeDash(
                "interval_label:N",
                scale=alt.Scale(domain=[legend], range=[[1, 0]]),
                legend=alt.Legend(title=None, symbolType="stroke", symbolStrokeColor="black"),
            )
        layers.append(
            # Unfilled ticks: filled ones turn a legend's stroke symbol transparent. Black where
            # no color is encoded (the breakdown's colors are its components').
            chart.mark_errorbar(ticks=alt.TickConfig(filled=False, size=10), color="black").encode(
                x=x, y=y, **{channel: f"{field}:Q"}, **encoding
            )
        )
    return layers


def unstable_marks(data: pd.DataFrame, x: alt.X, y: alt.Y, series: str = CONFIG) -> list[alt.Chart]:
    """A red hollow circle over each unstable point, with a legend entry; none if all are
    stable. ``series``: the field naming a point's series, for the tooltip."""
    if not data[UNSTABLE].any():
        return []
    return [
        alt.Chart()
        .transform_filter(alt.FieldEqualPredicate(field=UNSTABLE, equal=True))
        .transform_calculate(unstable_label=json.dumps(UNSTABLE_LABEL))
        .mark_point(shape="circle", filled=False, opacity=1, size=200, strokeWidth=2)
        .encode(
            x=x,
            y=y,
            # The stroke channel, which no other layer uses, so its legend stays its own; a
            # constant field, not a datum: Vega-Lite gives a datum no scale or legend.
            stroke=alt.Stroke(
                "unstable_label:N",
                scale=alt.Scale(domain=[UNSTABLE_LABEL], range=[UNSTABLE_COLOR]),
                legend=alt.Legend(title=None, symbolType="circle"),
            ),
            tooltip=[
                alt.Tooltip(f"{series}:N"),
                alt.Tooltip(x.shorthand),
                alt.Tooltip(y.shorthand),
                alt.Tooltip("unstable_label:N", title="stable"),
            ],
        )
    ]


def layered(
    layers: Sequence[alt.Chart], data: pd.DataFrame, title: alt.TitleParams
) -> alt.LayerChart:
    """The layers over one shared dataset (the HTML page carries it once)."""
    return alt.LayerChart(layer=list(layers), data=data, title=title)


def config_color(data: pd.DataFrame, configurations: Sequence[str] | None = None) -> alt.Color:
    """The configuration's color: ``data``'s configurations, or all of ``configurations`` in
    that order (one scale for panels of different data: the same domain in each)."""
    domain = list(configurations) if configurations else alt.Undefined
    configurations = list(configurations or sorted(data[CONFIG].unique()))
    # The default palette repeats after 10 colors; the published overlays can hold more.
    return alt.Color(
        f"{CONFIG}:N",
        title="Configuration",
        sort=configurations,
        scale=alt.Scale(
            scheme="tableau10" if len(configurations) <= 10 else "tableau20", domain=domain
        ),
    )


def variant_suffix(rows: pd.DataFrame, columns: Sequence[str] = VARIANT_COLUMNS) -> pd.Series:
    """Per published row, the suffix telling apart variants of one configuration (another
    accelerator, data set or sequence length): " trt", " electricity 128" or ""."""
    variant = pd.Series("", index=rows.index, dtype=str)
    for column in columns:
        if column in rows:
            variant += rows[column].map(_label)
    return variant


def _label(value: object) -> str:
    """A published variant's value as a label suffix: nothing when empty, 128 not 128.0."""
    if pd.isna(value):
        return ""
    return f" {value:g}" if isinstance(value, float) else f" {value}"


def models_title(text: str, data: pd.DataFrame) -> alt.TitleParams:
    models = sorted(data["model"].unique()) if "model" in data.columns else []
    return alt.TitleParams(text, subtitle=", ".join(map(str, models)) or alt.Undefined)
