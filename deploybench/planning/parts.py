"""A scenario measured in parts (deploybench.planning.schedule) becomes the scenario's own files: the
rows of its CSVs in the parts' order, and one provenance record that keeps each part's.

Standard library only: the merge runs where Snakemake runs (a login node's driver venv).
"""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..io import sha256_of, write_csv, write_json


def read_rows(path: str | Path) -> tuple[list[str], list[dict[str, str]]]:
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        return list(reader.fieldnames or []), list(reader)


def concatenate(parts: Sequence[str | Path], merged: str | Path) -> None:
    """The parts' rows, in order, under their one header (parts with another header fail)."""
    columns: list[str] | None = None
    rows: list[dict[str, str]] = []
    for part in parts:
        header, part_rows = read_rows(part)
        if columns is not None and header != columns:
            raise ConfigError(f"{part}: columns {header} differ from the first part's {columns}")
        columns = header
        rows += part_rows
    if columns is None:
        raise ConfigError(f"{merged}: no parts to merge")
    write_csv(merged, rows, columns)


def merge_provenance(parts: Sequence[str | Path], csv_path: str | Path) -> dict[str, Any]:
    """The first part's record for the merged CSV (its points: all the parts'), with every
    part's record under ``parts`` (each part ran as a job of its own, maybe on another node)."""
    records = [json.loads(Path(p).read_text()) for p in parts]
    merged = dict(records[0])
    merged["config"] = {
        **records[0]["config"],
        "points": [point for r in records for point in r["config"]["points"]],
    }
    merged["result"] = str(csv_path)
    merged["sha256"] = sha256_of(csv_path)
    merged["parts"] = records
    return merged


def merge(
    *,
    part_csvs: Sequence[str],
    part_trials: Sequence[str],
    part_provenances: Sequence[str],
    csv: str,
    trials: str,
    provenance: str,
) -> None:
    concatenate(part_trials, trials)
    concatenate(part_csvs, csv)
    write_json(provenance, merge_provenance(part_provenances, csv))
