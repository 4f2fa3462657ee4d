"""What perf_analyzer's ``--collect-metrics`` costs a measurement: one point of a built run
measured with and without it, the two sides alternating, in one run.

Each round measures the point once without the instrument (``instruments.NO_GPU_METRICS``) and
once with it (``instruments.TritonGpuMetrics`` as the perf job probes it: perf_analyzer polls
the server's metrics endpoint every second); which side goes first alternates. Prints the
per-round throughput ratios' mean (with ÷ without) and their standard deviation.

    .venv/bin/python benchmarks/collect_metrics.py [--run results/tft/cpu/onnx/fp32]
        [--configfile config/demo.yaml] [--rounds 4] [--batch 8]

Run it in a workdir where the run is built (its ``repository/``), e.g. after ``make demo``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import yaml

from deploybench import perf
from deploybench.instruments import NO_GPU_METRICS, probe_gpu_metrics
from deploybench.models import load_family
from deploybench.perf_inputs import write_input_data
from deploybench.planning.run_plan import plan_run
from deploybench.planning.workflow_config import deep_merge, load_yaml
from deploybench.server import TritonServer
from deploybench.transport import Transport
from deploybench.triton_client import served_feeds, served_inputs

REPO = Path(__file__).resolve().parent.parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", type=Path, default=Path("results/tft/cpu/onnx/fp32"))
    parser.add_argument("--configfile", type=Path, default=REPO / "config" / "demo.yaml")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--batch", type=int, default=8)
    args = parser.parse_args()

    config = load_yaml(REPO / "config" / "config.yaml")
    config = deep_merge(config, yaml.safe_load(args.configfile.read_text()) or {})
    plan = plan_run(config, *args.run.parts[-4:])
    spec = plan.spec("offline")
    family = load_family(spec["model"]["module"], spec["model"]["hparams"])
    sample = family.perf_inputs(seed=0, dataset=spec.get("dataset_path"))
    settings = perf.MeasureSettings(
        request_count=100, warmup_factor=1, max_retries=2, trials=1, min_duration_ms=3000
    )
    sides: dict[str, list[float]] = {"without": [], "with": []}
    with (
        tempfile.TemporaryDirectory() as tmp,
        TritonServer(args.run / "repository", Path(tmp) / "server.log") as server,
    ):
        feeds = served_feeds(sample, served_inputs(server.http_url, spec["model_name"]))
        data = Path(tmp) / "data.json"
        write_input_data(feeds, data)
        metrics = probe_gpu_metrics(server.metrics_port, server.extra_args)
        print(f"Triton's GPU metrics: {metrics.status}", file=sys.stderr)
        for i in range(args.rounds):
            for side in ("without", "with") if i % 2 == 0 else ("with", "without"):
                measurement = perf.Measurement(
                    spec["model_name"],
                    server.http_url,
                    Transport("http", "none"),
                    data,
                    settings,
                    instruments=(metrics if side == "with" else NO_GPU_METRICS,),
                )
                row = perf.measure_point(measurement, perf.Point(args.batch, 1), warm_up=i == 0)
                sides[side].append(float(row["throughput"]))
                print(f"  round {i + 1} {side:>7}: {row['throughput']} infer/s", file=sys.stderr)
    ratios = [w / wo for w, wo in zip(sides["with"], sides["without"], strict=True)]
    sd = statistics.stdev(ratios) if len(ratios) > 1 else float("nan")
    print(
        f"throughput with/without --collect-metrics: {statistics.mean(ratios):.3f} "
        f"(sd {sd:.3f}, {args.rounds} rounds; with {statistics.mean(sides['with']):.1f}, "
        f"without {statistics.mean(sides['without']):.1f} infer/s, batch {args.batch})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
