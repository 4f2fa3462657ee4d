"""Serving efficiency: Triton throughput / in-process throughput of the same artifact.

Both sides run the artifact of one built run (default ``results/tft/cpu/onnx/fp32``) with the
same runtime and thread settings, at the same batch size, alternated ``--rounds`` times so that
drift of the machine hits both alike. Triton is measured by the real perf_analyzer (offline
scenario: gRPC + system shared memory, concurrency 1); in-process is a timed loop of the runner
that the python backend itself uses.

    .venv/bin/python benchmarks/serving_efficiency.py [--run results/tft/cpu/onnx/fp32] [--batch 32]

Build the run first (``make demo``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

from deploybench import perf
from deploybench.models import load_family
from deploybench.runtime import load_runner
from deploybench.server import TritonServer, graceful_signals


def in_process_throughput(runner, feeds, batch: int, seconds: float) -> float:
    runner(feeds)  # warm-up
    done, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        runner(feeds)
        done += batch
    return done / (time.perf_counter() - start)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", default="results/tft/cpu/onnx/fp32")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()

    run_dir = Path(args.run)
    provenance = json.loads((run_dir / "offline.provenance.json").read_text())
    model_name = provenance["config"]["model"]
    model_dir = run_dir / "repository" / model_name
    params = dict(
        line.split('"')[1::2]
        for line in (model_dir / "config.pbtxt").read_text().splitlines()
        if line.startswith("parameters")
    )
    config = yaml.safe_load(Path("config/config.yaml").read_text())["models"][model_name]
    family = load_family(config["module"], config["hparams"])
    runner = load_runner(
        params["runtime"],
        model_dir / "1" / params["artifact"],
        input_names=[s.name for s in family.inputs],
        output_names=[s.name for s in family.outputs],
        threads=int(params["intra_op_threads"]),
    )
    feeds = family.example_inputs(args.batch, seed=0)

    triton, local = [], []
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data.json"
        perf.write_input_data(family.example_inputs(1, seed=0), data)
        with (
            graceful_signals(),
            TritonServer(run_dir / "repository", Path(tmp) / "server.log") as server,
        ):
            for _ in range(args.rounds):
                row = perf.measure_point(
                    model_name=model_name,
                    url=server.grpc_url,
                    scenario=perf.SCENARIOS["offline"],
                    point=perf.Point(args.batch, 1),
                    input_data=data,
                    settings=perf.MeasureSettings(request_count=args.requests, warmup_factor=1),
                    check_server=server.check_alive,
                )
                triton.append(row["throughput"])
                local.append(in_process_throughput(runner, feeds, args.batch, args.seconds))
    t, lo = statistics.median(triton), statistics.median(local)
    print(f"run {run_dir}  runtime {params['runtime']}  batch {args.batch}  rounds {args.rounds}")
    print(f"  triton (perf_analyzer, offline)  {t:10.1f} inf/s   {[round(x, 1) for x in triton]}")
    print(
        f"  in-process ({params['runtime']})     {lo:10.1f} inf/s   {[round(x, 1) for x in local]}"
    )
    print(f"  serving efficiency (median ratio) {t / lo:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
