"""Performance points measured by the real ``perf_analyzer``, one process per measurement.

Scenarios follow the seed pages: *offline* is static batching (each batch size at concurrency 1);
*online* is dynamic batching (a concurrency sweep). How perf_analyzer reaches the server (HTTP or
gRPC, system, CUDA or no shared memory) is the model's, per scenario, as DLE's runners chose
(:mod:`deploybench.transport`, ``models.<m>.perf.<scenario>.transport``). Each point is
measured ``trials`` times, the points alternating (trial 1 of every point, then trial 2, ...) so
that drift of the machine spreads over all of them; the CSV row is the trials' mean with its
95 % confidence interval (:mod:`deploybench.stats`), the sidecar CSV keeps every trial.

A trial is measured as the runner that made the model's page measured
(``models.<m>.perf.measurement_mode``). In ``time_windows`` mode (perf_client's ``-p``: nnU-Net,
ResNet-50, FastPitch) a window lasts ``measurement_interval_ms`` and the trial is 3 of them, as
perf_analyzer merges its last 3 windows. Otherwise a trial is perf_analyzer in ``count_windows``
mode (BERT, TFT): a measurement merges its last 3 windows,
each at least 1 s long and lasting until ``request_count`` requests finished (perf_analyzer
2.41 ignores ``--measurement-interval`` in this mode). So that a fast point is not judged on a
few seconds, the request count per window is raised until a trial lasts ``min_duration_ms``
(from the point's rate measured in its warm-up or previous trial); so that a slow point (BERT,
nnU-Net on a CPU) does not run for hours, it is lowered, to one request a window at least,
until a trial fits ``max_duration_ms``, and the row says ``duration_capped``. A trial that
perf_analyzer calls unstable is retried with more requests (as DLE's tooling did); one that
never stabilises is measured once more with the stability criterion off and kept with
``stable=False``: the row is honest about it instead of missing or pretending, and its
``unstable_reason`` says why (that, or trials that disagree beyond ``max_ci_pct``). Where
perf_analyzer may measure only its 3 windows (``max_windows`` 3) its verdict is over exactly the
windows it measures either way, so it measures them with its criterion off and they are judged
here by that criterion (:func:`windows_settled`): an unsettled trial keeps its windows instead of
being measured twice.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import math
import os
import re
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from . import stats, tools
from .collectors import (
    PERF_ANALYZER,
    PROFILE_EXPORT,
    PerfAnalyzerOutput,
    collect_trial,
    derived_values,
)
from .columns import (  # noqa: F401 - LATENCY_COLUMNS, MEASURED: perf's names too (tests)
    CSV_COLUMNS,
    LATENCY_COLUMNS,
    MEASURED,
    PERF_COLUMNS,
    POWER_CAP_REASON,
    Column,
    as_written,
    interval_columns,
    measured_seconds,
    slowdown_parts,
    slowdown_text,
)
from .errors import PerfError
from .instruments import UNMEASURED, Attempt, Instrument, Recorded
from .process import die_with_parent
from .progress import TrialDone
from .server import SHM_DIR
from .transport import Transport

log = logging.getLogger(__name__)

COLUMNS = CSV_COLUMNS  # the CSV a scenario's measurement writes, in its order
UNSTABLE_MARKER = "Failed to obtain stable measurement"
NO_STABILITY_CHECK = "1000"  # --stability-percentage: any variation passes
WINDOWS = 3  # perf_analyzer merges its last 3 measurement windows into the reported result
# perf_analyzer's --stability-percentage default (command_line_parser.cc: stability_threshold 0.1)
STABILITY_PCT = 10.0
# `-v`'s line for each window (inference_profiler.cc ProfileHelper, the same from client r23.12
# to perf_analyzer r25.02): its throughput and the latency it stabilises on (average, or pN)
PASS_LINE = re.compile(
    r"Pass \[(\d+)\] throughput: (\S+) infer/sec\. (?:Avg|p\d+) latency: (\d+) usec"
)
# a count window lasts this long at least (perf_analyzer polls its count once a second)
MIN_COUNT_WINDOW_S = 1.0
FLOOR_MARGIN = 1.1  # aim this far above the duration floor: a trial's rate varies
FLOOR_RERUNS = 2  # a trial that still falls short of the floor is measured again, this often


@dataclass(frozen=True)
class Point:
    batch: int
    concurrency: int


MEASUREMENT_MODES = ("count_windows", "time_windows")


@dataclass(frozen=True)
class MeasureSettings:
    request_count: int  # requests per window, at least (unless the duration cap lowers it)
    measurement_interval_ms: int = 5000
    # count_windows: windows of request_count requests; time_windows: of the interval (DLE's
    # perf_client -p 10000 for nnU-Net, ResNet-50 and FastPitch), whose length is the trial's
    measurement_mode: str = "count_windows"
    max_retries: int = 10
    retry_request_step: int = 50
    warmup_factor: int = 2  # warm-up uses this many times the requests; 0: no warm-up
    timeout_s: float = 600.0
    trials: int = 1  # measurements of each point
    max_ci_pct: float = 5.0  # a stable point's throughput interval, at most, in % of its mean
    min_duration_ms: int = 0  # a trial's measured time, at least
    max_duration_ms: int | None = None  # a trial's measured time, at most (None: no cap)
    # perf_analyzer's --max-trials: windows it measures before calling a point unstable
    # (None: its default, 10); each window lasts a second at least
    max_windows: int | None = None

    @property
    def time_windows(self) -> bool:
        return self.measurement_mode == "time_windows"

    @property
    def judged_here(self) -> bool:
        """Whether a trial's windows are judged here (:func:`windows_settled`), not by
        perf_analyzer: with ``max_windows`` 3 it measures the same 3 windows either way."""
        return self.max_windows == WINDOWS

    def requests_per_window(self, rate: float | None) -> tuple[int, bool]:
        """The request count per window for a point that completes ``rate`` requests a second
        (None: not known yet), and whether the duration cap cut it: the configured count (or
        the floor's) would have made the trial outlast ``max_duration_ms``. Time windows count
        no requests: their length is the interval's."""
        if not rate or rate <= 0 or self.time_windows:
            return self.request_count, False
        window_s = self.min_duration_ms / 1000 / WINDOWS * FLOOR_MARGIN
        wanted = max(self.request_count, math.ceil(rate * window_s))
        most = self.request_limit(rate)
        if most is None or self.max_duration_ms is None:
            return wanted, False
        # capped: the wanted windows would outlast the cap (with one request a window too)
        return min(wanted, most), wanted / rate * WINDOWS > self.max_duration_ms / 1000

    def requests_held(self, rate: float | None, requests: int, windows_of: int = 1) -> int | None:
        """The requests one window holds at ``rate`` requests a second (None: not known), the
        one estimate a job's memory (measurement_memory) and the profile export's budget
        (measure_point) both take. Time windows: rate x the interval (x ``windows_of``, the
        warm-up's longer windows), None where the rate is not known (their length, not a
        count, decides it). Count windows: the ``requests`` asked for, or rate x 1 s where
        more (a window lasts a second at least)."""
        if rate is None or rate <= 0:
            return None if self.time_windows else requests
        if self.time_windows:
            return math.ceil(rate * self.measurement_interval_ms / 1000 * windows_of)
        return max(requests, math.ceil(rate * MIN_COUNT_WINDOW_S))

    def request_limit(self, rate: float | None) -> int | None:
        """The most requests per window that keep a trial within the duration cap (one at
        least); None without a cap or a known rate."""
        if self.max_duration_ms is None or not rate or rate <= 0:
            return None
        return max(1, math.floor(rate * self.max_duration_ms / 1000 / WINDOWS))


@dataclass(frozen=True)
class ExportSize:
    """What perf_analyzer's profile export would hold of a request's tensors: whether this
    perf_analyzer records them at all (:func:`deploybench.tails.records_tensors`), and the
    values of one sample's inputs (it records the first sample's) and outputs (all of the
    batch's)."""

    tensors_recorded: bool = False
    input_values: int = 0
    output_values: int = 0

    def values_per_request(self, batch: int) -> int:
        return self.input_values + batch * self.output_values if self.tensors_recorded else 0


TIMESTAMPS_ONLY = ExportSize()  # a perf_analyzer that records no tensors (2.41)


def _alive() -> None:
    """A server check that never fails: no server to ask."""


@dataclass(frozen=True)
class Measurement:
    """A scenario's measurement, handed to each of its trials whole: what perf_analyzer
    measures (the served model, the server's URL, the transport, the example to send) and how
    (``settings``), and the instruments measuring beside it (deploybench.instruments; a
    source none of them feeds says "not measured": instruments.UNMEASURED).

    ``batch_models``: a batch measured on a model of its own (offline per-batch engines);
    ``output_bytes_per_sample``: the output region's size (perf_command); ``export_size``:
    what the profile export would hold of the tensors (tails.export_too_costly);
    ``check_server``: raises when the server died (a dead server explains a failure best)."""

    model_name: str
    url: str
    transport: Transport
    input_data: Path
    settings: MeasureSettings
    instruments: tuple[Instrument, ...] = UNMEASURED
    output_bytes_per_sample: int = 0
    export_size: ExportSize = TIMESTAMPS_ONLY
    batch_models: Mapping[str, str] = field(default_factory=dict)
    log_file: Path | None = None
    check_server: Callable[[], None] = _alive

    def __post_init__(self) -> None:
        sources = [i.source for i in self.instruments]
        if len(sources) != len(set(sources)):
            raise PerfError(f"two instruments feed one source: {sources}")

    def served_model(self, point: Point) -> str:
        """The model that serves ``point``: its batch's own, or the scenario's."""
        return self.batch_models.get(str(point.batch), self.model_name)

    def instrument_flags(self) -> list[str]:
        return [flag for instrument in self.instruments for flag in instrument.flags()]


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
    transport: Transport,
    point: Point,
    input_data: Path,
    request_count: int,
    interval_ms: int,
    result_csv: Path,
    stability_percentage: str | None = None,
    output_bytes_per_sample: int = 0,
    max_windows: int | None = None,
    mode: str = "count_windows",
    profile_export: Path | None = None,
    verbose: bool = False,
    extra: Sequence[str] = (),
) -> list[str]:
    """The perf_analyzer command line for one point (DLE's flags), over ``transport``: ``-i
    http|grpc``, and ``--shared-memory system|cuda`` unless it uses none (perf_analyzer's
    default; its flags as parsed by triton-inference-server/client r23.12,
    src/c++/perf_analyzer/command_line_parser.cc, the source of tritonclient 2.41's binary).

    ``mode``: count_windows (``--measurement-request-count``) or time_windows (windows of
    ``interval_ms``, as perf_client's ``-p``). ``profile_export``: where perf_analyzer writes
    every request's timestamps and its windows' boundaries (``--profile-export-file``, in
    client r23.12's command_line_parser.cc and profile_data_exporter.cc). ``verbose``: ``-v``,
    a line for each window (:func:`windows_settled` reads them). ``extra``: the flags of the
    instruments measuring beside it (``--collect-metrics``: deploybench.instruments).

    The output shared-memory region (system or CUDA) must hold a whole batch of outputs (an
    nnU-Net volume is 25 MB a sample), so it is sized from the bytes one sample's outputs take.
    """
    if mode not in MEASUREMENT_MODES:
        raise PerfError(f"unknown measurement mode {mode!r}; valid choices: {MEASUREMENT_MODES}")
    cmd = [
        str(tools.perf_analyzer_binary()),
        "-m", model_name,
        "-x", "1",
        "-b", str(point.batch),
        "-u", url,
        "-i", transport.protocol,
        "--input-data", str(input_data),
        "--measurement-interval", str(interval_ms),
        "--concurrency-range", f"{point.concurrency}:{point.concurrency}:1",
        "--measurement-mode", mode,
        *(["--measurement-request-count", str(request_count)] if mode == "count_windows" else []),
        "-f", str(result_csv),
        "--verbose-csv",
    ]  # fmt: skip
    if transport.shared_memory != "none":
        size = max(MIN_OUTPUT_SHM_BYTES, output_bytes_per_sample * point.batch)
        cmd += ["--shared-memory", transport.shared_memory]
        cmd += ["--output-shared-memory-size", str(size)]
    if stability_percentage is not None:
        cmd += ["--stability-percentage", stability_percentage]
    if max_windows is not None:
        cmd += ["--max-trials", str(max_windows)]
    if profile_export is not None:  # every request's timestamps (deploybench.tails)
        cmd += ["--profile-export-file", str(profile_export)]
    if verbose:
        cmd.append("-v")
    return cmd + list(extra)  # the instruments' (Measurement.instrument_flags)


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


def shared_memory_guard(
    transport: Transport, inputs: list[str], outputs: list[str]
) -> contextlib.AbstractContextManager[None]:
    """What a measurement over ``transport`` holds while it runs: with system shared memory,
    :func:`shared_memory_lock` (and the cleanup of its /dev/shm regions). CUDA shared memory
    leaves nothing there: perf_analyzer ``cudaMalloc``s each region on the GPU and registers
    it with the server by a ``cudaIpc`` handle (client r23.12,
    src/c++/perf_analyzer/infer_data_manager_shm.cc), under a name only the job's own server
    knows, and the CUDA driver releases it when the two processes exit: no lock, no cleanup."""
    if transport.uses_system_shared_memory:
        return shared_memory_lock(inputs, outputs)
    return contextlib.nullcontext()


def parse_result(csv_path: Path, stdout: str) -> dict[str, Any]:
    """One measurement's values from perf_analyzer's one-row CSV and its stdout, latencies
    converted from µs to ms (:func:`deploybench.collectors.perf_analyzer`)."""
    return collect_trial({PERF_ANALYZER: PerfAnalyzerOutput(csv_path, stdout)})


def windows_settled(stdout: str, stability_pct: float = STABILITY_PCT) -> bool:
    """Whether perf_analyzer's last 3 windows (its ``-v`` lines) meet its own stability
    criterion (inference_profiler.cc DetermineStability, client r23.12 to perf_analyzer r25.02):
    each window's throughput non-zero, and the largest throughput and the largest latency each
    at most ``1 + stability_pct / 100`` times the smallest. The lines round throughput to 6
    digits and latency to whole microseconds, so a ratio that close to the bound may be judged
    otherwise than perf_analyzer would have."""
    windows = [(float(t), int(lat)) for _, t, lat in PASS_LINE.findall(stdout)]
    if len(windows) < WINDOWS:
        raise PerfError(
            f"perf_analyzer printed {len(windows)} window lines ('Pass [n] throughput: ...'), "
            f"{WINDOWS} needed to judge its stability; its output:\n{stdout[-2000:]}"
        )
    bound = 1 + stability_pct / 100
    throughputs, latencies = zip(*windows[-WINDOWS:], strict=True)
    if min(throughputs) <= 0 or min(latencies) <= 0:
        return False
    return max(throughputs) / min(throughputs) <= bound and max(latencies) / min(latencies) <= bound


def request_rate(values: dict[str, Any], batch: int) -> float | None:
    """Requests a second of a measurement (perf_analyzer reports inferences a second)."""
    throughput = values.get("throughput")
    return float(throughput) / batch if throughput else None


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
    measurement: Measurement, point: Point, *, warm_up: bool = True, rate: float | None = None
) -> dict[str, Any]:
    """One trial of one point: warm up (``warm_up``, and a warm-up factor), then measure until
    stable (at most ``max_retries`` retries) for at least the duration floor. ``rate``: the
    point's requests per second when known (a warm-up measures it). A measuring attempt
    records every request (perf_analyzer's profile export) and runs the measurement's
    instruments beside it; the trial's values are over its measured windows. Where that export
    would hold too many tensors (``export_size``: tails.export_too_costly, for the requests a
    window holds: MeasureSettings.requests_held) it is not asked for: the trial then has no
    tails, its instruments no windows, and they say why. In time windows that count is the
    rate x the interval; where no warm-up or earlier trial measured the rate, an export that
    records tensors is not asked for either (its size is not known)."""
    from .tails import export_too_costly, read_profile_export

    settings, transport = measurement.settings, measurement.transport
    size = measurement.export_size
    with tempfile.TemporaryDirectory(prefix="deploybench-pa-") as tmp:
        result_csv = Path(tmp) / "point.csv"
        export = Path(tmp) / "requests.json"
        last: list[tuple[Attempt, list[Any]]] = []  # the last attempt and its instruments' runs

        def attempt(
            requests: int,
            stability: str | None,
            windows_of: int = 1,
            measuring: bool = True,
            verbose: bool = False,
        ) -> tuple[int, str]:
            measurement.check_server()
            result_csv.unlink(missing_ok=True)
            export.unlink(missing_ok=True)
            # the export holds every request its windows held: in time windows that is the
            # point's rate (its warm-up's or previous trial's) x the interval, not `requests`
            too_costly = (
                export_too_costly(
                    tensors_recorded=size.tensors_recorded,
                    shared_memory=transport.shared_memory != "none",
                    values_per_request=size.values_per_request(point.batch),
                    requests_per_window=settings.requests_held(rate, requests, windows_of),
                    max_windows=settings.max_windows,
                )
                if measuring
                else None
            )
            this = Attempt(str(point), measuring and not too_costly, too_costly)
            cmd = perf_command(
                model_name=measurement.served_model(point),
                url=measurement.url,
                transport=transport,
                point=point,
                input_data=measurement.input_data,
                request_count=requests,
                interval_ms=settings.measurement_interval_ms * windows_of,
                result_csv=result_csv,
                stability_percentage=stability,
                output_bytes_per_sample=measurement.output_bytes_per_sample,
                max_windows=settings.max_windows,
                mode=settings.measurement_mode,
                profile_export=export if this.recording else None,
                verbose=verbose,
                extra=measurement.instrument_flags(),
            )
            with contextlib.ExitStack() as stack:
                ran = [stack.enter_context(i.during(this)) for i in measurement.instruments]
                code, out = run_perf_analyzer(cmd, settings.timeout_s, measurement.log_file)
            last[:] = [(this, ran)]
            if code != 0 and UNSTABLE_MARKER not in out:
                measurement.check_server()  # a dead server explains the failure best
                raise PerfError(f"perf_analyzer failed (exit {code}) at {point}:\n{out[-2000:]}")
            return code, out

        if warm_up and settings.warmup_factor:
            # longer windows: more requests, or (time windows) a longer interval
            factor = settings.warmup_factor
            code, out = attempt(
                settings.request_count * factor,
                NO_STABILITY_CHECK,
                windows_of=factor if settings.time_windows else 1,
                measuring=False,
            )
            if code == 0:
                rate = request_rate(parse_result(result_csv, out), point.batch)

        floor_s = settings.min_duration_ms / 1000
        requests, capped = settings.requests_per_window(rate)
        attempts = unstable = short = 0
        judged_here = settings.judged_here
        # perf_analyzer's own criterion, until it never holds; judged here: always off
        stability: str | None = NO_STABILITY_CHECK if judged_here else None
        given_up = False  # retries spent: the next measurement is kept, settled or not
        while True:
            attempts += 1
            code, out = attempt(requests, stability, verbose=judged_here)
            if code != 0 and stability is not None:
                raise PerfError(f"perf_analyzer could not measure {point}:\n{out[-2000:]}")
            settled = code == 0 and (windows_settled(out) if judged_here else stability is None)
            if not settled and not given_up:
                unstable += 1
                log.warning("%s unstable with %d requests (try %d)", point, requests, attempts)
                if unstable > settings.max_retries:
                    given_up = True
                    if not judged_here:  # perf_analyzer reported nothing: once more, kept
                        stability = NO_STABILITY_CHECK
                        continue
                else:
                    requests += settings.retry_request_step
                    limit = settings.request_limit(rate)
                    if limit is not None:  # retries stay within the duration cap
                        requests = min(requests, limit)
                    continue
            # the trial's tools' outputs → its values (collectors.collect_trial)
            this, ran = last[0]
            if this.unrecorded:
                log.warning("%s: %s", point, this.unrecorded)
            window = read_profile_export(export) if this.recording else None
            inferences = window.requests * point.batch if window is not None else 0
            recorded = Recorded(window, inferences, result_csv)
            outputs: dict[str, Any] = {
                PERF_ANALYZER: PerfAnalyzerOutput(result_csv, out),
                PROFILE_EXPORT: window,
            }
            for instrument, running in zip(measurement.instruments, ran, strict=True):
                outputs[instrument.source] = instrument.output(this, running, recorded)
            for unmeasured in UNMEASURED:  # a source no instrument measured says so
                if unmeasured.source not in outputs:
                    outputs[unmeasured.source] = unmeasured.output(this, None, recorded)
            values = collect_trial(outputs)
            seconds = measured_seconds(values, point.batch)
            if (
                seconds is not None
                and seconds < floor_s
                and not capped
                and short < FLOOR_RERUNS
                and not settings.time_windows  # their length is the interval's, not ours
            ):
                short += 1
                log.warning(
                    "%s measured %.2f s with %d requests a window, under the %.2f s floor",
                    point,
                    seconds,
                    requests,
                    floor_s,
                )
                rate = request_rate(values, point.batch)
                floor_requests, capped = settings.requests_per_window(rate)
                requests = max(requests, floor_requests)
                continue
            if settings.time_windows:  # the requests its windows held, not a count asked for
                held = values.get("measured_requests")
                requests = math.ceil(held / WINDOWS) if held else 0
            return _row(point, values, requests, settled, attempts, capped)


def measure_trials(
    points: Iterable[Point],
    trials: int,
    measure: Callable[[Point, bool, float | None], dict[str, Any]],
    progress: Callable[[TrialDone], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
    kept: Iterable[dict[str, Any]] = (),
    keep: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """Every point ``trials`` times, alternating: trial 1 of each point, then trial 2, ...
    ``measure(point, warm_up, rate)`` measures one trial; a point is warmed up on its first
    visit only, later visits start from the rate its previous trial measured. Returns the
    trials' rows (each with its ``trial`` number) in measurement order. ``progress`` hears of
    each trial once it is done (between two trials, never during one), with the time the
    trials so far took by ``clock``.

    ``kept``: trials an earlier attempt measured (deploybench.partial), taken as they are in
    their places; a point first visited after them is warmed up then (the server is another)
    and starts from the rate its last kept trial measured. ``keep`` hears of each trial this
    attempt measures, once it is done."""
    points = list(points)
    earlier = {(Point(int(r["batch"]), int(r["concurrency"])), int(r["trial"])): r for r in kept}
    rates: dict[Point, float | None] = {}
    visited: set[Point] = set()
    rows = []
    spent = 0.0
    measured = 0  # by this attempt, of `to_measure`
    to_measure = sum(1 for t in range(1, trials + 1) for p in points if (p, t) not in earlier)
    for trial in range(1, trials + 1):
        for point in points:
            if (point, trial) in earlier:
                row = earlier[point, trial]
                rates[point] = request_rate(row, point.batch)
                rows.append(row)
                continue
            started = clock()
            row = measure(point, point not in visited, rates.get(point))
            visited.add(point)
            spent += clock() - started
            measured += 1
            rates[point] = request_rate(row, point.batch)
            row = {**row, "trial": trial}
            rows.append(row)
            if keep is not None:
                keep(row)
            if progress is not None:
                progress(
                    TrialDone(
                        batch=point.batch,
                        concurrency=point.concurrency,
                        trial=trial,
                        trials=trials,
                        done=measured,
                        total=to_measure,
                        throughput=_float(row.get("throughput")),
                        p99_latency_ms=_float(row.get("p99_latency_ms")),
                        spent_s=spent,
                    )
                )
    return rows


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


def joined_distinct(texts: Iterable[Any]) -> str:
    """The distinct parts of ``texts`` (each itself "a; b" or empty), in order, joined by "; ":
    a point's union of its trials' texts (throttle reasons, energy statuses)."""
    return "; ".join(dict.fromkeys(t for v in texts for t in str(v or "").split("; ") if t))


def unstable_reason(
    trials_unsettled: int,
    trials: int,
    throughput: stats.Interval,
    max_ci_pct: float,
    throttled: Sequence[str] = (),
) -> str:
    """Why a point is not stable ("" when it is): perf_analyzer did not settle in some of its
    trials (each kept: measured once more with its criterion off, or its 3 windows judged
    here), and/or (with two trials or
    more) the throughput's 95 % interval is wider than ``max_ci_pct`` % of the mean, and/or a
    thermal or hardware slowdown held the GPU's clocks down for more than
    ``energy.max_slowdown_fraction`` of some trials (``throttled``: each such trial's
    ``throttle_reasons``; its power capping is left out of the reason)."""
    reasons = []
    if trials_unsettled:
        reasons.append(f"perf_analyzer did not settle ({trials_unsettled} of {trials} trials)")
    if throughput.n >= 2 and not throughput.within(max_ci_pct):
        width = throughput.relative * 100
        shown = "not known (mean 0)" if math.isnan(width) else f"±{width:.1f} %"
        reasons.append(f"interval {shown} > max_ci_pct {max_ci_pct:g} %")
    if throttled:
        found: dict[str, float] = {}
        for text in throttled:
            for name, fraction in slowdown_parts(text).items():
                if name != POWER_CAP_REASON:
                    found[name] = max(found.get(name, 0.0), fraction)
        names = slowdown_text(found) or joined_distinct(throttled)
        reasons.append(
            f"GPU thermal or hardware slowdown ({names}) in {len(throttled)} of {trials} trials"
        )
    return "; ".join(reasons)


def summarize(
    trial_rows: list[dict[str, Any]],
    max_ci_pct: float,
    columns: Sequence[Column] = PERF_COLUMNS,
) -> list[dict[str, Any]]:
    """One row per point (in first-measured order) from its trials, every column combined as
    its :class:`Column`'s ``aggregate`` says: the mean of every measured value (its 95 %
    half-width beside it where it has an interval column; empty with one trial), the sums,
    minima and flags of how the point was measured. ``stable``: perf_analyzer called every
    trial stable, (with two trials or more) the throughput interval is within ``max_ci_pct`` %
    of the mean, and no trial had a thermal or hardware slowdown over
    ``energy.max_slowdown_fraction``; ``unstable_reason`` says which failed
    (:func:`unstable_reason`). The run's columns (and the transport's) are the job's to add."""
    by_point: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for row in trial_rows:
        by_point.setdefault((int(row["batch"]), int(row["concurrency"])), []).append(row)
    intervals_of = interval_columns(columns)
    summary = []
    for (batch, concurrency), rows in by_point.items():
        point: dict[str, Any] = {"batch": batch, "concurrency": concurrency}
        means: dict[str, stats.Interval] = {}
        for column in columns:
            if not column.in_points or column.aggregate in (None, "key", "verdict"):
                continue
            if column.aggregate == "mean":
                numbers = [float(v) for r in rows if (v := r.get(column.name)) is not None]
                if len(numbers) < len(rows):  # not measured in a trial: none for the point
                    point[column.name] = None
                    if column.name in intervals_of:
                        point[intervals_of[column.name]] = None
                    continue
                iv = means[column.name] = stats.interval(numbers)
                point[column.name] = as_written(iv.mean)
                if column.name in intervals_of:
                    width = widened(iv.half_width, column.widened_by, rows)
                    half = None if math.isnan(width) else as_written(width)
                    point[intervals_of[column.name]] = half
            elif column.aggregate == "pooled":
                assert column.pool is not None  # columns.check
                point[column.name] = column.pool(rows)
            else:
                point[column.name] = aggregate(column, [r.get(column.name) for r in rows])
        # The verdicts judge the trials as a whole (perf_analyzer's verdict on each, the
        # throughput's interval against max_ci_pct, the GPU's throttling), not one column's
        # values: no aggregation.
        unsettled = sum(1 for r in rows if not bool(r["stable"]))
        throttled = [str(r.get("throttle_reasons") or "") for r in rows if r.get("throttled")]
        reason = unstable_reason(unsettled, len(rows), means["throughput"], max_ci_pct, throttled)
        point |= {"stable": not reason, "unstable_reason": reason}
        summary.append({c.name: point[c.name] for c in columns if c.name in point})
    return summary


def widened(half_width: float, by: str | None, rows: Sequence[Mapping[str, Any]]) -> float:
    """A mean's half-width over its trials, with the trials' mean of the column ``by`` (an
    uncertainty common to every trial: Column.widened_by) added in quadrature where every
    trial has it; NaN stays NaN (one trial: no interval)."""
    if by is None or math.isnan(half_width):
        return half_width
    extra = [float(v) for r in rows if (v := r.get(by)) is not None]
    if not extra or len(extra) < len(rows):
        return half_width
    return math.hypot(half_width, sum(extra) / len(extra))


def aggregate(column: Column, values: list[Any]) -> Any:
    """A point's value of ``column`` from its trials' ``values`` (in measurement order), as its
    ``aggregate`` says (all but ``mean``, whose interval :func:`summarize` adds)."""
    how = column.aggregate
    if how == "count":
        return len(values)
    if how == "first":
        return values[0]
    if how == "union":
        return joined_distinct(values)
    if how in ("any", "all"):
        if all(v is None for v in values):  # not measured (a meter's flag): none, not False
            return None
        flags = [bool(v) for v in values]
        return any(flags) if how == "any" else all(flags)
    if how in ("sum", "min", "max"):
        if any(v is None for v in values):  # a trial without it: the point has none
            return None
        numbers = [int(v) if column.kind == "int" else float(v) for v in values]
        if how == "sum":
            return sum(numbers)
        return min(numbers) if how == "min" else max(numbers)
    raise ValueError(
        f"column {column.name!r}: aggregate {how!r} is not one value of its trials; "
        "valid: count, first, union, any, all, sum, min, max (mean, pooled: perf.summarize)"
    )


def _row(
    point: Point,
    values: dict[str, Any],
    requests: int,
    stable: bool,
    attempts: int,
    capped: bool,
) -> dict[str, Any]:
    """A trial's row: its point, its tools' values, the measurement loop's records and the
    derived columns."""
    row = {
        "batch": point.batch,
        "concurrency": point.concurrency,
        **values,
        "request_count": requests,
        "duration_capped": capped,
        "stable": stable,
        "attempts": attempts,
    }
    return row | derived_values(row)
