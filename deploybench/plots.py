"""Altair charts of the perf CSVs, drawn like the graphs on NVIDIA's "Deploying on Triton" pages.

Offline (static batching): throughput and latency quantiles vs batch size. Online (dynamic
batching): the stacked latency breakdown and throughput vs p99 latency over the concurrency sweep.
Every chart draws one series per *configuration* ("gpu/format/precision"), so runs concatenated
from several formats, precisions or GPUs compare on one chart. ``save`` writes SVG and PNG (via
vl-convert, no browser needed) and an interactive, self-contained HTML page.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import altair as alt
import pandas as pd

from .columns import chart_labels
from .io import atomic_path

CONFIG_FIELDS = ("gpu", "format", "precision")
CONFIG = "configuration"
SOURCE = "source"

THROUGHPUT_TITLE = "Throughput [infer/sec]"
LATENCY_TITLE = "Latency [ms]"
BATCH_TITLE = "Batch size"
CONCURRENCY_TITLE = "Concurrent client requests"

# Latency quantiles of the offline graphs, drawn as one dash style each.
QUANTILES = chart_labels("quantile")
# The online breakdown's components, bottom of the stack first, as in the seed pages' tables.
COMPONENTS = chart_labels("component")
SCENARIO_X = {"offline": "batch", "online": "concurrency"}


def offline_throughput(rows: pd.DataFrame) -> alt.Chart:
    """Throughput vs batch size, one line per configuration."""
    data = _prepare(rows, "offline", ["batch", "throughput"])
    return _series_chart(
        data,
        x=("batch", BATCH_TITLE),
        y=("throughput", THROUGHPUT_TITLE),
        title="Throughput vs Batch Size",
        order="batch",
    )


def offline_latency(rows: pd.DataFrame) -> alt.Chart:
    """Latency quantiles vs batch size: color = configuration, dash = quantile.

    The quantile columns are renamed to their short labels and folded in the spec, so a missing
    (NaN) quantile leaves a gap in its own line only.
    """
    data = _prepare(rows, "offline", ["batch"], optional=list(QUANTILES))
    data = data.rename(columns=QUANTILES)
    labels = list(QUANTILES.values())
    return (
        alt.Chart(data, title=_title("Latency vs Batch Size", data))
        .transform_fold(list[str | alt.FieldName](labels), as_=["quantile", "latency_ms"])
        .mark_line(point=True)
        .encode(
            x=alt.X("batch:Q", title=BATCH_TITLE),
            y=alt.Y("latency_ms:Q", title=LATENCY_TITLE),
            color=_color(data),
            strokeDash=alt.StrokeDash(
                "quantile:N", title="Quantile", sort=labels, legend=alt.Legend(symbolType="stroke")
            ),
            order=alt.Order("batch:Q"),
            tooltip=[
                alt.Tooltip(f"{CONFIG}:N"),
                alt.Tooltip("batch:Q"),
                alt.Tooltip("quantile:N"),
                alt.Tooltip("latency_ms:Q", title=LATENCY_TITLE),
            ],
        )
        .interactive()
    )


def online_latency_breakdown(rows: pd.DataFrame) -> alt.Chart:
    """Stacked latency components per concurrency; one column per configuration when several."""
    data = _prepare(rows, "online", ["concurrency"], optional=list(COMPONENTS))
    labels = list(COMPONENTS.values())
    long = data.melt(
        id_vars=[CONFIG, "concurrency"],
        value_vars=list(COMPONENTS),
        var_name="component_column",
        value_name="latency_ms",
    ).dropna(subset=["latency_ms"])
    long["component"] = long["component_column"].map(COMPONENTS)
    long["component_order"] = long["component_column"].map(
        {column: i for i, column in enumerate(COMPONENTS)}
    )
    long = long.drop(columns="component_column")
    encoding: dict[str, object] = {
        # A short title: with one column per configuration the cells are narrow.
        "x": alt.X("concurrency:O", title="Concurrency", axis=alt.Axis(labelAngle=0)),
        "y": alt.Y("latency_ms:Q", title=LATENCY_TITLE, stack="zero"),
        "color": alt.Color(
            "component:N",
            title="Component",
            sort=labels,
            scale=alt.Scale(domain=labels),
        ),
        "order": alt.Order("component_order:Q", sort="ascending"),
        "tooltip": [
            alt.Tooltip(f"{CONFIG}:N"),
            alt.Tooltip("concurrency:O"),
            alt.Tooltip("component:N"),
            alt.Tooltip("latency_ms:Q", title=LATENCY_TITLE),
        ],
    }
    if data[CONFIG].nunique() > 1:
        encoding["column"] = alt.Column(f"{CONFIG}:N", title="Configuration")
    return (
        alt.Chart(long, title=_title("Latency breakdown vs Concurrency", data))
        .mark_bar()
        .encode(**encoding)
    )


def online_throughput_latency(rows: pd.DataFrame) -> alt.Chart:
    """Throughput vs p99 latency, one line per configuration following the concurrency sweep."""
    data = _prepare(rows, "online", ["concurrency", "throughput", "p99_latency_ms"])
    return _series_chart(
        data,
        x=("p99_latency_ms", "p99 " + LATENCY_TITLE),
        y=("throughput", THROUGHPUT_TITLE),
        title="Throughput vs Latency",
        order="concurrency",
    )


def comparison(rows: pd.DataFrame, scenario: str) -> alt.Chart:
    """One model across formats, precisions and GPUs: the scenario's throughput chart."""
    charts = {"offline": offline_throughput, "online": online_throughput_latency}
    if scenario not in charts:
        raise ValueError(f"unknown scenario {scenario!r}; valid: {sorted(charts)}")
    return charts[scenario](rows)


def published_overlay(measured: pd.DataFrame, published: pd.DataFrame, scenario: str) -> alt.Chart:
    """Measured and published throughput on one chart (vs batch offline, vs concurrency online).

    Color is the configuration, point shape and line dash the source. Published rows of other
    models or scenarios, or lacking the x value or the throughput, are dropped; which published
    GPUs/formats/precisions to show is the caller's choice. Published tables sometimes list one
    configuration twice (another accelerator or dataset); those stay separate lines.
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
    variant = pd.Series("", index=theirs.index, dtype=str)
    for column in ("accelerator", "dataset", "sequence_length"):
        if column in theirs:
            variant += theirs[column].map(_label)
    theirs = theirs.assign(
        **{SOURCE: "published", "series": "published " + theirs[CONFIG] + variant}
    )
    data = pd.concat([ours, theirs], ignore_index=True)
    x_title = BATCH_TITLE if scenario == "offline" else CONCURRENCY_TITLE
    x_name = "Batch Size" if scenario == "offline" else "Concurrency"
    sources = ["measured", "published"]
    return (
        alt.Chart(data, title=_title(f"Throughput vs {x_name}: measured and published", ours))
        .mark_line(point=True)
        .encode(
            x=alt.X(f"{x}:Q", title=x_title),
            y=alt.Y("throughput:Q", title=THROUGHPUT_TITLE),
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
            ],
        )
        .interactive()
    )


def save(chart: alt.TopLevelMixin, stem: Path, inline_html: bool = True) -> list[Path]:
    """Write ``stem.svg``, ``stem.png`` and ``stem.html``; return their paths.

    The HTML page embeds the Vega JavaScript (~0.9 MB) unless ``inline_html`` is false, when it
    loads it from a CDN instead (a few kB, but needs the network to display).
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

    Only the columns a chart uses travel into its spec (the HTML page carries the data).
    """
    missing = [c for c in (*CONFIG_FIELDS, *needed, *optional) if c not in rows.columns]
    if missing:
        raise ValueError(f"perf rows lack columns {missing}; have {sorted(map(str, rows.columns))}")
    data = rows
    if "scenario" in data.columns:
        data = data[data["scenario"] == scenario]
    keep = [c for c in ("model", *CONFIG_FIELDS) if c in data.columns]
    keep += [c for c in (*needed, *optional) if c not in keep]
    keep += [c for c in ("accelerator", "dataset", "sequence_length") if c in data.columns]
    data = data[keep].copy()
    for column in (*needed, *optional):
        data[column] = pd.to_numeric(data[column], errors="coerce")
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


def _series_chart(
    data: pd.DataFrame, x: tuple[str, str], y: tuple[str, str], title: str, order: str
) -> alt.Chart:
    """Line + points, one series per configuration, joined in ``order``; x, y: (field, title)."""
    fields = dict.fromkeys([CONFIG, order, x[0], y[0]])
    return (
        alt.Chart(data, title=_title(title, data))
        .mark_line(point=True)
        .encode(
            x=alt.X(f"{x[0]}:Q", title=x[1]),
            y=alt.Y(f"{y[0]}:Q", title=y[1]),
            color=_color(data),
            order=alt.Order(f"{order}:Q"),
            tooltip=[f"{f}:N" if f == CONFIG else f"{f}:Q" for f in fields],
        )
        .interactive()
    )


def _color(data: pd.DataFrame) -> alt.Color:
    configurations = sorted(data[CONFIG].unique())
    # The default palette repeats after 10 colors; the published overlays can hold more.
    return alt.Color(
        f"{CONFIG}:N",
        title="Configuration",
        sort=configurations,
        scale=alt.Scale(scheme="tableau10" if len(configurations) <= 10 else "tableau20"),
    )


def _label(value: object) -> str:
    """A published variant's value as a label suffix: nothing when empty, 128 not 128.0."""
    if pd.isna(value):
        return ""
    return f" {value:g}" if isinstance(value, float) else f" {value}"


def _title(text: str, data: pd.DataFrame) -> alt.TitleParams:
    models = sorted(data["model"].unique()) if "model" in data.columns else []
    return alt.TitleParams(text, subtitle=", ".join(map(str, models)) or alt.Undefined)
