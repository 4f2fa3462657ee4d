"""Altair charts of the perf CSVs, drawn like the graphs on NVIDIA's "Deploying on Triton" pages.

Offline (static batching): throughput and latency quantiles vs batch size. Online (dynamic
batching): the stacked latency breakdown and throughput vs p99 latency over the concurrency sweep.
Every chart draws one series per *configuration* ("gpu/format/precision"), so runs concatenated
from several formats, precisions or GPUs compare on one chart. Every measured value with a 95 %
confidence interval (its ``_ci95`` column, over the point's trials) carries it as an error bar,
and the points whose measurement was not stable are circled in red. ``save`` writes SVG and PNG
(via vl-convert, no browser needed) and an interactive, self-contained HTML page. A run nothing
was published for (a CPU run) has its published charts draw the seed page's rows of its model
and format beside it, in a panel with axes of its own (``published_reference``).
"""

from __future__ import annotations

import json
import math
import numbers
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import altair as alt
import numpy as np
import pandas as pd

from .columns import INTERVAL_COLUMNS, chart_labels
from .errors import ConfigError, ResultsError
from .io import atomic_path
from .search import MEASURED

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

# Latency quantiles of the offline graphs, drawn as one dash style each.
QUANTILES = chart_labels("quantile")
# Dashes long enough to tell apart in a 20 px legend symbol (Vega's defaults are 1-4 px).
DASHES = [[1, 0], [8, 4], [3, 3], [10, 3, 2, 3]]
# The online breakdown's components, bottom of the stack first, as in the seed pages' tables.
COMPONENTS = chart_labels("component")
# Components have no interval of their own: the breakdown's bar is the average latency's.
BREAKDOWN_TOTAL = "avg_latency_ms"
BREAKDOWN_ERROR_LABEL = "avg latency ± 95 % CI"
SCENARIO_X = {"offline": "batch", "online": "concurrency"}
# What tells apart published rows of one configuration (another accelerator, data set, ...).
VARIANT_COLUMNS = ("accelerator", "dataset", "sequence_length")
MEASURED_PANEL = "Measured (this run)"
REFERENCE_PANEL = "Published (seed page), for reference"

# The serving-configuration search's points.csv: the columns its chart needs, those it draws
# when there, which of them are numbers and which flags.
SEARCH_TITLE = "Serving-configuration search: throughput vs p99 latency"
P99_TITLE = "p99 " + LATENCY_TITLE
SEARCH_NEEDED = (
    "variant",
    "baseline",
    "chosen",
    "concurrency",
    "throughput",
    "p99_latency_ms",
    "frontier",
)
SEARCH_OPTIONAL = ("batch", "throughput_ci95", "p99_latency_ms_ci95", "in_budget")
SEARCH_NUMERIC = tuple(c for c in MEASURED if c != "stable")
SEARCH_FLAGS = ("baseline", "chosen", "frontier", "in_budget")
# The outlined points' shapes, one legend entry each.
MARKED = {"baseline": "square", "chosen": "diamond"}
FRONTIER_LABEL = "Pareto frontier"
BUDGET_COLOR = "#7f7f7f"


def offline_throughput(rows: pd.DataFrame) -> alt.LayerChart:
    """Throughput vs batch size, one line per configuration."""
    data = _prepare(rows, "offline", ["batch", "throughput"])
    return _series_chart(
        data,
        x=("batch", BATCH_TITLE),
        y=("throughput", THROUGHPUT_TITLE),
        title="Throughput vs Batch Size",
        order="batch",
    )


def offline_latency(rows: pd.DataFrame) -> alt.LayerChart:
    """Latency quantiles vs batch size: color = configuration, dash = quantile.

    One row per (configuration, batch, quantile), the quantile's interval beside it; a missing
    (NaN) quantile is no row, so it leaves its own line only.
    """
    data = _prepare(rows, "offline", ["batch"], optional=list(QUANTILES))
    labels = list(QUANTILES.values())
    ids = [c for c in ("model", CONFIG, "batch", UNSTABLE) if c in data.columns]
    long = pd.concat(
        [
            data[ids].assign(
                quantile=label,
                latency_ms=data[column],
                latency_ci95=data[INTERVAL_COLUMNS[column]],
            )
            for column, label in QUANTILES.items()
        ],
        ignore_index=True,
    ).dropna(subset=["latency_ms"])
    x = alt.X("batch:Q", title=BATCH_TITLE)
    y = alt.Y("latency_ms:Q", title=LATENCY_TITLE)
    tooltip = [
        alt.Tooltip(f"{CONFIG}:N"),
        alt.Tooltip("batch:Q"),
        alt.Tooltip("quantile:N"),
        alt.Tooltip("latency_ms:Q", title=LATENCY_TITLE),
        alt.Tooltip("latency_ci95:Q", title=CI_TITLE),
    ]
    line = (
        alt.Chart()
        .mark_line()
        .encode(
            x=x,
            y=y,
            color=_color(long),
            strokeDash=alt.StrokeDash(
                "quantile:N",
                title="Quantile",
                sort=labels,
                scale=alt.Scale(domain=labels, range=DASHES[: len(labels)]),
                # Black: the color is the configuration's, not the quantile's.
                legend=alt.Legend(
                    symbolType="stroke",
                    symbolStrokeColor="black",
                    symbolStrokeWidth=1.5,
                    symbolSize=400,
                ),
            ),
            order=alt.Order("batch:Q"),
            tooltip=tooltip,
        )
    )
    # The points in a layer of their own: with mark_line(point=True) Vega-Lite draws the
    # strokeDash legend's symbols as filled points, stroke transparent: no dash visible.
    points = (
        alt.Chart()
        .mark_point(filled=True, opacity=1)
        .encode(x=x, y=y, color=_color(long), detail="quantile:N", tooltip=tooltip)
    )
    layers = [line, points, *_error_bars(long, x, y, y_error="latency_ci95", color=_color(long))]
    layers += _unstable_marks(long, x, y)
    return _layer(layers, long, _title("Latency vs Batch Size", data)).interactive()


def online_latency_breakdown(rows: pd.DataFrame) -> alt.LayerChart | alt.FacetChart:
    """Stacked latency components per concurrency; one column per configuration when several.

    The components have no interval of their own: the error bar over each stack is the average
    latency (about their sum) ± its 95 % interval.
    """
    optional = [*COMPONENTS, BREAKDOWN_TOTAL]
    data = _prepare(rows, "online", ["concurrency"], optional=optional)
    # Folded in the spec, not in pandas: the bars, the error bars and the unstable marks share
    # one dataset, which a facet over the configurations needs.
    data = data.rename(columns=COMPONENTS)
    labels = list(COMPONENTS.values())
    x = alt.X("concurrency:O", title="Concurrency", axis=alt.Axis(labelAngle=0))
    bars = (
        alt.Chart()
        .transform_fold(list[str | alt.FieldName](labels), as_=["component", "latency_ms"])
        .transform_filter(alt.FieldValidPredicate(field="latency_ms", valid=True))
        .transform_calculate(component_order=f"indexof({json.dumps(labels)}, datum.component)")
        .mark_bar()
        .encode(
            x=x,
            # A short title: with one column per configuration the cells are narrow.
            y=alt.Y("latency_ms:Q", title=LATENCY_TITLE, stack="zero"),
            color=alt.Color(
                "component:N", title="Component", sort=labels, scale=alt.Scale(domain=labels)
            ),
            order=alt.Order("component_order:Q", sort="ascending"),
            tooltip=[
                alt.Tooltip(f"{CONFIG}:N"),
                alt.Tooltip("concurrency:O"),
                alt.Tooltip("component:N"),
                alt.Tooltip("latency_ms:Q", title=LATENCY_TITLE),
            ],
        )
    )
    total = alt.Y(f"{BREAKDOWN_TOTAL}:Q", title=LATENCY_TITLE)
    error = _error_bars(
        data,
        x,
        total,
        y_error=INTERVAL_COLUMNS[BREAKDOWN_TOTAL],
        # Its own legend entry says what the bar is: not an interval of the stack's parts.
        legend=BREAKDOWN_ERROR_LABEL,
    )
    layers = [bars, *error, *_unstable_marks(data, x, total)]
    title = _title("Latency breakdown vs Concurrency", data)
    if data[CONFIG].nunique() > 1:
        return alt.layer(*layers, data=data).facet(
            column=alt.Column(f"{CONFIG}:N", title="Configuration"), title=title
        )
    return _layer(layers, data, title)


def online_throughput_latency(rows: pd.DataFrame) -> alt.LayerChart:
    """Throughput vs p99 latency, one line per configuration following the concurrency sweep."""
    data = _prepare(rows, "online", ["concurrency", "throughput", "p99_latency_ms"])
    return _series_chart(
        data,
        x=("p99_latency_ms", "p99 " + LATENCY_TITLE),
        y=("throughput", THROUGHPUT_TITLE),
        title="Throughput vs Latency",
        order="concurrency",
    )


def comparison(rows: pd.DataFrame, scenario: str) -> alt.LayerChart:
    """One model across formats, precisions and GPUs: the scenario's throughput chart."""
    charts = {"offline": offline_throughput, "online": online_throughput_latency}
    if scenario not in charts:
        raise ValueError(f"unknown scenario {scenario!r}; valid: {sorted(charts)}")
    return charts[scenario](rows)


def published_overlay(
    measured: pd.DataFrame, published: pd.DataFrame, scenario: str
) -> alt.LayerChart:
    """Measured and published throughput on one chart (vs batch offline, vs concurrency online).

    Color is the configuration, point shape and line dash the source. Published rows of other
    models or scenarios, or lacking the x value or the throughput, are dropped; which published
    GPUs/formats/precisions to show is the caller's choice. Published tables sometimes list one
    configuration twice (another accelerator or dataset); those stay separate lines. Published
    rows have no interval and no stability verdict: no error bars, no unstable marks.
    """
    if scenario not in SCENARIO_X:
        raise ValueError(f"unknown scenario {scenario!r}; valid: {sorted(SCENARIO_X)}")
    x = SCENARIO_X[scenario]
    needed = [x, "throughput"]
    ours = _prepare(measured, scenario, needed)
    ours[SOURCE] = "measured"
    ours["series"] = "measured " + ours[CONFIG]
    theirs = _prepare(published, scenario, needed, check_model=False)
    if "model" in ours and "model" in theirs:
        theirs = theirs[theirs["model"].isin(ours["model"].unique())]
    theirs = theirs.assign(
        **{SOURCE: "published", "series": "published " + theirs[CONFIG] + _variant(theirs)}
    )
    data = pd.concat([ours, theirs], ignore_index=True)
    x_title = BATCH_TITLE if scenario == "offline" else CONCURRENCY_TITLE
    x_name = "Batch Size" if scenario == "offline" else "Concurrency"
    sources = ["measured", "published"]
    x_enc = alt.X(f"{x}:Q", title=x_title)
    y_enc = alt.Y("throughput:Q", title=THROUGHPUT_TITLE)
    line = (
        alt.Chart()
        .mark_line(point=True)
        .encode(
            x=x_enc,
            y=y_enc,
            color=_color(data),
            shape=alt.Shape(f"{SOURCE}:N", title="Source", scale=alt.Scale(domain=sources)),
            strokeDash=alt.StrokeDash(
                f"{SOURCE}:N", title="Source", scale=alt.Scale(domain=sources)
            ),
            detail=alt.Detail("series:N"),
            order=alt.Order(f"{x}:Q"),
            tooltip=[
                alt.Tooltip("series:N"),
                alt.Tooltip(f"{x}:Q"),
                alt.Tooltip("throughput:Q", title=THROUGHPUT_TITLE),
                alt.Tooltip(f"{INTERVAL_COLUMNS['throughput']}:Q", title=CI_TITLE),
            ],
        )
    )
    error = _error_bars(
        data, x_enc, y_enc, y_error=INTERVAL_COLUMNS["throughput"], color=_color(data)
    )
    layers = [line, *error, *_unstable_marks(data, x_enc, y_enc)]
    title = _title(f"Throughput vs {x_name}: measured and published", ours)
    return _layer(layers, data, title).interactive()


def published_reference(
    measured: pd.DataFrame, reference: pd.DataFrame, scenario: str, reason: str | None = None
) -> alt.HConcatChart | alt.LayerChart:
    """Measured throughput beside published rows of *other* configurations, each panel on its
    own axes (vs batch size offline, vs concurrency online).

    For a run nothing was published for (a CPU run: the seed pages measured GPUs only) the
    overlay would hold no published point. ``reference`` (the seed page's rows of the run's
    model and format on the GPUs they were measured on: ``deploybench.report.reference_rows``)
    stands in a second panel with its own y axis: a CPU's throughput may be orders of magnitude
    lower, and one axis would flatten one side. One color scale across both panels; published
    variants of one configuration (accelerator, data set, sequence length) are separate lines
    where the reference holds several. ``reason``: why nothing was published for the run, for
    the subtitle. Where ``reference`` has no row of ``scenario`` the chart is the measured panel
    alone, and its subtitle says so.
    """
    if scenario not in SCENARIO_X:
        raise ValueError(f"unknown scenario {scenario!r}; valid: {sorted(SCENARIO_X)}")
    x = SCENARIO_X[scenario]
    needed = [x, "throughput"]
    ours = _prepare(measured, scenario, needed)
    theirs = _prepare(reference, scenario, needed, check_model=False)
    varying = [c for c in VARIANT_COLUMNS if c in theirs and theirs[c].nunique() > 1]
    theirs[CONFIG] = theirs[CONFIG] + _variant(theirs, varying)
    x_title = BATCH_TITLE if scenario == "offline" else CONCURRENCY_TITLE
    x_name = "Batch Size" if scenario == "offline" else "Concurrency"
    models = sorted(ours["model"].unique()) if "model" in ours.columns else []
    model = " ".join(map(str, models))
    what = "Nothing was published for " + ", ".join(sorted(ours[CONFIG].unique()))
    what += f" ({reason})" if reason else ""
    if theirs.empty:
        what += f", and the seed page has no {scenario} {model} rows to show beside it"
    else:
        formats = ", ".join(sorted(theirs["format"].astype(str).unique()))
        gpus = ", ".join(sorted(theirs["gpu"].astype(str).unique()))
        what += (
            f": the seed page's {model} {formats} rows on {gpus} stand beside it for reference, "
            "on axes of their own"
        )
    title = alt.TitleParams(
        f"Throughput vs {x_name}: measured and published", subtitle=[*models, what]
    )
    configurations = [*sorted(ours[CONFIG].unique()), *sorted(theirs[CONFIG].unique())]
    panels = [
        _series_chart(
            data,
            x=(x, x_title),
            y=("throughput", THROUGHPUT_TITLE),
            title=alt.TitleParams(panel, fontSize=12),
            order=x,
            color=_color(data, configurations),
            # its own: one parameter bound to both panels' scales would pan them together
            zoom=f"zoom_{source}",
        )
        for source, panel, data in (
            ("measured", MEASURED_PANEL, ours),
            ("published", REFERENCE_PANEL, theirs),
        )
        if not data.empty or source == "measured"
    ]
    if len(panels) == 1:
        return panels[0].properties(title=title)
    return alt.hconcat(*panels, title=title)


def published_chart(
    measured: pd.DataFrame,
    published: pd.DataFrame,
    reference: pd.DataFrame,
    scenario: str,
    reason: str | None = None,
) -> alt.TopLevelMixin:
    """A run's published chart: its points over its ``published`` rows (:func:`published_overlay`)
    or, where it has none, beside the ``reference`` rows (:func:`published_reference`)."""
    if published.empty:
        return published_reference(measured, reference, scenario, reason)
    return published_overlay(measured, published, scenario)


def search_pareto(
    points: pd.DataFrame, budget_ms: float | None, subtitle: str | None = None
) -> alt.LayerChart:
    """The serving-configuration search: throughput vs p99 latency of every point it measured.

    One color per candidate (its points joined faintly along its concurrency sweep), the Pareto
    frontier of all points as a step line (the most throughput at that latency or less), the
    baseline's and the chosen candidate's points outlined, the latency budget (when there is
    one) as a dashed rule and the points over it faint. Error bars and unstable marks as in the
    other charts. ``points``: the search's points.csv; ``subtitle``: the run, say.
    """
    missing = [c for c in SEARCH_NEEDED if c not in points.columns]
    if missing:
        raise ResultsError(
            f"search points lack columns {missing}; have {sorted(map(str, points.columns))}"
        )
    if budget_ms is not None and not (
        isinstance(budget_ms, numbers.Real)
        and not isinstance(budget_ms, bool)
        and math.isfinite(budget_ms)
        and budget_ms > 0
    ):
        raise ConfigError(
            f"latency budget must be a positive number of ms or None, not {budget_ms!r}"
        )
    data = points[[c for c in (*SEARCH_NEEDED, *SEARCH_OPTIONAL) if c in points.columns]].copy()
    for column in SEARCH_NUMERIC:
        # The intervals always (NaN: none, as with one trial), for the tooltips; batch if there.
        if column in data.columns or column in INTERVAL_COLUMNS.values():
            data[column] = pd.to_numeric(data.get(column, float("nan")), errors="coerce")
    # From a CSV with gaps a bool column reads as strings: "True", "False", NaN.
    for column in SEARCH_FLAGS:
        if column in data.columns:
            data[column] = _said(data[column], True)
    data[UNSTABLE] = _unstable(points)
    data["variant"] = data["variant"].astype(str)
    data = data.dropna(subset=["throughput", "p99_latency_ms"]).reset_index(drop=True)

    # The baseline first in the legend, the rest in the search's order.
    variants = list(dict.fromkeys([*data.loc[data["baseline"], "variant"], *data["variant"]]))
    color = alt.Color(
        "variant:N",
        title="Candidate",
        # Opaque symbols: the legend would take the faint sweep lines' opacity.
        legend=alt.Legend(symbolOpacity=1),
        scale=alt.Scale(
            domain=variants, scheme="tableau10" if len(variants) <= 10 else "tableau20"
        ),
    )
    x = alt.X("p99_latency_ms:Q", title=P99_TITLE)
    y = alt.Y("throughput:Q", title=THROUGHPUT_TITLE)
    tooltip = [
        alt.Tooltip(f"{c}:{'N' if c == 'variant' else 'Q'}")
        for c in ("variant", "batch", "concurrency", "throughput", "p99_latency_ms")
        if c in data.columns
    ]
    tooltip += [
        alt.Tooltip(f"{INTERVAL_COLUMNS[c]}:Q", title=f"{c} {CI_TITLE}")
        for c in ("throughput", "p99_latency_ms")
    ]
    sweep = (
        alt.Chart()
        .mark_line(opacity=0.35, strokeWidth=1)
        .encode(
            x=x,
            y=y,
            color=color,
            order=alt.Order("concurrency:Q"),
            # A candidate measured at several batch sizes: one sweep each, not a zig-zag.
            **({"detail": alt.Detail("batch:Q")} if "batch" in data.columns else {}),
        )
    )
    dots = alt.Chart().mark_point(filled=True, size=50)
    if "in_budget" in data.columns:
        over = alt.when(alt.FieldEqualPredicate(field="in_budget", equal=True))
        dots = dots.encode(opacity=over.then(alt.value(1.0)).otherwise(alt.value(0.35)))
    dots = dots.encode(x=x, y=y, color=color, tooltip=tooltip)
    error = _error_bars(
        data,
        x,
        y,
        x_error=INTERVAL_COLUMNS["p99_latency_ms"],
        y_error=INTERVAL_COLUMNS["throughput"],
        color=color,
    )
    frontier = (
        alt.Chart()
        .transform_filter(alt.FieldEqualPredicate(field="frontier", equal=True))
        .transform_calculate(frontier_label=json.dumps(FRONTIER_LABEL))
        # step-after: flat to the next frontier point's latency, then up to its throughput.
        .mark_line(interpolate="step-after", color="black", strokeWidth=1.5)
        .encode(
            x=x,
            y=y,
            order=alt.Order("p99_latency_ms:Q"),
            # A constant field, as for the unstable marks: a legend entry of its own.
            strokeDash=alt.StrokeDash(
                "frontier_label:N",
                scale=alt.Scale(domain=[FRONTIER_LABEL], range=[[1, 0]]),
                legend=alt.Legend(title=None, symbolType="stroke", symbolStrokeColor="black"),
            ),
        )
    )
    marked = [role for role in MARKED if data[role].any()]
    outlines = [
        alt.Chart()
        .transform_filter(alt.FieldEqualPredicate(field=role, equal=True))
        .transform_calculate(marked=json.dumps(role))
        .mark_point(filled=False, size=220, strokeWidth=2, color="black", opacity=1)
        .encode(
            x=x,
            y=y,
            shape=alt.Shape(
                "marked:N",
                scale=alt.Scale(domain=marked, range=[MARKED[r] for r in marked]),
                legend=alt.Legend(title=None),
            ),
            tooltip=tooltip,
        )
        for role in marked
    ]
    layers = [sweep, dots, *error, frontier, *outlines]
    layers += _unstable_marks(data, x, y, series="variant")
    if budget_ms is not None:
        label = f"p99 budget {budget_ms:g} ms"
        # Its own one-row data, under the points' field name: the rule shares their x scale
        # (so it stays in view) and is drawn once, not once per point.
        budget = alt.Chart(alt.Data(values=[{"p99_latency_ms": budget_ms, "budget_label": label}]))
        layers += [
            budget.mark_rule(strokeDash=[6, 4], strokeWidth=1.5, color=BUDGET_COLOR).encode(x=x),
            # At the foot of the rule: the points near the budget are the high ones.
            budget.mark_text(
                align="left", baseline="bottom", dx=4, dy=-4, color=BUDGET_COLOR
            ).encode(x=x, y=alt.value(alt.ExprRef("height")), text="budget_label:N"),
        ]
    title = alt.TitleParams(SEARCH_TITLE, subtitle=subtitle or alt.Undefined)
    return _layer(layers, data, title).interactive()


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


def save(chart: alt.TopLevelMixin, stem: Path, inline_html: bool = True) -> list[Path]:
    """Write ``stem.svg``, ``stem.png`` and ``stem.html``; return their paths.

    The HTML page carries its JavaScript (~0.9 MB: Vega, Vega-Lite and vega-embed, the bundle
    vl-convert ships, which Altair's ``inline=True`` writes into the page), so it opens offline
    and loads nothing (tests/test_browser.py opens them in Chromium). ``inline_html`` false
    loads them from a CDN instead: a few kB, but blank without the network; for tests only.
    """
    paths = []
    for suffix, write in (
        ("svg", lambda tmp: chart.save(tmp, format="svg")),
        # scale 2: the PNG stays sharp on high-DPI screens and in slides.
        ("png", lambda tmp: chart.save(tmp, format="png", scale_factor=2)),
        ("html", lambda tmp: chart.save(tmp, format="html", inline=inline_html)),
    ):
        path = Path(f"{stem}.{suffix}")
        with atomic_path(path) as tmp:
            write(tmp)
        paths.append(path)
    return paths


def _prepare(
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
    unstable = _unstable(data)
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


def _unstable(rows: pd.DataFrame) -> pd.Series:
    """Whether each row's ``stable`` says False: a bool, or the string pandas reads from a CSV
    whose column also has gaps. Missing (published rows, older CSVs) or empty: not marked."""
    if "stable" not in rows.columns:
        return pd.Series(False, index=rows.index, dtype=bool)
    return _said(rows["stable"], False)


def _said(column: pd.Series, expected: bool) -> pd.Series:
    """Whether each value is ``expected``: a bool, or the string pandas reads from a CSV whose
    column also has gaps ("True", "False"). Missing or empty: False."""

    def said(value: object) -> bool:
        if isinstance(value, str):
            return value.strip().lower() == str(expected).lower()
        # NaN (no verdict) is neither; numpy's bool_ is no bool.
        return isinstance(value, bool | np.bool_) and bool(value) == expected

    return column.map(said).astype(bool)


def _series_chart(
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
    color = color or _color(data)
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
    error = _error_bars(
        data,
        x_enc,
        y_enc,
        x_error=INTERVAL_COLUMNS.get(x[0]),
        y_error=INTERVAL_COLUMNS.get(y[0]),
        color=color,
    )
    layers = [line, *error, *_unstable_marks(data, x_enc, y_enc)]
    if isinstance(title, str):
        title = _title(title, data)
    return _layer(layers, data, title).interactive(name=zoom)


def _error_bars(
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


def _unstable_marks(
    data: pd.DataFrame, x: alt.X, y: alt.Y, series: str = CONFIG
) -> list[alt.Chart]:
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


def _layer(
    layers: Sequence[alt.Chart], data: pd.DataFrame, title: alt.TitleParams
) -> alt.LayerChart:
    """The layers over one shared dataset (the HTML page carries it once)."""
    return alt.LayerChart(layer=list(layers), data=data, title=title)


def _color(data: pd.DataFrame, configurations: Sequence[str] | None = None) -> alt.Color:
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


def _variant(rows: pd.DataFrame, columns: Sequence[str] = VARIANT_COLUMNS) -> pd.Series:
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


def _title(text: str, data: pd.DataFrame) -> alt.TitleParams:
    models = sorted(data["model"].unique()) if "model" in data.columns else []
    return alt.TitleParams(text, subtitle=", ".join(map(str, models)) or alt.Undefined)
