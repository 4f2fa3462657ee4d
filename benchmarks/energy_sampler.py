"""What the energy sampler beside perf_analyzer costs the measurement, on the embedded default.

One built run (default ``results/tft/cpu/onnx/fp32``, gpu=cpu) is served by one Triton server
and measured at one point (the offline job's largest batch at concurrency 1, or ``--batch`` /
``--concurrency``) with the run's own measurement settings, exactly as the workflow's measuring
job does (``perf.measure_point``). ``--rounds`` paired rounds; each round measures one trial
**without** the sampler (``instruments.NOT_MEASURED``) and one **with** it: the sampler thread
reading an NVML meter every ``--sample-ms`` in this process while perf_analyzer runs. Which
side goes first alternates, so that drift of the machine hits both sides alike. The NVML meter
reads the stand-in ``libnvidia-ml.so.1`` (tests/fixtures/fake_libnvidia_ml.c, compiled here
with gcc), or a real one with ``--nvml-library``.

It prints each side's mean throughput ± its 95 % half-width, the mean of the per-round ratios
with/without (throughput and perf_analyzer's p99 latency) ± their 95 % half-widths
(:func:`deploybench.stats.interval`, Student's t over the rounds), and the sampler's own cost:
the sampler thread's CPU time per second of sampling, read with ``time.thread_time()`` inside
the thread at each of its readings (cumulative since the thread started, so it counts the
thread's whole loop, not only the NVML calls), and the mean wall time of one reading.
The exit status is 1 when the mean throughput ratio is below the goal (0.99).

    .venv/bin/python benchmarks/energy_sampler.py [--run results/tft/cpu/onnx/fp32] \\
        [--configfile config/smoke.yaml] [--rounds 5] [--sample-ms 100] [--batch N]

Run it in the workdir of a run whose repository is built, with the config it was built with,
e.g. ``snakemake --profile profiles/local results/tft/cpu/onnx/fp32/repository`` first.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from serving_efficiency import digits_for, with_interval  # benchmarks/: the same table style
from snakemake.utils import validate

from deploybench import perf, stats
from deploybench.instruments import NOT_MEASURED, NOT_READ, TrialEnergy
from deploybench.jobs.measure import energy_meter, ready_server
from deploybench.models import load_family
from deploybench.perf_inputs import write_input_data
from deploybench.planning.run_plan import plan_run
from deploybench.planning.workflow_config import deep_merge, load_yaml
from deploybench.server import graceful_signals
from deploybench.telemetry import Meter, Sample
from deploybench.transport import of_spec
from deploybench.triton_client import infer_triton, served_feeds, served_inputs

REPO = Path(__file__).resolve().parent.parent
STANDIN = REPO / "tests" / "fixtures" / "fake_libnvidia_ml.c"
GOAL = 0.99


class TimedMeter(Meter):
    """``meter``, with the CPU time of the sampler threads that read it: a reading made in a
    thread other than the one that made the meter is the sampler thread's, and
    ``time.thread_time()`` there is that thread's CPU time since it started."""

    def __init__(self, meter: Meter) -> None:
        self.meter = meter
        self.name = meter.name
        self._owner = threading.get_ident()
        self._lock = threading.Lock()
        self.read_s: list[float] = []  # wall time of each reading
        self._last_owner_read = time.perf_counter()
        # per sampler thread (the Thread itself: an ident is reused once a thread ends): when
        # it started (the owner's entry reading), its CPU time and the time at its last reading
        self.threads: dict[threading.Thread, tuple[float, float, float]] = {}

    def read(self) -> Sample:
        start = time.perf_counter()
        sample = self.meter.read()
        end = time.perf_counter()
        with self._lock:
            self.read_s.append(end - start)
            if (
                threading.get_ident() == self._owner
            ):  # Sampler.__enter__/__exit__: just before a thread starts
                self._last_owner_read = end
            else:
                thread = threading.current_thread()
                began = self.threads.get(thread, (self._last_owner_read, 0.0, 0.0))[0]
                self.threads[thread] = (began, time.thread_time(), end)
        return sample

    def facts(self) -> dict[str, Any]:
        return self.meter.facts()

    def power_limit_w(self) -> float | None:
        return self.meter.power_limit_w()

    def cpu_per_second(self) -> float:
        """The sampler threads' CPU seconds per second they ran (over all threads so far)."""
        cpu = sum(c for _, c, _ in self.threads.values())
        wall = sum(end - began for began, _, end in self.threads.values())
        return cpu / wall if wall > 0 else float("nan")


@dataclass
class Side:
    throughput: list[float] = field(default_factory=list)
    p99_ms: list[float] = field(default_factory=list)
    stable: list[bool] = field(default_factory=list)


def build_standin(into: Path) -> Path:
    """The stand-in libnvidia-ml.so.1 compiled into ``into`` (as tests/nvml_standin.py does;
    benchmarks do not import the tests' helpers)."""
    compiler = shutil.which("gcc") or shutil.which("cc")
    if compiler is None:
        raise SystemExit("no C compiler (gcc) to build the stand-in libnvidia-ml.so.1")
    library = into / "libnvidia-ml.so.1"
    cmd = [compiler, "-shared", "-fPIC", "-O2", "-Wall", "-o", str(library), str(STANDIN)]
    subprocess.run(cmd, check=True)
    return library


def load_config(overlay: Path | None) -> dict[str, Any]:
    """config/config.yaml with ``overlay`` layered over it (as ``--configfile`` does), checked
    against the schema (defaults filled in)."""
    config = load_yaml(REPO / "config" / "config.yaml")
    if overlay is not None:
        config = deep_merge(config, load_yaml(overlay))
    validate(config, str(REPO / "config" / "schema" / "config.schema.yaml"))
    return dict(config)


def ratios(a: list[float], b: list[float]) -> list[float]:
    return [x / y for x, y in zip(a, b, strict=True)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", type=Path, default=Path("results/tft/cpu/onnx/fp32"))
    parser.add_argument("--configfile", type=Path, help="layered over config/config.yaml")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--sample-ms", type=int, default=100)
    parser.add_argument("--batch", type=int, help="default: the offline job's largest batch")
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--nvml-library", help="a libnvidia-ml.so.1 (default: the stand-in)")
    args = parser.parse_args()
    if args.rounds < 2:
        parser.error(f"--rounds {args.rounds}: an interval needs at least 2 rounds")
    if args.sample_ms < 1:
        parser.error(f"--sample-ms {args.sample_ms}: must be at least 1")
    if not (args.run / "repository").is_dir():
        parser.error(
            f"no built repository under {args.run.resolve()}; build it first, e.g. snakemake "
            f"--profile profiles/local {args.run}/repository"
        )

    config = load_config(args.configfile)
    fields = args.run.parts[-4:]  # model/gpu/format/precision
    scenario = "offline" if args.concurrency == 1 else "online"
    spec = plan_run(config, *fields).perf_spec(scenario)
    batch = args.batch or max(int(p["batch"]) for p in spec["points"])
    point = perf.Point(batch, args.concurrency)
    settings = perf.MeasureSettings(**spec["measure"])
    transport = of_spec(spec["transport"])
    model_name = spec["model_name"]
    family = load_family(spec["model"]["module"], spec["model"]["hparams"])
    outputs = [s.name for s in family.outputs]
    sides = {"without": Side(), "with": Side()}
    print(
        f"{'/'.join(fields)} at {point} ({scenario} settings: {settings.request_count} requests "
        f"a window, floor {settings.min_duration_ms} ms), sampler every {args.sample_ms} ms, "
        f"{args.rounds} rounds",
        file=sys.stderr,
    )

    with tempfile.TemporaryDirectory(prefix="deploybench-bench-") as tmp:
        library = args.nvml_library or str(build_standin(Path(tmp)))
        data = Path(tmp) / "data.json"
        with (
            graceful_signals(),
            ready_server(
                str(args.run / "repository"), str(Path(tmp) / "server.log"), spec["server"]
            ) as server,
            energy_meter({"meter": "nvml", "nvml_library": library}) as (meter, status),
        ):
            if meter is None:
                raise SystemExit(f"the NVML meter did not open: {status}")
            timed = TimedMeter(meter)
            energy = TrialEnergy(status, timed, args.sample_ms / 1000)
            sample = family.perf_inputs(seed=0, dataset=spec.get("dataset_path"))
            feeds = served_feeds(sample, served_inputs(server.http_url, model_name))
            write_input_data(feeds, data)
            output_bytes = perf.output_bytes_per_sample(
                infer_triton(server.http_url, model_name, sample, outputs).values()
            )
            rate: float | None = None
            with perf.shared_memory_guard(transport, list(feeds), outputs):
                for i in range(args.rounds):
                    order = ("without", "with") if i % 2 == 0 else ("with", "without")
                    for side in order:
                        measurement = perf.Measurement(
                            model_name,
                            server.url(transport.protocol),
                            transport,
                            data,
                            settings,
                            instruments=(energy if side == "with" else NOT_MEASURED, NOT_READ),
                            output_bytes_per_sample=output_bytes,
                            check_server=server.check_alive,
                        )
                        row = perf.measure_point(
                            measurement, point, warm_up=rate is None, rate=rate
                        )
                        s = sides[side]
                        s.throughput.append(float(row["throughput"]))
                        s.p99_ms.append(float(row["p99_latency_ms"]))
                        s.stable.append(bool(row["stable"]))
                        rate = s.throughput[-1] / batch
                        energy_j = row.get("energy_per_inference_j")
                        print(
                            f"  round {i + 1} {side:>7} sampler: {s.throughput[-1]:.2f} inf/s, "
                            f"p99 {s.p99_ms[-1]:.2f} ms, stable {s.stable[-1]}, energy/inf "
                            f"{'-' if energy_j is None else f'{float(energy_j) * 1000:.1f} mJ'}",
                            file=sys.stderr,
                            flush=True,
                        )

    without, with_ = sides["without"], sides["with"]
    ratio = stats.interval(ratios(with_.throughput, without.throughput))
    p99_ratio = stats.interval(ratios(with_.p99_ms, without.p99_ms))
    d = digits_for(stats.interval(without.throughput).mean)
    print(
        f"\n{'/'.join(fields)} at {point}, sampler every {args.sample_ms} ms over {status} "
        f"({library}); {args.rounds} paired rounds; ± : 95 % half-width (Student's t)\n"
    )
    print("| measure | without sampler | with sampler | with ÷ without (per round) |")
    print("| --- | ---: | ---: | ---: |")
    print(
        f"| throughput (inf/s) | {with_interval(stats.interval(without.throughput), d)} "
        f"| {with_interval(stats.interval(with_.throughput), d)} | {with_interval(ratio, 3)} |"
    )
    print(
        f"| p99 latency (ms) | {with_interval(stats.interval(without.p99_ms), 2)} "
        f"| {with_interval(stats.interval(with_.p99_ms), 2)} | {with_interval(p99_ratio, 3)} |"
    )
    print(
        f"| stable trials | {sum(without.stable)}/{args.rounds} "
        f"| {sum(with_.stable)}/{args.rounds} | |"
    )
    readings = len(timed.read_s)
    print(
        f"\nsampler thread CPU (time.thread_time in the thread): "
        f"{timed.cpu_per_second() * 1000:.3f} ms per s over {len(timed.threads)} sampler threads; "
        f"{readings} readings, {sum(timed.read_s) / readings * 1e6:.0f} µs each (mean wall)"
    )
    includes_one = abs(ratio.mean - 1) <= ratio.half_width
    print(
        f"throughput ratio {ratio.mean:.3f} (goal ≥ {GOAL}); its interval "
        f"{'includes' if includes_one else 'excludes'} 1",
    )
    print(
        f"rounds: with {[round(x, 2) for x in with_.throughput]}, without "
        f"{[round(x, 2) for x in without.throughput]}, ratios "
        f"{[round(x, 3) for x in ratios(with_.throughput, without.throughput)]}",
        file=sys.stderr,
    )
    return 1 if ratio.mean < GOAL else 0


if __name__ == "__main__":
    raise SystemExit(main())
