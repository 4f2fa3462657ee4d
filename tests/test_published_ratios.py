"""The published table as the report's oracle: every row of config/reference/published.csv is
reproduced by a run whose plan measures that row's point, and the report gives it a ratio.

Generated from the table, never a hand list. Each run's measured CSV is synthesized from its
plan's points (made-up figures in the perf CSV's columns), and joined with the published rows the
report matches to it (``report.published_rows``, ``report.ratios``: what the report page and its
charts use). A row without a ratio fails the test by its source page and values.
"""

from __future__ import annotations

from collections import defaultdict

import pandas as pd
import pytest

from deploybench.compare import POINT
from deploybench.config import reference_run
from deploybench.plan import plan_run
from deploybench.report import published_rows, ratios
from tests.conftest import REPO, base_config, validated

TABLE = pd.read_csv(REPO / "config" / "reference" / "published.csv")
CONFIG = validated(base_config())


def runs_of_rows() -> dict[str, list[int]]:
    """Run path → the published rows (by index) it reproduces."""
    runs: dict[str, list[int]] = defaultdict(list)
    for index, row in TABLE.iterrows():
        runs[reference_run(CONFIG, row.to_dict()).path].append(int(index))
    return dict(runs)


RUNS = runs_of_rows()


def synthesized(run_path: str) -> pd.DataFrame:
    """The run's offline and online points as its perf CSVs hold them, made-up figures."""
    plan = plan_run(CONFIG, *run_path.split("/"))
    rows = [
        {"scenario": scenario, "batch": int(p["batch"]), "concurrency": int(p["concurrency"]),
         "throughput": 100.0 + i, "p99_latency_ms": 10.0 + i, "trials": 1}
        for scenario, points in plan.points.items()
        for i, p in enumerate(points)
    ]  # fmt: skip
    return pd.DataFrame(rows)


def describe(index: int) -> str:
    row = TABLE.loc[index]
    return (
        f"{row['source']}: {row['model']} {row['gpu']} {row['format']} {row['precision']} "
        f"{row['scenario']} batch {row['batch']} concurrency {row['concurrency']}"
    )


def test_every_published_row_has_a_run():
    assert sum(len(rows) for rows in RUNS.values()) == len(TABLE) == 1078


@pytest.mark.parametrize("run_path", sorted(RUNS))
def test_every_published_row_of_a_run_gets_a_ratio(run_path):
    matched = published_rows(CONFIG, TABLE, run_path)
    assert sorted(matched.index) == sorted(RUNS[run_path])
    compared = ratios(synthesized(run_path), matched)
    keys = {tuple(k) for k in compared[POINT].itertuples(index=False, name=None)}
    without = [
        describe(int(i))
        for i, point in matched[POINT].iterrows()
        if (point["scenario"], point["batch"], point["concurrency"]) not in keys
    ]
    assert not without, f"{len(without)} published rows without a ratio: {without[:5]}"
    assert compared["throughput_ratio"].notna().all() and len(compared) == len(matched)
