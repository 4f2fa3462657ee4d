"""The jobs of a serving-configuration search: its settings, steps, choice and charts."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..io import write_csv, write_json, write_text

if TYPE_CHECKING:
    from ..planning.job_specs import (
        SearchSpec,
    )

log = logging.getLogger("deploybench")


def _scored(spec: SearchSpec, candidates: list[str]) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """The search's settings, and each candidate (by name) scored by its objective and as
    measured (with the energy objective, a candidate without energy measured fails here)."""
    from ..config_search import read_points, score, settings_from_spec, variant_of_csv

    settings = settings_from_spec(spec["settings"])
    device = spec["run"]["device"]
    scored, measured = {}, {}
    for path in candidates:
        variant = variant_of_csv(path, device)
        measured[variant.name] = read_points(path)
        scored[variant.name] = score(
            variant,
            measured[variant.name],
            settings.latency_budget_ms,
            settings.min_throughput,
            settings.objective,
        )
    return settings, scored, measured


def search_settings(spec: SearchSpec, *, settings: str) -> None:
    """The search's settings as a file (an input of the walk's steps and of the choice)."""
    write_json(settings, spec)


def search_step(
    spec: SearchSpec, *, previous: list[str], candidates: list[str], state: str
) -> None:
    """One step of the quick walk: replayed over every candidate measured so far, it says what
    to measure next, or that the walk is done."""
    from ..config_search import parse_variant, quick_walk

    settings, scored, _ = _scored(spec, candidates)
    walk = quick_walk(settings, parse_variant(spec["baseline"], spec["run"]["device"]), scored)
    log.info("quick walk after %s: %s", previous or "the start", walk)
    write_json(state, walk.as_dict())


def search_choice(
    spec: SearchSpec,
    *,
    candidates: list[str],
    repositories: list[str],
    walk: list[str],
    csv: str,
    points: str,
    choice: str,
    pbtxt: str,
    best: str,
) -> None:
    """The search's choice (deploybench.config_search.choose, by the settings' objective) over every
    measured candidate: search.csv, the points of the Pareto chart (both fronts marked), and
    best/ (the chosen repository, its config.pbtxt, and choice.json with the gain over the
    baseline)."""
    import shutil

    from ..config_search import (
        POINT_COLUMNS,
        SEARCH_COLUMNS,
        candidate_rows,
        choice_record,
        choose,
        point_rows,
    )
    from ..io import atomic_path

    settings, scored, measured = _scored(spec, candidates)
    run = spec["run"]
    if spec["baseline"] not in scored:
        raise ValueError(f"{run['path']}: the search measured no baseline {spec['baseline']}")
    pool = list(scored.values())
    chosen = choose(pool, settings.latency_budget_ms, settings.min_throughput, spec["baseline"])
    baseline = scored[spec["baseline"]]
    write_csv(csv, candidate_rows(pool, chosen, baseline, run), SEARCH_COLUMNS)
    write_csv(
        points,
        point_rows(measured, chosen.name, baseline.name, settings.latency_budget_ms),
        POINT_COLUMNS,
    )
    source = Path(repositories[[Path(c).parent.name for c in candidates].index(chosen.name)])
    with atomic_path(best) as tmp:
        tmp.unlink()
        shutil.copytree(source, tmp)
    write_text(pbtxt, (source / run["model"] / "config.pbtxt").read_text())
    record = choice_record(settings, chosen, baseline, run, len(pool))
    record["walk"] = _read_json(walk[0]) if walk else None
    write_json(choice, record)
    log.info("search of %s: %s", run["path"], record)


def _read_json(path: str) -> Any:
    import json

    return json.loads(Path(path).read_text())


def search_plots(spec: dict[str, Any], *, points: str, choice: str, svg: str) -> None:
    """The search's Pareto chart: throughput against p99 latency of every candidate's points."""
    import pandas as pd

    from .. import plots as charts

    budget = _read_json(choice)["latency_budget_ms"]
    chart = charts.search_pareto(pd.read_csv(points), budget)
    options = spec["options"]
    charts.save(charts.sized(chart, options["width"], options["height"]), Path(spec["stem"]))
