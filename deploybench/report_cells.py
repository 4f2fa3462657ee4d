"""Cells and tables of the report's pages: a Markdown table whose values show their 95 %
interval in the same cell ("123.4 ± 5.6"), and how a CSV cell reads (a number, a gap, a flag, a
whole number). Shared by the page's sections (deploybench.report, report_published,
report_search).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from typing import Any

import pandas as pd

from .columns import INTERVAL_COLUMNS
from .compare import format_interval


def markdown_table(
    frame: pd.DataFrame,
    columns: Mapping[str, str],
    intervals: Mapping[str, str] = INTERVAL_COLUMNS,
) -> str:
    """``frame``'s ``columns`` (column → heading) as a Markdown table; a column with an
    interval column in ``intervals`` (value → half-width) shows both in its cells: "x ± h"."""
    present = {k: v for k, v in columns.items() if k in frame.columns}
    lines = [
        "| " + " | ".join(present.values()) + " |",
        "|" + "---|" * len(present),
    ]
    for _, row in frame.iterrows():
        cells = []
        for k in present:
            half = intervals.get(k)
            if half in frame.columns and is_number(row[k]):
                cells.append(format_interval(float(row[k]), as_float(row[half])))
            else:
                cells.append(cell_text(row[k]))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def as_float(value: Any) -> float:
    return float(value) if is_number(value) else float("nan")


def cell_text(value: Any) -> str:
    if isinstance(value, float):
        if pd.isna(value):
            return ""
        # a count (requests) in full, not as 1.5e+04
        return str(int(value)) if value.is_integer() and abs(value) >= 1e4 else f"{value:.4g}"
    return str(value)


def integer_text(value: Any) -> str:
    """``4``, ``4.0`` or ``"4"`` as "4"; a missing value as ""; anything else as it is."""
    if is_missing(value):
        return ""
    number = pd.to_numeric(value, errors="coerce")
    if is_number(number) and float(number).is_integer():
        return str(int(number))
    return str(value)


def is_missing(value: Any) -> bool:
    """None, NaN or a blank string (an empty CSV cell)."""
    if isinstance(value, str):
        return not value.strip()
    return value is None or (is_number(value) and math.isnan(float(value)))


def is_true(value: Any) -> bool:
    """A flag from a CSV: a bool, or "True" when its column also has gaps."""
    if isinstance(value, str):
        return value.strip().lower() == "true"
    return not is_missing(value) and bool(value)
