"""Triton on a GPU without containers, as a `serving: python` entry (H100-pip) serves: pytriton's
``tritonserver`` loading the workflow's python-backend model with ``KIND_GPU`` instances, the
TorchScript artifact on CUDA. Run on a lent GPU machine (benchmarks/gpu/README.md).

    python benchmarks/gpu/triton_python_gpu.py --out DIR [--model tft] [--gpu H100-pip]
        [--precisions fp32 fp16] [--requests 100]

Per precision, with the workflow's own functions: the seeded checkpoint, the artifact
(``ts-trace`` fp32 exported on the CPU as the export job does; fp16 made on the GPU as the
convert job does), the repository (``model_repository.model_config`` from ``plan.serving`` of the
entry's run, ``build_repository``), a ready server (``jobs.measure.ready_server``), then:

* the served model's config as Triton reports it (instance kind, data types);
* one request of the accuracy step's inputs over HTTP with Triton's binary tensor extension
  (this machine has no tritonclient with perf_analyzer), compared by ``accuracy.compare_outputs`` with the fp32 framework on CUDA at
  the run's tolerance;
* ``--requests`` sequential requests of batch 1: median and p90 latency of the whole HTTP round
  trip. Not perf_analyzer's figures, and not comparable with the published rows.

Writes ``DIR/triton_python_gpu.json`` and the servers' logs. Exit status 1 if a precision failed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import traceback
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))


def get(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=30) as response:
        result: dict[str, Any] = json.loads(response.read())
        return result


def infer_binary(
    url: str, model: str, feeds: dict[str, np.ndarray], outputs: list[str]
) -> dict[str, np.ndarray]:
    """One inference with Triton's binary tensor extension over HTTP (JSON cannot carry FP16):
    a JSON header, then each input's bytes; the answer likewise."""
    from deploybench.tensors import NUMPY_TO_TRITON, TRITON_TO_NUMPY

    arrays = [np.ascontiguousarray(a) for a in feeds.values()]
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": name,
                    "shape": list(array.shape),
                    "datatype": NUMPY_TO_TRITON[str(array.dtype)],
                    "parameters": {"binary_data_size": array.nbytes},
                }
                for name, array in zip(feeds, arrays, strict=True)
            ],
            "outputs": [{"name": name, "parameters": {"binary_data": True}} for name in outputs],
        }
    ).encode()
    request = urllib.request.Request(
        f"http://{url}/v2/models/{model}/infer",
        data=header + b"".join(a.tobytes() for a in arrays),
        headers={
            "Content-Type": "application/octet-stream",
            "Inference-Header-Content-Length": str(len(header)),
        },
    )
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            body = response.read()
            given = response.headers.get("Inference-Header-Content-Length")
    except urllib.error.HTTPError as error:
        raise RuntimeError(f"HTTP {error.code}: {error.read().decode(errors='replace')}") from None
    # the JSON header's length: as the server says, else where the JSON ends
    text = body.decode("latin-1")
    answer, length = json.JSONDecoder().raw_decode(text) if given is None else (None, int(given))
    answer = answer if answer is not None else json.loads(body[:length])
    if "error" in answer or "outputs" not in answer:
        raise RuntimeError(f"Triton answered: {body[:2000].decode(errors='replace')}")
    found, offset = {}, length
    for out in answer["outputs"]:
        size = int(out["parameters"]["binary_data_size"])
        dtype = TRITON_TO_NUMPY[out["datatype"]]
        found[out["name"]] = np.frombuffer(body[offset : offset + size], dtype=dtype).reshape(
            out["shape"]
        )
        offset += size
    return found


def measure(args: argparse.Namespace, precision: str, tmp: Path) -> dict[str, Any]:
    import torch

    from deploybench.accuracy import compare_outputs
    from deploybench.convert import SERVED_TYPES, torchscript_fp16
    from deploybench.export import prepare_model
    from deploybench.jobs.measure import ready_server
    from deploybench.model_repository import build_repository, model_config
    from deploybench.models import CHECKPOINT_FILES, framework_of
    from deploybench.planning.serving_plan import serving
    from deploybench.planning.workflow_config import load_yaml, resolve
    from deploybench.triton_config import to_pbtxt

    config = load_yaml(REPO / "config" / "config.yaml")
    run = resolve(config, args.model, args.gpu, "ts-trace", precision)
    settings = run.settings
    # seeded-random weights (no configured checkpoint), as the prepare_checkpoint job writes them
    seeded = {**settings, "checkpoint": None, "checkpoint_ema": False}
    prepared = prepare_model(seeded, tmp / CHECKPOINT_FILES[framework_of(settings["module"])])
    family, checkpoint = prepared.family, prepared.checkpoint
    artifact = tmp / "model.pt"
    if precision == "fp32":
        export = settings["export"]
        spec = {  # the export job's spec (ExportPlan.spec) of an unvalidated config
            "export_format": "ts-trace",
            "precision": "fp32",
            "opset": export["onnx_opset"],
            "tolerance": export["tolerance"],
            "check_batch": export.get("check_batch", 3),  # the schema's default
        }
        prepared.export(spec, artifact)
    else:
        module = family.serving_module(checkpoint)
        torchscript_fp16(module, artifact, family.example_inputs(1, 0), script=False)
    how = dict(serving(run))
    message = model_config(
        name=args.model,
        serving=how,
        triton=settings["triton"],
        device=run.device,
        inputs=family.inputs,
        outputs=family.outputs,
        artifact_name="model.pt",
    )
    repository = tmp / "repository"
    build_repository(message, artifact, "model.pt", repository)
    result: dict[str, Any] = {"precision": precision, "config.pbtxt": to_pbtxt(message)}
    accuracy = settings["accuracy"]
    feeds = family.example_inputs(int(accuracy["batch_size"]), int(accuracy["seed"]))
    device = "cuda" if torch.cuda.is_available() else "cpu"  # cpu: a rehearsal (--gpu cpu)
    reference = family.framework_outputs(family.serving_module(checkpoint), feeds, device)
    types = SERVED_TYPES["torchscript-fp16"] if precision == "fp16" else {}
    sent = {k: v.astype(types.get(str(v.dtype), v.dtype)) for k, v in feeds.items()}
    log = args.out / f"server-{precision}.log"
    began = time.monotonic()
    with ready_server(str(repository), str(log), {"startup_timeout_s": 300}) as server:
        result["ready_s"] = round(time.monotonic() - began, 1)
        url = server.http_url
        served = get(f"http://{url}/v2/models/{args.model}/config")
        result["instance_group"] = served.get("instance_group")
        result["served_types"] = {
            t["name"]: t["data_type"] for t in [*served["input"], *served["output"]]
        }
        outputs = [s.name for s in family.outputs]
        actual = infer_binary(url, args.model, sent, outputs)
        rows = compare_outputs(
            reference, actual, accuracy["tolerance"], int(accuracy["batch_size"]), family
        )
        result["accuracy"] = [
            {k: r[k] for k in ("output", "max_abs_err", "mismatched", "elements", "passed")}
            for r in rows
        ]
        one = {k: v[:1] for k, v in sent.items()}
        times = []
        for _ in range(args.requests + 5):
            start = time.perf_counter()
            infer_binary(url, args.model, one, outputs)
            times.append((time.perf_counter() - start) * 1000)
        times = sorted(times[5:])
        result["latency_ms_batch1_http"] = {
            "median": round(statistics.median(times), 2),
            "p90": round(times[int(0.9 * (len(times) - 1))], 2),
            "requests": len(times),
        }
        if device == "cuda":
            result["gpu_memory_mib"] = round(torch.cuda.memory_allocated() / 2**20)
    result["passed"] = all(r["passed"] for r in rows)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--model", default="tft")
    parser.add_argument("--gpu", default="H100-pip", help="a `serving: python` gpus entry")
    parser.add_argument("--precisions", nargs="+", default=["fp32", "fp16"])
    parser.add_argument("--requests", type=int, default=100)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    results = []
    for precision in args.precisions:
        with tempfile.TemporaryDirectory(prefix=f"triton-gpu-{precision}-") as tmp:
            try:
                results.append(measure(args, precision, Path(tmp)))
            except Exception as error:  # noqa: BLE001 - the result says what failed
                traceback.print_exc()
                results.append(
                    {"precision": precision, "error": f"{type(error).__name__}: {error}"}
                )
        print(json.dumps(results[-1], indent=1, default=str)[:3000], flush=True)
    (args.out / "triton_python_gpu.json").write_text(json.dumps(results, indent=1, default=str))
    return 0 if all(r.get("passed") for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
