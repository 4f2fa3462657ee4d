"""A ``tritonserver`` process owned by one job: free ports, readiness, and a stop that always runs.

The server gets its own process group (its python-backend stubs are in it too), so stopping it
stops them all; with ``PR_SET_PDEATHSIG`` the kernel also stops it if the job that started it is
killed outright. ``graceful_signals`` turns SIGTERM (what SLURM and Snakemake send) into an
exception, so ``with TritonServer(...)`` blocks unwind and stop the server on it too.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import FrameType, TracebackType
from typing import TYPE_CHECKING

from . import tools
from .errors import ServerError
from .process import die_with_parent

if TYPE_CHECKING:  # 3.11: jobs run on the V100 images' Python 3.10 too
    from typing_extensions import Self

log = logging.getLogger(__name__)

PORT_IN_USE_MARKERS = ("address already in use", "failed to start", "socket bind failed")
SHM_DIR = Path("/dev/shm")  # POSIX shared memory: machine-wide, shared with containers


class Terminated(SystemExit):
    """Raised in the main thread when the job is sent SIGTERM."""


# The stop that arrived while the main thread held it (see held_signals); None when not holding.
_held: list[BaseException] | None = None


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports that are free on loopback right now (held open together so the
    kernel cannot hand out one twice)."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


@contextlib.contextmanager
def graceful_signals() -> Iterator[None]:
    """SIGTERM raises ``Terminated`` and SIGINT KeyboardInterrupt while inside. Only the first:
    it starts the cleanup, and a later one must not cut that short (SLURM signals every process
    of a job; a job whose Snakemake died signals itself, see deploybench.process), so they are
    ignored from then on, also after the block, while the exception ends the job."""
    stopping = False
    signals = [signal.SIGTERM]
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # not if ignored (nohup)
        signals.append(signal.SIGINT)

    def ignore(_signum: int, _frame: FrameType | None) -> None:
        pass

    def handler(signum: int, _frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True
        for sig in signals:
            signal.signal(sig, ignore)
        stop = KeyboardInterrupt() if signum == signal.SIGINT else Terminated(128 + signum)
        if _held is not None:
            _held.append(stop)
            return
        raise stop

    previous = {sig: signal.signal(sig, handler) for sig in signals}
    try:
        yield
    finally:
        if not stopping:
            for sig, old in previous.items():
                signal.signal(sig, old)


@contextlib.contextmanager
def held_signals() -> Iterator[None]:
    """``graceful_signals``' exception is raised at the end of this block instead of inside it:
    a child started in it is assigned before a stop can unwind the code that must stop it.
    Signal handlers run in the main thread, so only the main thread holds them."""
    global _held
    if _held is not None or threading.current_thread() is not threading.main_thread():
        yield
        return
    _held = []
    try:
        yield
    finally:
        stops, _held = _held, None
        if stops:
            raise stops[0]


class TritonServer:
    """``with TritonServer(repo, log) as server:`` → a ready server on free loopback ports."""

    def __init__(
        self,
        repository: Path,
        log_path: Path,
        *,
        startup_timeout_s: float = 120.0,
        shutdown_timeout_s: float = 30.0,
        start_attempts: int = 3,
        extra_args: tuple[str, ...] = (),
        environment: dict[str, str] | None = None,
    ) -> None:
        self.repository = Path(repository).resolve()
        # set in the server's environment (a run's `server.environment`: TF32 in libtorch)
        self.environment = dict(environment or {})
        self.log_path = Path(log_path)
        self.startup_timeout_s = startup_timeout_s
        self.shutdown_timeout_s = shutdown_timeout_s
        self.start_attempts = start_attempts
        self.extra_args = extra_args
        self.process: subprocess.Popen[bytes] | None = None
        # the environment the last process was started with (its Popen env): provenance
        self.started_environment: dict[str, str] | None = None
        self._stopped: subprocess.Popen[bytes] | None = None  # the process stop() has swept
        self.http_port = self.grpc_port = self.metrics_port = 0
        # The python backend's regions get a name of this server's own, so that stop() can
        # remove what a killed server leaves in /dev/shm (it unlinks them only on a clean exit).
        self.shm_prefix = f"deploybench_{uuid.uuid4().hex[:12]}_"

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def url(self, protocol: str) -> str:
        return self.http_url if protocol == "http" else self.grpc_url

    def command(self) -> list[str]:
        cmd = [
            str(tools.tritonserver_binary()),
            f"--model-repository={self.repository}",
            f"--http-port={self.http_port}",
            f"--grpc-port={self.grpc_port}",
            f"--metrics-port={self.metrics_port}",
            "--exit-on-error=true",
            "--strict-readiness=true",
            f"--backend-config=python,shm-region-prefix-name={self.shm_prefix}",
        ]
        backends = tools.backend_directory()
        if backends is not None:
            cmd.append(f"--backend-directory={backends}")
        return cmd + list(self.extra_args)

    def start(self) -> Self:
        """Start the server and wait until it is ready. Whatever ends this early (a failed
        start, SIGTERM, Ctrl-C) stops what it started before it propagates."""
        try:
            return self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> Self:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        for attempt in range(1, self.start_attempts + 1):
            self.http_port, self.grpc_port, self.metrics_port = free_ports(3)
            process = self._spawn(self.command())  # also self.process, for stop()
            try:
                self._wait_ready()
            except ServerError:
                self.stop()
                # Another process may have taken a port between our probe and the bind: retry.
                if attempt < self.start_attempts and self._ports_were_taken():
                    log.warning("ports taken (attempt %d), retrying on new ports", attempt)
                    continue
                raise
            log.info(
                "tritonserver ready (pid %d, http %d, grpc %d)",
                process.pid,
                self.http_port,
                self.grpc_port,
            )
            return self
        raise ServerError("unreachable")  # pragma: no cover

    def _spawn(self, cmd: list[str]) -> subprocess.Popen[bytes]:
        with self.log_path.open("ab") as out:
            out.write(f"$ {' '.join(cmd)}\n".encode())
            out.flush()
            env = tools.server_environment() | self.environment
            self.started_environment = env
            # A SIGTERM inside Popen would lose the child it has just started: held until
            # the caller has it (self.process), so that stop() reaches it.
            with held_signals():
                self.process = subprocess.Popen(
                    cmd,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env=env,
                    start_new_session=True,
                    preexec_fn=die_with_parent(signal.SIGTERM),  # noqa: PLW1509 - the child only calls prctl
                )
            return self.process

    def _log_tail(self, lines: int = 15) -> str:
        """Triton's error lines (``E<date> ...``) and the last lines of the server log."""
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no server log)"
        errors = [line for line in text if re.match(r"^E\d{4} ", line)][-10:]
        tail = [line for line in text[-lines:] if line not in errors]
        return "\n".join(errors + tail)

    def _ports_were_taken(self) -> bool:
        tail = self._log_tail(15).lower()
        return any(marker in tail for marker in PORT_IN_USE_MARKERS)

    def _wait_ready(self) -> None:
        assert self.process is not None
        deadline = time.monotonic() + self.startup_timeout_s
        url = f"http://{self.http_url}/v2/health/ready"
        while time.monotonic() < deadline:
            code = self.process.poll()
            if code is not None:
                raise ServerError(
                    f"tritonserver exited with code {code} before it was ready; log "
                    f"{self.log_path}:\n{self._log_tail()}"
                )
            try:
                with urllib.request.urlopen(url, timeout=2) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass
            time.sleep(0.25)
        raise ServerError(
            f"tritonserver not ready within {self.startup_timeout_s:g} s; log {self.log_path}:\n"
            f"{self._log_tail()}"
        )

    def metadata(self) -> dict[str, object]:
        """The server's ``/v2`` metadata (name, version, extensions) and the binary that runs."""
        with urllib.request.urlopen(f"http://{self.http_url}/v2", timeout=10) as response:
            data: dict[str, object] = json.loads(response.read())
        return {**data, "binary": self.command()[0]}

    def process_environment(self) -> tuple[dict[str, str], str]:
        """The server process's environment and where it was read: its ``/proc/<pid>/environ``
        while it runs (Linux, where readable: what the kernel gave the process at exec), else
        the environment it was started with (the Popen ``env``). Empty where none started."""
        proc = self.process
        if proc is not None and proc.poll() is None:  # our child, not reaped: its pid is its own
            environ = Path(f"/proc/{proc.pid}/environ")
            with contextlib.suppress(OSError):
                items = environ.read_bytes().split(b"\0")
                pairs = (item.decode(errors="replace").split("=", 1) for item in items)
                read = {pair[0]: pair[1] for pair in pairs if len(pair) == 2}
                if read:  # (empty: it has exited since)
                    return read, str(environ)
        if self.started_environment is None:
            return {}, "no server started"
        return dict(self.started_environment), "the environment it was started with (Popen env)"

    def is_running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def check_alive(self) -> None:
        if not self.is_running():
            code = self.process.poll() if self.process else None
            raise ServerError(
                f"tritonserver died (exit code {code}); log {self.log_path}:\n{self._log_tail()}"
            )

    def stop(self) -> None:
        """Stop the server and everything in its process group; idempotent, and a no-op where
        none was started. Once swept, a group is not signalled again (its id may be reused)."""
        proc = self.process
        if proc is None or proc is self._stopped:
            return
        if proc.poll() is None:
            self._signal_group(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=self.shutdown_timeout_s)
            except subprocess.TimeoutExpired:
                log.warning(
                    "tritonserver ignored SIGTERM for %ss; killing", self.shutdown_timeout_s
                )
        # Stubs may outlive the server's own exit: sweep the group either way.
        self._signal_group(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)
        for region in self.shm_regions():
            region.unlink(missing_ok=True)
        self._stopped = proc

    def shm_regions(self) -> list[Path]:
        """The python backend's shared-memory regions of this server still in /dev/shm."""
        return sorted(SHM_DIR.glob(f"{self.shm_prefix}*")) if SHM_DIR.is_dir() else []

    @staticmethod
    def _signal_group(pgid: int, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
