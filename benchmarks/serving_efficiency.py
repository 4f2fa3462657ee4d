"""Serving efficiency per model, with its 95 % interval, on the embedded default (gpu=cpu).

For each model's built run (default ``results/<model>/cpu/onnx/fp32``), at the largest offline
batch of its ``cpu`` sizing, ``--rounds`` paired rounds; each round measures both sides once,
the side that goes first alternating, so that drift of the machine hits both sides alike:

* **Triton**: one trial of the real perf_analyzer, offline scenario (concurrency 1, over the
  model's offline transport as planned for the run: ``models.<m>.perf.offline.transport``),
  with the sizing's measurement settings (request count, duration floor and cap, retries),
  exactly as the workflow's offline job measures a point;
* **in-process**: the same artifact, loaded by the runner the python backend itself uses, with
  the same runtime and thread settings (from the repository's ``config.pbtxt``), fed the very
  data perf_analyzer sends (one example repeated to the batch, in the served types), timed
  over as many inferences as perf_analyzer measured.

Round ``i``'s efficiency is ``r_i = triton_i / in_process_i``; the table prints the mean of the
``r_i`` with its 95 % half-width (Student's t, :func:`deploybench.stats.interval`), each side's
mean throughput with its half-width, and how many Triton trials perf_analyzer called stable.
The exit status is 1 when a model's mean efficiency is below the goal (0.95).
``--threads N`` serves and runs both sides with N runtime threads instead of the configured
value (the repository is copied and its ``intra_op_threads`` rewritten).

    .venv/bin/python benchmarks/serving_efficiency.py [--models tft,bert] [--rounds 5]

Build the runs' repositories first, e.g.
``snakemake --profile profiles/local results/tft/cpu/onnx/fp32/repository``.
"""

from __future__ import annotations

import argparse
import math
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml
from snakemake.utils import validate

from deploybench import perf, stats
from deploybench.models import load_family
from deploybench.perf_inputs import write_input_data
from deploybench.planning.run_plan import plan_run
from deploybench.planning.workflow_config import resolve
from deploybench.runtime import Runner, load_runner, threads_per_instance
from deploybench.server import TritonServer, graceful_signals
from deploybench.transport import of_spec
from deploybench.triton_client import served_feeds, served_inputs
from deploybench.triton_config import read_config, to_pbtxt

REPO = Path(__file__).resolve().parent.parent
MODELS = ("tft", "tft_traffic", "bert", "nnunet", "resnet50", "fastpitch")
GOAL = 0.95


@dataclass(frozen=True)
class Result:
    model: str
    run: str
    threads: int
    batch: int
    triton: list[float]  # per round, inferences/s as perf_analyzer reports them
    served: list[float]  # per round, batch / mean request latency (concurrency 1)
    local: list[float]
    stable: list[bool]

    @property
    def ratios(self) -> list[float]:
        return [t / lo for t, lo in zip(self.triton, self.local, strict=True)]

    @property
    def served_ratios(self) -> list[float]:
        return [t / lo for t, lo in zip(self.served, self.local, strict=True)]

    @property
    def efficiency(self) -> stats.Interval:
        return stats.interval(self.ratios)


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


def in_process(runner: Runner, feeds: dict[str, np.ndarray], batch: int, inferences: int) -> float:
    """Throughput of ``runner`` over at least ``inferences`` inferences (and 3 calls)."""
    runner(feeds)  # warm-up, as perf_analyzer warms up
    calls = max(3, -(-inferences // batch))
    start = time.perf_counter()
    for _ in range(calls):
        runner(feeds)
    return calls * batch / (time.perf_counter() - start)


def benchmark(model: str, run_dir: Path, rounds: int, threads: int | None) -> Result:
    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    validate(config, str(REPO / "config" / "schema" / "config.schema.yaml"))  # defaults, as run
    fields = run_dir.parts[-4:]  # model/gpu/format/precision
    run = resolve(config, *fields)
    # the offline job's largest point, measured with the offline job's settings
    offline = plan_run(config, *fields).perf_spec("offline")
    batch = max(p["batch"] for p in offline["points"])
    settings = perf.MeasureSettings(**offline["measure"])
    transport = of_spec(offline["transport"])
    family = load_family(run.settings["module"], run.settings["hparams"])
    point = perf.Point(batch, 1)
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
        data = Path(tmp) / "data.json"
        triton: list[float] = []
        served_rate: list[float] = []
        local: list[float] = []
        stable: list[bool] = []
        with (
            graceful_signals(),
            TritonServer(repository, Path(tmp) / "server.log") as server,
        ):
            served = served_feeds(
                family.example_inputs(1, seed=0), served_inputs(server.http_url, model)
            )
            write_input_data(served, data)
            # what perf_analyzer sends: the one example repeated to the batch (a FastPitch
            # mel's length, and so its cost, depends on the input)
            feeds = {name: np.repeat(array, batch, axis=0) for name, array in served.items()}
            output_bytes = perf.output_bytes_per_sample(runner(served))
            outputs = [s.name for s in family.outputs]
            rate: float | None = None
            inferences = settings.request_count * batch
            measurement = perf.Measurement(
                model,
                server.url(transport.protocol),
                transport,
                data,
                settings,
                output_bytes_per_sample=output_bytes,
                check_server=server.check_alive,
            )
            with perf.shared_memory_guard(transport, list(served), outputs):
                for i in range(rounds):
                    if i % 2:  # odd rounds: in-process first, as long as the last Triton trial
                        local.append(in_process(runner, feeds, batch, inferences))
                    row = perf.measure_point(measurement, point, warm_up=i == 0, rate=rate)
                    triton.append(float(row["throughput"]))
                    # one request at a time, back to back: the rate the requests were served
                    # at, free of how perf_analyzer's windows cut them (see README)
                    served_rate.append(batch / (float(row["avg_latency_ms"]) / 1000))
                    stable.append(bool(row["stable"]))
                    rate = triton[-1] / batch
                    inferences = int(row["measured_requests"] or row["request_count"]) * batch
                    if not i % 2:
                        local.append(in_process(runner, feeds, batch, inferences))
                    print(
                        f"  {model} round {i + 1}: Triton {triton[-1]:.3f} (by latency "
                        f"{served_rate[-1]:.3f}), in-process {local[-1]:.3f} inf/s, efficiency "
                        f"{triton[-1] / local[-1]:.3f}, {inferences} inferences",
                        file=sys.stderr,
                        flush=True,
                    )
    return Result(model, "/".join(fields), threads_used, batch, triton, served_rate, local, stable)


def with_interval(iv: stats.Interval, digits: int) -> str:
    if math.isnan(iv.half_width):
        return f"{iv.mean:.{digits}f}"
    return f"{iv.mean:.{digits}f} ± {iv.half_width:.{digits}f}"


def digits_for(value: float) -> int:
    """Decimals that show three significant figures of a throughput (0.10 vs 279)."""
    return max(0, 2 - math.floor(math.log10(abs(value)))) if value else 2


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--format", default="onnx")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, help="runtime threads on both sides")
    args = parser.parse_args()
    models = args.models.split(",")
    unknown = [m for m in models if m not in MODELS]
    if unknown:
        parser.error(f"unknown models {unknown}; valid choices: {', '.join(MODELS)}")
    if args.rounds < 2:
        parser.error(f"--rounds {args.rounds}: an interval needs at least 2 rounds")
    missing = [
        m for m in models if not (Path("results") / m / "cpu" / args.format / "fp32").is_dir()
    ]
    if missing:
        parser.error(
            f"no built run for {missing} under {Path.cwd() / 'results'}; build it first, e.g. "
            f"snakemake --profile profiles/local results/{missing[0]}/cpu/{args.format}/fp32/"
            "repository"
        )

    results = []
    for model in models:
        run_dir = Path("results") / model / "cpu" / args.format / "fp32"
        results.append(benchmark(model, run_dir, args.rounds, args.threads))

    print(
        f"\n{args.rounds} paired rounds a model; ± : 95 % half-width (Student's t over the "
        "rounds)\n"
    )
    print(
        "| model | run | runtime threads | batch | Triton inf/s | in-process inf/s "
        "| efficiency | Triton by latency | efficiency by latency | stable |"
    )
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    below = 0
    for r in results:
        efficiency = r.efficiency
        below += efficiency.mean < GOAL
        triton, local = stats.interval(r.triton), stats.interval(r.local)
        served = stats.interval(r.served)
        d = digits_for(triton.mean)
        mark = "**" if efficiency.mean < GOAL else ""
        print(
            f"| {r.model} | {r.run} | {r.threads} | {r.batch} | {with_interval(triton, d)} "
            f"| {with_interval(local, d)} | {mark}{with_interval(efficiency, 3)}{mark} "
            f"| {with_interval(served, d)} | {with_interval(stats.interval(r.served_ratios), 3)} "
            f"| {sum(r.stable)}/{len(r.stable)} |"
        )
    for r in results:
        print(
            f"{r.model} rounds: efficiency {[round(x, 3) for x in r.ratios]}, Triton "
            f"{[round(x, 3) for x in r.triton]}, by latency {[round(x, 3) for x in r.served]}, "
            f"in-process {[round(x, 3) for x in r.local]}",
            file=sys.stderr,
        )
    return 1 if below else 0


if __name__ == "__main__":
    raise SystemExit(main())
