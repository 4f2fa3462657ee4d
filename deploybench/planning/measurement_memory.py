"""What a measurement job (offline, online and their parts) asks the cluster for in memory
(``mem_mb``): the copies perf_analyzer keeps of its requests' inputs over its longest window,
plus a baseline for tritonserver, perf_analyzer and the job's own Python.

perf_analyzer keeps every request's inputs whether or not a profile export is asked for. As read
in its sources (triton-inference-server/client for r24.03 and r24.04, its
``src/c++/perf_analyzer/``; triton-inference-server/perf_analyzer from r24.08, ``src/``):

- r24.03 (tritonclient 2.44) records responses' outputs only (request_record.h: ResponseData).
  r24.04 (2.45) adds RecordData and ``RequestRecord::request_inputs_`` (request_record.h:38-42,
  89): InferContext::SendRequest copies every request's inputs (``request_inputs{GetInputs()}``,
  infer_context.cc:117, kept at :127 async and :177 sync; GetInputs :189-207 copies each
  input's RawData, RecordData's memcpy at request_record.h:40-41).
- A window's records live until the window is summarized: InferenceProfiler::Measure swaps them
  out of the load manager and appends them to ``all_request_records_`` (inference_profiler.cc:
  1208-1212, r24.04); Summarize hands the window's to the export collector only with
  ``--profile-export-file`` (:1241) and drops them otherwise; ProfileHelper clears the rest for
  each point (:694). So one window's requests are held at once.
- Up to r24.10 (2.51) copies of a record share its buffer (RecordData holds a shared_ptr). From
  r24.11 (2.52) RecordData owns a std::vector (perf_analyzer r24.11 src/request_record.h:38),
  so that append copies every input again: a window's inputs are held twice while it is
  summarized (perf_analyzer r25.01 src/inference_profiler.cc:1269-1272; the same in r25.12).
- With shared memory an input has no buffer to copy: InferInput::RawData gives nullptr, 0 bytes
  (client r24.04 and r25.12 src/c++/library/common.cc:186-197), so nothing is kept.
- Of a batch only the first sample is kept: RawData returns ``bufs_[0]`` ("TMA-1775 - handle
  multi-batch case", same lines), and perf_analyzer appends each sample as a buffer of its own
  (client r24.04 src/c++/perf_analyzer/infer_data_manager.cc:97-101).

A run's perf_analyzer is its triton image's SDK build (envs/triton.def copies it from
``images.<image>.sdk``): NGC release YY.MM ships tritonclient 2.N (server TRITON_VERSION: r23.12
2.41.0, r24.03 2.44.0, r24.04 2.45.0, r24.09 2.50.0, r24.11 2.52.0, r25.01 2.54.0, r25.02
2.55.0: one minor a month). A container-free run (``serving: python``) uses the environment's
(:func:`deploybench.provenance.perf_analyzer_version`).
"""

from __future__ import annotations

import csv
import functools
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..tails import TENSORS_RECORDED_FROM
from .serving_plan import container_free
from .workflow_config import published_ran, reference_format, reference_model

MIB = 2**20  # SLURM reads --mem (the executor plugin's mem_mb) in MiB
COPIED_ON_APPEND_FROM = (2, 52)  # r24.11: RecordData owns its bytes; the append copies them
# NGC release 24.04 shipped tritonclient 2.45.0; one minor a month since (see above)
_RELEASE_ANCHOR = ((24, 4), (2, 45))
_SDK_TAG = re.compile(r":(\d{2})\.(\d{2})-py3-sdk$")
# the source tree: deploybench/planning/ is two levels below it
PUBLISHED = Path(__file__).resolve().parents[2] / "config" / "reference" / "published.csv"


def sdk_tritonclient(sdk: str | None) -> tuple[int, int] | None:
    """The tritonclient version (major, minor) of an NGC SDK image reference
    (``nvcr.io/nvidia/tritonserver:25.02-py3-sdk`` -> (2, 55)); None where it names no
    release."""
    found = _SDK_TAG.search(sdk or "")
    if found is None:
        return None
    (year, month), (major, minor) = _RELEASE_ANCHOR
    months = (int(found.group(1)) - year) * 12 + int(found.group(2)) - month
    return major, minor + months


def tritonclient_of(version: str | None) -> tuple[int, int] | None:
    """(major, minor) of ``provenance.perf_analyzer_version()`` ("tritonclient 2.41.0"); None
    where it is not known."""
    found = re.search(r"tritonclient (\d+)\.(\d+)", version or "")
    return (int(found.group(1)), int(found.group(2))) if found else None


def recorded_copies(tritonclient: tuple[int, int] | None, shared_memory: str) -> int:
    """Copies of a window's inputs this perf_analyzer holds at once (see above): 0 before 2.45
    or over shared memory, 1 from 2.45, 2 from 2.52; one not known (None) as the newest."""
    if shared_memory != "none":
        return 0
    if tritonclient is None:
        return 2
    if tritonclient < TENSORS_RECORDED_FROM:
        return 0
    return 2 if tritonclient >= COPIED_ON_APPEND_FROM else 1


def measurement_mem_mb(
    *,
    points: Sequence[tuple[int, float]],
    measure: Mapping[str, Any],
    input_bytes: int,
    copies: int,
    baseline_mb: int,
    margin: float,
) -> int:
    """A measurement job's ``mem_mb``: baseline_mb + margin x copies x input_bytes x the most
    requests one window holds, over the job's ``points`` ((batch, inferences/s) each), MiB
    rounded up.

    A window holds r = inferences/s / batch requests a second (perf_analyzer keeps one sample of
    each; see the module's docstring). ``measure``: the run's MEASURE_KEYS. time_windows: r x
    measurement_interval_ms x warmup_factor (the warm-up measures windows that many times
    longer: perf.measure_point). count_windows: the warm-up's request_count x warmup_factor, or
    the measuring windows' count (perf.MeasureSettings.requests_per_window at r, plus every
    retry's step, within the duration cap), or r x 1 s (a window lasts a second at least),
    whichever is the most. Both are perf.MeasureSettings.requests_held, the count the profile
    export's budget takes too."""
    from ..perf import MeasureSettings  # numpy: imported where a measurement job is planned

    settings = MeasureSettings(**measure)
    warm_up = max(1, settings.warmup_factor)
    held = 0
    for batch, rate in points:
        requests_s = rate / batch
        # the requests a window holds (MeasureSettings.requests_held, as the export's budget)
        if settings.time_windows:
            held = max(held, settings.requests_held(requests_s, 0, windows_of=warm_up) or 0)
            continue
        measuring = settings.requests_per_window(requests_s)[0]
        measuring += settings.max_retries * settings.retry_request_step
        limit = settings.request_limit(requests_s)
        if limit is not None:
            measuring = min(measuring, limit)
        for requests in (settings.request_count * warm_up, measuring):
            held = max(held, settings.requests_held(requests_s, requests) or 0)
    recorded = margin * copies * input_bytes * held
    return math.ceil(baseline_mb + recorded / MIB)


@functools.cache
def _published_table(path: Path) -> tuple[dict[str, str], ...]:
    with path.open(newline="") as f:
        return tuple(csv.DictReader(f))


def _entry(find: Any, config: dict[str, Any], *args: str | None) -> str | None:
    try:
        return str(find(config, *args))
    except ConfigError:
        return None


# A published point of a run: (concurrency, batch: None where the row names none, inferences/s)
PublishedPoint = tuple[int, int | None, float]


@dataclass(frozen=True)
class PublishedRates:
    """One model entry's published rates: by scenario, and by run (scenario, gpu, format,
    precision) as its points."""

    by_scenario: dict[str, list[float]] = field(default_factory=dict)
    by_run: dict[tuple[str, str, str, str], list[PublishedPoint]] = field(default_factory=dict)


def published_table(config: dict[str, Any], path: Path = PUBLISHED) -> dict[str, PublishedRates]:
    """Model entry -> the published rows with a rate it reproduces (the rows
    workflow_config.reference_run reproduces; a row's run is its gpu, the format entry that
    serves it and the precision that ran: models.<m>.published_ran). Read and resolved once
    for every measurement job of a DAG."""
    table: dict[str, PublishedRates] = {}
    keys: dict[tuple[str, ...], tuple[str | None, str | None]] = {}
    for row in _published_table(path):
        if not row["throughput"]:
            continue
        key = (row["model"], row.get("dataset") or "", row["format"], row["accelerator"] or "none")
        if key not in keys:
            keys[key] = (
                _entry(reference_model, config, key[0], key[1] or None),
                _entry(reference_format, config, key[2], key[3]),
            )
        model, entry_format = keys[key]
        if model is None:
            continue
        rates = table.setdefault(model, PublishedRates())
        rate = float(row["throughput"])
        rates.by_scenario.setdefault(row["scenario"], []).append(rate)
        if entry_format is None:
            continue  # no format entry serves it: no run of this config is its
        ran = published_ran(config, model).get(entry_format, {}).get(row["precision"])
        precision = ran["precision"] if ran else row["precision"]
        batch = int(row["batch"]) if row["batch"] else None
        rates.by_run.setdefault((row["scenario"], row["gpu"], entry_format, precision), []).append(
            (int(row["concurrency"] or 1), batch, rate)
        )
    return table


def published_rates(
    config: dict[str, Any],
    plan: Any,
    scenario: str,
    path: Path = PUBLISHED,
    table: Mapping[str, PublishedRates] | None = None,
) -> tuple[dict[tuple[int, int], float], dict[str, list[float]]]:
    """The published inferences/s of ``plan``'s (a RunPlan's) ``scenario`` by (batch,
    concurrency), a row that names no batch at the batch the plan measures it with
    (``RunPlan.batch_at``, as the report joins it), and those of its model by scenario, on any
    GPU, format and precision (the rows workflow_config.reference_run reproduces with this model
    entry). ``table``: :func:`published_table` of ``config`` and ``path``, made once."""
    if table is None:
        table = published_table(config, path)
    rates = table.get(plan.model)
    if rates is None:
        return {}, {}
    own: dict[tuple[int, int], float] = {}
    for concurrency, batch, rate in rates.by_run.get(
        (scenario, plan.gpu, plan.format, plan.precision), ()
    ):
        if batch is None:
            batch = plan.batch_at(scenario, concurrency)
        if batch is not None:
            own[(batch, concurrency)] = max(rate, own.get((batch, concurrency), 0.0))
    return own, {s: list(r) for s, r in rates.by_scenario.items()}


def plan_measurement_mem_mb(
    config: dict[str, Any],
    plan: Any,
    scenario: str,
    part: int | None = None,
    path: Path = PUBLISHED,
    table: Mapping[str, PublishedRates] | None = None,
) -> int:
    """``mem_mb`` of the measurement job of ``plan``'s (a RunPlan's) ``scenario`` (or of its
    part ``part``), :func:`measurement_mem_mb` over its points at their expected rates: the
    published rate of the point (a published row of this run), else the run's highest published
    rate of the scenario, else ``models.<m>.perf.expected_rate``, else the highest the seed page
    published for the model's scenario on any GPU (for its other scenario where it has none).
    More than ``gpus.<gpu>.slurm.node_mem_mb`` fails here (ConfigError naming both and what to
    change). ``table``: :func:`published_table` of ``config`` and ``path``, made once."""
    where = f"{plan.path} {scenario}" + ("" if part is None else f" (part {part})")
    own, of_model = published_rates(config, plan, scenario, path, table)
    estimate = plan.expected_rate
    if estimate is None and of_model:
        estimate = max(of_model.get(scenario) or [r for rates in of_model.values() for r in rates])
    points = plan.points[scenario] if part is None else plan.part_points(scenario, part)
    loads: list[tuple[int, float]] = []
    for point in points:
        batch, concurrency = int(point["batch"]), int(point["concurrency"])
        rate = own.get((batch, concurrency)) or (max(own.values()) if own else estimate)
        if rate is None:
            raise ConfigError(
                f"{where}: no published rate for its model and no "
                f"models.{plan.model}.perf.expected_rate (inferences/s) to size its memory from"
            )
        loads.append((batch, float(rate)))
    memory = config.get("measurement_memory") or {}
    if container_free(config["gpus"][plan.gpu]):
        from ..provenance import perf_analyzer_version

        tritonclient = tritonclient_of(perf_analyzer_version())
    else:
        image = config["images"].get(plan.containers.get("triton"), {})
        tritonclient = sdk_tritonclient(image.get("sdk"))
    copies = recorded_copies(tritonclient, str(plan.transport[scenario]["shared_memory"]))
    input_bytes = plan.input_bytes
    if input_bytes is None and copies:
        raise ConfigError(
            f"{where}: its perf_analyzer keeps every request's inputs, and "
            f"models.{plan.model}.perf.input_bytes (the bytes of one sample's inputs) is not set "
            "to size its memory from"
        )
    mem_mb = measurement_mem_mb(
        points=loads,
        measure=plan.measure,
        input_bytes=int(input_bytes or 0),
        copies=copies,
        baseline_mb=int(memory.get("baseline_mb", 16000)),
        margin=float(memory.get("margin", 1.2)),
    )
    node_mb = (config["gpus"][plan.gpu].get("slurm") or {}).get("node_mem_mb")
    if node_mb is not None and mem_mb > node_mb:
        raise ConfigError(
            f"{where}: its measurement job needs {mem_mb} MB (perf_analyzer keeps {copies} "
            f"cop{'y' if copies == 1 else 'ies'} of each request's "
            f"{input_bytes} input bytes over its longest window, at up to "
            f"{max(r for _, r in loads):g} inferences/s, plus measurement_memory.baseline_mb), "
            f"more than gpus.{plan.gpu}.slurm.node_mem_mb ({node_mb} MB). Shorten its windows "
            f"(models.{plan.model}.perf.measurement_interval_ms, warmup_factor), use shared "
            f"memory (models.{plan.model}.perf.{scenario}.transport), lower "
            "measurement_memory.margin or baseline_mb, or raise node_mem_mb if the node has more"
        )
    return mem_mb
