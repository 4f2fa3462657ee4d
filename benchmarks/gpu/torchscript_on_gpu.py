"""TorchScript on a real GPU, in process: the workflow's ``ts-trace``/``ts-script`` exports
(made on the CPU, as the export job makes them) and its fp16 TorchScript (made on the GPU from
the halved module, as the convert job makes it), loaded on CUDA, checked against the fp32
framework and timed. No Triton server: a lent GPU machine has none (benchmarks/gpu/README.md).

    python benchmarks/gpu/torchscript_on_gpu.py --out DIR [--models tft bert fastpitch nnunet]
        [--gpu H100_SXM] [--deadline-s 420] [--iterations 30]

Per model (config/config.yaml at the ``full`` sizing, seeded-random weights as the
``prepare_checkpoint`` job writes them with no configured checkpoint):

* ``export``: the model's TorchScript format at fp32 on the CPU, as the export job makes it
  (``export.prepare_model``, with its CPU runtime check); the device constants its graph
  holds (issue 27: a trace made on the CPU that holds ``cpu`` fails on a GPU);
* ``fp16``: ``convert.torchscript_fp16`` on ``cuda`` from the checkpoint's module;
* each artifact loaded with ``map_location="cuda"`` and run on the accuracy step's inputs
  (``accuracy.batch_size``, ``seed``), compared by ``accuracy.compare_outputs`` with the fp32
  framework on the CPU at the run's tolerance (fp16: ``precision_tolerance.fp16``);
* latency of one call at the smallest and largest offline batch size (median and p90 of
  ``--iterations`` calls after 5 warm-ups, CUDA events): fp32 and fp16 side by side, in the same
  process. This is TorchScript alone, not Triton: no queueing, no transport.

Writes ``DIR/<model>.json`` as each model finishes, then ``DIR/torchscript_on_gpu.csv`` and
``.md`` and ``DIR/environment.json``. A model not reached before ``--deadline-s`` is listed as
skipped. Exit status 1 if an artifact failed to load, run or match.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

DEVICE_CONSTANT = re.compile(r"Device = prim::Constant|prim::Constant\[value=\"(cpu|cuda)")
COLUMNS = [
    "model",
    "format",
    "precision",
    "made_on",
    "made_s",
    "device_constants",
    "output",
    "max_abs_err",
    "mismatched",
    "elements",
    "atol",
    "rtol",
    "passed",
    "batch",
    "latency_median_ms",
    "latency_p90_ms",
    "error",
]


def environment() -> dict[str, Any]:
    import torch

    query = ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"]
    smi = subprocess.run(
        query if shutil.which("nvidia-smi") else ["true"],
        capture_output=True,
        text=True,
        check=False,
    )
    commit = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True, check=False
    )
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "nvidia_smi": smi.stdout.strip() or smi.stderr.strip(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "commit": commit.stdout.strip() or None,
        "tf32": {
            "cudnn.allow_tf32": torch.backends.cudnn.allow_tf32,
            "cuda.matmul.allow_tf32": torch.backends.cuda.matmul.allow_tf32,
        },
        "command": " ".join(sys.argv),
    }


def device_constants(path: Path) -> list[str]:
    import torch

    graph = str(torch.jit.load(str(path), map_location="cpu").inlined_graph)
    return [line.strip()[:200] for line in graph.splitlines() if DEVICE_CONSTANT.search(line)]


def device_inputs(feeds: dict[str, np.ndarray], types: dict[str, str], device: str) -> list:
    import torch

    return [
        torch.from_numpy(a.astype(types.get(str(a.dtype), a.dtype))).to(device)
        for a in feeds.values()
    ]


def run_on_device(module: Any, tensors: list[Any], names: list[str]) -> dict[str, np.ndarray]:
    import torch

    with torch.no_grad():
        result = module(*tensors)
    results = result if isinstance(result, tuple | list) else (result,)
    return {n: r.detach().cpu().numpy() for n, r in zip(names, results, strict=False)}


def latency_ms(module: Any, tensors: list[Any], iterations: int) -> tuple[float, float]:
    """Median and p90 of one call (CUDA events on a GPU, the wall clock on a CPU)."""
    import torch

    cuda = tensors[0].is_cuda
    times = []
    with torch.no_grad():
        for i in range(5 + iterations):
            if cuda:
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                module(*tensors)
                end.record()
                torch.cuda.synchronize()
                elapsed = start.elapsed_time(end)
            else:
                began = time.perf_counter()
                module(*tensors)
                elapsed = (time.perf_counter() - began) * 1000
            if i >= 5:
                times.append(elapsed)
    times.sort()
    return statistics.median(times), times[int(0.9 * (len(times) - 1))]


def measure_model(config: dict[str, Any], model: str, gpu: str, args: Any, tmp: Path) -> list:
    import torch

    from deploybench.accuracy import compare_outputs
    from deploybench.convert import SERVED_TYPES, torchscript_fp16
    from deploybench.export import prepare_model
    from deploybench.models import CHECKPOINT_FILES, framework_of
    from deploybench.planning.workflow_config import resolve

    fmt = next(f for f in config["models"][model]["formats"] if f.startswith("ts-"))
    runs = {p: resolve(config, model, gpu, fmt, p) for p in ("fp32", "fp16")}
    settings = runs["fp32"].settings
    # the checkpoint and the fp32 export as the workflow's jobs make them
    checkpoint_file = tmp / CHECKPOINT_FILES[framework_of(settings["module"])]
    prepared = prepare_model(settings, checkpoint_file)
    family, checkpoint = prepared.family, prepared.checkpoint
    device = args.device
    accuracy = settings["accuracy"]
    feeds = family.example_inputs(int(accuracy["batch_size"]), int(accuracy["seed"]))
    reference = family.framework_outputs(family.serving_module(checkpoint), feeds)
    batches = sorted({min(settings["perf"]["offline"]["batch_sizes"]), args.max_batch})
    names = [s.name for s in family.outputs]
    rows: list[dict[str, Any]] = []

    artifacts: dict[str, tuple[Path, str, float]] = {}
    clock = time.monotonic()
    export = tmp / "model.pt"
    export_settings = settings["export"]
    export_spec = {  # the export job's spec (ExportPlan.spec) of an unvalidated config
        "export_format": fmt,
        "precision": "fp32",
        "opset": export_settings["onnx_opset"],
        "tolerance": export_settings["tolerance"],
        "check_batch": export_settings.get("check_batch", 3),  # the schema's default
    }
    prepared.export(export_spec, export)
    artifacts["fp32"] = (export, "cpu (export job)", time.monotonic() - clock)
    clock = time.monotonic()
    half = tmp / "model.fp16.pt"
    torchscript_fp16(
        family.serving_module(checkpoint),
        half,
        family.example_inputs(1, seed=0),
        script=fmt == "ts-script",
        device=device,
    )
    artifacts["fp16"] = (half, f"{device} (convert job)", time.monotonic() - clock)
    if device == "cuda":
        torch.cuda.empty_cache()

    for precision, (path, made_on, made_s) in artifacts.items():
        base = {
            "model": model,
            "format": fmt,
            "precision": precision,
            "made_on": made_on,
            "made_s": round(made_s, 1),
            "device_constants": len(device_constants(path)),
        }
        types = SERVED_TYPES["torchscript-fp16"] if precision == "fp16" else {}
        try:
            module = torch.jit.load(str(path), map_location=device).eval()
            actual = run_on_device(module, device_inputs(feeds, types, device), names)
            tolerance = {
                k: dict(v) for k, v in runs[precision].settings["accuracy"]["tolerance"].items()
            }
            checks = compare_outputs(
                {k: v for k, v in reference.items() if k in actual},
                actual,
                {k: v for k, v in tolerance.items() if k in actual},
                int(accuracy["batch_size"]),
                family,
            )
        except Exception as error:  # noqa: BLE001 - the row says what failed
            rows.append({**base, "error": f"{type(error).__name__}: {error}"[:400]})
            continue
        for check in checks:
            rows.append(
                {
                    **base,
                    **{k: check[k] for k in ("output", "max_abs_err", "mismatched", "elements")},
                    "atol": check["atol"],
                    "rtol": check["rtol"],
                    "passed": check["passed"],
                }
            )
        for batch in batches:
            try:
                tensors = device_inputs(family.example_inputs(batch, seed=0), types, device)
                median, p90 = latency_ms(module, tensors, args.iterations)
                rows.append(
                    {
                        **base,
                        "batch": batch,
                        "latency_median_ms": round(median, 3),
                        "latency_p90_ms": round(p90, 3),
                    }
                )
            except Exception as error:  # noqa: BLE001
                rows.append({**base, "batch": batch, "error": f"{type(error).__name__}: {error}"})
        del module
        if device == "cuda":
            torch.cuda.empty_cache()
    return rows


def markdown(rows: list[dict[str, Any]], env: dict[str, Any]) -> str:
    lines = [
        f"# TorchScript on {env.get('gpu')}, in process ({env['date']})",
        "",
        (
            f"torch {env['torch']} (CUDA {env['cuda']}), commit {env['commit']}. Command: "
            f"`{env['command']}`"
        ),
        "",
        (
            "| model | format | precision | made on | device constants | output | max abs err | "
            "mismatched | passed | batch | latency median / p90 (ms) | error |"
        ),
        "| --- | --- | --- | --- | ---: | --- | ---: | ---: | --- | ---: | ---: | --- |",
    ]
    for r in rows:
        latency = (
            f"{r['latency_median_ms']} / {r['latency_p90_ms']}" if "latency_median_ms" in r else ""
        )
        err = r.get("max_abs_err")
        lines.append(
            f"| {r['model']} | {r['format']} | {r['precision']} | {r.get('made_on', '')} | "
            f"{r.get('device_constants', '')} | {r.get('output', '')} | "
            f"{'' if err is None else f'{err:.3g}'} | "
            f"{r.get('mismatched', '')}{'/' + str(r['elements']) if 'elements' in r else ''} | "
            f"{r.get('passed', '')} | {r.get('batch', '')} | {latency} | {r.get('error', '')} |"
        )
    return "\n".join(lines) + "\n"


def write_tables(out: Path, rows: list[dict[str, Any]], env: dict[str, Any]) -> None:
    with open(out / "torchscript_on_gpu.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    (out / "torchscript_on_gpu.md").write_text(markdown(rows, env))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--models", nargs="+", default=["tft", "bert", "fastpitch", "nnunet"])
    parser.add_argument("--gpu", default="H100_SXM", help="the config's gpus entry to resolve")
    parser.add_argument("--deadline-s", type=float, default=420)
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--max-batch", type=int, default=16, help="the larger batch timed")
    parser.add_argument(
        "--device", default="cuda", choices=["cuda", "cpu"], help="cpu: a rehearsal of the code"
    )
    parser.add_argument("--configfile", type=Path, help="layered over config/config.yaml")
    parser.add_argument(
        "--tf32",
        default="default",
        choices=["default", "off"],
        help="off: float32 convolutions and matmuls without TF32 (PyTorch's default lets "
        "cuDNN convolutions use TF32 on Ampere and later GPUs)",
    )
    args = parser.parse_args()
    import torch

    if args.tf32 == "off":
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False

    from deploybench.planning.workflow_config import deep_merge, load_yaml

    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: this benchmark runs on a GPU machine", file=sys.stderr)
        return 2
    start = time.monotonic()
    args.out.mkdir(parents=True, exist_ok=True)
    env = environment()
    (args.out / "environment.json").write_text(json.dumps(env, indent=1))
    print(json.dumps(env), flush=True)
    config = load_yaml(REPO / "config" / "config.yaml")
    if args.configfile:
        config = deep_merge(config, load_yaml(args.configfile))
    rows: list[dict[str, Any]] = []
    for model in args.models:
        if time.monotonic() - start > args.deadline_s:
            rows.append(
                {"model": model, "format": "", "precision": "", "error": "skipped: deadline"}
            )
            continue
        began = time.monotonic()
        with tempfile.TemporaryDirectory(prefix=f"ts-gpu-{model}-") as tmp:
            try:
                found = measure_model(config, model, args.gpu, args, Path(tmp))
            except Exception as error:  # noqa: BLE001 - the model's row says what failed
                traceback.print_exc()
                found = [
                    {
                        "model": model,
                        "format": "",
                        "precision": "",
                        "error": f"{type(error).__name__}: {error}"[:400],
                    }
                ]
        (args.out / f"{model}.json").write_text(json.dumps(found, indent=1, default=str))
        print(f"{model}: {time.monotonic() - began:.0f} s", flush=True)
        for r in found:
            print("  ", json.dumps(r, default=str), flush=True)
        rows += found
        # after each model: a call stopped at its time limit keeps the models it finished
        write_tables(args.out, rows, env)
    write_tables(args.out, rows, env)
    failed = [r for r in rows if r.get("error") or r.get("passed") is False]
    print(f"done in {time.monotonic() - start:.0f} s; {len(failed)} failed rows", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
