"""One function per workflow step; ``scripts/`` call these with the rule's inputs and params.

Each step writes its outputs whole (or not at all) and a provenance sidecar beside each result.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import tempfile
from pathlib import Path
from typing import Any

from . import provenance
from .io import write_csv, write_json, write_text
from .models import load_family

log = logging.getLogger("deploybench")


def setup_logging(path: str | Path | None) -> None:
    """Log to the rule's log file (and stderr when there is none)."""
    handler: logging.Handler
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        handler = logging.FileHandler(path, mode="a")
    else:
        handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)


def make_checkpoint(*, model: dict[str, Any], out: str, provenance_out: str) -> None:
    from .checkpoint import prepare_checkpoint  # torch: imported by the jobs that need it

    family = load_family(model["module"], model["hparams"])
    origin = prepare_checkpoint(
        family,
        model.get("checkpoint"),
        int(model["seed"]),
        out,
        ema=bool(model.get("checkpoint_ema")),
    )
    log.info("checkpoint %s from %s", out, origin)
    write_json(provenance_out, provenance.collect(out, model, origin=origin))


def export(
    *,
    model: dict[str, Any],
    checkpoint: str,
    source: str | None,
    export_format: str,
    precision: str,
    opset: int,
    tolerance: dict[str, dict[str, float]],
    check_batch: int,
    out: str,
    provenance_out: str,
) -> None:
    from .checkpoint import read_workflow_checkpoint
    from .export import export_model

    family = load_family(model["module"], model["hparams"])
    report = export_model(
        family,
        read_workflow_checkpoint(family, checkpoint),
        export_format,
        precision,
        out,
        opset=opset,
        tolerance=tolerance,
        check_batch=check_batch,
        source=source,
    )
    log.info("exported %s; runtime check: %s", out, report)
    config = {
        "model": model,
        "export_format": export_format,
        "precision": precision,
        "opset": opset,
        "source": source,
    }
    write_json(provenance_out, provenance.collect(out, config, verification=report))


def convert(
    *,
    model: dict[str, Any],
    converter: str,
    settings: dict[str, Any],
    precision: str,
    source: str,
    out: str,
    provenance_out: str,
) -> None:
    from .convert import convert as run_converter

    family = load_family(model["module"], model["hparams"])
    record = run_converter(
        converter,
        source=Path(source),
        out=Path(out),
        precision=precision,
        settings=settings,
        inputs=family.inputs,
        example_inputs=lambda batch: family.example_inputs(batch, seed=0),
    )
    log.info("converted %s: %s", out, record)
    write_json(provenance_out, provenance.collect(out, {"model": model}, conversion=record))


def repository(
    *,
    model: dict[str, Any],
    model_name: str,
    serving: dict[str, Any],
    triton: dict[str, Any],
    device: str,
    artifact: str,
    artifact_name: str,
    artifact_provenance: str,
    out: str,
    signature: str | None = None,
) -> None:
    """``signature``: an ONNX file whose graph inputs are the ones served (native backends)."""
    from .convert import artifact_inputs
    from .repository import build_repository, model_config

    provenance.verify(artifact, artifact_provenance)
    family = load_family(model["module"], model["hparams"])
    inputs = artifact_inputs(family.inputs, Path(signature)) if signature else family.inputs
    config = model_config(
        name=model_name,
        serving=serving,
        triton=triton,
        device=device,
        inputs=inputs,
        outputs=family.outputs,
        artifact_name=artifact_name,
    )
    build_repository(config, Path(artifact), artifact_name, Path(out))
    log.info("model repository %s:\n%s", out, config.to_pbtxt())


def _server(repo: str, server_log: str, server_settings: dict[str, Any]) -> Any:
    from .server import TritonServer

    return TritonServer(
        Path(repo),
        Path(server_log),
        startup_timeout_s=float(server_settings.get("startup_timeout_s", 120)),
        shutdown_timeout_s=float(server_settings.get("shutdown_timeout_s", 30)),
    )


def accuracy(
    *,
    model: dict[str, Any],
    model_name: str,
    checkpoint: str,
    repo: str,
    settings: dict[str, Any],
    server_settings: dict[str, Any],
    run: dict[str, Any],
    out: str,
    task_out: str,
    provenance_out: str,
    server_log: str,
) -> None:
    from .accuracy import (
        COLUMNS,
        TASK_COLUMNS,
        AccuracyError,
        compare_outputs,
        format_failure,
        infer_triton,
        task_rows,
    )
    from .checkpoint import read_workflow_checkpoint
    from .server import graceful_signals

    family = load_family(model["module"], model["hparams"])
    batch = int(settings["batch_size"])
    feeds = family.example_inputs(batch, int(settings["seed"]))
    module = family.serving_module(read_workflow_checkpoint(family, checkpoint))
    reference = family.framework_outputs(module, feeds)

    task = settings.get("task") or {}
    with graceful_signals(), _server(repo, server_log, server_settings) as server:
        served = infer_triton(server.http_url, model_name, feeds, list(reference))
        server_info = server.metadata()
        rows = compare_outputs(reference, served, settings["tolerance"], batch)
        for row in rows:
            log.info("accuracy %s", row)
        if not all(r["passed"] for r in rows):
            raise AccuracyError(
                f"{run['path']}: Triton's output differs from the framework: {format_failure(rows)}"
            )
        metrics = task_rows(
            family,
            task,
            lambda batch_feeds: infer_triton(
                server.http_url, model_name, batch_feeds, [s.name for s in family.outputs]
            ),
        )
    for metric in metrics:
        log.info("task metric %s", metric)
    failed = [m for m in metrics if m["passed"] is False]
    if failed:
        raise AccuracyError(f"{run['path']}: task metric below its threshold: {failed}")
    write_csv(out, rows, COLUMNS)
    write_csv(task_out, metrics, TASK_COLUMNS)
    write_json(
        provenance_out,
        provenance.collect(out, {"accuracy": settings, **run}, tritonserver=server_info),
    )


def perf(
    *,
    scenario: str,
    model: dict[str, Any],
    model_name: str,
    repo: str,
    points: list[dict[str, int]],
    measure: dict[str, Any],
    server_settings: dict[str, Any],
    run: dict[str, Any],
    out: str,
    provenance_out: str,
    server_log: str,
    perf_log: str,
) -> None:
    from .accuracy import infer_triton, served_feeds, served_inputs
    from .perf import COLUMNS as PERF_COLUMNS
    from .perf import (
        SCENARIOS,
        MeasureSettings,
        Point,
        measure_point,
        output_bytes_per_sample,
        shared_memory_lock,
        write_input_data,
    )
    from .server import graceful_signals

    family = load_family(model["module"], model["hparams"])
    settings = MeasureSettings(**measure)
    Path(perf_log).parent.mkdir(parents=True, exist_ok=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="deploybench-") as tmp:
        input_data = Path(tmp) / "data.json"
        sample = family.example_inputs(1, seed=0)
        with (
            graceful_signals(),
            _server(repo, server_log, server_settings) as server,
            contextlib.ExitStack() as stack,
        ):
            server_info = server.metadata()
            # perf_analyzer gets the inputs the served model takes (a native backend serves
            # the artifact's own inputs; see served_feeds).
            feeds = served_feeds(sample, served_inputs(server.http_url, model_name))
            write_input_data(feeds, input_data)
            if SCENARIOS[scenario].shared_memory == "system":
                stack.enter_context(
                    shared_memory_lock(list(feeds), [s.name for s in family.outputs])
                )
            outputs = infer_triton(
                server.http_url, model_name, sample, [s.name for s in family.outputs]
            )
            output_bytes = output_bytes_per_sample(outputs.values())
            for p in points:
                point = Point(int(p["batch"]), int(p["concurrency"]))
                row = measure_point(
                    model_name=model_name,
                    url=server.url(SCENARIOS[scenario].protocol),
                    scenario=SCENARIOS[scenario],
                    point=point,
                    input_data=input_data,
                    settings=settings,
                    log_file=Path(perf_log),
                    check_server=server.check_alive,
                    output_bytes_per_sample=output_bytes,
                )
                log.info("%s %s: %s", scenario, point, row)
                rows.append(
                    {
                        **{k: run[k] for k in ("model", "gpu", "format", "precision")},
                        "scenario": scenario,
                        **row,
                    }
                )
    write_csv(out, rows, PERF_COLUMNS)
    config = {"scenario": scenario, "points": points, "measure": measure, **run}
    write_json(provenance_out, provenance.collect(out, config, tritonserver=server_info))


def plots(
    *,
    run_path: str,
    offline: str,
    online: str,
    published: str,
    config: dict[str, Any],
    options: dict[str, Any],
    outputs: dict[str, str],
) -> None:
    """The charts of one run: ``outputs`` maps a chart name to its file stem."""
    import pandas as pd

    from . import plots as charts
    from .report import published_rows

    offline_rows, online_rows = pd.read_csv(offline), pd.read_csv(online)
    reference = published_rows(config, pd.read_csv(published), run_path)
    built = {
        "offline_throughput": charts.offline_throughput(offline_rows),
        "offline_latency": charts.offline_latency(offline_rows),
        "online_latency_breakdown": charts.online_latency_breakdown(online_rows),
        "online_throughput_latency": charts.online_throughput_latency(online_rows),
        "published_offline": charts.published_overlay(offline_rows, reference, "offline"),
        "published_online": charts.published_overlay(online_rows, reference, "online"),
    }
    for name, stem in outputs.items():
        chart = built[name].properties(width=options["width"], height=options["height"])
        charts.save(chart, Path(stem))
        log.info("%s: %s", name, stem)


def report(
    *,
    model: str,
    runs: list[dict[str, Any]],
    published: str,
    config: dict[str, Any],
    options: dict[str, Any],
    markdown_out: str,
    html_out: str,
    comparison_stems: dict[str, str],
) -> None:
    """One model's page: every run's configuration, plots, tables and provenance, the
    comparison across its runs, and measured vs published per point."""
    import os

    import pandas as pd

    from . import plots as charts
    from .report import (
        published_rows,
        ratios,
        read_json,
        render_html,
        run_section,
        summary_section,
    )

    reference = pd.read_csv(published)
    here = Path(markdown_out).parent
    sections: list[str] = []
    comparisons: dict[str, pd.DataFrame] = {}
    frames: dict[str, list[pd.DataFrame]] = {"offline": [], "online": []}
    for run in runs:
        offline, online = pd.read_csv(run["offline"]), pd.read_csv(run["online"])
        frames["offline"].append(offline)
        frames["online"].append(online)
        plots = [os.path.relpath(p, here) for p in run["plots"]]
        provenance = read_json(run["provenance"])
        provenance["config"]["accelerator"] = run["accelerator"]
        sections.append(run_section(run["path"], offline, online, provenance, plots))
        matched = published_rows(config, reference, run["path"])
        comparisons[run["path"]] = ratios(pd.concat([offline, online]), matched)
    comparison_plots = []
    for scenario, stem in comparison_stems.items():
        chart = charts.comparison(pd.concat(frames[scenario]), scenario).properties(
            width=options["width"], height=options["height"]
        )
        charts.save(chart, Path(stem))
        comparison_plots.append(os.path.relpath(f"{stem}.png", here))
    text = "\n\n".join(
        [
            f"# {model}: Triton Inference Server performance",
            "Configurations compared: " + ", ".join(r["path"] for r in runs),
            *[f"![{Path(p).stem}]({p})" for p in comparison_plots],
            summary_section(comparisons),
            *sections,
        ]
    )
    write_text(markdown_out, text + "\n")
    write_text(html_out, render_html(text, f"{model} performance"))
