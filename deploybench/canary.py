"""The canary: in well under a minute, whether this machine serves and measures as a run will.

A lent GPU machine is held for minutes, so what would fail a run's first request or first
perf_analyzer call (a python-backend stub that cannot import NumPy or reach CUDA, a library
perf_analyzer cannot find, an input perf_analyzer refuses) is found here first, and the step
that failed is named (``benchmarks/gpu/kit/run.sh`` stops the call on it). On the CPU it runs in
the tests.

One TorchScript module, ``y = 2x + 1`` (scripted: it keeps its input's float type), is served
by Triton's python backend through the workflow's own ``model.py`` and runtime
(:mod:`deploybench.model_repository`), with ``KIND_GPU`` instances on a GPU device, as two models:
``canary_fp32`` takes a ``TYPE_FP32`` input and ``canary_fp16`` a ``TYPE_FP16`` one. The
steps, in order (:data:`STEPS`): the module run on the device; the repository written; the
server ready; one request to each model, its answer checked (type and values); one short
perf_analyzer run of each (the workflow's ``--input-data`` file and command, HTTP with system
shared memory as TFT's offline runs). Each step gets what is left of the deadline.
"""

from __future__ import annotations

import contextlib
import functools
import json
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .errors import DeploybenchError
from .gpus import FRAMEWORK_DEVICE
from .tensors import TensorSpec

DTYPES = ("float32", "float16")
STEPS = ("artifact", "repository", "server", *(f"request_{d}" for d in DTYPES))
STEPS += tuple(f"perf_{d}" for d in DTYPES)
MAX_BATCH = 8
WIDTH = 4  # elements a sample
PERF_REQUESTS = 20  # requests a measurement window: a perf step lasts a few seconds


class CanaryFailed(DeploybenchError, RuntimeError):
    """A canary step failed; the message says what was seen."""


@dataclass
class Step:
    step: str
    passed: bool
    seconds: float
    detail: str


@dataclass
class Report:
    device: str
    deadline_s: float
    steps: list[Step]

    @property
    def failed(self) -> Step | None:
        return next((s for s in self.steps if not s.passed), None)

    def as_json(self) -> dict[str, Any]:
        failed = self.failed
        return {
            "device": self.device,
            "deadline_s": self.deadline_s,
            "passed": failed is None and len(self.steps) == len(STEPS),
            "failed_step": failed.step if failed else None,
            "seconds": round(sum(s.seconds for s in self.steps), 2),
            "steps": [asdict(s) for s in self.steps],
        }


def model_name(dtype: str) -> str:
    return f"canary_{dtype.replace('float', 'fp')}"


def sample(dtype: str, batch: int = 2) -> np.ndarray:
    """Values that float16 holds exactly, and so does 2x + 1."""
    return (np.arange(batch * WIDTH).reshape(batch, WIDTH) / 4).astype(dtype)


def write_artifact(path: Path, device: str) -> str:
    """The scripted module, run once on ``device`` in each type; what ran where."""
    import torch

    class TwicePlusOne(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * 2 + 1

    where = FRAMEWORK_DEVICE[device]
    if where == "cuda" and not torch.cuda.is_available():
        raise CanaryFailed(f"torch {torch.__version__} sees no CUDA device")
    module = torch.jit.script(TwicePlusOne())
    for dtype in DTYPES:
        x = torch.from_numpy(sample(dtype)).to(where)
        y = module(x).cpu().numpy()
        np.testing.assert_array_equal(y, sample(dtype) * 2 + 1)
    torch.jit.save(module, str(path))
    name = torch.cuda.get_device_name(0) if where == "cuda" else "cpu"
    return f"torch {torch.__version__} on {where} ({name})"


def write_repository(out: Path, artifact: Path, device: str) -> str:
    from .model_repository import build_repository, model_config

    triton = {
        "max_batch_size": MAX_BATCH,
        "model_instances": 1,
        "preferred_batch_sizes": [MAX_BATCH],
        "max_queue_delay_us": 100,
        "intra_op_threads": 1,
    }
    configs = [
        model_config(
            name=model_name(dtype),
            serving={"backend": "python", "runtime": "torchscript"},
            triton=triton,
            device=device,
            inputs=[TensorSpec("x", dtype, (WIDTH,))],
            outputs=[TensorSpec("y", dtype, (WIDTH,))],
            artifact_name=artifact.name,
        )
        for dtype in DTYPES
    ]
    build_repository(configs[0], artifact, artifact.name, out, more=[(configs[1], artifact)])
    kind = "KIND_CPU" if device == "cpu" else "KIND_GPU"
    return f"{', '.join(c.name for c in configs)} ({kind}, python backend)"


def check_answer(url: str, dtype: str, timeout_s: float) -> str:
    from .triton_client import infer_triton

    x = sample(dtype)
    y = infer_triton(url, model_name(dtype), {"x": x}, ["y"], timeout_s)["y"]
    if y.dtype != np.dtype(dtype) or y.shape != x.shape:
        raise CanaryFailed(f"answer of type {y.dtype} shape {y.shape}, sent {dtype} {x.shape}")
    if not np.array_equal(y, x * 2 + 1):
        raise CanaryFailed(f"wrong answer: sent {x.ravel().tolist()}, got {y.ravel().tolist()}")
    return f"{y.shape} {y.dtype}, 2x + 1 exactly"


def measure(url: str, dtype: str, folder: Path, log_file: Path, timeout_s: float) -> str:
    """One short perf_analyzer trial, as a run's offline point is measured."""
    from .perf import (
        Measurement,
        MeasureSettings,
        Point,
        measure_point,
        output_bytes_per_sample,
        shared_memory_guard,
    )
    from .perf_inputs import write_input_data
    from .transport import Transport

    transport = Transport("http", "system")
    input_data = folder / f"{dtype}.json"
    write_input_data({"x": sample(dtype, 1)}, input_data)
    settings = MeasureSettings(
        request_count=PERF_REQUESTS,
        measurement_interval_ms=1000,
        max_retries=0,
        warmup_factor=0,
        timeout_s=timeout_s,
        max_windows=3,
    )
    with shared_memory_guard(transport, ["x"], ["y"]):
        measurement = Measurement(
            model_name(dtype),
            url,
            transport,
            input_data,
            settings,
            output_bytes_per_sample=output_bytes_per_sample([sample(dtype, 1)]),
            log_file=log_file,
        )
        row = measure_point(measurement, Point(batch=MAX_BATCH, concurrency=1), warm_up=False)
    if not row["throughput"] > 0:
        raise CanaryFailed(f"perf_analyzer measured no throughput: {row}")
    return (
        f"{row['throughput']:.0f} infer/s, p99 {row['p99_latency_ms']:.2f} ms (batch {MAX_BATCH})"
    )


def run(device: str, out: Path, deadline_s: float = 60.0) -> Report:
    """The steps on ``device`` (cpu | gpu) until one fails or the deadline passes; logs and the
    report (``canary.json``) under ``out``."""
    from .server import TritonServer, graceful_signals

    if device not in FRAMEWORK_DEVICE:
        raise CanaryFailed(
            f"unknown device {device!r}; valid choices: {', '.join(FRAMEWORK_DEVICE)}"
        )
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    report = Report(device, deadline_s, [])

    def left() -> float:
        return deadline_s - (time.monotonic() - started)

    def step(name: str, action: Callable[[], str]) -> None:
        if report.failed:
            return
        began = time.monotonic()
        try:
            if left() <= 0:
                raise CanaryFailed(f"no time left of the {deadline_s:g} s deadline")
            detail, passed = action(), True
        except Exception as err:  # noqa: BLE001 - any failure is the step's, reported by name
            detail, passed = f"{type(err).__name__}: {err}", False
            (out / f"{name}.traceback.txt").write_text(traceback.format_exc())
        report.steps.append(Step(name, passed, round(time.monotonic() - began, 2), detail))
        (out / "canary.json").write_text(json.dumps(report.as_json(), indent=1) + "\n")

    with tempfile.TemporaryDirectory(prefix="deploybench-canary-") as tmp:
        folder = Path(tmp)
        artifact, repository = folder / "model.pt", folder / "repository"
        step("artifact", lambda: write_artifact(artifact, device))
        step("repository", lambda: write_repository(repository, artifact, device))
        with graceful_signals(), contextlib.ExitStack() as stack:
            servers: list[TritonServer] = []

            def start() -> str:
                server = TritonServer(
                    repository, out / "server.log", startup_timeout_s=max(1.0, left())
                )
                servers.append(stack.enter_context(server))
                return f"Triton {server.metadata().get('version')} at {server.http_url}"

            def request(dtype: str) -> str:
                return check_answer(servers[0].http_url, dtype, max(1.0, left()))

            def perf(dtype: str) -> str:
                log_file = out / "perf_analyzer.log"
                return measure(servers[0].http_url, dtype, folder, log_file, max(1.0, left()))

            step("server", start)
            for dtype in DTYPES:
                step(f"request_{dtype}", functools.partial(request, dtype))
            for dtype in DTYPES:
                step(f"perf_{dtype}", functools.partial(perf, dtype))
    return report
