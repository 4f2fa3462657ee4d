"""The trials a measurement finished, kept when it is stopped partway.

A measurement job writes its CSVs only at its end, whole (deploybench.io). A job stopped before
then (SLURM's time limit, preemption, the GPU kit's share of its call: SIGTERM) would lose
every trial it had measured. So the job appends each finished trial, every request's latency
included, to a partial file beside its CSV (``online.csv`` → ``online.partial.jsonl``), never
to the CSV itself. Run again, the job reads the trials kept there and measures only the ones
missing; once it has written its CSVs it removes the file. A trial is kept only for the same
measurement: the same job spec (less its points, so that a point added or dropped keeps the
others) on the same model repository (its files' sizes and times, less the engine caches a
server writes into it). Anything else starts afresh, and the log says why.

Lines of JSON, one record each: a ``header`` (the format, the fingerprint, the scenario and
points planned), an ``attempt`` (its number, when it started, the host and the server that
measured), and a ``trial`` (the attempt that measured it and the trial's row). A line cut by a
stop is skipped on reading. ``deploybench summary`` and the GPU kit read the file to show a
stopped scenario's finished points, marked partial (:func:`finished_points`).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger("deploybench")

SUFFIX = ".partial.jsonl"
FORMAT = "deploybench partial measurement 1"


def partial_path(csv: Path | str) -> Path:
    """Where the measurement writing ``csv`` keeps its finished trials."""
    csv = Path(csv)
    return csv.with_name(csv.stem + SUFFIX)


def fingerprint(spec: Mapping[str, Any], repository: Path | str) -> str:
    """What a kept trial must have been measured with: the job's spec less its points, and
    the model repository's files (name, size, modification time) less what a server writes
    into it while it loads (engine caches, the python backend's bytecode cache)."""
    from .io import content_files
    from .model_repository import engine_caches

    repository = Path(repository)
    caches = [c.resolve() for c in engine_caches(repository)]
    files = []
    for path in content_files(repository):
        if any(path.resolve().is_relative_to(cache) for cache in caches):
            continue
        stat = path.stat()
        files.append([str(path.relative_to(repository)), stat.st_size, stat.st_mtime_ns])
    measured = {k: v for k, v in spec.items() if k != "points"}
    text = json.dumps({"spec": measured, "repository": files}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def point_key(row: Mapping[str, Any]) -> tuple[int, int]:
    return int(row["batch"]), int(row["concurrency"])


@dataclass
class Kept:
    """What a partial file holds: its header, the attempts that wrote it and their trials
    (each row with its ``trial`` and ``attempt``)."""

    header: dict[str, Any] = field(default_factory=dict)
    attempts: list[dict[str, Any]] = field(default_factory=list)
    trials: list[dict[str, Any]] = field(default_factory=list)


def read(path: Path | str) -> Kept:
    """The records of the partial file at ``path`` (empty when there is none); a line cut
    short by a stop, or not a record, is skipped."""
    kept = Kept()
    path = Path(path)
    if not path.is_file():
        return kept
    with path.open() as f:
        for number, line in enumerate(f, 1):
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                log.warning("%s:%d: not a whole record (cut by a stop?): skipped", path, number)
                continue
            kind = record.get("kind") if isinstance(record, dict) else None
            if kind == "header" and not kept.header:
                kept.header = record
            elif kind == "attempt":
                kept.attempts.append(record)
            elif kind == "trial":
                kept.trials.append({**record["row"], "attempt": record["attempt"]})
    return kept


def finished_points(kept: Kept) -> list[list[dict[str, Any]]]:
    """Each point whose trials (the header's count) are all kept, its trials in order; points
    in the order they were first measured."""
    wanted = int(kept.header.get("trials", 1))
    by_point: dict[tuple[int, int], dict[int, dict[str, Any]]] = {}
    for row in kept.trials:
        by_point.setdefault(point_key(row), {})[int(row["trial"])] = row
    return [
        [rows[t] for t in range(1, wanted + 1)]
        for rows in by_point.values()
        if all(t in rows for t in range(1, wanted + 1))
    ]


def finished_rows(kept: Kept) -> list[dict[str, Any]]:
    """The finished points' rows, as the scenario's CSV would have them (perf.summarize over
    their kept trials, the header's ``max_ci_pct``); a point with a trial missing has none."""
    from .perf import summarize  # NumPy: only where a partial file is read

    trials = [row for point in finished_points(kept) for row in point]
    return summarize(trials, float(kept.header.get("max_ci_pct", 10.0))) if trials else []


def planned_points(kept: Kept) -> int:
    """How many points the stopped measurement planned (its header's)."""
    return len(kept.header.get("points") or [])


class PartialMeasurement:
    """The partial file of one measurement job: the trials an earlier attempt of the same
    measurement kept, and this attempt's trials appended as they finish. Nothing is written
    before this attempt's first trial is done: a job stopped in its first trial leaves no
    file."""

    def __init__(
        self,
        path: Path | str,
        print_: str,
        scenario: str,
        trials: int,
        max_ci_pct: float = 10.0,
    ) -> None:
        self.path = Path(path)
        self.fingerprint = print_
        self.scenario = scenario
        self.trials = trials
        self.max_ci_pct = max_ci_pct
        self.attempt = 1
        self._header: dict[str, Any] | None = None  # to write first: the file is another's
        self._attempt: dict[str, Any] = {}  # this attempt's record, written with its 1st trial
        self._begun = False

    def open(
        self, points: Sequence[Mapping[str, Any]], about: Mapping[str, Any]
    ) -> list[dict[str, Any]]:
        """Start this attempt (``about``: the host, the server) and return the trials kept
        for ``points`` by earlier attempts of the same measurement (each with its
        ``attempt``); a file of another measurement is replaced once a trial is done."""
        previous = read(self.path)
        planned = {point_key(p) for p in points}
        kept: list[dict[str, Any]] = []
        if previous.header.get("fingerprint") == self.fingerprint:
            kept = [
                row
                for row in previous.trials
                if point_key(row) in planned and 1 <= int(row["trial"]) <= self.trials
            ]
            self.attempt = 1 + max((int(a["attempt"]) for a in previous.attempts), default=0)
        else:
            if previous.header:
                log.warning(
                    "%s was kept by another measurement (its spec or repository changed): "
                    "measuring afresh",
                    self.path,
                )
            self._header = {
                "kind": "header",
                "format": FORMAT,
                "fingerprint": self.fingerprint,
                "scenario": self.scenario,
                "trials": self.trials,
                "max_ci_pct": self.max_ci_pct,
                "points": [dict(p) for p in points],
            }
        started = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
        self._attempt = {"kind": "attempt", "attempt": self.attempt, "started": started, **about}
        return kept

    def add(self, row: Mapping[str, Any]) -> None:
        """Keep a finished trial (its row holds its ``trial`` number)."""
        if not self._begun:
            if self._header is not None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                tmp = self.path.with_name(f".{self.path.name}.tmp")
                tmp.write_text(json.dumps(self._header, sort_keys=True) + "\n")
                tmp.replace(self.path)
            self._append(self._attempt)
            self._begun = True
        self._append({"kind": "trial", "attempt": self.attempt, "row": dict(row)})

    def attempts(self) -> list[dict[str, Any]]:
        """Every attempt's record, this one's included, each with the trials it measured
        (``[batch, concurrency, trial]``) among those kept."""
        kept = read(self.path) if self._header is None or self._begun else Kept()
        records = kept.attempts if self._begun else [*kept.attempts, self._attempt]
        measured: dict[int, list[list[int]]] = {}
        for row in kept.trials:
            measured.setdefault(int(row["attempt"]), []).append([*point_key(row), row["trial"]])
        return [
            {k: v for k, v in a.items() if k != "kind"} | {"trials": measured.get(a["attempt"], [])}
            for a in records
        ]

    def remove(self) -> None:
        """The measurement's CSVs are written: nothing is left to resume."""
        self.path.unlink(missing_ok=True)

    def _append(self, record: Mapping[str, Any]) -> None:
        # one write of one line, flushed to disk: a stop between two trials loses neither,
        # and a line cut by a kill is skipped on reading
        line = json.dumps(record, sort_keys=True, default=_plain) + "\n"
        with self.path.open("a") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())


def _plain(value: Any) -> Any:
    """NumPy scalars and other number-likes a trial row may hold, as JSON numbers."""
    if hasattr(value, "item"):
        return value.item()
    return str(value)
