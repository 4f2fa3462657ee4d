"""The serving-configuration search: candidates, the quick walk, and the choice.

Over 600 lines on purpose: candidates, the quick walk and the choice read one variant model.

A *variant* is one way Triton serves a run's one artifact: model instances, max batch size with
its preferred batch sizes, max queue delay and, on CPU, the runtime threads per instance. Its
name spells every setting (``i2-b1024-p512.1024-q1``, ``-t1`` on CPU), so a candidate is the
same artifact whichever search asks for it: a grid and a quick walk share what they both
measured, and adding a value to an axis leaves the measured candidates as they are. The run's
own configuration (the seed page's) is always a candidate: the *baseline*.

Each candidate is measured over one online sweep; its score is its best point among those whose
p99 latency (the trials' mean) is within the budget and whose throughput reaches the floor. The
*objective* (``search.objective``) says which point is best: ``throughput``, the most inferences/s;
``energy``, the least energy per inference (``energy_per_inference_j``: the meter's counter over
the measured windows, deploybench.telemetry), which a candidate measured without energy cannot be
scored by (:func:`score` fails, naming it and its ``energy_status``). A candidate *beats* another
when it meets the constraints and the other does not, or when both do and its objective's value
is better by more than the two 95 % intervals combined (:func:`deploybench.stats.change`). The
baseline stays unless a candidate beats it; then the choice is the simplest of the candidates
that beat it and that no other beats (:func:`choose`): no candidate that meets the budget is
significantly better than the one chosen, and its gain over the baseline is significant.
``grid`` measures every combination; ``quick`` (:func:`quick_walk`) walks one axis at a time
from the baseline to the neighbour that beats the current position, until a pass over every
axis moves nowhere. Every point is marked on two Pareto fronts (:func:`pareto_frontier`):
throughput against p99 latency, and throughput against energy per inference.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from .compare import measured
from .errors import ConfigError, SearchError
from .stats import Change, Interval, change

STRATEGIES = ("grid", "quick")
# What a candidate's best point is best at: the most throughput, or the least energy per inference.
THROUGHPUT, ENERGY = OBJECTIVES = ("throughput", "energy")
ENERGY_COLUMN = "energy_per_inference_j"  # the perf CSV's (deploybench.columns)
ENERGY_STATUS = "energy_status"  # the meter's name, or "not measured: <why>"
# The axes in the order the quick walk tries them and a name spells them.
AXES = ("model_instances", "max_batch_size", "max_queue_delay_us", "intra_op_threads")
# Runtime threads are the python backend's (CPU) setting; a native GPU backend has none.
CPU_ONLY_AXES = ("intra_op_threads",)
# A variant's name: i<instances>-b<max batch>-p<preferred, dot-separated>-q<delay µs>[-t<threads>]
VARIANT_PATTERN = r"i[0-9]+-b[0-9]+-p[0-9]+(?:\.[0-9]+)*-q[0-9]+(?:-t[0-9]+)?"
_VARIANT = re.compile(
    r"i(?P<i>[0-9]+)-b(?P<b>[0-9]+)-p(?P<p>[0-9]+(?:\.[0-9]+)*)-q(?P<q>[0-9]+)(?:-t(?P<t>[0-9]+))?"
)

# A candidate's verdict in search.csv.
CHOSEN = "chosen"
TIE = "tie"  # no other candidate beats it, but another was chosen (simpler, or the baseline)
SLOWER = "slower"  # another candidate meeting the constraints is significantly faster
MORE_ENERGY = "more energy"  # (objective energy) another uses significantly less per inference
OVER_BUDGET = "over budget"  # no point within the latency budget
BELOW_FLOOR = "below floor"  # its best throughput within the budget is under min_throughput


@dataclass(frozen=True)
class Variant:
    """One serving configuration of a run's artifact."""

    model_instances: int
    max_batch_size: int
    preferred_batch_sizes: tuple[int, ...]
    max_queue_delay_us: int
    intra_op_threads: int | None  # None on a GPU (native backends have no such setting)

    @property
    def name(self) -> str:
        preferred = ".".join(str(b) for b in self.preferred_batch_sizes)
        name = (
            f"i{self.model_instances}-b{self.max_batch_size}-p{preferred}"
            f"-q{self.max_queue_delay_us}"
        )
        return name if self.intra_op_threads is None else f"{name}-t{self.intra_op_threads}"

    def triton(self) -> dict[str, Any]:
        """Its values of the run's `triton` settings."""
        settings: dict[str, Any] = {
            "model_instances": self.model_instances,
            "max_batch_size": self.max_batch_size,
            "preferred_batch_sizes": list(self.preferred_batch_sizes),
            "max_queue_delay_us": self.max_queue_delay_us,
        }
        if self.intra_op_threads is not None:
            settings["intra_op_threads"] = self.intra_op_threads
        return settings

    def simplicity(self) -> tuple[int, ...]:
        """Ties go to the smallest: fewest instances, then threads, the smallest batches, the
        shortest queue delay."""
        return (
            self.model_instances,
            self.intra_op_threads or 0,
            self.max_batch_size,
            self.max_queue_delay_us,
            *self.preferred_batch_sizes,
        )

    def axis_value(self, axis: str) -> Any:
        if axis == "max_batch_size":
            return (self.max_batch_size, self.preferred_batch_sizes)
        return getattr(self, axis)

    def with_value(self, axis: str, value: Any) -> Variant:
        if axis == "max_batch_size":
            return replace(self, max_batch_size=value[0], preferred_batch_sizes=value[1])
        return replace(self, **{axis: value})


def check_variant(variant: Variant, where: str) -> Variant:
    """``variant`` if Triton can serve it: preferred batch sizes ascending, unique, within the
    max batch size; at least one instance."""
    preferred = variant.preferred_batch_sizes
    if variant.model_instances < 1 or variant.max_batch_size < 1:
        raise ConfigError(f"{where}: a variant needs at least one instance and batch size 1")
    if not preferred or list(preferred) != sorted(set(preferred)) or preferred[0] < 1:
        raise ConfigError(
            f"{where}: preferred batch sizes {list(preferred)} must be ascending, unique and >= 1"
        )
    if preferred[-1] > variant.max_batch_size:
        raise ConfigError(
            f"{where}: preferred batch size {preferred[-1]} exceeds max batch size "
            f"{variant.max_batch_size}"
        )
    return variant


def parse_variant(name: str, device: str) -> Variant:
    """The variant a name spells; a malformed name, threads on a GPU or none on CPU fail."""
    match = _VARIANT.fullmatch(name)
    if match is None:
        raise ConfigError(
            f"variant {name!r} is not a variant name; expected i<instances>-b<max batch>-"
            "p<preferred batch sizes, dot-separated>-q<max queue delay us>[-t<threads>], "
            "e.g. i2-b1024-p512.1024-q1 (GPU) or i1-b64-p32.64-q1-t1 (CPU)"
        )
    threads = match["t"]
    if (threads is None) != (device != "cpu"):
        raise ConfigError(
            f"variant {name!r}: -t<threads> names the CPU runtime's threads per instance; "
            f"a {device} run's variant must {'not ' if device != 'cpu' else ''}have it"
        )
    return check_variant(
        Variant(
            model_instances=int(match["i"]),
            max_batch_size=int(match["b"]),
            preferred_batch_sizes=tuple(int(b) for b in match["p"].split(".")),
            max_queue_delay_us=int(match["q"]),
            intra_op_threads=None if threads is None else int(threads),
        ),
        f"variant {name!r}",
    )


def baseline_of(triton: Mapping[str, Any], device: str) -> Variant:
    """The run's own serving configuration (its `triton` settings) as a variant."""
    return check_variant(
        Variant(
            model_instances=int(triton["model_instances"]),
            max_batch_size=int(triton["max_batch_size"]),
            preferred_batch_sizes=tuple(int(b) for b in triton["preferred_batch_sizes"]),
            max_queue_delay_us=int(triton["max_queue_delay_us"]),
            intra_op_threads=int(triton.get("intra_op_threads", 0)) if device == "cpu" else None,
        ),
        "the run's triton settings",
    )


@dataclass(frozen=True)
class SearchSettings:
    """`models.<m>.search` (sized), resolved: axes as sorted values, the baseline's included."""

    strategy: str
    latency_budget_ms: float | None
    min_throughput: float | None
    max_candidates: int
    axes: Mapping[str, tuple[Any, ...]]  # searched axes only, in AXES order
    objective: str = THROUGHPUT  # OBJECTIVES: what a candidate's best point is best at

    def grid(self, baseline: Variant) -> list[Variant]:
        """Every combination of the axes' values (others at the baseline's), baseline first."""
        names = list(self.axes)
        combos = itertools.product(*(self.axes[a] for a in names))
        variants = [baseline]
        for values in combos:
            variant = baseline
            for axis, value in zip(names, values, strict=True):
                variant = variant.with_value(axis, value)
            if variant not in variants:
                variants.append(variant)
        return variants

    def neighbours(self, variant: Variant, axis: str) -> list[Variant]:
        """The variants one value down and one up ``axis`` from ``variant``."""
        values = self.axes[axis]
        at = values.index(variant.axis_value(axis))
        return [
            variant.with_value(axis, values[i]) for i in (at - 1, at + 1) if 0 <= i < len(values)
        ]


def search_settings(
    search: Mapping[str, Any], baseline: Variant, device: str, where: str
) -> SearchSettings:
    """Resolve a run's `search` settings; an axis a device lacks or a bad value fails here."""
    strategy = str(search["strategy"])
    if strategy not in STRATEGIES:
        raise ConfigError(
            f"{where}.strategy: unknown strategy {strategy!r}; valid choices: {', '.join(STRATEGIES)}"
        )
    given = dict(search.get("axes") or {})
    unknown = sorted(set(given) - set(AXES))
    if unknown:
        raise ConfigError(
            f"{where}.axes: unknown axis {unknown[0]!r}; valid choices: {', '.join(AXES)}"
        )
    axes: dict[str, tuple[Any, ...]] = {}
    for axis in AXES:
        if axis not in given:
            continue
        if axis in CPU_ONLY_AXES and device != "cpu":
            raise ConfigError(
                f"{where}.axes.{axis}: the CPU runtime's threads per instance; a {device} run's "
                "native backend has no such setting"
            )
        values = [_axis_value(axis, v, f"{where}.axes.{axis}") for v in given[axis]]
        values.append(baseline.axis_value(axis))
        axes[axis] = tuple(sorted(set(values)))
    budget, floor = search.get("latency_budget_ms"), search.get("min_throughput")
    objective = str(search.get("objective", THROUGHPUT))
    if objective not in OBJECTIVES:
        raise ConfigError(
            f"{where}.objective: unknown objective {objective!r}; valid choices: "
            f"{', '.join(OBJECTIVES)}"
        )
    return SearchSettings(
        strategy=strategy,
        latency_budget_ms=None if budget is None else float(budget),
        min_throughput=None if floor is None else float(floor),
        max_candidates=int(search["max_candidates"]),
        axes=axes,
        objective=objective,
    )


def settings_spec(settings: SearchSettings) -> dict[str, Any]:
    """``settings`` as plain JSON-able data (a job's spec; :func:`settings_from_spec` reads it)."""
    return {
        "strategy": settings.strategy,
        "latency_budget_ms": settings.latency_budget_ms,
        "min_throughput": settings.min_throughput,
        "max_candidates": settings.max_candidates,
        "objective": settings.objective,
        "axes": {
            axis: [[v[0], list(v[1])] if axis == "max_batch_size" else v for v in values]
            for axis, values in settings.axes.items()
        },
    }


def settings_from_spec(spec: Mapping[str, Any]) -> SearchSettings:
    return SearchSettings(
        strategy=str(spec["strategy"]),
        latency_budget_ms=spec["latency_budget_ms"],
        min_throughput=spec["min_throughput"],
        max_candidates=int(spec["max_candidates"]),
        axes={
            axis: tuple(
                (int(v[0]), tuple(int(b) for b in v[1])) if axis == "max_batch_size" else int(v)
                for v in values
            )
            for axis, values in spec["axes"].items()
        },
        # a settings.json from before the objective was a setting searched for throughput
        objective=str(spec.get("objective", THROUGHPUT)),
    )


def _axis_value(axis: str, value: Any, where: str) -> Any:
    """An axis value as a variant holds it: max batch size as (max, preferred sizes); an int
    ``m`` means preferred sizes ``m/2, m``, as the seed pages pair them (1024: 512, 1024)."""
    if axis != "max_batch_size":
        return int(value)
    if isinstance(value, Mapping):
        top, preferred = (
            int(value["max_batch_size"]),
            tuple(int(b) for b in value["preferred_batch_sizes"]),
        )
    else:
        top = int(value)
        preferred = tuple(sorted({max(1, top // 2), top}))
    probe = Variant(1, top, preferred, 0, None)
    check_variant(probe, where)
    return (top, preferred)


# ---------------------------------------------------------------------------- results


NO_INTERVAL = Interval(math.nan, math.nan, 0)


@dataclass(frozen=True)
class Candidate:
    """A measured variant, scored: its best point (by the objective) within the constraints."""

    variant: Variant
    feasible: bool  # a point within the budget, and its throughput at least the floor
    verdict_if_infeasible: str | None  # OVER_BUDGET | BELOW_FLOOR
    point: Mapping[str, Any] | None  # the best point's row (None: no point within budget)
    throughput: Interval
    p99: Interval
    lowest_p99_ms: float  # over all its points: how far an over-budget candidate is
    # the best point's energy per inference (NaN: not measured, or no point within the budget)
    energy: Interval = NO_INTERVAL
    objective: str = THROUGHPUT  # what it was scored by; only the same compare (beats)

    @property
    def name(self) -> str:
        return self.variant.name

    @property
    def value(self) -> Interval:
        """The objective's value at its best point: throughput, or energy per inference."""
        return self.energy if self.objective == ENERGY else self.throughput

    @property
    def merit(self) -> float:
        """The value's mean, the higher the better (less energy is better)."""
        return -self.value.mean if self.objective == ENERGY else self.value.mean

    @property
    def stable(self) -> bool | None:
        value = None if self.point is None else self.point.get("stable")
        return None if value is None else _truthy(value)


def _truthy(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() == "true"
    return bool(value)


def score(
    variant: Variant,
    rows: Sequence[Mapping[str, Any]],
    budget_ms: float | None,
    min_throughput: float | None,
    objective: str = THROUGHPUT,
) -> Candidate:
    """``variant``'s best point among the points (online CSV rows) whose mean p99 latency is
    within ``budget_ms`` (None: every point) and whose mean throughput reaches
    ``min_throughput``: the highest mean throughput, or with ``objective`` energy the least mean
    energy per inference. With energy, such a point without energy measured fails, naming the
    candidate and its ``energy_status``: the choice cannot be made without it."""
    if objective not in OBJECTIVES:
        raise ValueError(f"objective {objective!r}; valid choices: {', '.join(OBJECTIVES)}")
    if not rows:
        raise SearchError(f"candidate {variant.name}: its online CSV has no points")
    lowest = min(float(r["p99_latency_ms"]) for r in rows)
    within = [r for r in rows if budget_ms is None or float(r["p99_latency_ms"]) <= budget_ms]
    if not within:
        return Candidate(
            variant, False, OVER_BUDGET, None, NO_INTERVAL, NO_INTERVAL, lowest, objective=objective
        )
    # The floor is a point's constraint as the budget is; under the throughput objective this
    # is the same as asking it of the fastest point within the budget.
    reaching = [
        r
        for r in within
        if min_throughput is None or measured(r, "throughput").mean >= min_throughput
    ]
    if not reaching:
        # below the floor: shown at its fastest point within the budget, how near it came
        best, feasible = max(within, key=lambda r: float(r["throughput"])), False
    elif objective == ENERGY:
        for r in reaching:
            _check_energy(variant, r)
        best, feasible = min(reaching, key=lambda r: energy_of(r).mean), True
    else:
        best, feasible = max(reaching, key=lambda r: float(r["throughput"])), True
    return Candidate(
        variant,
        feasible,
        None if feasible else BELOW_FLOOR,
        best,
        measured(best, "throughput"),
        measured(best, "p99_latency_ms"),
        lowest,
        energy=energy_of(best),
        objective=objective,
    )


def energy_of(row: Mapping[str, Any]) -> Interval:
    """A point's energy per inference with its interval; NaN where not measured, or in a perf
    CSV from before energy was measured (no such column)."""
    return measured(row, ENERGY_COLUMN) if ENERGY_COLUMN in row else NO_INTERVAL


def _check_energy(variant: Variant, row: Mapping[str, Any]) -> None:
    """A point the energy objective must compare has its energy per inference measured."""
    if not math.isnan(energy_of(row).mean):
        return
    status = row.get(ENERGY_STATUS)
    if not isinstance(status, str) or not status.strip():
        reason = "no energy_status: a perf CSV from before energy was measured"
    elif status.startswith("not measured"):
        reason = f"energy_status: {status}"
    else:
        reason = f"energy_status {status!r}, but the cell is empty"
    raise SearchError(
        f"search.objective energy: candidate {variant.name} cannot be scored: its point at "
        f"batch {row.get('batch')}, concurrency {row.get('concurrency')} within the budget has "
        f"no {ENERGY_COLUMN} ({reason}); measure energy (energy.meter, or the GPU entry's "
        "meter) or search for throughput (search.objective: throughput)"
    )


def beats(a: Candidate, b: Candidate) -> bool:
    """``a`` meets the constraints and ``b`` does not, or both do and ``a``'s objective is
    better (more throughput, or less energy per inference) by more than their 95 % intervals
    combined."""
    if a.objective != b.objective:
        raise ValueError(
            f"candidates {a.name} and {b.name} were scored by different objectives "
            f"({a.objective}, {b.objective}): they do not compare"
        )
    if a.feasible != b.feasible:
        return a.feasible
    if not a.feasible:
        return False
    return change(b.value, a.value).significant and a.merit > b.merit


def undominated(candidates: Iterable[Candidate]) -> list[Candidate]:
    """The candidates meeting the constraints that no other beats."""
    pool = [c for c in candidates if c.feasible]
    return [c for c in pool if not any(beats(other, c) for other in pool)]


def choose(
    candidates: Sequence[Candidate],
    budget_ms: float | None,
    min_throughput: float | None,
    baseline: str | None = None,
) -> Candidate:
    """The simplest candidate that no other beats (:meth:`Variant.simplicity`, then the name),
    by the objective the candidates were scored by (:func:`score`).
    With a ``baseline`` (its name), the baseline stays unless a candidate beats it: then the
    simplest of the unbeaten candidates that beat it (one does whenever the baseline is beaten:
    beating is transitive), so the gain reported over the baseline is always significant.
    None meeting the constraints fails, naming the closest."""
    best = undominated(candidates)
    if best and baseline is not None:
        base = next(c for c in candidates if c.name == baseline)
        best = [c for c in best if beats(c, base)] or [base]
    if best:
        return min(best, key=lambda c: (c.variant.simplicity(), c.name))
    if min_throughput is not None and any(
        c.verdict_if_infeasible == BELOW_FLOOR for c in candidates
    ):
        top = max((c for c in candidates if c.point is not None), key=lambda c: c.throughput.mean)
        raise SearchError(
            f"no candidate reaches search.min_throughput {min_throughput:g} infer/s within the "
            f"budget: the most is {top.throughput.mean:.4g} ({top.name}); lower the floor or "
            "widen the axes"
        )
    closest = min(candidates, key=lambda c: c.lowest_p99_ms)
    raise SearchError(
        f"no candidate of {len(candidates)} has a point within the p99 latency budget of "
        f"{budget_ms:g} ms (search.latency_budget_ms); the lowest p99 measured is "
        f"{closest.lowest_p99_ms:.4g} ms ({closest.name}): raise the budget or measure lower "
        "concurrencies (search.online.concurrency)"
    )


def verdicts(candidates: Sequence[Candidate], chosen: Candidate) -> dict[str, str]:
    """Each candidate's verdict (CHOSEN, TIE, SLOWER or with the energy objective MORE_ENERGY,
    OVER_BUDGET, BELOW_FLOOR), by name."""
    top = {c.name for c in undominated(candidates)}
    beaten = MORE_ENERGY if chosen.objective == ENERGY else SLOWER
    out = {}
    for c in candidates:
        if c.name == chosen.name:
            out[c.name] = CHOSEN
        elif not c.feasible:
            out[c.name] = c.verdict_if_infeasible or OVER_BUDGET
        else:
            out[c.name] = TIE if c.name in top else beaten
    return out


# ---------------------------------------------------------------------------- quick walk


@dataclass(frozen=True)
class WalkState:
    """Where the quick walk stands given the candidates measured so far."""

    measured: tuple[str, ...]  # the candidates it has results of
    pending: tuple[str, ...]  # what it needs measured next (empty when done)
    position: str  # the best configuration the walk reached
    done: bool
    reason: str

    def as_dict(self) -> dict[str, Any]:
        return {
            "measured": list(self.measured),
            "pending": list(self.pending),
            "position": self.position,
            "done": self.done,
            "reason": self.reason,
        }


def quick_walk(
    settings: SearchSettings, baseline: Variant, results: Mapping[str, Candidate]
) -> WalkState:
    """Replay the greedy walk over ``results`` (measured candidates by name): from the baseline,
    along each axis in turn, move to the neighbour that beats the position (the better of two,
    by the objective's mean: :attr:`Candidate.merit`) and keep going along that axis; the walk ends when a pass over every
    axis moves nowhere; at ``max_candidates`` it measures nothing more and moves over the
    candidates it has, ending there with that reason. It returns the candidates to measure next
    where a result it needs is missing. The same results give the same walk, so each step of
    the workflow's data-dependent DAG replays it from the start.
    """
    have = tuple(results)

    def state(pending: Sequence[Variant], position: Variant, done: bool, reason: str) -> WalkState:
        return WalkState(have, tuple(v.name for v in pending), position.name, done, reason)

    if baseline.name not in results:
        return state([baseline], baseline, False, "measure the baseline")
    position = baseline
    capped = False
    while True:
        moved = False
        for axis in settings.axes:
            while True:
                around = settings.neighbours(position, axis)
                missing = [v for v in around if v.name not in results]
                if missing:
                    room = settings.max_candidates - len(results)
                    if room > 0:
                        return state(missing[:room], position, False, f"neighbours along {axis}")
                    # At the cap the walk still moves over what it measured, so that its
                    # position is never a candidate that a measured neighbour beats.
                    capped = True
                    around = [v for v in around if v.name in results]
                better = [v for v in around if beats(results[v.name], results[position.name])]
                if not better:
                    break
                position = max(better, key=lambda v: results[v.name].merit)
                moved = True
        if not moved:
            if capped:
                reason = f"max_candidates ({settings.max_candidates}) reached"
                return state([], position, True, reason)
            return state([], position, True, "no neighbour of the position beats it")


# ---------------------------------------------------------------------------- the frontier


def pareto_frontier(points: Sequence[tuple[float, float]]) -> list[bool]:
    """For (gain, cost) pairs, (throughput, p99 latency) or (throughput, energy per inference):
    whether each is on the frontier (no other point has at least its gain at no more cost, and
    is better in one). A pair with a NaN (energy not measured) is on none and hides none."""
    known = [(t, c) for t, c in points if not (math.isnan(t) or math.isnan(c))]
    flags = []
    for t, c in points:
        dominated = any((t2 >= t and c2 <= c) and (t2 > t or c2 < c) for t2, c2 in known)
        flags.append(not (math.isnan(t) or math.isnan(c) or dominated))
    return flags


# ---------------------------------------------------------------------------- the tables

# A point as both tables show it (the perf CSV's columns of the same names).
MEASURED = [
    "batch",
    "concurrency",
    "throughput",
    "throughput_ci95",
    "p99_latency_ms",
    "p99_latency_ms_ci95",
    "stable",
]
# Its energy beside them (empty where not measured), and the meter or why none measured.
ENERGY_MEASURED = [ENERGY_COLUMN, ENERGY_COLUMN + "_ci95", ENERGY_STATUS]
# search.csv: one row per candidate, its settings and its best point within the budget.
SEARCH_COLUMNS = [
    "model",
    "gpu",
    "format",
    "precision",
    "variant",
    "baseline",
    "chosen",
    *AXES[:2],
    "preferred_batch_sizes",
    *AXES[2:],
    "verdict",
    *MEASURED,
    *ENERGY_MEASURED,
    "trials",
    # the objective's gain over the baseline, with the ratio's 95 % half-width: its throughput
    # over the baseline's, or (energy) the baseline's energy per inference over its own
    "gain",
    "gain_ci95",
]
# search/points.csv: every measured point of every candidate (the Pareto chart's data); on the
# throughput-vs-p99 frontier, and on the throughput-vs-energy one (empty: energy not measured).
POINT_COLUMNS = [
    "variant",
    "baseline",
    "chosen",
    *MEASURED,
    *ENERGY_MEASURED,
    "in_budget",
    "frontier",
    "energy_frontier",
]


def read_points(path: str | Path) -> list[dict[str, Any]]:
    """A candidate's online CSV as rows."""
    import pandas as pd

    rows: list[dict[str, Any]] = pd.read_csv(path).to_dict("records")
    return rows


def variant_of_csv(path: str | Path, device: str) -> Variant:
    """The candidate whose measurement ``path`` is (``search/<variant>/online.csv``)."""
    return parse_variant(Path(path).parent.name, device)


def gain_over(baseline: Candidate, candidate: Candidate) -> Change:
    """``candidate`` against ``baseline`` by their objective, as a ratio where more is better:
    throughput over the baseline's, or the baseline's energy per inference over the candidate's
    (how many more inferences a joule buys)."""
    if candidate.objective == ENERGY:
        return change(candidate.energy, baseline.energy)
    return change(baseline.throughput, candidate.throughput)


def candidate_rows(
    candidates: Sequence[Candidate],
    chosen: Candidate,
    baseline: Candidate,
    run: Mapping[str, Any],
) -> list[dict[str, Any]]:
    """search.csv's rows."""
    verdict = verdicts(candidates, chosen)
    rows = []
    for c in candidates:
        point = c.point or {}
        gain = gain_over(baseline, c)
        rows.append(
            {
                **{k: run[k] for k in ("model", "gpu", "format", "precision")},
                "variant": c.name,
                "baseline": c.name == baseline.name,
                "chosen": c.name == chosen.name,
                **{k: v for k, v in c.variant.triton().items() if k != "preferred_batch_sizes"},
                "preferred_batch_sizes": " ".join(str(b) for b in c.variant.preferred_batch_sizes),
                "verdict": verdict[c.name],
                "batch": point.get("batch"),
                "concurrency": point.get("concurrency"),
                "throughput": _value(c.throughput.mean),
                "throughput_ci95": _value(c.throughput.half_width),
                "p99_latency_ms": _value(c.p99.mean),
                "p99_latency_ms_ci95": _value(c.p99.half_width),
                "stable": c.stable,
                ENERGY_COLUMN: _value(c.energy.mean),
                ENERGY_COLUMN + "_ci95": _value(c.energy.half_width),
                ENERGY_STATUS: _text(point.get(ENERGY_STATUS)),
                "trials": point.get("trials"),
                "gain": _value(gain.ratio),
                "gain_ci95": _value(gain.ratio_half_width),
            }
        )
    return rows


def point_rows(
    measured: Mapping[str, Sequence[Mapping[str, Any]]],
    chosen: str,
    baseline: str,
    budget_ms: float | None,
) -> list[dict[str, Any]]:
    """points.csv's rows: every point of every candidate (by name), both fronts marked: more
    throughput at less p99 latency, and more throughput at less energy per inference (empty
    where the point's energy was not measured)."""
    rows: list[dict[str, Any]] = []
    for name, points in measured.items():
        for r in points:
            energy = energy_of(r)
            rows.append(
                {
                    "variant": name,
                    "baseline": name == baseline,
                    "chosen": name == chosen,
                    **{k: r.get(k) for k in MEASURED},
                    ENERGY_COLUMN: _value(energy.mean),
                    ENERGY_COLUMN + "_ci95": _value(energy.half_width),
                    ENERGY_STATUS: _text(r.get(ENERGY_STATUS)),
                    "in_budget": budget_ms is None or float(r["p99_latency_ms"]) <= budget_ms,
                }
            )
    throughput = [float(r["throughput"]) for r in rows]
    latency = [float(r["p99_latency_ms"]) for r in rows]
    joules = [math.nan if r[ENERGY_COLUMN] is None else float(r[ENERGY_COLUMN]) for r in rows]
    on_latency = pareto_frontier(list(zip(throughput, latency, strict=True)))
    on_energy = pareto_frontier(list(zip(throughput, joules, strict=True)))
    return [
        r | {"frontier": f, "energy_frontier": None if math.isnan(j) else e}
        for r, f, e, j in zip(rows, on_latency, on_energy, joules, strict=True)
    ]


def choice_record(
    settings: SearchSettings,
    chosen: Candidate,
    baseline: Candidate,
    run: Mapping[str, Any],
    count: int,
) -> dict[str, Any]:
    """best/choice.json: what was chosen, by which rule, and its gain over the baseline (by the
    objective: ``gain.of`` says which ratio)."""
    gain = gain_over(baseline, chosen)
    point = chosen.point or {}
    return {
        "run": run["path"],
        "variant": chosen.name,
        "baseline": baseline.name,
        "settings": chosen.variant.triton(),
        "strategy": settings.strategy,
        "objective": settings.objective,
        "latency_budget_ms": settings.latency_budget_ms,
        "min_throughput": settings.min_throughput,
        "candidates": count,
        "point": {"batch": point.get("batch"), "concurrency": point.get("concurrency")},
        "throughput": {
            "mean": chosen.throughput.mean,
            "ci95": _value(chosen.throughput.half_width),
        },
        "p99_latency_ms": {"mean": chosen.p99.mean, "ci95": _value(chosen.p99.half_width)},
        # null where not measured
        ENERGY_COLUMN: {
            "mean": _value(chosen.energy.mean),
            "ci95": _value(chosen.energy.half_width),
        },
        # NaN (as null) when the baseline meets no constraint: nothing to compare with
        "gain": {
            "of": "inferences per joule" if settings.objective == ENERGY else "throughput",
            "ratio": _value(gain.ratio),
            "ci95": _value(gain.ratio_half_width),
            "significant": bool(gain.significant) and baseline.feasible,
        },
    }


def _value(x: float) -> float | None:
    """A number for a CSV/JSON cell; NaN (no interval, no point) as empty."""
    return None if x is None or math.isnan(x) else x


def _text(x: Any) -> str | None:
    """A text cell as read back (pandas reads an empty one as NaN), or None."""
    return x if isinstance(x, str) and x else None
