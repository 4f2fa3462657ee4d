"""How a run's jobs go to a cluster whose partition caps a job's time (`gpus.<gpu>.slurm.
max_runtime`, the partition's MaxTime in minutes).

Every job has a time limit (resources.runtime_minutes: sbatch --time). A measurement over many
points can alone ask for more than the partition allows, and a group job asks for the sum of
its members. So, on a GPU with a `max_runtime`:

- a scenario's points are measured in parts, each a job of its own that fits (as many points
  as fit, spread evenly over as few parts as that needs), merged into the scenario's CSVs by a
  local job (deploybench.planning.parts);
- the run's group job takes its jobs in order (convert, repository, accuracy, then the
  measurements) while their sum fits; the others are submitted alone, each within the limit.

A job that cannot fit even alone (one point longer than the limit) fails the plan, naming the
numbers. Without a `max_runtime` nothing is split: one group job per run, as before.
"""

from __future__ import annotations

import math
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from ..errors import ConfigError

# The group job of a run (its jobs share one allocation and wait in the queue once).
RUN_GROUP = "run"


def part_key(scenario: str, part: int) -> str:
    """The name of a scenario's measurement part in a run's job table (``online.1``)."""
    return f"{scenario}.{part}"


def check_fits(job: str, minutes: int, max_runtime: int | None, where: str) -> None:
    """A job that asks for more than the partition allows fails here, with the numbers."""
    if max_runtime is not None and minutes > max_runtime:
        raise ConfigError(
            f"{where}: job {job!r} asks for {minutes} min (--time), more than the partition's "
            f"max_runtime of {max_runtime} min; lower runtime.steps or runtime.per_point (or the "
            "model's points or perf.trials), or use a partition with a longer MaxTime"
        )


def split_points(
    points: int, limit_of: Callable[[int], int], max_runtime: int | None, scenario: str, where: str
) -> tuple[int, int]:
    """(parts, points per part) for a scenario of ``points`` points whose job's limit is
    ``limit_of(points in the job)``: as few parts as fit ``max_runtime``, points spread evenly."""
    if max_runtime is None or points == 0 or limit_of(points) <= max_runtime:
        return 1, points
    fit = max((n for n in range(1, points + 1) if limit_of(n) <= max_runtime), default=0)
    if not fit:
        raise ConfigError(
            f"{where}: one {scenario} point alone asks for {limit_of(1)} min (--time), more "
            f"than the partition's max_runtime of {max_runtime} min; lower runtime.per_point, "
            "runtime.margin or perf.trials, or use a partition with a longer MaxTime"
        )
    parts = math.ceil(points / fit)
    return parts, points_per_part(points, parts)


def points_per_part(points: int, parts: int) -> int:
    """The most points a part of a scenario of ``points`` points in ``parts`` parts measures."""
    return math.ceil(points / parts)


def part_slice(points: int, parts: int, part: int) -> slice:
    """The points of part ``part`` (0-based) of a scenario of ``points`` points in ``parts``."""
    per_part = points_per_part(points, parts)
    return slice(part * per_part, min(points, (part + 1) * per_part))


def pack_groups(
    jobs: Sequence[tuple[str, int]], max_runtime: int | None, where: str
) -> dict[str, str | None]:
    """Job → its group job (None: submitted alone). ``jobs``: (name, minutes) in the run's
    order. First fit: a job joins the run's group while the group's sum stays within
    ``max_runtime``; every job must fit alone."""
    groups: dict[str, str | None] = {}
    total = 0
    for job, minutes in jobs:
        check_fits(job, minutes, max_runtime, where)
        if max_runtime is None or total + minutes <= max_runtime:
            groups[job] = RUN_GROUP
            total += minutes
        else:
            groups[job] = None
    return groups


def describe(
    run: str,
    jobs: Sequence[tuple[str, int]],
    groups: Mapping[str, str | None],
    max_runtime: int | None,
) -> list[str]:
    """What a run's jobs ask a cluster for, one line per submission (the preflight logs it)."""
    limit = f"max_runtime {max_runtime} min" if max_runtime is not None else "no max_runtime"
    lines = [f"{run} ({limit}): its jobs' --time, as submitted"]
    grouped = [(job, minutes) for job, minutes in jobs if groups[job] is not None]
    for label, minutes in submissions(jobs, groups):
        if label == f"group job {RUN_GROUP}":
            terms = " + ".join(f"{job} {m}" for job, m in grouped)
            lines.append(f"  {label}: {terms} = {minutes} min")
        else:
            lines.append(f"  {label}: {minutes} min")
    return lines


def submissions(
    jobs: Sequence[tuple[str, int]], groups: Mapping[str, str | None]
) -> list[tuple[str, int]]:
    """Each submission of a run's jobs and the --time it asks for: its group job (the sum of
    its members), then each job submitted alone."""
    grouped = [minutes for job, minutes in jobs if groups[job] is not None]
    alone = [(job, minutes) for job, minutes in jobs if groups[job] is None]
    return ([(f"group job {RUN_GROUP}", sum(grouped))] if grouped else []) + alone


# --- the partition's own limit ------------------------------------------------------------

SINFO_TIMEOUT_S = 30


def parse_slurm_time(text: str) -> int | None:
    """A SLURM time limit as ``sinfo -o %l`` prints it (``[days-]hours:minutes:seconds``,
    ``minutes:seconds``, ``minutes``), in whole minutes rounded down; None for no limit
    (``infinite``, ``UNLIMITED``)."""
    text = text.strip()
    if text.lower() in ("infinite", "unlimited"):
        return None
    days, _, clock = text.rpartition("-")
    parts = [int(p) for p in clock.split(":")]
    if not parts or len(parts) > 3 or (days and not days.isdigit()):
        raise ValueError(f"not a SLURM time: {text!r}")
    if len(parts) == 3:
        hours, minutes, seconds = parts
    elif len(parts) == 2:
        hours, (minutes, seconds) = 0, parts
    else:
        hours, minutes, seconds = 0, parts[0], 0
    return int(days or 0) * 1440 + hours * 60 + minutes + seconds // 60


def partition_max_minutes(partition: str, sinfo: str = "sinfo") -> tuple[int | None, str]:
    """The MaxTime of ``partition`` (``sinfo -h -p <partition> -o %l``) in minutes (None: no
    limit, or it could not be read), and what was found."""
    try:
        out = subprocess.run(
            [sinfo, "-h", "-p", partition, "-o", "%l"],
            capture_output=True, text=True, timeout=SINFO_TIMEOUT_S, check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"could not run sinfo: {exc}"
    lines = sorted(set(out.stdout.split()))
    if out.returncode != 0 or not lines:
        why = out.stderr.strip().splitlines()[-1:] or [f"exit {out.returncode}, no partition"]
        return None, f"sinfo -p {partition} gave no MaxTime ({why[0]})"
    try:
        limits = [parse_slurm_time(line) for line in lines]
    except ValueError as exc:
        return None, f"sinfo -p {partition}: {exc}"
    finite = [limit for limit in limits if limit is not None]
    if not finite:
        return None, f"partition {partition}: MaxTime {lines[0]}"
    return min(finite), f"partition {partition}: MaxTime {lines[0]} ({min(finite)} min)"


# --- a QOS's limit --------------------------------------------------------------------------
# A job's time is capped by its partition's MaxTime and by the MaxWall of its QOS (the one it is
# submitted with, `--qos`) and of the partition's own QOS (`scontrol show partition`: QoS=):
# SLURM leaves a job over a QOS's MaxWall pending for ever (QOSMaxWallDurationPerJobLimit).
# The QOS flags that lift one of them (PartitionTimeLimit, OverPartQOS) are not read: the
# smallest applies.

SACCTMGR_TIMEOUT_S = 30


def parse_max_wall(text: str) -> int | None:
    """A QOS's MaxWall as ``sacctmgr -P`` prints it (``00:30:00``, ``1-00:00:00``; empty: none)
    in whole minutes; None for no limit."""
    return parse_slurm_time(text) if text.strip() else None


def _last_line(out: subprocess.CompletedProcess[str]) -> str:
    lines = (out.stderr.strip() or out.stdout.strip()).splitlines()
    return lines[-1] if lines else f"exit {out.returncode}"


def qos_max_minutes(qos: str, sacctmgr: str = "sacctmgr") -> tuple[int | None, str]:
    """The MaxWall of QOS ``qos`` (``sacctmgr -n -P show qos <qos> format=Name,MaxWall``, which
    asks slurmdbd) in minutes (None: no limit, or it could not be read), and what was found."""
    try:
        out = subprocess.run(
            [sacctmgr, "-n", "-P", "show", "qos", qos, "format=Name,MaxWall"],
            capture_output=True, text=True, timeout=SACCTMGR_TIMEOUT_S, check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"could not run sacctmgr: {exc} (QOS {qos}'s MaxWall not checked)"
    if out.returncode != 0:
        return None, f"sacctmgr show qos {qos} gave no MaxWall ({_last_line(out)})"
    # "short|00:30:00"; SLURM's database keeps names in lower case
    rows = [line.split("|") for line in out.stdout.splitlines() if line.strip()]
    walls = [row[1] if len(row) > 1 else "" for row in rows if row[0].lower() == qos.lower()]
    if not walls:
        return None, f"sacctmgr knows no QOS {qos} (sbatch --qos={qos} would be refused)"
    try:
        minutes = parse_max_wall(walls[0])
    except ValueError as exc:
        return None, f"sacctmgr show qos {qos}: {exc}"
    if minutes is None:
        return None, f"QOS {qos}: no MaxWall"
    return minutes, f"QOS {qos}: MaxWall {walls[0]} ({minutes} min)"


def partition_qos(partition: str, scontrol: str = "scontrol") -> tuple[str | None, str]:
    """The QOS of ``partition`` itself (``scontrol -o show partition <partition>``: QoS=; None:
    none, or it could not be read), and what was found."""
    try:
        out = subprocess.run(
            [scontrol, "-o", "show", "partition", partition],
            capture_output=True, text=True, timeout=SINFO_TIMEOUT_S, check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"could not run scontrol: {exc} (partition {partition}'s QOS not checked)"
    fields = dict(f.split("=", 1) for f in out.stdout.split() if "=" in f)
    if out.returncode != 0 or "QoS" not in fields:
        return None, f"scontrol show partition {partition} gave no QoS ({_last_line(out)})"
    if fields["QoS"] in ("", "N/A"):
        return None, f"partition {partition}: no QOS of its own"
    return fields["QoS"], f"partition {partition}: QOS {fields['QoS']}"


@dataclass(frozen=True)
class TimeLimit:
    """What caps one job's time on the cluster: its minutes, what sets them (the error's
    words) and how to get more."""

    minutes: int
    source: str
    remedy: str


def cluster_time_limits(
    gpu: str,
    partition: str | None,
    qos: str | None,
    log: Callable[[str], None],
    read: dict[tuple[str, str], tuple[object, str]],
) -> list[TimeLimit]:
    """What caps the time of a job submitted to ``partition`` with ``qos`` (either None: the
    cluster's default, not read): the partition's MaxTime (sinfo), the MaxWall of the QOS and
    of the partition's own QOS (scontrol, sacctmgr). Each is read once (``read`` keeps what was
    read) and what was found goes to ``log``; what cannot be read is no limit."""

    def once(key: tuple[str, str], reader: Callable[[], tuple[object, str]]) -> object:
        if key not in read:
            read[key] = reader()
            log(read[key][1])
        return read[key][0]

    def wall(name: str) -> int | None:
        found = once(("qos", name.lower()), lambda: qos_max_minutes(name))
        return found if isinstance(found, int) else None

    limits = []
    if partition:
        found = once(("partition", partition), lambda: partition_max_minutes(partition))
        if isinstance(found, int):
            limits.append(partition_limit(partition, found))
        # where sinfo could not read the partition (no slurmctld answering: each try waits),
        # scontrol cannot either: its QOS is not asked for
        answered = read[("partition", partition)][1].startswith(f"partition {partition}:")
        own = answered and once(("partition_qos", partition), lambda: partition_qos(partition))
        # the job's own QOS is read below
        mine = isinstance(own, str) and own.lower() == (qos or "").lower()
        if isinstance(own, str) and not mine and (minutes := wall(own)) is not None:
            limits.append(
                TimeLimit(
                    minutes,
                    f"partition {partition!r}'s own QOS {own!r} allows {minutes} min a job "
                    "(its MaxWall, read with sacctmgr)",
                    "use a partition whose QOS allows more",
                )
            )
    if qos and (minutes := wall(qos)) is not None:
        limits.append(
            TimeLimit(
                minutes,
                f"QOS {qos!r} allows {minutes} min a job (its MaxWall, read with sacctmgr)",
                f"submit with a QOS whose MaxWall is longer (gpus.{gpu}.slurm.qos or slurm.qos)",
            )
        )
    return limits


def partition_limit(partition: str, minutes: int) -> TimeLimit:
    """A partition's MaxTime as a TimeLimit."""
    return TimeLimit(
        minutes,
        f"partition {partition!r} allows {minutes} min a job (its MaxTime, read with sinfo)",
        "use a partition with a longer MaxTime",
    )


def check_time_limits(
    run: str,
    gpu: str,
    limits: Sequence[TimeLimit],
    jobs: Sequence[tuple[str, int]],
    groups: Mapping[str, str | None],
    max_runtime: int | None,
) -> None:
    """Refuse a run whose submissions ask for more time than the smallest of ``limits`` (its
    partition's MaxTime, its QOS's MaxWall) allows, naming what sets it and what to do."""
    if not limits:
        return
    limit = min(t.minutes for t in limits)
    binding = [t for t in limits if t.minutes == limit]
    over = [(label, m) for label, m in submissions(jobs, groups) if m > limit]
    if max_runtime is not None and max_runtime > limit:
        over.insert(0, (f"gpus.{gpu}.slurm.max_runtime", max_runtime))
    if over:
        asks = ", ".join(f"{label} {minutes} min" for label, minutes in over)
        raise ConfigError(
            f"{run}: {' and '.join(t.source for t in binding)}, but {asks}: set "
            f"gpus.{gpu}.slurm.max_runtime to {limit} or less (the measurements are then split "
            f"into parts that fit) or {' or '.join(t.remedy for t in binding)}"
        )
