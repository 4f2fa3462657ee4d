"""The charts' names, which name their files too: defined once for the rules (which files a run
and a report page have) and the jobs (which chart each file holds). A leaf module, light enough
for the Snakefile to import at DAG time.
"""

from __future__ import annotations

from enum import Enum


class RunChart(str, Enum):  # not StrEnum (3.11): jobs run on the V100 images' Python 3.10
    """One run's charts (``<run>/plots/<name>.{svg,png,html}``), each drawn by the function
    registered for it in ``deploybench.plots`` (``@run_chart``; checked when it is imported)."""

    OFFLINE_THROUGHPUT = "offline_throughput"
    OFFLINE_LATENCY = "offline_latency"
    ONLINE_LATENCY_BREAKDOWN = "online_latency_breakdown"
    ONLINE_THROUGHPUT_LATENCY = "online_throughput_latency"
    PUBLISHED_OFFLINE = "published_offline"
    PUBLISHED_ONLINE = "published_online"
    # Both scenarios: throughput against joules per inference (the energy meter's), or why not.
    ENERGY_THROUGHPUT = "energy_throughput"

    def __str__(self) -> str:  # as StrEnum's: the value
        return self.value


# As plain strings: they travel in rule params and file patterns.
RUN_CHARTS: tuple[str, ...] = tuple(chart.value for chart in RunChart)


def comparison_chart(scenario: str) -> str:
    """A report page's chart of one model across its runs in ``scenario`` (``plots.comparison``);
    ``scenario`` may be a ``{scenario}`` wildcard."""
    return f"comparison_{scenario}"
