"""What a long job says as it goes, on the terminal where ``snakemake`` runs and in its log.

A measurement job says one line as each trial of each point finishes (the trial's throughput and
p99 latency, and the time left in the job, estimated from the trials done so far); export,
conversion and accuracy say one line per phase. The lines go to the ``deploybench.progress``
logger: :func:`deploybench.jobs.setup_logging` sends it to the job's log with everything else,
and to stderr too, which Snakemake's ``script:`` jobs inherit from the ``snakemake`` that runs
them. Nothing here runs during a measurement: a line is written between two trials.

A leaf module: the standard library only.
"""

from __future__ import annotations

import logging
import math
import sys
from dataclasses import dataclass

PROGRESS = logging.getLogger("deploybench.progress")
TERMINAL_FORMAT = "%(asctime)s deploybench: %(message)s"
TERMINAL_DATE = "%H:%M:%S"


def say(message: str, *args: object) -> None:
    """One line of progress (``%``-style arguments, as ``logging``)."""
    PROGRESS.info(message, *args)


def terminal_handler() -> logging.Handler:
    """The handler that shows progress lines on stderr (the terminal of ``snakemake``)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(TERMINAL_FORMAT, TERMINAL_DATE))
    return handler


def count(n: int, noun: str) -> str:
    """``n`` and the noun, plural unless one: "1 point", "3 trials"."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def format_duration(seconds: float) -> str:
    """A duration rounded to whole seconds: "40 s", "2 min 10 s", "1 h 5 min"."""
    hours, rest = divmod(round(max(seconds, 0.0)), 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours} h {minutes} min"
    if minutes:
        return f"{minutes} min {secs} s"
    return f"{secs} s"


def format_left(seconds: float) -> str:
    """An estimate of the time left: "~40 s left", "~2 min 10 s left", "~1 h 5 min left";
    "nothing left" under half a second."""
    if math.isnan(seconds):
        return "time left not known"
    if round(seconds) <= 0:
        return "nothing left"
    return f"~{format_duration(seconds)} left"


@dataclass(frozen=True)
class TrialDone:
    """One trial of one point, just measured, and where the job stands."""

    batch: int
    concurrency: int
    trial: int  # this point's trial k ...
    trials: int  # ... of n
    done: int  # trials measured so far in the job, over all points
    total: int  # trials the job measures (less those an earlier attempt kept)
    throughput: float | None  # inferences a second
    p99_latency_ms: float | None
    spent_s: float  # the trials done so far took this long, together

    @property
    def left_s(self) -> float:
        """The time left: the mean duration of the trials done times the trials left."""
        if self.done <= 0:
            return math.nan
        return self.spent_s / self.done * (self.total - self.done)


def _number(value: float | None, digits: int) -> str:
    if value is None or math.isnan(value):
        return "?"
    return f"{value:.{digits}f}"


def trial_line(label: str, done: TrialDone) -> str:
    """The line a finished trial says, e.g. "offline tft/cpu/onnx/fp32 batch 4 concurrency 1:
    trial 2 of 3, 1843.2 infer/s, p99 2.31 ms; ~18 s left (5 of 9 trials done)"."""
    return (
        f"{label} batch {done.batch} concurrency {done.concurrency}: "
        f"trial {done.trial} of {done.trials}, {_number(done.throughput, 1)} infer/s, "
        f"p99 {_number(done.p99_latency_ms, 2)} ms; {format_left(done.left_s)} "
        f"({done.done} of {done.total} trials done)"
    )
