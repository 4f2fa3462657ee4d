"""One function per workflow step, and the entry point every rule's script calls.

A rule passes its job one spec (``params: spec=``, from :mod:`deploybench.plan`) and names its
files; :func:`run_rule` calls the rule's job (:data:`JOBS`) with the spec and, by name, the
files and the workflow config its signature takes. So each setting is named once in the plan and
once in the job that reads it, and each file once in its rule and once in its job.

Each step writes its outputs whole (or not at all) and a provenance sidecar beside each result.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import progress
from . import provenance as sidecar
from .io import write_csv, write_json, write_text
from .models import load_family
from .process import stop_with_snakemake
from .searchpaths import confine_to_image

if TYPE_CHECKING:
    from .job_specs import (
        AccuracySpec,
        CheckpointSpec,
        ConvertSpec,
        ExportSpec,
        PerfSpec,
        PlotsSpec,
        ReportSpec,
        RepositorySpec,
        SearchSpec,
    )
    from .preflight.spec import PreflightSpec

log = logging.getLogger("deploybench")
# torch's device for a run's (gpus.<g>.device): where its framework reference is computed and
# its fp16 TorchScript made (and where the canary runs its model).
FRAMEWORK_DEVICE = {"cpu": "cpu", "gpu": "cuda"}


def setup_logging(path: str | Path | None) -> None:
    """Log to the rule's log file (and stderr when there is none). Progress lines
    (:mod:`deploybench.progress`) go to stderr as well, which a ``script:`` job shares with the
    ``snakemake`` that runs it: they show in its terminal."""
    handler: logging.Handler
    terminal: list[logging.Handler] = []
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        handler = logging.FileHandler(path, mode="a")
        terminal = [progress.terminal_handler()]
    else:
        handler = logging.StreamHandler(sys.stderr)  # progress lines among the rest
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)
    progress.PROGRESS.handlers[:] = terminal  # and on to the root's handler


def make_checkpoint(spec: CheckpointSpec, *, checkpoint: str, provenance: str) -> None:
    from .checkpoint import prepare_checkpoint  # torch: imported by the jobs that need it

    model = spec["model"]
    family = load_family(model["module"], model["hparams"])
    origin = prepare_checkpoint(
        family,
        model.get("checkpoint"),
        int(model["seed"]),
        checkpoint,
        ema=bool(model.get("checkpoint_ema")),
    )
    log.info("checkpoint %s from %s", checkpoint, origin)
    write_json(provenance, sidecar.collect(checkpoint, dict(model), origin=origin))


# What an export says it does, per export format (a progress line).
EXPORT_PHASES = {
    "ts-trace": "tracing {model} ({format})",
    "ts-script": "scripting {model} ({format})",
    "onnx": "exporting {model} to ONNX",
    "tf-savedmodel": "saving {model} as a SavedModel",
}


def _model_of(path: str, fallback: str) -> str:
    """The model a workflow file belongs to (``results/<model>/...``), for progress lines."""
    parts = Path(path).parts
    return parts[parts.index("results") + 1] if "results" in parts[:-1] else fallback or "model"


def export(
    spec: ExportSpec, *, checkpoint: str, source: list[str], artifact: str, provenance: str
) -> None:
    """``source``: the export this one is made from, if the model makes it from another one."""
    from .checkpoint import read_workflow_checkpoint
    from .export import export_model

    model = spec["model"]
    made_from = source[0] if source else None
    family = load_family(model["module"], model["hparams"])
    started = time.monotonic()
    what = EXPORT_PHASES.get(spec["export_format"], "exporting {model} ({format})")
    progress.say(
        "export: %s%s → %s …",
        what.format(model=_model_of(artifact, family.name), format=spec["export_format"]),
        f" from {made_from}" if made_from else "",
        artifact,
    )
    report = export_model(
        family,
        read_workflow_checkpoint(family, checkpoint),
        spec["export_format"],
        spec["precision"],
        artifact,
        opset=spec["opset"],
        tolerance=spec["tolerance"],
        check_batch=spec["check_batch"],
        source=made_from,
    )
    log.info("exported %s; runtime check: %s", artifact, report)
    progress.say(
        "export: %s done in %s, within tolerance in %s",
        artifact,
        progress.format_duration(time.monotonic() - started),
        report.get("runtime"),
    )
    config = {
        "model": model,
        "export_format": spec["export_format"],
        "precision": spec["precision"],
        "opset": spec["opset"],
        "source": made_from,
    }
    write_json(provenance, sidecar.collect(artifact, config, verification=report))


def convert(spec: ConvertSpec, *, source: str, artifact: str, provenance: str) -> None:
    """``source``: the export, or the checkpoint for a converter that starts from the framework
    module (convert.FROM_CHECKPOINT)."""
    from .checkpoint import read_workflow_checkpoint
    from .convert import convert as run_converter

    model = spec["model"]
    family = load_family(model["module"], model["hparams"])
    started = time.monotonic()
    progress.say(
        "convert: %s of %s (%s) → %s …",
        spec["converter"],
        _model_of(artifact, family.name),
        spec["precision"],
        artifact,
    )
    record = run_converter(
        spec["converter"],
        source=Path(source),
        out=Path(artifact),
        precision=spec["precision"],
        settings=spec["settings"],
        inputs=family.inputs,
        example_inputs=lambda batch: family.example_inputs(batch, seed=0),
        export_format=spec["export_format"],
        framework_module=lambda: family.serving_module(
            read_workflow_checkpoint(family, Path(source))
        ),
        device=FRAMEWORK_DEVICE[spec["device"]],
    )
    log.info("converted %s: %s", artifact, record)
    progress.say(
        "convert: %s done in %s",
        artifact,
        progress.format_duration(time.monotonic() - started),
    )
    write_json(provenance, sidecar.collect(artifact, {"model": model}, conversion=record))


def repository(
    spec: RepositorySpec,
    *,
    artifact: str,
    artifact_provenance: str,
    signature: list[str],
    repository: str,
    batch_artifacts: list[str] | tuple[str, ...] = (),
    batch_provenances: list[str] | tuple[str, ...] = (),
) -> None:
    """``signature``: the ONNX file whose graph inputs are the ones served (native backends on
    an ONNX export), if any. With engines: per_batch (``spec['batch_models']``) the repository
    also serves a model per batch: of ``batch_artifacts`` (trt: an engine each, in the specs'
    order), else of ``artifact`` (onnx-trt: each with its own profile and engine cache)."""
    from .convert import artifact_inputs
    from .repository import (
        batch_engine_cache,
        build_repository,
        engine_cache_dir,
        model_config,
        reset_engine_cache,
    )
    from .triton_config import to_pbtxt

    batch_models = spec.get("batch_models") or []
    if batch_artifacts and len(batch_artifacts) != len(batch_models):
        raise ValueError(
            f"{repository}: {len(batch_artifacts)} per-batch artifacts for the models "
            f"{[m['name'] for m in batch_models]}"
        )
    served = [
        (artifact, artifact_provenance),
        *zip(batch_artifacts, batch_provenances, strict=True),
    ]
    for path, path_provenance in served:
        sidecar.verify(path, path_provenance)
        if "tensorrt" in spec:  # engines inside: only the TensorRT that built them loads them
            from .trt_version import check_engine

            built = check_engine(path, path_provenance, spec["tensorrt"])
            log.info("%s: built by TensorRT %s, as %s serves it", path, built, spec["tensorrt"])
    model = spec["model"]
    family = load_family(model["module"], model["hparams"])
    inputs = artifact_inputs(family.inputs, Path(signature[0])) if signature else family.inputs
    engine_cache = engine_cache_dir(Path(repository))
    builds_engine = spec["serving"].get("engine_build") is not None

    def configured(name: str, how: Any, triton: Any, cache: Path | None) -> Any:
        """The config of one model of the repository (engines: per_batch makes several)."""
        return model_config(
            name=name,
            serving=dict(how),
            triton=triton,
            device=spec["device"],
            inputs=inputs,
            outputs=family.outputs,
            artifact_name=spec["artifact_name"],
            engine_cache=cache if builds_engine else None,
        )

    config = configured(spec["model_name"], spec["serving"], spec["triton"], engine_cache)
    more = [
        (
            configured(
                entry["name"],
                entry["serving"],
                entry["triton"],
                batch_engine_cache(engine_cache, entry["name"]),
            ),
            Path(batch_artifacts[k] if batch_artifacts else artifact),
        )
        for k, entry in enumerate(batch_models)
    ]
    build_repository(config, Path(artifact), spec["artifact_name"], Path(repository), more)
    if builds_engine:  # the servers of this repository build the engine anew, once
        reset_engine_cache(engine_cache)
    for written in [config, *(c for c, _ in more)]:
        log.info("model repository %s, %s:\n%s", repository, written.name, to_pbtxt(written))


@contextlib.contextmanager
def _server(repo: str, server_log: str, server_settings: dict[str, Any]) -> Iterator[Any]:
    """A ready server of ``repo``. Where its models build a TensorRT engine while they load
    (onnx-trt), their engine cache is made and held while it starts (one build per run; see
    deploybench.repository.engine_build_lock)."""
    from .repository import engine_build_lock
    from .server import TritonServer

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


def _client_timeout(server_settings: dict[str, Any]) -> float:
    """How long a client waits for the server (longer where an engine may still be built)."""
    from .triton_client import DEFAULT_TIMEOUT_S

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
    from .accuracy import COLUMNS, TASK_COLUMNS, compare_outputs, format_failure, task_rows
    from .checkpoint import read_workflow_checkpoint
    from .errors import AccuracyError
    from .server import graceful_signals
    from .triton_client import infer_triton

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
    with graceful_signals(), _server(repository, server_log, spec["server"]) as server:
        served = infer_triton(server.http_url, model_name, feeds, list(reference), timeout_s)
        server_info = server.metadata()
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
    intervals); ``trials``: a row per trial."""
    from .columns import TRIAL_COLUMNS
    from .perf import COLUMNS as PERF_COLUMNS
    from .perf import (
        MeasureSettings,
        Point,
        inputs_digest,
        measure_point,
        measure_trials,
        output_bytes_per_sample,
        read_input_files,
        shared_memory_guard,
        summarize,
        write_input_data,
    )
    from .server import graceful_signals
    from .transport import of_spec
    from .triton_client import infer_triton, served_feeds, served_inputs

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
    with tempfile.TemporaryDirectory(prefix="deploybench-") as tmp:
        input_data = Path(tmp) / "data.json"
        # one example, made as the seed page's perf data was (Family.perf_inputs)
        # DLE's own input files (perf.input_data), or the family's
        if spec.get("input_data"):
            sample = read_input_files(Path(spec["input_data"]), family.inputs)
            input_source = f"{spec['input_data']}: raw input files (perf.input_data)"
        else:
            sample = family.perf_inputs(seed=0, dataset=spec.get("dataset_path"))
            input_source = family.perf_input_source(seed=0, dataset=spec.get("dataset_path"))
        progress.say("%s: starting tritonserver (%s) …", label, repository)
        with (
            graceful_signals(),
            _server(repository, server_log, spec["server"]) as server,
            contextlib.ExitStack() as stack,
        ):
            server_info = server.metadata()
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
            output_bytes = output_bytes_per_sample(outputs.values())

            # engines: per_batch (offline): each batch on the model of its own engine
            batch_models = spec.get("batch_models") or {}

            def measure(point: Point, warm_up: bool, rate: float | None) -> dict[str, Any]:
                row = measure_point(
                    model_name=batch_models.get(str(point.batch), model_name),
                    url=server.url(transport.protocol),
                    transport=transport,
                    point=point,
                    input_data=input_data,
                    settings=settings,
                    log_file=Path(perf_log),
                    check_server=server.check_alive,
                    output_bytes_per_sample=output_bytes,
                    warm_up=warm_up,
                    rate=rate,
                )
                log.info("%s %s: %s", scenario, point, row)
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
            )
    write_csv(trials, [identity | row for row in trial_rows], TRIAL_COLUMNS)
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
    config = {
        "scenario": scenario,
        "points": spec["points"],
        "measure": spec["measure"],
        "transport": spec["transport"],
        # what the rows were measured with: the weights (None: seeded) and the example sent
        "checkpoint": spec["model"].get("checkpoint"),
        "server_environment": spec["server"].get("environment") or {},
        "inputs": {
            "source": input_source,
            "sha256": inputs_digest(sample),
            "files": spec.get("input_data"),
        },
        **run,
    }
    if spec.get("batch_models"):  # the model each batch was measured on
        config["batch_models"] = spec["batch_models"]
    write_json(provenance, sidecar.collect(csv, config, tritonserver=server_info))


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
    from .parts import merge

    merge(
        part_csvs=part_csvs,
        part_trials=part_trials,
        part_provenances=part_provenances,
        csv=csv,
        trials=trials,
        provenance=provenance,
    )
    log.info("%s %s: merged %d parts", spec["run"], spec["scenario"], len(part_csvs))


def plots(
    spec: PlotsSpec, *, offline: str, online: str, published: str, config: dict[str, Any]
) -> None:
    """The charts of one run: ``spec["stems"]`` maps a chart name to its file stem; each is
    drawn by the function ``plots.run_chart`` registered for it."""
    import altair as alt  # the charts' (named here: the driver image must hold it)
    import pandas as pd

    from . import plots as charts
    from .report import no_published_reason, published_rows, reference_rows

    table, run_path = pd.read_csv(published), spec["run_path"]
    inputs = charts.ChartInputs(
        offline=pd.read_csv(offline),
        online=pd.read_csv(online),
        published=published_rows(config, table, run_path),
        # Nothing published for the run (a CPU run): the seed page's GPU rows beside it instead.
        reference=reference_rows(config, table, run_path),
        no_published_reason=no_published_reason(config, run_path),
    )
    built: dict[str, alt.TopLevelMixin] = charts.draw_run_charts(inputs)
    options = spec["options"]
    for name, stem in spec["stems"].items():
        # sized: a faceted chart (several configurations) takes the size per cell.
        chart = charts.sized(built[name], options["width"], options["height"])
        charts.save(chart, Path(stem))
        log.info("%s: %s", name, stem)


def report(
    spec: ReportSpec, *, published: str, markdown: str, html: str, config: dict[str, Any]
) -> None:
    """One model's page: every run's configuration, plots, tables and provenance, the
    comparison across its runs, and measured vs published per point."""
    import os

    import pandas as pd

    from . import plots as charts
    from .report import (
        between_runs_section,
        chart_image,
        publication_gate,
        published_notes,
        published_rows,
        ratios,
        read_json,
        reference_note,
        render_html,
        run_section,
        search_section,
        summary_section,
    )

    model, runs, options = spec["model"], spec["runs"], spec["options"]
    reference = pd.read_csv(published)
    here = Path(markdown).parent
    sections: list[str] = []
    comparisons: dict[str, pd.DataFrame] = {}
    notes: dict[str, list[str]] = {}  # run → what its published comparison must say
    frames: dict[str, list[pd.DataFrame]] = {"offline": [], "online": []}
    measured: dict[str, pd.DataFrame] = {}  # run → its points, in the listed order
    for run in runs:
        offline, online = pd.read_csv(run["offline"]), pd.read_csv(run["online"])
        frames["offline"].append(offline)
        frames["online"].append(online)
        measured[run["path"]] = pd.concat([offline, online], ignore_index=True)
        plots = [os.path.relpath(p, here) for p in run["plots"]]
        provenance = read_json(run["provenance"])
        provenance["config"]["accelerator"] = run["accelerator"]
        conversion = run.get("conversion")
        if conversion:  # the artifact's conversion record (TF-TRT: its engines)
            provenance["conversion"] = read_json(conversion).get("conversion")
        sections.append(run_section(run["path"], offline, online, provenance, plots))
        if run["search"]:
            search = run["search"]
            sections.append(
                search_section(
                    run["path"],
                    pd.read_csv(search["csv"]),
                    read_json(search["choice"]),
                    os.path.relpath(search["chart"], here),
                    nested=True,
                )
            )
        matched = published_rows(config, reference, run["path"])
        notes[run["path"]] = published_notes(config, reference, run["path"])
        blockers, passed = publication_gate(config, run, provenance)
        if not matched.empty and blockers:  # shown for reference, never as a ratio
            notes[run["path"]].append(
                f"Not set beside its {len(matched)} published rows: {'; '.join(blockers)}."
            )
            matched = matched.iloc[:0]
        elif not matched.empty and passed:
            notes[run["path"]].append(f"Preflight passed: {', '.join(passed)}.")
        comparisons[run["path"]] = ratios(measured[run["path"]], matched)
        # nothing published for it (a CPU run): which rows its published charts show instead
        instead = reference_note(config, reference, run["path"])
        notes[run["path"]] += [instead] if instead else []
    comparison_plots = []
    for scenario, stem in spec["stems"].items():
        chart = charts.sized(
            charts.comparison(pd.concat(frames[scenario]), scenario),
            options["width"],
            options["height"],
        )
        charts.save(chart, Path(stem))
        comparison_plots.append(os.path.relpath(f"{stem}.png", here))
    text = "\n\n".join(
        [
            f"# {model}: Triton Inference Server performance",
            "Configurations compared: " + ", ".join(r["path"] for r in runs),
            *[chart_image(p) for p in comparison_plots],
            summary_section(comparisons, notes),
            between_runs_section(measured),
            *sections,
        ]
    )
    write_text(markdown, text + "\n")
    write_text(html, render_html(text, f"{model} performance"))


def preflight(spec: PreflightSpec, *, report: str, log_report: str) -> None:
    """What the runs on one GPU need of one image, checked where they run (see
    :mod:`deploybench.preflight`). The report goes to ``log_report`` always (Snakemake keeps a
    failed job's logs, not its outputs), and to ``report`` only when no check failed."""
    import datetime as dt
    import time

    from . import preflight as checks
    from .server import graceful_signals

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


# ---------------------------------------------------------------------------- the search


def _scored(spec: SearchSpec, candidates: list[str]) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """The search's settings, and each candidate (by name) scored and as measured."""
    from .search import read_points, score, settings_from_spec, variant_of_csv

    settings = settings_from_spec(spec["settings"])
    device = spec["run"]["device"]
    scored, measured = {}, {}
    for path in candidates:
        variant = variant_of_csv(path, device)
        measured[variant.name] = read_points(path)
        scored[variant.name] = score(
            variant, measured[variant.name], settings.latency_budget_ms, settings.min_throughput
        )
    return settings, scored, measured


def search_settings(spec: SearchSpec, *, settings: str) -> None:
    """The search's settings as a file (an input of the walk's steps and of the choice)."""
    write_json(settings, spec)


def search_step(
    spec: SearchSpec, *, previous: list[str], candidates: list[str], state: str
) -> None:
    """One step of the quick walk: replayed over every candidate measured so far, it says what
    to measure next, or that the walk is done."""
    from .search import parse_variant, quick_walk

    settings, scored, _ = _scored(spec, candidates)
    walk = quick_walk(settings, parse_variant(spec["baseline"], spec["run"]["device"]), scored)
    log.info("quick walk after %s: %s", previous or "the start", walk)
    write_json(state, walk.as_dict())


def search_choice(
    spec: SearchSpec,
    *,
    candidates: list[str],
    repositories: list[str],
    walk: list[str],
    csv: str,
    points: str,
    choice: str,
    pbtxt: str,
    best: str,
) -> None:
    """The search's choice (deploybench.search.choose) over every measured candidate:
    search.csv, the points of the Pareto chart, and best/ (the chosen repository, its
    config.pbtxt, and choice.json with the gain over the baseline)."""
    import shutil

    from .io import atomic_path
    from .search import (
        POINT_COLUMNS,
        SEARCH_COLUMNS,
        candidate_rows,
        choice_record,
        choose,
        point_rows,
    )

    settings, scored, measured = _scored(spec, candidates)
    run = spec["run"]
    if spec["baseline"] not in scored:
        raise ValueError(f"{run['path']}: the search measured no baseline {spec['baseline']}")
    pool = list(scored.values())
    chosen = choose(pool, settings.latency_budget_ms, settings.min_throughput, spec["baseline"])
    baseline = scored[spec["baseline"]]
    write_csv(csv, candidate_rows(pool, chosen, baseline, run), SEARCH_COLUMNS)
    write_csv(
        points,
        point_rows(measured, chosen.name, baseline.name, settings.latency_budget_ms),
        POINT_COLUMNS,
    )
    source = Path(repositories[[Path(c).parent.name for c in candidates].index(chosen.name)])
    with atomic_path(best) as tmp:
        tmp.unlink()
        shutil.copytree(source, tmp)
    write_text(pbtxt, (source / run["model"] / "config.pbtxt").read_text())
    record = choice_record(settings, chosen, baseline, run, len(pool))
    record["walk"] = _read_json(walk[0]) if walk else None
    write_json(choice, record)
    log.info("search of %s: %s", run["path"], record)


def _read_json(path: str) -> Any:
    import json

    return json.loads(Path(path).read_text())


def search_plots(spec: dict[str, Any], *, points: str, choice: str, svg: str) -> None:
    """The search's Pareto chart: throughput against p99 latency of every candidate's points."""
    import pandas as pd

    from . import plots as charts

    budget = _read_json(choice)["latency_budget_ms"]
    chart = charts.search_pareto(pd.read_csv(points), budget)
    options = spec["options"]
    charts.save(charts.sized(chart, options["width"], options["height"]), Path(spec["stem"]))


# The job of each rule (`use rule ... as` variants included).
JOBS: dict[str, Callable[..., None]] = {
    "prepare_checkpoint": make_checkpoint,
    "export": export,
    "export_directory": export,
    "export_in_image": export,
    "export_directory_in_image": export,
    "convert": convert,
    "convert_directory": convert,
    "convert_batch": convert,
    "repository": repository,
    "accuracy": accuracy,
    "offline": perf,
    "online": perf,
    "offline_part": perf,
    "online_part": perf,
    "merge_parts": merge_parts,
    "search_repository": repository,
    "search_online": perf,
    "search_settings": search_settings,
    "search_step": search_step,
    "search_choice": search_choice,
    "search_plots": search_plots,
    "plots": plots,
    "model_report": report,
    "preflight_check": preflight,
}
# Inputs that only order the DAG; no job reads them.
DAG_ONLY_INPUTS = ("image", "preflight")


def job_arguments(
    job: Callable[..., None], rule: str, files: dict[str, Any], config: dict[str, Any]
) -> dict[str, Any]:
    """The keyword arguments of ``job``: each a file its rule names (one path, or a list for an
    input given as a list), or ``config``, the workflow's config."""
    if "config" in files:
        raise ValueError(f"rule {rule!r} names a file 'config', the name of the workflow's config")
    offered = {**files, "config": config}
    wanted = [p for p in inspect.signature(job).parameters.values() if p.kind == p.KEYWORD_ONLY]
    missing = [p.name for p in wanted if p.name not in offered]
    if missing:
        raise TypeError(
            f"rule {rule!r} names no file {missing[0]!r}, which job {job.__name__} takes; "
            f"it names: {', '.join(sorted(files))}"
        )
    return {p.name: offered[p.name] for p in wanted}


def rule_files(smk: Any) -> dict[str, Any]:
    """The named inputs, outputs and logs of the job Snakemake runs (names are unique across
    them); a list given for one name (a function's inputs, maybe none) stays a list."""
    files: dict[str, Any] = {}
    for kind in (smk.input, smk.output, smk.log):
        for name, value in kind.items():
            if kind is smk.input and name in DAG_ONLY_INPUTS:
                continue
            if name in files:
                raise ValueError(f"rule {smk.rule!r} names {name!r} twice")
            files[name] = [str(v) for v in value] if isinstance(value, list) else str(value)
    return files


def run_rule(smk: Any) -> None:
    """Entry point of every rule's script: the rule's job, called with its spec and files, logging
    to the rule's first log."""
    if smk.rule not in JOBS:
        raise ValueError(f"no job for rule {smk.rule!r}; valid choices: {', '.join(sorted(JOBS))}")
    setup_logging(smk.log[0] if smk.log else None)
    try:
        # In a container: nothing more from the driver's environment than Snakemake itself.
        confine_to_image()
        # Killed outright, Snakemake cannot stop its jobs: each stops itself when it sees it die.
        stop_with_snakemake()
        job = JOBS[smk.rule]
        job(smk.params.spec, **job_arguments(job, smk.rule, rule_files(smk), smk.config))
    except BaseException as error:
        # Snakemake sends whoever reads of the failure to the log file: it says why there too
        # (stderr gets the traceback as ever, and the job the same exit status).
        if smk.log:
            _log_failure(smk.rule, error)
        raise


def _log_failure(rule: str, error: BaseException) -> None:
    """The exception that ends a job, in its log: a stop signal in a line, an error with its
    traceback."""
    from .server import Terminated

    if isinstance(error, KeyboardInterrupt):
        log.error("rule %s stopped by Ctrl-C (SIGINT)", rule)
    elif isinstance(error, Terminated):
        log.error("rule %s stopped by SIGTERM", rule)
    elif isinstance(error, SystemExit):
        log.error("rule %s exited with status %s", rule, error.code)
    else:
        log.error("rule %s failed", rule, exc_info=error)
