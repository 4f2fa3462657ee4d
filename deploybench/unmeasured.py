"""Which of a table's columns no row measured, and the one line under the table that says why.

A report table (``report.results_table``) leaves out a column that holds no value in any of its
rows (every cell empty, or a "not measured: <why>" text): on the CPU default the energy meter's
and Triton's energy columns would say "not measured" in every row. Why is the rows' status
column of the column's source (``energy_status``, ``triton_energy_status``: "not measured:
<why>"), or, for a column without one, :data:`NO_STATUS`. A column some row measured stays, its
other cells as the table writes them.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Mapping
from typing import Any

import pandas as pd

from .columns import PERF_COLUMNS, Column

NOT_MEASURED = "not measured"
# Why a column without a status column of its own holds no value.
NO_STATUS = "not measured on this device"
# A source's status column: the meter's name, or "not measured: <why>".
STATUS_SUFFIX = "_status"


def status_columns(columns: Iterable[Column] = PERF_COLUMNS) -> dict[str, str]:
    """Column → the column that says why its cells are empty: the ``*_status`` column of the
    same source (the energy meter's ``energy_status``, Triton's ``triton_energy_status``)."""
    columns = list(columns)
    statuses = {c.source: c.name for c in columns if c.source and c.name.endswith(STATUS_SUFFIX)}
    return {
        c.name: statuses[c.source]
        for c in columns
        if c.source in statuses and c.name != statuses[c.source]
    }


STATUS_COLUMNS: dict[str, str] = status_columns()


def unmeasured(value: Any) -> bool:
    """A cell that holds no measured value: None, NaN, a blank text or "not measured: …"."""
    if isinstance(value, str):
        return not value.strip() or value.strip().startswith(NOT_MEASURED)
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return math.isnan(float(value))
    return value is None or value is pd.NA or value is pd.NaT


def measured_columns(
    frame: pd.DataFrame,
    columns: Mapping[str, str],
    keep: Iterable[str] = (),
    statuses: Mapping[str, str] = STATUS_COLUMNS,
) -> tuple[dict[str, str], str | None]:
    """The table's ``columns`` (column → heading) that some row of ``frame`` measured, and the
    line that names the others and why no row measured them (None: every column was). Columns
    ``frame`` lacks are left out without a word (a CSV from before them); those in ``keep``
    (the point's key, the values always measured) stay whatever they hold; a table without rows
    keeps them all."""
    present = {k: v for k, v in columns.items() if k in frame.columns}
    if frame.empty:
        return present, None
    kept: dict[str, str] = {}
    left_out: dict[tuple[str, ...], list[str]] = {}  # why → the headings of the columns
    for column, heading in present.items():
        if column in keep or not frame[column].map(unmeasured).all():
            kept[column] = heading
        else:
            left_out.setdefault(_why(frame, column, statuses), []).append(heading)
    if not left_out:
        return kept, None
    said = "; ".join(
        f"{', '.join(headings)} ({'; '.join(why)})" for why, headings in left_out.items()
    )
    return kept, f"Not shown, as no point here measured them: {said}."


def _why(frame: pd.DataFrame, column: str, statuses: Mapping[str, str]) -> tuple[str, ...]:
    """Why no row of ``frame`` has a value of ``column``: the distinct "not measured: …" texts
    of its cells or of its status column's, in order."""
    cells = [str(v).strip() for v in frame[column] if isinstance(v, str) and v.strip()]
    status = statuses.get(column)
    if not cells and status is not None and status in frame.columns:
        cells = [_reason(v, status) for v in frame[status]]
    return tuple(dict.fromkeys(cells)) or (NO_STATUS,)


def _reason(value: Any, status: str) -> str:
    """A row's status as why it has no value: "not measured: <why>" as it is; a meter's name
    (it measured, but not this value), or nothing, said so."""
    text = value.strip() if isinstance(value, str) else "" if unmeasured(value) else str(value)
    if not text:
        return f"{NOT_MEASURED}: no {status} recorded"
    if text.startswith(NOT_MEASURED):
        return text
    return f"{NOT_MEASURED}: {text} recorded no value"
