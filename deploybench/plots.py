"""Altair charts of the perf CSVs, drawn like the graphs on NVIDIA's "Deploying on Triton" pages.

Over 600 lines on purpose: every run chart and its registration sit together, sharing chart_kit.

Offline (static batching): throughput and latency quantiles vs batch size. Online (dynamic
batching): the stacked latency breakdown and throughput vs p99 latency over the concurrency sweep.
Both: throughput vs the energy meter's joules per inference. A chart whose data has nothing to
draw (no energy measured, no point of its scenario) is not drawn: :func:`not_drawn` says why,
and its files say so (``chart_kit.save_not_drawn``).
Every chart draws one series per *configuration* ("gpu/format/precision"), so runs concatenated
from several formats, precisions or GPUs compare on one chart. Every measured value with a 95 %
confidence interval (its ``_ci95`` column, over the point's trials) carries it as an error bar,
and the points whose measurement was not stable are circled in red. ``save`` writes SVG and PNG
(via vl-convert, no browser needed) and an interactive, self-contained HTML page, from one spec
(:mod:`deploybench.report_render`). A run nothing was published for (a CPU run) has its
published charts draw the seed page's rows of its model and format beside it, in a panel with
axes of its own (``published_reference``).

Each of a run's charts (``chart_names.RunChart``) is drawn by the function registered for it
with ``@run_chart`` beside its definition; ``jobs.plots`` draws them all from one
:class:`ChartInputs`. The pieces the charts share are in :mod:`deploybench.chart_kit`.
"""

from __future__ import annotations

import json
import math
import numbers
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import altair as alt
import pandas as pd

from .chart_kit import (  # noqa: F401 - CONFIG, SOURCE, UNSTABLE_COLOR, save*, sized: plots' too
    BATCH_TITLE,
    CI_TITLE,
    CONCURRENCY_TITLE,
    CONFIG,
    LATENCY_TITLE,
    SOURCE,
    THROUGHPUT_TITLE,
    UNSTABLE,
    UNSTABLE_COLOR,
    VARIANT_COLUMNS,
    config_color,
    error_bars,
    layered,
    models_title,
    not_drawn_chart,
    prepare,
    said,
    save_not_drawn,
    series_chart,
    sized,
    unstable_flags,
    unstable_marks,
    variant_suffix,
)
from .chart_names import RunChart
from .columns import INTERVAL_COLUMNS, chart_labels
from .compare import has_energy, not_measured
from .config_search import MEASURED
from .errors import ConfigError, ResultsError
from .report_render import save  # noqa: F401 - plots.save: the jobs' and the tests'

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


@dataclass(frozen=True)
class ChartInputs:
    """What a run's charts are drawn from: its scenarios' perf rows, the published rows it
    reproduces (``report_published.published_rows``), the seed page's rows to show beside it where it has
    none (``report_published.reference_rows``) and why it has none (``report_published.no_published_reason``)."""

    offline: pd.DataFrame
    online: pd.DataFrame
    published: pd.DataFrame
    reference: pd.DataFrame
    no_published_reason: str | None = None

    def rows(self, scenario: str) -> pd.DataFrame:
        """The perf rows of ``scenario``."""
        if scenario not in SCENARIO_X:
            raise ValueError(f"unknown scenario {scenario!r}; valid: {sorted(SCENARIO_X)}")
        return self.offline if scenario == "offline" else self.online


DrawRunChart = Callable[[ChartInputs], alt.TopLevelMixin]
# Each of the run's charts (chart_names.RunChart) → the function drawing it, in the order they
# are defined below (@run_chart); every RunChart has one (checked at import: check_run_charts).
RUN_CHART_DRAWERS: dict[RunChart, DrawRunChart] = {}
# Why a run's chart has nothing to draw (None: it has something): each chart's, beside its
# function (@run_chart's ``empty``; a scenario's chart: no point of the scenario).
NothingToDraw = Callable[[ChartInputs], str | None]
RUN_CHART_EMPTY: dict[RunChart, NothingToDraw] = {}
ChartFunction = TypeVar("ChartFunction", bound=Callable[..., alt.TopLevelMixin])


def run_chart(
    name: RunChart | str, scenario: str | None = None, empty: NothingToDraw | None = None
) -> Callable[[ChartFunction], ChartFunction]:
    """Register the decorated function as the one drawing the run's chart ``name``: with
    ``scenario`` a function of that scenario's rows (``offline_throughput(rows)``), without one
    a function of the run's :class:`ChartInputs`. ``empty``: why the chart has nothing to draw
    from its inputs, or None (:func:`not_drawn`; a scenario's chart by default: no point of the
    scenario measured). The function itself is left as it is."""
    try:
        chart = RunChart(name)
    except ValueError:
        names = [c.value for c in RunChart]
        raise ValueError(f"unknown run chart {name!r}; valid: {names}") from None
    if scenario is not None and scenario not in SCENARIO_X:
        raise ValueError(f"unknown scenario {scenario!r}; valid: {sorted(SCENARIO_X)}")

    def register(function: ChartFunction) -> ChartFunction:
        if chart in RUN_CHART_DRAWERS:
            raise ValueError(f"run chart {chart.value!r} has a function drawing it already")
        if scenario is None:
            RUN_CHART_DRAWERS[chart] = function
        else:
            RUN_CHART_DRAWERS[chart] = lambda inputs: function(inputs.rows(scenario))
        if empty is not None:
            RUN_CHART_EMPTY[chart] = empty
        elif scenario is not None:
            RUN_CHART_EMPTY[chart] = lambda inputs: no_points(inputs, scenario)
        else:
            RUN_CHART_EMPTY.pop(chart, None)
        return function

    return register


def check_run_charts() -> None:
    """A clear error where a run chart has no function drawing it (:func:`run_chart`)."""
    missing = [c.value for c in RunChart if c not in RUN_CHART_DRAWERS]
    if missing:
        raise RuntimeError(f"run charts without a function drawing them (@run_chart): {missing}")


def not_drawn(inputs: ChartInputs) -> dict[str, str]:
    """The run's charts whose data has nothing to draw, by name: why (a CPU run without an
    energy meter: ``energy_throughput``, "energy not measured: <why>"). Their files say so
    instead (``chart_kit.save_not_drawn``), and the report page says it in their place."""
    check_run_charts()
    found = {chart.value: empty(inputs) for chart, empty in RUN_CHART_EMPTY.items()}
    return {name: why for name, why in found.items() if why is not None}


def draw_run_charts(inputs: ChartInputs) -> dict[str, alt.TopLevelMixin]:
    """Every chart of a run that has something to draw (:func:`not_drawn`: the others), by
    name."""
    skipped = not_drawn(inputs)
    return {
        chart.value: draw(inputs)
        for chart, draw in RUN_CHART_DRAWERS.items()
        if chart.value not in skipped
    }


def no_points(inputs: ChartInputs, scenario: str) -> str | None:
    """Why a chart of ``scenario``'s points has nothing to draw: no point with a throughput."""
    rows = _points(inputs.rows(scenario), scenario)
    throughput = pd.to_numeric(rows.get("throughput", pd.Series(dtype=float)), errors="coerce")
    return None if throughput.notna().any() else f"no {scenario} point was measured"


@run_chart(RunChart.OFFLINE_THROUGHPUT, "offline")
def offline_throughput(rows: pd.DataFrame) -> alt.LayerChart:
    """Throughput vs batch size, one line per configuration."""
    data = prepare(rows, "offline", ["batch", "throughput"])
    return series_chart(
        data,
        x=("batch", BATCH_TITLE),
        y=("throughput", THROUGHPUT_TITLE),
        title="Throughput vs Batch Size",
        order="batch",
    )


@run_chart(RunChart.OFFLINE_LATENCY, "offline")
def offline_latency(rows: pd.DataFrame) -> alt.LayerChart:
    """Latency quantiles vs batch size: color = configuration, dash = quantile.

    One row per (configuration, batch, quantile), the quantile's interval beside it; a missing
    (NaN) quantile is no row, so it leaves its own line only.
    """
    data = prepare(rows, "offline", ["batch"], optional=list(QUANTILES))
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
            color=config_color(long),
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
        .encode(x=x, y=y, color=config_color(long), detail="quantile:N", tooltip=tooltip)
    )
    layers = [
        line,
        points,
        *error_bars(long, x, y, y_error="latency_ci95", color=config_color(long)),
    ]
    layers += unstable_marks(long, x, y)
    return layered(layers, long, models_title("Latency vs Batch Size", data)).interactive()


@run_chart(RunChart.ONLINE_LATENCY_BREAKDOWN, "online")
def online_latency_breakdown(rows: pd.DataFrame) -> alt.LayerChart | alt.FacetChart:
    """Stacked latency components per concurrency; one column per configuration when several.

    The components have no interval of their own: the error bar over each stack is the average
    latency (about their sum) ± its 95 % interval.
    """
    optional = [*COMPONENTS, BREAKDOWN_TOTAL]
    data = prepare(rows, "online", ["concurrency"], optional=optional)
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
    error = error_bars(
        data,
        x,
        total,
        y_error=INTERVAL_COLUMNS[BREAKDOWN_TOTAL],
        # Its own legend entry says what the bar is: not an interval of the stack's parts.
        legend=BREAKDOWN_ERROR_LABEL,
    )
    layers = [bars, *error, *unstable_marks(data, x, total)]
    title = models_title("Latency breakdown vs Concurrency", data)
    if data[CONFIG].nunique() > 1:
        return alt.layer(*layers, data=data).facet(
            column=alt.Column(f"{CONFIG}:N", title="Configuration"), title=title
        )
    return layered(layers, data, title)


@run_chart(RunChart.ONLINE_THROUGHPUT_LATENCY, "online")
def online_throughput_latency(rows: pd.DataFrame) -> alt.LayerChart:
    """Throughput vs p99 latency, one line per configuration following the concurrency sweep."""
    data = prepare(rows, "online", ["concurrency", "throughput", "p99_latency_ms"])
    return series_chart(
        data,
        x=("p99_latency_ms", "p99 " + LATENCY_TITLE),
        y=("throughput", THROUGHPUT_TITLE),
        title="Throughput vs Latency",
        order="concurrency",
    )


# The energy chart: throughput against the meter's joules per inference, each point labelled
# by the setting its scenario sweeps.
ENERGY = "energy_per_inference_j"
ENERGY_TITLE = "Energy per inference [J]"
ENERGY_CHART_TITLE = "Throughput vs Energy per inference"
POINT_LABELS = {"offline": "batch", "online": "conc."}
# A panel's note wraps at this many characters (a 480 px panel at 13 px).
NOTE_WRAP = 60
SCENARIO_PANELS = {
    "offline": "Offline (static batching, concurrency 1)",
    "online": "Online (dynamic batching over concurrency)",
}


def _energy_missing(inputs: ChartInputs) -> dict[str, str]:
    """The scenarios without an energy per inference, by name: why (their ``energy_status``)."""
    missing = {}
    for scenario in SCENARIO_X:
        points = _points(inputs.rows(scenario), scenario)
        if points.empty:
            missing[scenario] = f"no {scenario} points"
        elif not has_energy(points):
            missing[scenario] = "; ".join(_why(r) for r in not_measured(points))
    return missing


def no_energy(inputs: ChartInputs) -> str | None:
    """Why the energy chart has nothing to draw: no scenario has an energy per inference."""
    missing = _energy_missing(inputs)
    return _no_energy_text(missing) if len(missing) == len(SCENARIO_X) else None


def _no_energy_text(missing: dict[str, str]) -> str:
    return "energy not measured: " + "; ".join(dict.fromkeys(missing.values()))


@run_chart(RunChart.ENERGY_THROUGHPUT, empty=no_energy)
def energy_throughput(inputs: ChartInputs) -> alt.TopLevelMixin:
    """Throughput against joules per inference, a panel per scenario, one mark per point
    (labelled with its batch size or concurrency) with its 95 % error bars on both axes.

    Energy is empty where the run's meter measured nothing (a CPU without RAPL, a MIG
    instance, meter none). Where no scenario has it the chart is not drawn (:func:`no_energy`
    says why: the rows' ``energy_status``; :func:`not_drawn`), and this returns the stand-in
    its files hold (``chart_kit.not_drawn_chart``); where one scenario lacks it, that
    scenario's panel says "energy not measured: <why>". Rows of a CSV from before the energy
    columns: not measured, and the text says so.
    """
    missing = _energy_missing(inputs)
    if len(missing) == len(SCENARIO_X):
        return not_drawn_chart(RunChart.ENERGY_THROUGHPUT.value, _no_energy_text(missing))
    panels = [(scenario, inputs.rows(scenario)) for scenario in SCENARIO_X]
    models = sorted(
        {str(m) for _, rows in panels if "model" in rows.columns for m in rows["model"].unique()}
    )
    drawn = pd.concat(
        [_energy_rows(rows, s) for s, rows in panels if s not in missing], ignore_index=True
    )
    configurations = sorted(drawn[CONFIG].unique())
    charts = [
        _note_chart(
            f"energy not measured: {missing[scenario]}",
            alt.TitleParams(SCENARIO_PANELS[scenario], fontSize=12),
        )
        if scenario in missing
        else _energy_panel(
            drawn[drawn["scenario"] == scenario], scenario, config_color(drawn, configurations)
        )
        for scenario, _ in panels
    ]
    subtitle = [*models] + [
        f"{scenario}: energy not measured: {why}" for scenario, why in missing.items()
    ]
    return alt.hconcat(
        *charts, title=alt.TitleParams(ENERGY_CHART_TITLE, subtitle=subtitle or alt.Undefined)
    )


def _why(reason: str) -> str:
    """A status "not measured: <why>" as its why."""
    return reason.removeprefix("not measured").lstrip(": ") or reason


def _points(rows: pd.DataFrame, scenario: str) -> pd.DataFrame:
    return rows[rows["scenario"] == scenario] if "scenario" in rows.columns else rows


def _energy_rows(rows: pd.DataFrame, scenario: str) -> pd.DataFrame:
    """The scenario's points that have energy, prepared (:func:`prepare`) and labelled."""
    x = SCENARIO_X[scenario]
    data = prepare(rows, scenario, [x, "throughput", ENERGY], optional=["power_mean_w"])
    data["scenario"] = scenario
    data["point"] = POINT_LABELS[scenario] + " " + data[x].astype(int).astype(str)
    return data


def _energy_panel(data: pd.DataFrame, scenario: str, color: alt.Color) -> alt.LayerChart:
    # padding: room for the right-most point's label inside the plot
    x = alt.X(f"{ENERGY}:Q", title=ENERGY_TITLE, scale=alt.Scale(zero=False, padding=40))
    y = alt.Y("throughput:Q", title=THROUGHPUT_TITLE, scale=alt.Scale(zero=False))
    tooltip = [
        alt.Tooltip(f"{CONFIG}:N"),
        alt.Tooltip("point:N"),
        alt.Tooltip("throughput:Q", title=THROUGHPUT_TITLE),
        alt.Tooltip(f"{INTERVAL_COLUMNS['throughput']}:Q", title=f"throughput {CI_TITLE}"),
        alt.Tooltip(f"{ENERGY}:Q", title=ENERGY_TITLE, format=".4g"),
        alt.Tooltip(f"{INTERVAL_COLUMNS[ENERGY]}:Q", title=f"energy {CI_TITLE}", format=".2g"),
        alt.Tooltip("power_mean_w:Q", title="mean power [W]", format=".1f"),
    ]
    dots = alt.Chart().mark_point(filled=True, size=60, opacity=1)
    labels = alt.Chart().mark_text(align="left", baseline="middle", dx=7, fontSize=10)
    layers = [
        dots.encode(x=x, y=y, color=color, tooltip=tooltip),
        labels.encode(x=x, y=y, text="point:N", color=color),
        *error_bars(
            data,
            x,
            y,
            x_error=INTERVAL_COLUMNS[ENERGY],
            y_error=INTERVAL_COLUMNS["throughput"],
            color=color,
        ),
        *unstable_marks(data, x, y),
    ]
    title = alt.TitleParams(SCENARIO_PANELS[scenario], fontSize=12)
    return layered(layers, data, title).interactive(name=f"zoom_{scenario}")


def _note_chart(text: str, title: alt.TitleParams) -> alt.Chart:
    """A panel holding only ``text`` (wrapped: a panel is a chart's width): what a panel
    without data says instead."""
    wrapped = "\n".join(textwrap.wrap(text, NOTE_WRAP))
    return (
        alt.Chart(alt.Data(values=[{"note": wrapped}]), title=title)
        .mark_text(fontSize=13, color=UNSTABLE_COLOR, lineBreak="\n")
        .encode(text="note:N")
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
    ours = prepare(measured, scenario, needed)
    ours[SOURCE] = "measured"
    ours["series"] = "measured " + ours[CONFIG]
    theirs = prepare(published, scenario, needed, check_model=False)
    if "model" in ours and "model" in theirs:
        theirs = theirs[theirs["model"].isin(ours["model"].unique())]
    theirs = theirs.assign(
        **{SOURCE: "published", "series": "published " + theirs[CONFIG] + variant_suffix(theirs)}
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
            color=config_color(data),
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
    error = error_bars(
        data, x_enc, y_enc, y_error=INTERVAL_COLUMNS["throughput"], color=config_color(data)
    )
    layers = [line, *error, *unstable_marks(data, x_enc, y_enc)]
    title = models_title(f"Throughput vs {x_name}: measured and published", ours)
    return layered(layers, data, title).interactive()


def published_reference(
    measured: pd.DataFrame, reference: pd.DataFrame, scenario: str, reason: str | None = None
) -> alt.HConcatChart | alt.LayerChart:
    """Measured throughput beside published rows of *other* configurations, each panel on its
    own axes (vs batch size offline, vs concurrency online).

    For a run nothing was published for (a CPU run: the seed pages measured GPUs only) the
    overlay would hold no published point. ``reference`` (the seed page's rows of the run's
    model and format on the GPUs they were measured on: ``deploybench.report_published.reference_rows``)
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
    ours = prepare(measured, scenario, needed)
    theirs = prepare(reference, scenario, needed, check_model=False)
    varying = [c for c in VARIANT_COLUMNS if c in theirs and theirs[c].nunique() > 1]
    theirs[CONFIG] = theirs[CONFIG] + variant_suffix(theirs, varying)
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
        series_chart(
            data,
            x=(x, x_title),
            y=("throughput", THROUGHPUT_TITLE),
            title=alt.TitleParams(panel, fontSize=12),
            order=x,
            color=config_color(data, configurations),
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


@run_chart(RunChart.PUBLISHED_OFFLINE, empty=lambda inputs: no_points(inputs, "offline"))
def published_offline(inputs: ChartInputs) -> alt.TopLevelMixin:
    """The run's offline points and the published ones (:func:`published_chart`)."""
    return _published(inputs, "offline")


@run_chart(RunChart.PUBLISHED_ONLINE, empty=lambda inputs: no_points(inputs, "online"))
def published_online(inputs: ChartInputs) -> alt.TopLevelMixin:
    """The run's online points and the published ones (:func:`published_chart`)."""
    return _published(inputs, "online")


def _published(inputs: ChartInputs, scenario: str) -> alt.TopLevelMixin:
    return published_chart(
        inputs.rows(scenario),
        inputs.published,
        inputs.reference,
        scenario,
        inputs.no_published_reason,
    )


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
            data[column] = said(data[column], True)
    data[UNSTABLE] = unstable_flags(points)
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
    error = error_bars(
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
    layers += unstable_marks(data, x, y, series="variant")
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
    return layered(layers, data, title).interactive()


check_run_charts()
