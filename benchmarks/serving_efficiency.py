"""Serving efficiency and measurement stability, per model, on the embedded default (gpu=cpu).

For each model's built run (default ``results/<model>/cpu/onnx/fp32``), at the largest offline
batch of its ``cpu`` sizing, alternated ``--rounds`` times so that drift of the machine hits
both sides alike:

* **Triton**: the real perf_analyzer, offline scenario (gRPC, system shared memory,
  concurrency 1), with the sizing's request count, interval and retries;
* **in-process**: the same artifact, loaded by the runner the python backend itself uses, with
  the same runtime and thread settings (from the repository's ``config.pbtxt``), timed over as
  many inferences as perf_analyzer measured.

It prints throughput medians, their ratio (serving efficiency, goal >= 0.95) and the coefficient
of variation of the ``--rounds`` Triton measurements of the same point (stability, goal <= 5 %).
``--threads N`` serves and runs both sides with N runtime threads instead of the configured
value (the repository is copied and its ``intra_op_threads`` rewritten).

    .venv/bin/python benchmarks/serving_efficiency.py [--models tft,bert] [--rounds 5]

Build the runs' repositories first, e.g.
``snakemake --profile profiles/local results/tft/cpu/onnx/fp32/repository``.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml
from snakemake.utils import validate

from deploybench import perf
from deploybench.config import resolve
from deploybench.models import load_family
from deploybench.plan import plan_run
from deploybench.runtime import load_runner, threads_per_instance
from deploybench.server import TritonServer, graceful_signals
from deploybench.triton_client import served_feeds, served_inputs
from deploybench.triton_config import read_config, to_pbtxt

REPO = Path(__file__).resolve().parent.parent
MODELS = ("tft", "bert", "nnunet", "resnet50", "fastpitch")


def parameters(config_pbtxt: Path) -> dict[str, str]:
    """The python backend's string parameters (runtime, artifact, intra_op_threads)."""
    config = read_config(config_pbtxt)
    return {key: value.string_value for key, value in config.parameters.items()}


def with_threads(repository: Path, threads: int, into: Path) -> Path:
    """A copy of ``repository`` serving with ``threads`` runtime threads."""
    copy = into / "repository"
    shutil.copytree(repository, copy)
    for path in copy.glob("*/config.pbtxt"):
        config = read_config(path)
        config.parameters["intra_op_threads"].string_value = str(threads)
        path.write_text(to_pbtxt(config))
    return copy


def in_process(runner, feeds, batch: int, inferences: int) -> float:
    """Throughput of ``runner`` over at least ``inferences`` inferences (and 3 calls)."""
    runner(feeds)  # warm-up, as perf_analyzer warms up
    calls = max(3, -(-inferences // batch))
    start = time.perf_counter()
    for _ in range(calls):
        runner(feeds)
    return calls * batch / (time.perf_counter() - start)


def cv(values: list[float]) -> float:
    return statistics.stdev(values) / statistics.mean(values) if len(values) > 1 else 0.0


def benchmark(model: str, run_dir: Path, rounds: int, threads: int | None) -> dict[str, object]:
    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    validate(config, str(REPO / "config" / "schema" / "config.schema.yaml"))  # defaults, as run
    fields = run_dir.parts[-4:]  # model/gpu/format/precision
    run = resolve(config, *fields)
    # the offline job's largest point, measured with the offline job's settings
    offline = plan_run(config, *fields).spec("offline")
    batch = max(p["batch"] for p in offline["points"])
    settings = perf.MeasureSettings(**offline["measure"])
    family = load_family(run.settings["module"], run.settings["hparams"])
    with tempfile.TemporaryDirectory(prefix="deploybench-bench-") as tmp:
        repository = run_dir / "repository"
        if threads is not None:
            repository = with_threads(repository, threads, Path(tmp))
        params = parameters(repository / model / "config.pbtxt")
        # the thread count each served instance runs with (see triton_model.py)
        instances = sum(
            g.count for g in read_config(repository / model / "config.pbtxt").instance_group
        )
        threads_used = threads_per_instance(int(params["intra_op_threads"]), instances or 1)
        runner = load_runner(
            params["runtime"],
            repository / model / "1" / params["artifact"],
            input_names=[s.name for s in family.inputs],
            output_names=[s.name for s in family.outputs],
            threads=threads_used,
        )
        feeds = family.example_inputs(batch, seed=0)
        output_bytes = perf.output_bytes_per_sample(runner(family.example_inputs(1, seed=0)))
        data = Path(tmp) / "data.json"
        triton: list[float] = []
        local: list[float] = []
        stable: list[bool] = []
        with (
            graceful_signals(),
            TritonServer(repository, Path(tmp) / "server.log") as server,
        ):
            served = served_feeds(
                family.example_inputs(1, seed=0), served_inputs(server.http_url, model)
            )
            perf.write_input_data(served, data)
            outputs = [s.name for s in family.outputs]
            with perf.shared_memory_lock(list(served), outputs):
                for _ in range(rounds):
                    row = perf.measure_point(
                        model_name=model,
                        url=server.grpc_url,
                        scenario=perf.SCENARIOS["offline"],
                        point=perf.Point(batch, 1),
                        input_data=data,
                        settings=settings,
                        check_server=server.check_alive,
                        output_bytes_per_sample=output_bytes,
                    )
                    triton.append(row["throughput"])
                    stable.append(bool(row["stable"]))
                    inferences = int(row["measured_requests"] or row["request_count"]) * batch
                    local.append(in_process(runner, feeds, batch, inferences))
    t, lo = statistics.median(triton), statistics.median(local)
    return {
        "model": model,
        "run": "/".join(fields),
        "runtime": params["runtime"],
        "threads": threads_used,
        "batch": batch,
        "triton": t,
        "local": lo,
        "ratio": t / lo,
        "cv": cv(triton),
        "stable": f"{sum(stable)}/{len(stable)}",
        "rounds_triton": triton,
        "rounds_local": local,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--format", default="onnx")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, help="runtime threads on both sides")
    args = parser.parse_args()

    print(
        "| model | run | runtime threads | batch | Triton inf/s | in-process inf/s "
        "| efficiency | Triton CV | stable |"
    )
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    below = 0
    for model in args.models.split(","):
        run_dir = Path("results") / model / "cpu" / args.format / "fp32"
        r = benchmark(model, run_dir, args.rounds, args.threads)
        below += r["ratio"] < 0.95 or r["cv"] > 0.05  # type: ignore[operator]
        print(
            f"| {model} | {r['run']} | {r['threads']} | {r['batch']} | {r['triton']:.2f} "
            f"| {r['local']:.2f} | {r['ratio']:.3f} | {100 * r['cv']:.1f} % | {r['stable']} |",
            flush=True,
        )
        print(
            f"|  | rounds: Triton {[round(x, 2) for x in r['rounds_triton']]}, "  # type: ignore[union-attr]
            f"in-process {[round(x, 2) for x in r['rounds_local']]} |||||||||",  # type: ignore[union-attr]
            file=sys.stderr,
            flush=True,
        )
    return 1 if below else 0


if __name__ == "__main__":
    raise SystemExit(main())
