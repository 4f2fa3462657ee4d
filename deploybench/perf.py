"""Performance points measured by the real ``perf_analyzer``, one process per point.

Scenarios follow the seed pages: *offline* is static batching (each batch size at concurrency 1,
gRPC with system shared memory); *online* is dynamic batching (HTTP, no shared memory, a
concurrency sweep). Every point is warmed up, measured in ``count_windows`` mode, and retried with
more requests while perf_analyzer reports it unstable (as DLE's tooling did). A point that never
stabilises is measured once more with the stability criterion off and kept with
``stable=False``: the row is honest about it instead of missing or pretending.
"""

from __future__ import annotations

import contextlib
import csv
import fcntl
import hashlib
import json
import logging
import os
import re
import signal
import subprocess
import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from . import tools
from .columns import CSV_COLUMNS, LATENCY_COLUMNS, THROUGHPUT_COLUMNS
from .errors import PerfError
from .process import die_with_parent
from .server import SHM_DIR

log = logging.getLogger(__name__)

COLUMNS = CSV_COLUMNS  # the CSV a scenario's measurement writes, in its order
UNSTABLE_MARKER = "Failed to obtain stable measurement"
NO_STABILITY_CHECK = "1000"  # --stability-percentage: any variation passes


@dataclass(frozen=True)
class Scenario:
    name: str
    protocol: str
    shared_memory: str  # "system" | "none"


SCENARIOS = {
    "offline": Scenario("offline", protocol="grpc", shared_memory="system"),
    "online": Scenario("online", protocol="http", shared_memory="none"),
}


@dataclass(frozen=True)
class Point:
    batch: int
    concurrency: int


@dataclass(frozen=True)
class MeasureSettings:
    request_count: int
    measurement_interval_ms: int = 5000
    max_retries: int = 10
    retry_request_step: int = 50
    warmup_factor: int = 2  # warm-up uses this many times the requests; 0: no warm-up
    timeout_s: float = 600.0


def write_input_data(feeds: dict[str, np.ndarray], path: Path) -> None:
    """perf_analyzer ``--input-data`` JSON: one example (no batch dimension); perf_analyzer
    repeats it to the requested batch size."""
    data = {
        "data": [
            {
                name: {"content": array[0].ravel().tolist(), "shape": list(array.shape[1:])}
                for name, array in feeds.items()
            }
        ]
    }
    path.write_text(json.dumps(data))


# perf_analyzer's default output region (DLE's runner passes this value too).
MIN_OUTPUT_SHM_BYTES = 100240


def output_bytes_per_sample(sample_outputs: Iterable[np.ndarray]) -> int:
    """What one sample's outputs take in perf_analyzer's output region, with a 2x margin for
    variable-length outputs (a FastPitch mel's length depends on the input)."""
    return 2 * sum(int(o.nbytes) for o in sample_outputs)


def perf_command(
    *,
    model_name: str,
    url: str,
    scenario: Scenario,
    point: Point,
    input_data: Path,
    request_count: int,
    interval_ms: int,
    result_csv: Path,
    stability_percentage: str | None = None,
    output_bytes_per_sample: int = 0,
) -> list[str]:
    """The perf_analyzer command line for one point (DLE's flags).

    The output shared-memory region must hold a whole batch of outputs (an nnU-Net volume is
    25 MB a sample), so it is sized from the bytes one sample's outputs take.
    """
    cmd = [
        str(tools.perf_analyzer_binary()),
        "-m", model_name,
        "-x", "1",
        "-b", str(point.batch),
        "-u", url,
        "-i", scenario.protocol,
        "--input-data", str(input_data),
        "--measurement-interval", str(interval_ms),
        "--concurrency-range", f"{point.concurrency}:{point.concurrency}:1",
        "--measurement-mode", "count_windows",
        "--measurement-request-count", str(request_count),
        "-f", str(result_csv),
        "--verbose-csv",
    ]  # fmt: skip
    if scenario.shared_memory == "system":
        size = max(MIN_OUTPUT_SHM_BYTES, output_bytes_per_sample * point.batch)
        cmd += ["--shared-memory", "system", "--output-shared-memory-size", str(size)]
    if stability_percentage is not None:
        cmd += ["--stability-percentage", stability_percentage]
    return cmd


def shared_memory_regions(inputs: list[str], outputs: list[str]) -> list[Path]:
    """The system shared-memory regions perf_analyzer has open for these tensors: it names them
    after the tensors (``/<input>_<i>_<j>``, ``/<output>``), not after its process."""
    if not SHM_DIR.is_dir():
        return []
    patterns = [re.compile(re.escape(name) + r"_\d+_\d+") for name in inputs]
    patterns += [re.compile(re.escape(name)) for name in outputs]
    return sorted(
        p for p in SHM_DIR.iterdir() if any(pattern.fullmatch(p.name) for pattern in patterns)
    )


@contextlib.contextmanager
def shared_memory_lock(inputs: list[str], outputs: list[str]) -> Iterator[None]:
    """Hold the machine's system shared-memory names of these tensors while measuring.

    Two perf_analyzers on one machine whose models share tensor names (TFT on two data sets,
    one model in two formats on two GPUs of a node) would otherwise map, overwrite and resize
    each other's regions; the second waits instead. The lock is an ``flock``, so a killed job
    cannot leave it held; regions a killed perf_analyzer leaves behind are removed on exit.
    """
    if not SHM_DIR.is_dir():
        yield
        return
    names = "\0".join(sorted(inputs) + ["->"] + sorted(outputs))
    lock_path = SHM_DIR / f"deploybench-perf-{hashlib.sha256(names.encode()).hexdigest()[:16]}.lock"
    with lock_path.open("a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.warning(
                "another measurement on this machine uses shared-memory regions named after the "
                "same tensors (%s); waiting for it to finish (lock %s)",
                ", ".join(inputs + outputs),
                lock_path,
            )
            fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            for region in shared_memory_regions(inputs, outputs):
                region.unlink(missing_ok=True)


def parse_result(csv_path: Path, stdout: str) -> dict[str, Any]:
    """perf_analyzer's one-row CSV, latencies converted from µs to ms."""
    with csv_path.open() as f:
        rows = list(csv.DictReader(f))
    if len(rows) != 1:
        raise PerfError(f"{csv_path}: expected one measurement row, found {len(rows)}")
    raw = rows[0]
    row: dict[str, Any] = {dst: float(raw[src]) for src, dst in THROUGHPUT_COLUMNS.items()}
    for src, dst in LATENCY_COLUMNS.items():
        row[dst] = float(raw[src]) / 1000.0
    match = re.search(r"Client:\s*\n\s*Request count:\s*(\d+)", stdout)
    row["measured_requests"] = int(match.group(1)) if match else None
    return row


def run_perf_analyzer(cmd: list[str], timeout_s: float, log_file: Path | None) -> tuple[int, str]:
    """Run one perf_analyzer process; killed (whole group) past ``timeout_s``."""
    with subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        env=tools.perf_analyzer_environment(),
        start_new_session=True,
        # a job killed outright takes it along (the caller waits on it, so its thread lives on)
        preexec_fn=die_with_parent(signal.SIGKILL),  # noqa: PLW1509 - the child only calls prctl
    ) as proc:
        try:
            out, _ = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise PerfError(f"perf_analyzer hung past its timeout of {timeout_s:g} s: {cmd}")
        except BaseException:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise
    if log_file is not None:
        with log_file.open("a") as f:
            f.write(f"$ {' '.join(cmd)}\n{out}\n(exit {proc.returncode})\n")
    return proc.returncode, out


def measure_point(
    *,
    model_name: str,
    url: str,
    scenario: Scenario,
    point: Point,
    input_data: Path,
    settings: MeasureSettings,
    log_file: Path | None = None,
    check_server: Callable[[], None] = lambda: None,
    output_bytes_per_sample: int = 0,
) -> dict[str, Any]:
    """Warm up, then measure until stable (at most ``max_retries`` retries)."""
    with tempfile.TemporaryDirectory(prefix="deploybench-pa-") as tmp:
        result_csv = Path(tmp) / "point.csv"

        def attempt(requests: int, stability: str | None) -> tuple[int, str]:
            check_server()
            result_csv.unlink(missing_ok=True)
            cmd = perf_command(
                model_name=model_name,
                url=url,
                scenario=scenario,
                point=point,
                input_data=input_data,
                request_count=requests,
                interval_ms=settings.measurement_interval_ms,
                result_csv=result_csv,
                stability_percentage=stability,
                output_bytes_per_sample=output_bytes_per_sample,
            )
            code, out = run_perf_analyzer(cmd, settings.timeout_s, log_file)
            if code != 0 and UNSTABLE_MARKER not in out:
                check_server()  # a dead server explains the failure best
                raise PerfError(f"perf_analyzer failed (exit {code}) at {point}:\n{out[-2000:]}")
            return code, out

        if settings.warmup_factor:
            attempt(settings.request_count * settings.warmup_factor, NO_STABILITY_CHECK)

        requests = settings.request_count
        for tries in range(1, settings.max_retries + 2):
            code, out = attempt(requests, None)
            if code == 0:
                return _row(point, parse_result(result_csv, out), requests, True, tries)
            log.warning("%s unstable with %d requests (try %d)", point, requests, tries)
            requests += settings.retry_request_step
        requests -= settings.retry_request_step
        code, out = attempt(requests, NO_STABILITY_CHECK)
        if code != 0:
            raise PerfError(f"perf_analyzer could not measure {point}:\n{out[-2000:]}")
        return _row(point, parse_result(result_csv, out), requests, False, settings.max_retries + 2)


def _row(
    point: Point, values: dict[str, Any], requests: int, stable: bool, attempts: int
) -> dict[str, Any]:
    return {
        "batch": point.batch,
        "concurrency": point.concurrency,
        **values,
        "request_count": requests,
        "stable": stable,
        "attempts": attempts,
    }
