"""The jobs that serve a run: its Triton server, the accuracy check, the perf measurements
(and the merge of a scenario measured in parts), and the image preflight."""

from __future__ import annotations

import contextlib
import logging
import math
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import progress
from .. import provenance as sidecar
from ..gpus import FRAMEWORK_DEVICE
from ..io import write_csv, write_json
from ..models import load_family

if TYPE_CHECKING:
    from ..planning.job_specs import (
        AccuracySpec,
        PerfSpec,
    )
    from ..preflight.spec import PreflightSpec

log = logging.getLogger("deploybench")


@contextlib.contextmanager
def ready_server(repo: str, server_log: str, server_settings: dict[str, Any]) -> Iterator[Any]:
    """A ready server of ``repo``. Where its models build a TensorRT engine while they load
    (onnx-trt), their engine cache is made and held while it starts (one build per run; see
    deploybench.model_repository.engine_build_lock)."""
    from ..model_repository import engine_build_lock
    from ..server import TritonServer

    server = TritonServer(
        Path(repo),
        Path(server_log),
        startup_timeout_s=float(server_settings.get("startup_timeout_s", 120)),
        shutdown_timeout_s=float(server_settings.get("shutdown_timeout_s", 30)),
        environment=server_settings.get("environment"),
    )
    if server_settings.get("environment"):
        log.info("server environment: %s", server_settings["environment"])
    try:  # from before the server may exist: a SIGTERM anywhere from here on stops it
        with engine_build_lock(Path(repo)) as caches:
            server.start()
        for cache in caches:
            log.info("TensorRT engine cache %s: %s", cache, sorted(p.name for p in cache.iterdir()))
        yield server
    finally:
        server.stop()


def served_by(server: Any) -> dict[str, Any]:
    """What a result's provenance (``tritonserver``; a measurement's attempts too) says of the
    server that answered: its ``/v2`` metadata and binary, and its process's environment as it
    was given, with the TF32 state it makes (provenance.server_environment), read while it
    runs."""
    return server.metadata() | {"environment": sidecar.server_environment(server)}


@contextlib.contextmanager
def energy_meter(settings: dict[str, Any], gpus: Any = None) -> Iterator[tuple[Any, str]]:
    """The run's energy meter, open while its trials are measured, and its status: the
    meter's name, or "not measured: <why>" (the meter is then None: the energy columns stay
    empty, never 0). ``gpus``: the GPUs the server computes on (gpu_identity.ServerGpus; None:
    none, a server on the CPU), which an NVML meter reads. The counter's update period is
    measured here, once per job (the meter's ``counter_period_s``)."""
    from ..meters import describe, open_meter
    from ..telemetry import NotMeasured

    try:
        meter = open_meter(
            settings.get("meter", "none"),
            nvml_library=settings.get("nvml_library", "libnvidia-ml.so.1"),
            gpus=gpus,
        )
    except NotMeasured as why:
        log.warning("energy %s", describe(why))
        yield None, describe(why)
        return
    try:
        try:
            period = meter.measure_counter_period()
        except NotMeasured as why:
            log.warning("energy %s", describe(why))
            yield None, describe(why)
            return
        log.info(
            "energy meter %s: %s; counter updates every %.1f ms",
            meter.name,
            meter.facts().get("how_chosen", ""),
            period * 1000,
        )
        yield meter, describe(meter)
    finally:
        meter.close()


class IdleReads:
    """A job's idle baseline: its meter read with no load before the first trial and again
    after the sweep, each after ``energy.settle_s`` of waiting, over ``energy.idle_s`` seconds
    as ``energy.idle_windows`` windows (telemetry.read_idle); the baseline the mean of the two
    where both were read (telemetry.idle_baseline). ``energy.idle_s`` 0: none. A read that
    cannot measure (another process on the GPU meanwhile) is left out, and says why."""

    def __init__(self, settings: dict[str, Any], interval_s: float) -> None:
        self.settle_s = float(settings.get("settle_s", 0))
        self.seconds = float(settings.get("idle_s", 3))
        self.windows = int(settings.get("idle_windows", 3))
        self.interval_s = interval_s
        self.reads: dict[str, Any] = {}  # "before"/"after" -> IdleRead, or None
        self.why: dict[str, str] = {}  # "before"/"after" -> why it was not measured

    def read(self, meter: Any, when: str) -> str:
        """Read the idle ``when`` ("before", "after" the sweep); what it found, for the
        progress line."""
        from ..telemetry import NotMeasured, read_idle

        self.reads[when] = None
        if not self.seconds > 0:
            self.why[when] = "energy.idle_s 0"
        else:
            try:
                self.reads[when] = read_idle(
                    meter, self.seconds, self.windows, self.interval_s, self.settle_s
                )
            except NotMeasured as why:  # a co-tenant on the GPU meanwhile
                self.why[when] = why.reason
        read = self.reads[when]
        if read is None:
            log.warning("energy: idle %s the sweep not measured: %s", when, self.why[when])
            return f"not measured ({self.why[when]})"
        iv = read.interval
        return f"{iv.mean:.1f} ± {iv.half_width:.1f} W"

    def baseline(self) -> Any:
        """The idle power of the reads so far (telemetry.IdleBaseline), or None."""
        from ..telemetry import idle_baseline

        return idle_baseline(self.reads.get("before"), self.reads.get("after"))

    def record(self) -> dict[str, Any]:
        """What the provenance's ``config.energy`` says of the idle: the power used and its
        half-width, which reads it comes from, each read (or why not), the settings."""
        baseline = self.baseline()
        reads = {
            when: read.record()
            if read is not None
            else {"status": f"not measured: {self.why[when]}"}
            for when, read in self.reads.items()
        }
        record: dict[str, Any] = {
            "idle_power_w": None if baseline is None else round(baseline.power_w, 4),
            "idle_power_ci95_w": None
            if baseline is None or math.isnan(baseline.half_width_w)
            else round(baseline.half_width_w, 4),
            "idle": {
                "settle_s": self.settle_s,
                "seconds": self.seconds,
                "windows": self.windows,
                **reads,
                "used": "none" if baseline is None else baseline.source,
            },
        }
        if baseline is None:
            record["idle_status"] = "not measured: " + "; ".join(
                f"{when} the sweep: {why}" for when, why in self.why.items()
            )
        return record


class ScenarioInstruments:
    """What a scenario's job measures beside perf_analyzer (``instruments``,
    deploybench.instruments): the energy meter (open while the trials run) with its idle
    baseline read before the first trial and after the sweep, Triton's energy counter and its
    GPU metrics; and what the provenance's ``config.energy`` says of them."""

    def __init__(
        self,
        stack: contextlib.ExitStack,
        settings: dict[str, Any],
        server: Any,
        repository: str,
        served: list[str],
        label: str,
    ) -> None:
        from ..instruments import TrialEnergy, TritonCounter, probe_gpu_metrics
        from ..triton_metrics import probe

        # an NVML meter reads the GPUs the served models' instances are placed on
        nvml = settings.get("meter") == "nvml"
        gpus = server_gpus(server, repository, served) if nvml else None
        self.meter, status = stack.enter_context(energy_meter(settings, gpus))
        self.label = label
        self.record: dict[str, Any] = dict(settings)
        # the second meter: Triton's own energy counter, where the server has one (a CPU
        # server has none: its trials say why)
        interval_s = int(settings.get("sample_ms", 100)) / 1000
        triton = probe(server.metrics_port, server.extra_args, poll_s=interval_s)
        self.record["triton"] = triton.record()
        log.info("%s: second energy meter: %s", label, triton.status)
        # the idle baseline: the server loaded (and past its first request), no load, after
        # a settle wait; read again after the sweep (idle_read)
        energy = TrialEnergy(status)
        self.idle = IdleReads(settings, interval_s)
        if self.meter is not None:
            before = self.idle.read(self.meter, "before")
            baseline = self.idle.baseline()
            facts = self.meter.facts()
            energy = TrialEnergy(
                status,
                self.meter,
                interval_s,
                None if baseline is None else baseline.power_w,
                facts.get("power_limit_w"),
                counter_period_s=self.meter.counter_period_s,
                idle_ci95_w=None if baseline is None else baseline.half_width_w,
                max_slowdown_fraction=float(settings.get("max_slowdown_fraction", 0.05)),
            )
            self.record |= {"status": status, "meter_facts": facts} | self.idle.record()
            progress.say("%s: energy from %s; idle %s", label, status, before)
        else:
            self.record["status"] = status
            progress.say("%s: energy %s", label, status)
        # Triton's GPU utilisation, power and memory, which perf_analyzer collects itself
        gpu_metrics = probe_gpu_metrics(server.metrics_port, server.extra_args)
        self.record["triton_gpu_metrics"] = {"status": gpu_metrics.status, "url": gpu_metrics.url}
        log.info("%s: Triton's GPU metrics: %s", label, gpu_metrics.status)
        self.instruments = (energy, TritonCounter(triton), gpu_metrics)

    def after_sweep(self, trial_rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The idle read again, the sweep over: the trials' above-idle figures from both."""
        from ..collectors import with_idle

        if self.meter is None:
            return trial_rows
        after = self.idle.read(self.meter, "after")
        baseline = self.idle.baseline()
        self.record.pop("idle_status", None)
        self.record |= self.idle.record()
        progress.say(
            "%s: idle after the sweep %s; above idle from %s",
            self.label,
            after,
            "no idle power" if baseline is None else baseline.source,
        )
        power = None if baseline is None else baseline.power_w
        half_width = None if baseline is None else baseline.half_width_w
        return [with_idle(row, power, half_width) for row in trial_rows]


def server_gpus(server: Any, repository: str, models: list[str]) -> Any:
    """The GPUs ``server`` computes on for ``models``: their instance groups' CUDA ordinals in
    the server's own environment (gpu_identity.ServerGpus); None where no group is on a GPU."""
    from ..gpu_identity import server_gpus as of_repository

    environ, _ = server.process_environment()
    found = of_repository(Path(repository), models, environ)
    return None if found.ordinals == () else found


def _client_timeout(server_settings: dict[str, Any]) -> float:
    """How long a client waits for the server (longer where an engine may still be built)."""
    from ..triton_client import DEFAULT_TIMEOUT_S

    return float(server_settings.get("client_timeout_s", DEFAULT_TIMEOUT_S))


def _perf_label(scenario: str, run_path: str, csv: str) -> str:
    """How a measurement's progress lines name it: scenario and run, and a search's candidate
    (``<run>/search/<variant>/online.csv``)."""
    where = Path(csv).parent
    if where.parent.name == "search":
        return f"{scenario} {run_path} (search candidate {where.name})"
    return f"{scenario} {run_path}"


def accuracy(
    spec: AccuracySpec,
    *,
    repository: str,
    checkpoint: str,
    csv: str,
    task_csv: str,
    provenance: str,
    server_log: str,
) -> None:
    from ..accuracy import COLUMNS, TASK_COLUMNS, compare_outputs, format_failure, task_rows
    from ..checkpoint import read_workflow_checkpoint
    from ..errors import AccuracyError
    from ..server import graceful_signals
    from ..triton_client import infer_triton

    model, model_name = spec["model"], spec["model_name"]
    settings, run = spec["accuracy"], spec["run"]
    family = load_family(model["module"], model["hparams"])
    batch = int(settings["batch_size"])
    started = time.monotonic()
    progress.say(
        "accuracy %s: framework reference on %s, %s …",
        run["path"],
        run["device"],
        progress.count(batch, "sample"),
    )
    feeds = family.example_inputs(batch, int(settings["seed"]))
    module = family.serving_module(read_workflow_checkpoint(family, checkpoint))
    # on the device the run is served on, as DLE's run_inference_on_fw.py: a GPU's float32
    # (cuDNN's TF32 convolutions) moves FastPitch's rounded durations from the CPU's
    # (benchmarks/gpu/results/2026-11-26-H100_SXM)
    reference = family.framework_outputs(module, feeds, FRAMEWORK_DEVICE[run["device"]])

    task = settings.get("task") or {}
    timeout_s = _client_timeout(spec["server"])
    progress.say("accuracy %s: starting tritonserver (%s) …", run["path"], repository)
    with graceful_signals(), ready_server(repository, server_log, spec["server"]) as server:
        served = infer_triton(server.http_url, model_name, feeds, list(reference), timeout_s)
        server_info = served_by(server)
        # each row also holds the model's own quantities (arg-max flips, moved durations)
        rows = compare_outputs(reference, served, settings["tolerance"], batch, family)
        for row in rows:
            log.info("accuracy %s", row)
        if not all(r["passed"] for r in rows):
            raise AccuracyError(
                f"{run['path']}: Triton's output differs from the framework: {format_failure(rows)}"
            )
        progress.say(
            "accuracy %s: %s compared (%s), all within tolerance",
            run["path"],
            progress.count(batch, "sample"),
            progress.count(len(rows), "output"),
        )
        # engines: per_batch: each batch's own engine, at its batch (rows name the model)
        batch_models = spec.get("batch_models") or {}
        if batch_models:
            rows = [row | {"model": model_name} for row in rows]
        for text, name in batch_models.items():
            own_feeds = family.example_inputs(int(text), int(settings["seed"]))
            own_reference = family.framework_outputs(
                module, own_feeds, FRAMEWORK_DEVICE[run["device"]]
            )
            own = infer_triton(server.http_url, name, own_feeds, list(own_reference), timeout_s)
            own_rows = [
                row | {"model": name}
                for row in compare_outputs(
                    own_reference, own, settings["tolerance"], int(text), family
                )
            ]
            for row in own_rows:
                log.info("accuracy %s", row)
            if not all(r["passed"] for r in own_rows):
                raise AccuracyError(
                    f"{run['path']}: the engine of batch {text} (model {name}) differs from the "
                    f"framework: {format_failure(own_rows)}"
                )
            rows += own_rows
            progress.say(
                "accuracy %s: batch %s's engine (model %s) within tolerance",
                run["path"],
                text,
                name,
            )
        if task.get("path"):
            progress.say("accuracy %s: task metric on %s …", run["path"], task["path"])
        metrics = task_rows(
            family,
            task,
            lambda batch_feeds: infer_triton(
                server.http_url,
                model_name,
                batch_feeds,
                [s.name for s in family.outputs],
                timeout_s,
            ),
        )
    for metric in metrics:
        log.info("task metric %s", metric)
    failed = [m for m in metrics if m["passed"] is False]
    if failed:
        raise AccuracyError(f"{run['path']}: task metric below its threshold: {failed}")
    write_csv(csv, rows, [*COLUMNS, "model"] if batch_models else COLUMNS)
    write_csv(task_csv, metrics, TASK_COLUMNS)
    progress.say(
        "accuracy %s: done in %s; %s",
        run["path"],
        progress.format_duration(time.monotonic() - started),
        csv,
    )
    write_json(
        provenance,
        sidecar.collect(csv, {"accuracy": settings, **run}, tritonserver=server_info),
    )


def _perf_example(spec: PerfSpec, family: Any) -> tuple[Any, str]:
    """The one example perf_analyzer sends and where it came from: DLE's own input files
    (``perf.input_data``), or the family's, made as the seed page's perf data was
    (Family.perf_inputs)."""
    from ..perf_inputs import read_input_files

    if spec.get("input_data"):
        sample = read_input_files(Path(spec["input_data"]), family.inputs)
        return sample, f"{spec['input_data']}: raw input files (perf.input_data)"
    dataset = spec.get("dataset_path")
    return family.perf_inputs(seed=0, dataset=dataset), family.perf_input_source(
        seed=0, dataset=dataset
    )


def _scenario_record(
    spec: PerfSpec,
    energy: dict[str, Any],
    sample: Any,
    input_source: str,
    attempts: list[dict[str, Any]],
) -> dict[str, Any]:
    """What the scenario's provenance says of how its rows were measured (``config``)."""
    from ..perf_inputs import inputs_digest, raw_sha256

    config: dict[str, Any] = {
        "scenario": spec["scenario"],
        "points": spec["points"],
        "measure": spec["measure"],
        "transport": spec["transport"],
        # how energy was read: the settings, the meter (GPU UUID, power limit, clocks,
        # persistence, driver) or why not, and the idle baseline
        "energy": energy,
        # what the rows were measured with: the weights (None: seeded) and the example sent
        "checkpoint": spec["model"].get("checkpoint"),
        "server_environment": spec["server"].get("environment") or {},
        "inputs": {
            "source": input_source,
            "sha256": inputs_digest(sample),
            "files": spec.get("input_data"),
            # each input's bytes, as DLE's raw files hold them: what
            # models.<m>.published_needs.input_sha256 pins (deploybench.report_published)
            "raw_sha256": raw_sha256(sample),
        },
        **spec["run"],
    }
    if spec.get("batch_models"):  # the model each batch was measured on
        config["batch_models"] = spec["batch_models"]
    # the job's attempts: one, or those a stop cut short, each with the trials it measured
    # (the trials CSV's `attempt`) and the server that answered them
    config["attempts"] = attempts
    return config


def perf(
    spec: PerfSpec,
    *,
    repository: str,
    csv: str,
    trials: str,
    provenance: str,
    server_log: str,
    perf_log: str,
) -> None:
    """One scenario (offline | online): perf_analyzer over its points, ``measure.trials``
    times each (alternating), one server. ``csv``: a row per point (trials' mean and 95 %
    intervals); ``trials``: a row per trial. Each finished trial is kept beside them until
    they are written (deploybench.partial): a job stopped partway and run again measures only
    the trials missing."""
    from ..columns import TRIAL_COLUMNS
    from ..partial import PartialMeasurement, fingerprint, partial_path
    from ..perf import COLUMNS as PERF_COLUMNS
    from ..perf import (
        ExportSize,
        Measurement,
        MeasureSettings,
        Point,
        measure_point,
        measure_trials,
        output_bytes_per_sample,
        shared_memory_guard,
        summarize,
    )
    from ..perf_inputs import write_input_data
    from ..server import graceful_signals, held_signals
    from ..tails import records_tensors
    from ..transport import of_spec
    from ..triton_client import infer_triton, served_feeds, served_inputs

    scenario, run = spec["scenario"], spec["run"]
    model, model_name = spec["model"], spec["model_name"]
    family = load_family(model["module"], model["hparams"])
    settings = MeasureSettings(**spec["measure"])
    # how perf_analyzer reaches the server, as planned (a CPU device's stand-in for CUDA
    # shared memory included); each row says which it used
    transport = of_spec(spec["transport"])
    if spec["transport"].get("fallback"):
        log.warning("%s", spec["transport"]["fallback"])
    Path(perf_log).parent.mkdir(parents=True, exist_ok=True)
    identity = {
        **{k: run[k] for k in ("model", "gpu", "format", "precision")},
        "scenario": scenario,
        "protocol": transport.protocol,
        "shared_memory": transport.shared_memory,
    }
    timeout_s = _client_timeout(spec["server"])
    points = [Point(int(p["batch"]), int(p["concurrency"])) for p in spec["points"]]
    label = _perf_label(scenario, run["path"], csv)
    started = time.monotonic()
    partial = PartialMeasurement(
        partial_path(csv),
        fingerprint(spec, repository),
        scenario,
        settings.trials,
        settings.max_ci_pct,
    )
    with tempfile.TemporaryDirectory(prefix="deploybench-") as tmp:
        input_data = Path(tmp) / "data.json"
        sample, input_source = _perf_example(spec, family)
        progress.say("%s: starting tritonserver (%s) …", label, repository)
        with (
            graceful_signals(),
            ready_server(repository, server_log, spec["server"]) as server,
            contextlib.ExitStack() as stack,
        ):
            server_info = served_by(server)
            # perf_analyzer gets the inputs the served model takes (a native backend serves
            # the artifact's own inputs; see served_feeds).
            feeds = served_feeds(sample, served_inputs(server.http_url, model_name, timeout_s))
            write_input_data(feeds, input_data)
            stack.enter_context(
                shared_memory_guard(transport, list(feeds), [s.name for s in family.outputs])
            )
            outputs = infer_triton(
                server.http_url, model_name, sample, [s.name for s in family.outputs], timeout_s
            )
            # engines: per_batch (offline): each batch on the model of its own engine
            batch_models = spec.get("batch_models") or {}
            served = [model_name, *batch_models.values()]
            # the instruments and the idle baseline: the server loaded and past its first request
            beside = ScenarioInstruments(
                stack, spec.get("energy") or {}, server, repository, served, label
            )
            measurement = Measurement(
                model_name,
                server.url(transport.protocol),
                transport,
                input_data,
                settings,
                instruments=beside.instruments,
                output_bytes_per_sample=output_bytes_per_sample(outputs.values()),
                # what perf_analyzer's per-request export would hold of the tensors (tails)
                export_size=ExportSize(
                    records_tensors(sidecar.perf_analyzer_version()),
                    sum(int(array[0].size) for array in feeds.values()),
                    sum(int(output.size) for output in outputs.values()),
                ),
                batch_models=batch_models,
                log_file=Path(perf_log),
                check_server=server.check_alive,
            )
            kept = partial.open(
                spec["points"], {"host": sidecar.host(), "tritonserver": server_info}
            )
            if kept:
                progress.say(
                    "%s: attempt %d: %s of %s kept by an earlier attempt (%s); measuring the rest",
                    label,
                    partial.attempt,
                    progress.count(len(kept), "trial"),
                    len(points) * settings.trials,
                    partial.path,
                )

            def keep(row: dict[str, Any]) -> None:
                with held_signals():  # a stop waits for the line to be written whole
                    partial.add(row)

            def measure(point: Point, warm_up: bool, rate: float | None) -> dict[str, Any]:
                row = measure_point(measurement, point, warm_up=warm_up, rate=rate)
                row |= {"attempt": partial.attempt}
                # every request's latency is the trial's own: summarize pools them; the log
                # keeps their count
                log.info(
                    "%s %s: %s",
                    scenario,
                    point,
                    {k: v for k, v in row.items() if k != "latencies_ms"},
                )
                return row

            progress.say(
                "%s: measuring %s × %s …",
                label,
                progress.count(len(points), "point"),
                progress.count(settings.trials, "trial"),
            )
            trial_rows = measure_trials(
                points,
                settings.trials,
                measure,
                lambda done: progress.say("%s", progress.trial_line(label, done)),
                kept=kept,
                keep=keep,
            )
            trial_rows = beside.after_sweep(trial_rows)
    # (a trial's own values, every request's latency, stay out of the CSV)
    write_csv(
        trials,
        [identity | {k: v for k, v in row.items() if k in TRIAL_COLUMNS} for row in trial_rows],
        TRIAL_COLUMNS,
    )
    rows = [identity | row for row in summarize(trial_rows, settings.max_ci_pct)]
    write_csv(csv, rows, PERF_COLUMNS)
    unstable = [
        f"batch {r['batch']} concurrency {r['concurrency']}: {r['unstable_reason']}"
        for r in rows
        if r["unstable_reason"]
    ]
    progress.say(
        "%s: done in %s, %s, %s; %s",
        label,
        progress.format_duration(time.monotonic() - started),
        progress.count(len(rows), "point"),
        f"{len(unstable)} unstable ({'; '.join(unstable)})" if unstable else "all stable",
        csv,
    )
    config = _scenario_record(spec, beside.record, sample, input_source, partial.attempts())
    write_json(provenance, sidecar.collect(csv, config, tritonserver=server_info))
    partial.remove()


def merge_parts(
    spec: dict[str, str],
    *,
    part_csvs: list[str],
    part_trials: list[str],
    part_provenances: list[str],
    csv: str,
    trials: str,
    provenance: str,
) -> None:
    """A scenario measured in parts: its CSVs and provenance from the parts' (in order)."""
    from ..planning.parts import merge

    merge(
        part_csvs=part_csvs,
        part_trials=part_trials,
        part_provenances=part_provenances,
        csv=csv,
        trials=trials,
        provenance=provenance,
    )
    log.info("%s %s: merged %d parts", spec["run"], spec["scenario"], len(part_csvs))


def preflight(spec: PreflightSpec, *, report: str, log_report: str) -> None:
    """What the runs on one GPU need of one image, checked where they run (see
    :mod:`deploybench.preflight`). The report goes to ``log_report`` always (Snakemake keeps a
    failed job's logs, not its outputs), and to ``report`` only when no check failed."""
    import datetime as dt
    import time

    from .. import preflight as checks
    from ..server import graceful_signals

    started = time.monotonic()
    with graceful_signals():  # SIGTERM unwinds, so the server and temp files go too
        results = checks.run_checks(spec)
    ok = not any(c.status == checks.FAIL for c in results)
    log.info("preflight of %s on %s:\n%s", spec["image"], spec["gpu"], checks.table(results))
    record = {
        "gpu": spec["gpu"],
        "image": spec["image"],
        "role": spec["role"],
        "device": spec["device"],
        "ok": ok,
        "checks": [c.as_dict() for c in results],
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "duration_s": round(time.monotonic() - started, 1),
        "spec": dict(spec),
        "host": sidecar.host(),
        "container": sidecar.container(),
    }
    write_json(log_report, record)
    checks.raise_on_failure(spec, results)
    write_json(report, record)
