"""fp16 accuracy, measured: every fp16 artifact the workflow makes that runs on a CPU, against
the fp32 framework, over the accuracy step's example inputs of the model's ``cpu`` sizing.

    .venv/bin/python benchmarks/fp16_accuracy.py [--models tft bert ...] \\
        [--configfile config/smoke.yaml] [--out benchmarks/results/fp16] [--batch N]

For each model (one subprocess each, one after the other, so that memory is freed between
them), with the workflow's own functions:

* the checkpoint as the ``prepare_checkpoint`` job makes it (with no configured checkpoint, the
  seeded-random initialisation: trained weights may give other figures);
* the fp32 framework's outputs (the reference) for the example inputs of the accuracy step at
  the ``cpu`` sizing (its ``batch_size`` and ``seed``; ``--batch N``: N samples instead, run
  ``batch_size`` at a time);
* every fp16 artifact of the model's configured formats whose converter runs without a GPU:
  ``onnx-fp16`` (``convert.onnx_fp16``, run in onnxruntime on CPU) and ``torchscript-fp16``
  (``convert.torchscript_fp16`` on ``device="cpu"``, run in TorchScript); the exports they are
  made from by ``export.export_model`` (with its runtime check). A conversion that fails is a
  row saying so. A model whose configured fp16 formats are all TorchScript also gets
  ``onnx fp16 (proxy)``: the ONNX export converted the same way, to measure fp16 where its own
  artifact cannot be made here. ``tensorrt`` and ``tf-trt`` need a GPU and are listed only;
* ``framework fp16 (eager)``: the framework model itself computing in float16 on CPU (PyTorch:
  ``module.half()``; Keras: built under the float16 dtype policy), an estimate of what fp16
  arithmetic does (onnxruntime's CPU computes most fp16 nodes in fp32), not an artifact; for
  3-D convolutions (nnU-Net), which PyTorch runs in float16 on CPU only by a slow path,
  ``framework fp16 (emulated)``: float32 kernels with every layer's weights, inputs and outputs
  rounded to float16;
* per output, :func:`deploybench.accuracy.measure` (max abs/rel error and the model's own
  quantities: arg-max flips, moved durations) and the verdict of the accuracy step at the
  configured fp16 tolerance (``accuracy.precision_tolerance.fp16``) by
  :func:`deploybench.accuracy.compare_outputs`;
* for ONNX artifacts, which kernels onnxruntime ran in fp16 (its profile at batch 1): where the
  CPU has no fp16 kernel it inserts casts and computes in fp32.

Each model's figures go to ``OUT/models/<model>.json`` as it is done; then
``OUT/fp16_accuracy.csv`` (a row per model x artifact x output) and ``OUT/fp16_accuracy.md``
(the tables) are written from every model measured into OUT with the same ``--configfile``, so
``--models nnunet`` measures nnU-Net again and keeps the other models' rows. It prints each
model's timing and peak memory.
Exit status 1 if a model's measurement failed (a conversion that fails is a row, not a failure).
"""

from __future__ import annotations

import argparse
import collections
import csv
import datetime
import json
import os
import platform
import re
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
SCHEMA = REPO / "config" / "schema" / "config.schema.yaml"
# Converters that run without a GPU here (TorchScript fp16 is made on device="cpu").
CPU_CONVERTERS = ("onnx-fp16", "torchscript-fp16")
RUNTIME = {"onnx-fp16": "onnxruntime", "torchscript-fp16": "torchscript"}
# Why a conversion is known to fail on CPU (said beside its error).
KNOWN_FAILURES: dict[str, str] = {}
# How long a TorchScript fp16 conversion may take here (TFT's: seconds).
CONVERT_TIMEOUT_S = 600
PROXY = "onnx fp16 (proxy)"
EAGER = "framework fp16 (eager)"
EMULATED = "framework fp16 (emulated)"
COLUMNS = [
    "model",
    "artifact",
    "formats",
    "converter",
    "runtime",
    "status",
    "batch",
    "seed",
    "output",
    "elements",
    "max_abs_err",
    "max_rel_err",
    "quantities",
    "atol",
    "rtol",
    "mismatch_fraction",
    "mismatched",
    "passed",
    "ort_kernels",
    "note",
]


# ---------------------------------------------------------------------------- config


def load_config(overlay: Path | None) -> dict[str, Any]:
    """config/config.yaml with ``overlay`` layered over it (as ``--configfile`` does), checked
    against the schema (defaults filled in)."""
    from snakemake.utils import validate

    from deploybench.planning.workflow_config import deep_merge, load_yaml

    config = load_yaml(REPO / "config" / "config.yaml")
    if overlay is not None:
        config = deep_merge(config, load_yaml(overlay))
    validate(config, str(SCHEMA))
    return dict(config)


def cpu_plan(config: dict[str, Any], model: str) -> Any:
    """The model's fp32 run on the ``cpu`` gpu (its sizing's accuracy settings)."""
    from deploybench.planning.run_plan import plan_run

    cpu = config["gpus"]["cpu"]
    formats = [f for f, p in config["models"][model]["formats"].items() if "fp32" in p]
    fmt = next(f for f in formats if f in cpu["formats"])
    return plan_run(config, model, "cpu", fmt, "fp32")


def fp16_plans(config: dict[str, Any], model: str) -> list[Any]:
    """One run plan per configured fp16 format of the model (on the first GPU that runs it)."""
    from deploybench.planning.run_plan import plan_run

    plans = []
    for fmt, precisions in config["models"][model]["formats"].items():
        if "fp16" not in precisions:
            continue
        gpu = next(
            (
                g
                for g, s in config["gpus"].items()
                if fmt in s["formats"] and "fp16" in s["precisions"]
            ),
            None,
        )
        if gpu is not None:
            plans.append(plan_run(config, model, gpu, fmt, "fp16"))
    return plans


# ---------------------------------------------------------------------------- one model


def short_error(error: BaseException, tmp: Path) -> str:
    """An error in a line: its last ``SomeError: ...`` line (TorchScript's come after a long
    serialized traceback), else its first, without onnxruntime's "Load model from <file>
    failed:" or this run's temporary paths."""
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    named = [line for line in lines if re.match(r"\w*(Error|Exception)\b", line)]
    text = named[-1] if named else lines[0] if lines else type(error).__name__
    text = text.split(" failed:", 1)[-1].replace(f"{tmp}/", "")
    return text if len(text) <= 240 else text[:237] + "..."


def ort_kernels(path: Path, feeds: dict[str, np.ndarray], tmp: Path) -> str:
    """Which kernels onnxruntime (CPU) runs in fp16 for the artifact: a profile of one call."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.enable_profiling = True
    options.profile_file_prefix = str(tmp / "ort-profile")
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    session.run(None, {i.name: feeds[i.name] for i in session.get_inputs()})
    events = json.loads(Path(session.end_profiling()).read_text())
    counts: collections.Counter[str] = collections.Counter()
    micros: collections.Counter[str] = collections.Counter()
    fp32_ops: collections.Counter[str] = collections.Counter()
    for event in events:
        if event.get("cat") != "Node" or not event["name"].endswith("_kernel_time"):
            continue
        args = event["args"]
        if args["op_name"] == "Cast":
            continue
        types = {t for shape in args.get("input_type_shape", []) for t in shape}
        kind = "fp16" if "float16" in types else "fp32" if "float" in types else "other"
        counts[kind] += 1
        micros[kind] += int(event["dur"])
        if kind == "fp32":
            fp32_ops[args["op_name"]] += 1
    float_time = micros["fp16"] + micros["fp32"]
    top = ", ".join(f"{op} {n}" for op, n in fp32_ops.most_common(4))
    share = micros["fp16"] / float_time if float_time else 0.0
    return (
        f"fp16 {counts['fp16']}, fp32 {counts['fp32']} of {sum(counts.values())} kernels "
        f"(casts aside); {share:.0%} of float kernel time in fp16; fp32: {top or 'none'}"
    )


def measure_model(
    config: dict[str, Any], model: str, batch_override: int | None, tmp: Path
) -> dict[str, Any]:
    """Everything this benchmark reports of one model (run in its own process)."""
    from deploybench.accuracy import compare_outputs, measure
    from deploybench.convert import SERVED_TYPES, onnx_fp16
    from deploybench.errors import AccuracyError
    from deploybench.export import prepare_model
    from deploybench.planning.conversion_plan import CONVERSION_DEFAULTS
    from deploybench.planning.export_plan import plan_export
    from deploybench.runtime import load_runner

    timings: dict[str, float] = {}
    clock = time.monotonic()

    def lap(step: str) -> None:
        nonlocal clock
        now = time.monotonic()
        timings[step] = round(now - clock, 1)
        clock = now

    plan = cpu_plan(config, model)
    identity = plan.export.model.identity
    batch = int(batch_override or plan.accuracy["batch_size"])
    seed = int(plan.accuracy["seed"])
    plans = fp16_plans(config, model)
    if not plans:
        raise SystemExit(f"{model}: no fp16 format configured")
    tolerance = {k: dict(v) for k, v in plans[0].accuracy["tolerance"].items()}

    # What to measure: (label, formats, converter, export format, converter settings)
    artifacts: dict[tuple[str, str], dict[str, Any]] = {}
    gpu_only = []
    for run in plans:
        conversion = run.conversion
        if conversion is None or conversion.converter not in CPU_CONVERTERS:
            made_by = conversion.converter if conversion else "export"
            gpu_only.append(f"{run.format} fp16 ({made_by}): needs a GPU, not measured")
            continue
        key = (conversion.converter, run.export.format)
        entry = artifacts.setdefault(
            key,
            {
                "artifact": f"{run.export.format} fp16",
                "formats": [],
                "converter": conversion.converter,
                "export": run.export.format,
                "settings": dict(conversion.settings),
            },
        )
        entry["formats"].append(run.format)
    configured = config["models"][model]["formats"]
    if ("onnx-fp16", "onnx") not in artifacts and "onnx" in configured:
        artifacts[("onnx-fp16", "onnx")] = {
            "artifact": PROXY,
            "formats": [],
            "converter": "onnx-fp16",
            "export": "onnx",
            "settings": {
                **CONVERSION_DEFAULTS["onnx-fp16"],
                **(config["models"][model].get("convert") or {}).get("onnx-fp16", {}),
            },
        }

    # The checkpoint and the exports, as the workflow's jobs make them.
    prepared = prepare_model(identity, tmp / plan.export.model.checkpoint_file)
    family, checkpoint = prepared.family, prepared.checkpoint
    lap("checkpoint")
    exports: dict[str, Path] = {}

    def exported(fmt: str) -> Path:
        if fmt not in exports:
            export_plan = plan_export(config, model, fmt, "fp32")
            source = exported(export_plan.source) if export_plan.source else None
            out = tmp / "export" / fmt / export_plan.artifact
            out.parent.mkdir(parents=True, exist_ok=True)
            prepared.export(export_plan.spec(), out, source)
            exports[fmt] = out
            lap(f"export {fmt}")
        return exports[fmt]

    for entry in artifacts.values():  # first, while no reference is held (tf2onnx: ~8 GB)
        exported(entry["export"])
    module = family.serving_module(checkpoint)
    feeds = family.example_inputs(batch, seed)
    chunk = int(plan.accuracy["batch_size"])  # the accuracy step's batch, whatever --batch is
    reference = in_chunks(lambda part: family.framework_outputs(module, part), feeds, chunk)
    lap("fp32 reference")
    input_names = [s.name for s in family.inputs]
    output_names = [s.name for s in family.outputs]

    def outcome(actual: dict[str, np.ndarray] | None, status: str, **extra: Any) -> dict[str, Any]:
        rows = []
        if actual is not None:
            measured = measure(reference, actual, family)
            try:
                verdicts = {
                    r["output"]: r
                    for r in compare_outputs(reference, actual, tolerance, batch, family)
                }
            except AccuracyError as error:
                verdicts, status = {}, f"measured; the accuracy step would fail: {error}"
            for name in reference:
                verdict = verdicts.get(name, {})
                rows.append(
                    {
                        "output": name,
                        # compared elements: both sides' where a frame count moved
                        "elements": verdict.get("elements", int(np.size(reference[name]))),
                        "figures": measured[name],
                        "mismatched": verdict.get("mismatched", ""),
                        "passed": verdict.get("passed", False),
                    }
                )
        return {"status": status, "outputs": rows, **extra}

    results = []
    for entry in artifacts.values():
        converter = entry["converter"]
        out = tmp / "convert" / converter / exported(entry["export"]).name
        out.parent.mkdir(parents=True, exist_ok=True)
        record = {k: entry[k] for k in ("artifact", "converter")}
        record["formats"] = ", ".join(entry["formats"]) or "none configured"
        record["runtime"] = RUNTIME[converter]
        try:
            if converter == "onnx-fp16":
                blocked = list(entry["settings"].get("op_block_list") or [])
                clipped = onnx_fp16(exports[entry["export"]], out, op_block_list=blocked)
                if clipped:
                    record["note"] = f"weights clipped to ±1e4: {', '.join(clipped)}"
            else:
                # from the checkpoint, halved, then traced/scripted, as the convert job does
                in_subprocess(
                    torchscript_fp16_cpu,
                    plan.export.model.identity_spec(),
                    prepared.checkpoint_file,
                    entry["export"],
                    out,
                )
        except Exception as error:  # noqa: BLE001 - the row says what failed
            known = f"; {KNOWN_FAILURES[converter]}" if converter in KNOWN_FAILURES else ""
            results.append(
                {**record, **outcome(None, f"not made here: {short_error(error, tmp)}{known}")}
            )
            lap(f"convert {record['artifact']} (failed)")
            continue
        lap(f"convert {record['artifact']}")
        try:
            runner = load_runner(
                RUNTIME[converter], out, input_names=input_names, output_names=output_names
            )
            served = {  # as a client sends them to the artifact's signature
                name: array.astype(
                    SERVED_TYPES.get(converter, {}).get(str(array.dtype), array.dtype)
                )
                for name, array in feeds.items()
            }
            actual = in_chunks(named_outputs(runner), served, chunk)
            del runner
        except Exception as error:  # noqa: BLE001 - the row says what failed
            results.append({**record, **outcome(None, f"did not run: {short_error(error, tmp)}")})
            lap(f"run {record['artifact']} (failed)")
            continue
        lap(f"run {record['artifact']}")
        kernels = ""
        if converter == "onnx-fp16":
            one = {k: v[:1] for k, v in feeds.items()}
            kernels = ort_kernels(out, one, tmp)
            lap(f"profile {record['artifact']}")
        results.append({**record, **outcome(actual, "measured", ort_kernels=kernels)})

    emulated = family.framework == "pytorch" and has_conv3d(module)
    how = {
        "pytorch": ("module.half()", "torch (eager)"),
        "tensorflow": ("float16 policy", "keras"),
        "emulated": ("float16 rounding per layer (no fast float16 Conv3d on CPU)", "torch"),
    }["emulated" if emulated else family.framework]
    name = EMULATED if emulated else EAGER
    record = {"artifact": name, "formats": "an estimate", "converter": how[0], "runtime": how[1]}
    try:
        run = emulated_fp16(module, family) if emulated else eager_fp16(module, family, checkpoint)
        actual = in_chunks(run, feeds, chunk)
        results.append({**record, **outcome(actual, "measured")})
    except Exception as error:  # noqa: BLE001 - the row says what failed
        results.append({**record, **outcome(None, f"did not run: {short_error(error, tmp)}")})
    lap(name)

    return {
        "model": model,
        "batch": batch,
        "seed": seed,
        "origin": prepared.origin,
        "tolerance": tolerance,
        "gpu_only": gpu_only,
        "artifacts": results,
        "timings": timings,
        "peak_rss_mb": peak_rss_mb(),
    }


Outputs = dict[str, np.ndarray]


def eager_fp16(
    module: Any, family: Any, checkpoint: dict[str, Any]
) -> Callable[[Outputs], Outputs]:
    """The framework model computing in float16 on CPU (float32 inputs cast to float16, float16
    outputs back to float32): fp16 arithmetic as a GPU's kernels do it, without a GPU. PyTorch:
    the module itself, ``half()`` (in place: the last use of the module); Keras: the network
    built again under the float16 dtype policy, with the checkpoint's weights."""

    def half(feeds: Outputs) -> Outputs:
        return {k: v.astype(np.float16) if v.dtype == np.float32 else v for k, v in feeds.items()}

    def single(outputs: Outputs) -> Outputs:
        return {k: v.astype(np.float32) if v.dtype == np.float16 else v for k, v in outputs.items()}

    if family.framework == "tensorflow":
        import keras

        keras.config.set_dtype_policy("float16")
        try:
            model = family.serving_module(checkpoint)
        finally:
            keras.config.set_dtype_policy("float32")
        return lambda feeds: single(family.framework_outputs(model, half(feeds)))
    module.half()
    return lambda feeds: single(family.framework_outputs(module, half(feeds)))


def named_outputs(runner: Any) -> Callable[[Outputs], Outputs]:
    return lambda feeds: dict(zip(runner.output_names, runner(feeds), strict=True))


def has_conv3d(module: Any) -> bool:
    import torch

    return any(isinstance(m, torch.nn.Conv3d) for m in module.modules())


def emulated_fp16(module: Any, family: Any) -> Callable[[Outputs], Outputs]:
    """float16 arithmetic emulated in float32: weights, inputs and every layer's output rounded to
    float16, products summed in float32 (as a GPU's fp16 convolutions accumulate). For 3-D
    convolutions, which PyTorch runs in float16 on CPU only by a slow path (tens of minutes and
    ~8 GB for one 128³ nnU-Net volume). Rounds the module's weights in place."""
    import torch

    def rounded(value: Any) -> Any:
        if isinstance(value, torch.Tensor) and value.dtype == torch.float32:
            return value.half().float()
        if isinstance(value, tuple):
            return tuple(rounded(v) for v in value)
        return value

    with torch.no_grad():
        for tensor in [*module.parameters(), *module.buffers()]:
            if tensor.dtype == torch.float32:
                tensor.copy_(rounded(tensor))
    for leaf in (m for m in module.modules() if not list(m.children())):
        leaf.register_forward_hook(lambda _m, _i, out: rounded(out))

    def run(feeds: Outputs) -> Outputs:
        fp16_valued = {
            k: v.astype(np.float16).astype(np.float32) if v.dtype == np.float32 else v
            for k, v in feeds.items()
        }
        return family.framework_outputs(module, fp16_valued)

    return run


def in_chunks(run: Callable[[Outputs], Outputs], feeds: Outputs, size: int) -> Outputs:
    """``run`` over ``feeds`` ``size`` samples at a time, the outputs joined. An output whose
    data-dependent size differs between chunks (FastPitch's frames) is padded with zeros, as the
    model pads a batch's shorter utterances."""
    total = len(next(iter(feeds.values())))
    parts = [run({k: v[i : i + size] for k, v in feeds.items()}) for i in range(0, total, size)]
    joined = {}
    for name in parts[0]:
        arrays = [p[name] for p in parts]
        shape = np.max([a.shape for a in arrays], axis=0)
        padded = [
            np.pad(a, [(0, 0)] + [(0, n - d) for n, d in zip(shape[1:], a.shape[1:], strict=True)])
            for a in arrays
        ]
        joined[name] = np.concatenate(padded)
    return joined


def torchscript_fp16_cpu(
    identity: dict[str, Any], checkpoint_file: Path, export_format: str, out: Path
) -> None:
    """``convert.torchscript_fp16`` as the convert job calls it, on ``device="cpu"``."""
    from deploybench.checkpoint import read_workflow_checkpoint
    from deploybench.convert import torchscript_fp16
    from deploybench.models import load_family

    family = load_family(identity["module"], dict(identity["hparams"]))
    module = family.serving_module(read_workflow_checkpoint(family, checkpoint_file))
    feeds = family.example_inputs(1, seed=0)  # as the convert job traces it
    torchscript_fp16(module, out, feeds, script=export_format == "ts-script", device="cpu")


def in_subprocess(function: Any, *args: Any) -> None:
    """``function(*args)`` in a process of its own, given ``CONVERT_TIMEOUT_S``: the TorchScript
    fp16 conversion runs the model in float16 on CPU, which for 3-D convolutions at a large
    size is slow. Its error is raised here as a RuntimeError."""
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    errors = context.Queue()
    proc = context.Process(target=_report_errors, args=(errors, function, *args))
    proc.start()
    proc.join(CONVERT_TIMEOUT_S)
    if proc.is_alive():
        proc.kill()
        proc.join()
        raise TimeoutError(
            f"did not finish in {CONVERT_TIMEOUT_S} s on CPU (the trace runs the model in float16)"
        )
    if proc.exitcode:
        raise RuntimeError(errors.get() if not errors.empty() else f"exit status {proc.exitcode}")


def _report_errors(errors: Any, function: Any, *args: Any) -> None:
    try:
        function(*args)
    except Exception as error:
        errors.put(str(error))
        raise SystemExit(1) from error


def peak_rss_mb() -> dict[str, float]:
    """This process's peak RSS, and that of its largest finished child (tf2onnx, the conversion
    subprocess), in MB; a child's counts the pages it shared with this process after fork."""
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return {"process": round(own), "largest_child": round(children)}


# ---------------------------------------------------------------------------- tables


def csv_rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    from deploybench.accuracy import format_quantities

    rows = []
    for artifact in result["artifacts"]:
        base = {
            "model": result["model"],
            **{k: artifact[k] for k in ("artifact", "formats", "converter", "runtime", "status")},
            "batch": result["batch"],
            "seed": result["seed"],
            "ort_kernels": artifact.get("ort_kernels", ""),
            "note": artifact.get("note", ""),
        }
        if not artifact["outputs"]:
            rows.append(base)
        for out in artifact["outputs"]:
            tol = result["tolerance"].get(out["output"], {})
            rows.append(
                {
                    **base,
                    "output": out["output"],
                    "elements": out["elements"],
                    "max_abs_err": out["figures"]["max_abs_err"],
                    "max_rel_err": out["figures"]["max_rel_err"],
                    "quantities": format_quantities(out["figures"]),
                    "atol": tol.get("atol", ""),
                    "rtol": tol.get("rtol", ""),
                    "mismatch_fraction": tol.get("mismatch_fraction", ""),
                    "mismatched": out["mismatched"],
                    "passed": out["passed"],
                }
            )
    return rows


def number(value: Any) -> str:
    if value in ("", None):
        return ""
    return f"{float(value):.3g}"


def tolerance_text(row: dict[str, Any]) -> str:
    text = f"atol {number(row['atol'])}, rtol {number(row['rtol'])}"
    if row.get("mismatch_fraction") not in ("", None, 0, 0.0):
        text += f", share {number(row['mismatch_fraction'])}"
    return text


def markdown(results: list[dict[str, Any]], header: str) -> str:
    lines = [header, ""]
    lines += [
        (
            "| model | artifact (formats) | output | max abs err | max rel err | "
            "model quantities | fp16 tolerance (config) | outside / elements | passes |"
        ),
        "| --- | --- | --- | ---: | ---: | --- | --- | ---: | --- |",
    ]
    notes, kernels = [], []
    for result in results:
        model = result["model"]
        if "error" in result:
            notes.append(
                f"- {model}: **measurement failed** ({result['measured_at']}): {result['error']}"
            )
            continue
        for row in csv_rows(result):
            what = f"{row['artifact']} ({row['formats']})"
            if not row.get("output"):
                lines.append(f"| {model} | {what} | all | — | — | {row['status']} | | | |")
                continue
            quantities = row["quantities"].replace("; ", "<br>")
            outside = f"{row['mismatched']} / {row['elements']}" if row["mismatched"] != "" else ""
            passes = "yes" if row["passed"] is True else "**no**"
            lines.append(
                f"| {model} | {what} | {row['output']} | {number(row['max_abs_err'])} | "
                f"{number(row['max_rel_err'])} | {quantities} | {tolerance_text(row)} | "
                f"{outside} | {passes} |"
            )
        for artifact in result["artifacts"]:
            if artifact["status"] != "measured" and artifact["outputs"]:
                notes.append(f"- {model} {artifact['artifact']}: {artifact['status']}")
            if artifact.get("note"):
                notes.append(f"- {model} {artifact['artifact']}: {artifact['note']}")
            if artifact.get("ort_kernels"):
                kernels.append(f"| {model} | {artifact['artifact']} | {artifact['ort_kernels']} |")
        notes += [f"- {model} {line}" for line in result["gpu_only"]]
        timing = ", ".join(f"{k} {v:.0f} s" for k, v in result["timings"].items())
        rss = result["peak_rss_mb"]
        notes.append(
            f"- {model}: measured {result['measured_at']}, batch {result['batch']}, "
            f"seed {result['seed']}, weights: "
            f"{result['origin']}; {timing}; peak RSS {rss['process']} MB, of a child process "
            f"{rss['largest_child']} MB (tf2onnx, the conversion; a forked child counts the "
            "pages it shares with its parent)"
        )
    if kernels:
        lines += [
            "",
            (
                "onnxruntime's CPU kernels for the fp16 ONNX files (profile of one sample; "
                "where the CPU has no fp16 kernel onnxruntime inserts casts and computes in fp32):"
            ),
            "",
            "| model | artifact | kernels |",
            "| --- | --- | --- |",
            *kernels,
        ]
    if notes:
        lines += ["", *notes]
    return "\n".join(lines) + "\n"


def versions() -> str:
    from deploybench.provenance import package_versions

    found = package_versions(("torch", "onnxruntime", "onnxconverter-common", "tensorflow"))
    return ", ".join(f"{k} {v}" for k, v in found.items() if v)


# ---------------------------------------------------------------------------- main


def run_child(model: str, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    """Measure ``model`` in a process of its own; its result, or ``error`` if it failed. The
    model is named in a job file, not on the child's command line."""
    job = tmp / f"job-{len(list(tmp.glob('job-*.json')))}.json"
    result = job.with_name(job.name.replace("job-", "result-"))
    configfile = str(args.configfile) if args.configfile else ""
    job.write_text(
        json.dumps(
            {"model": model, "configfile": configfile, "batch": args.batch, "out": str(result)}
        )
    )
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", str(job)]
    proc = subprocess.run(
        cmd, check=False, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    if proc.returncode == 0:
        measured: dict[str, Any] = json.loads(result.read_text())
        return measured
    print(proc.stderr[-3000:], file=sys.stderr)
    named = [line for line in proc.stderr.splitlines() if re.match(r"\w*(Error|Exception)\b", line)]
    code = proc.returncode
    error = f"killed by signal {-code}" if code < 0 else f"exit status {code}"
    return {
        "model": model,
        "configfile": configfile,
        "measured_at": now(),
        "error": f"{error}: {named[-1]}" if named else error,
    }


def child(job_file: Path) -> int:
    job = json.loads(job_file.read_text())
    config = load_config(Path(job["configfile"]) if job["configfile"] else None)
    with tempfile.TemporaryDirectory(prefix="deploybench-fp16-") as tmp:
        result = measure_model(config, job["model"], job["batch"], Path(tmp))
    result.update(configfile=job["configfile"], measured_at=now(), versions=versions())
    Path(job["out"]).write_text(json.dumps(result, indent=1) + "\n")
    return 0


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")


def write_tables(out: Path, config: dict[str, Any], configfile: str) -> None:
    """The CSV and markdown tables of every model measured into ``out`` with this config file
    (``out/models/<model>.json``: a model measured again replaces its own rows only)."""
    results = []
    for model in config["models"]:
        file = out / "models" / f"{model}.json"
        if file.is_file():
            result = json.loads(file.read_text())
            if result.get("configfile", "") == configfile:
                results.append(result)
    rows = [r for result in results if "error" not in result for r in csv_rows(result)]
    with (out / "fp16_accuracy.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    command = ".venv/bin/python benchmarks/fp16_accuracy.py"
    if configfile:
        command += f" --configfile {configfile}"
    header = (
        f"fp16 against the fp32 framework: `{command} [--models ...]`, on {platform.machine()} "
        f"with {len(os.sched_getaffinity(0))} cores (each model's date, batch and timing below; "
        f"{versions()}). Weights as the workflow makes them (seeded-random unless a checkpoint "
        "is configured: trained weights may give other figures). Errors as the accuracy step "
        "computes them (`accuracy.measure`); the tolerance is the config's "
        "`accuracy.precision_tolerance.fp16` when the model was measured."
    )
    (out / "fp16_accuracy.md").write_text(markdown(results, header))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", help="model entries, space- or comma-separated")
    parser.add_argument("--configfile", type=Path, help="layered over config/config.yaml")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "fp16")
    parser.add_argument(
        "--batch",
        type=int,
        help="samples instead of the accuracy batch_size (run that many at a time)",
    )
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args.child)

    config = load_config(args.configfile)
    models = [m for given in args.models or config["models"] for m in given.split(",")]
    unknown = sorted(set(models) - set(config["models"]))
    if unknown:
        parser.error(f"unknown models {unknown}; valid: {', '.join(sorted(config['models']))}")
    (args.out / "models").mkdir(parents=True, exist_ok=True)
    failed = 0
    with tempfile.TemporaryDirectory(prefix="deploybench-fp16-") as tmp:
        for model in models:
            start = time.monotonic()
            result = run_child(model, args, Path(tmp))
            seconds = time.monotonic() - start
            (args.out / "models" / f"{model}.json").write_text(json.dumps(result, indent=1) + "\n")
            if "error" in result:
                failed += 1
                print(f"{model}: FAILED after {seconds:.0f} s: {result['error']}", flush=True)
                continue
            steps = ", ".join(f"{k} {v:.0f} s" for k, v in result["timings"].items())
            rss = result["peak_rss_mb"]
            print(
                f"{model}: {seconds:.0f} s ({steps}); peak RSS {rss['process']} MB, largest "
                f"child {rss['largest_child']} MB",
                flush=True,
            )
    write_tables(args.out, config, str(args.configfile) if args.configfile else "")
    print(f"wrote {args.out / 'fp16_accuracy.csv'} and {args.out / 'fp16_accuracy.md'}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
