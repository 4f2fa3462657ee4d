"""The jobs that draw: one run's charts and one model's report page."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..io import write_text

if TYPE_CHECKING:
    import pandas as pd

    from ..planning.job_specs import (
        PlotsSpec,
        ReportSpec,
    )
    from ..plots import ChartInputs

log = logging.getLogger("deploybench")


def chart_inputs(
    config: dict[str, Any],
    published: pd.DataFrame,
    run_path: str,
    offline: pd.DataFrame,
    online: pd.DataFrame,
) -> ChartInputs:
    """What a run's charts are drawn from (``published``: the published table): the plots job
    draws them, the report job asks which have nothing to draw (``plots.not_drawn``)."""
    from .. import plots as charts
    from ..report_published import no_published_reason, published_rows, reference_rows

    return charts.ChartInputs(
        offline=offline,
        online=online,
        published=published_rows(config, published, run_path),
        # Nothing published for the run (a CPU run): the seed page's GPU rows beside it instead.
        reference=reference_rows(config, published, run_path),
        no_published_reason=no_published_reason(config, run_path),
    )


def plots(
    spec: PlotsSpec, *, offline: str, online: str, published: str, config: dict[str, Any]
) -> None:
    """The charts of one run: ``spec["stems"]`` maps a chart name to its file stem; each is
    drawn by the function ``plots.run_chart`` registered for it, or where its data has nothing
    to draw (``plots.not_drawn``) its files say why."""
    import altair as alt  # the charts' (named here: the driver image must hold it)
    import pandas as pd

    from .. import plots as charts

    run_path = spec["run_path"]
    inputs = chart_inputs(
        config, pd.read_csv(published), run_path, pd.read_csv(offline), pd.read_csv(online)
    )
    skipped = charts.not_drawn(inputs)
    built: dict[str, alt.TopLevelMixin] = charts.draw_run_charts(inputs)
    width, height = spec["options"]["width"], spec["options"]["height"]
    for name, stem in spec["stems"].items():
        if name in skipped:
            charts.save_not_drawn(name, skipped[name], Path(stem), width, height)
            log.info("%s: not drawn (%s): %s", name, skipped[name], stem)
            continue
        # sized: a faceted chart (several configurations) takes the size per cell.
        charts.save(charts.sized(built[name], width, height), Path(stem))
        log.info("%s: %s", name, stem)


def report(
    spec: ReportSpec, *, published: str, markdown: str, html: str, config: dict[str, Any]
) -> None:
    """One model's page: every run's configuration, plots, tables and provenance, the
    comparison across its runs, and measured vs published per point."""
    import os

    import pandas as pd

    from .. import plots as charts
    from ..planning.run_plan import plan_run
    from ..report import between_runs_section, chart_image, read_json, render_html, run_section
    from ..report_published import (
        publication_gate,
        published_notes,
        published_rows,
        ratios,
        reference_note,
        summary_section,
    )
    from ..report_search import search_section

    model, runs, options = spec["model"], spec["runs"], spec["options"]
    reference = pd.read_csv(published)
    here = Path(markdown).parent
    sections: list[str] = []
    comparisons: dict[str, pd.DataFrame] = {}
    notes: dict[str, list[str]] = {}  # run → what its published comparison must say
    frames: dict[str, list[pd.DataFrame]] = {"offline": [], "online": []}
    measured: dict[str, pd.DataFrame] = {}  # run → its points, in the listed order
    for run in runs:
        offline, online = pd.read_csv(run["offline"]), pd.read_csv(run["online"])
        frames["offline"].append(offline)
        frames["online"].append(online)
        measured[run["path"]] = pd.concat([offline, online], ignore_index=True)
        plots = [os.path.relpath(p, here) for p in run["plots"]]
        provenance = read_json(run["provenance"])
        provenance["config"]["accelerator"] = run["accelerator"]
        conversion = run.get("conversion")
        if conversion:  # the artifact's conversion record (TF-TRT: its engines)
            provenance["conversion"] = read_json(conversion).get("conversion")
        checkpoint = run.get("checkpoint")
        if checkpoint:  # the configured checkpoint's file and sha256 (publication_gate)
            provenance["config"]["checkpoint_source"] = read_json(checkpoint).get("source")
        # the run's charts with nothing to draw: the page says why in their place
        skipped = charts.not_drawn(chart_inputs(config, reference, run["path"], offline, online))
        sections.append(run_section(run["path"], offline, online, provenance, plots, skipped))
        if run["search"]:
            search = run["search"]
            sections.append(
                search_section(
                    run["path"],
                    pd.read_csv(search["csv"]),
                    read_json(search["choice"]),
                    os.path.relpath(search["chart"], here),
                    nested=True,
                )
            )
        matched = published_rows(config, reference, run["path"])
        notes[run["path"]] = published_notes(config, reference, run["path"])
        blockers, passed = publication_gate(config, run, provenance)
        if not matched.empty and blockers:  # shown for reference, never as a ratio
            notes[run["path"]].append(
                f"Not set beside its {len(matched)} published rows: {'; '.join(blockers)}."
            )
            matched = matched.iloc[:0]
        elif not matched.empty and passed:
            notes[run["path"]].append(f"Preflight passed: {', '.join(passed)}.")
        # the run's measurement settings: how many requests DLE's runner's p99 came from
        measure = plan_run(config, *run["path"].split("/")).measure if not matched.empty else None
        comparisons[run["path"]] = ratios(measured[run["path"]], matched, measure)
        # nothing published for it (a CPU run): which rows its published charts show instead
        instead = reference_note(config, reference, run["path"])
        notes[run["path"]] += [instead] if instead else []
    comparison_plots = []
    for scenario, stem in spec["stems"].items():
        chart = charts.sized(
            charts.comparison(pd.concat(frames[scenario]), scenario),
            options["width"],
            options["height"],
        )
        charts.save(chart, Path(stem))
        comparison_plots.append(os.path.relpath(f"{stem}.png", here))
    text = "\n\n".join(
        [
            f"# {model}: Triton Inference Server performance",
            "Configurations compared: " + ", ".join(r["path"] for r in runs),
            *[chart_image(p) for p in comparison_plots],
            summary_section(comparisons, notes),
            between_runs_section(measured),
            *sections,
        ]
    )
    write_text(markdown, text + "\n")
    write_text(html, render_html(text, f"{model} performance"))
