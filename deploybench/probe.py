"""Commands and Python probes run by the preflight (and ``trt_version``'s checks): each in a
process group of its own that is killed at its timeout, so a hung tool leaves nothing behind."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .process import die_with_parent


@dataclass(frozen=True)
class Output:
    code: int | None  # None: it did not run to its end (see ``error``)
    text: str  # stdout and stderr together
    error: str = ""  # why it did not run to its end: not found, timed out


def run_command(
    cmd: Sequence[str], timeout_s: float, env: Mapping[str, str] | None = None
) -> Output:
    """Run ``cmd`` in its own process group; past ``timeout_s`` the group is killed."""
    name = Path(cmd[0]).name
    try:
        proc = subprocess.Popen(
            list(cmd),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            errors="replace",
            env=dict(env) if env is not None else None,
            start_new_session=True,
            preexec_fn=die_with_parent(signal.SIGKILL),  # noqa: PLW1509 - it only calls prctl
        )
    except FileNotFoundError:
        return Output(None, "", f"{name} not found")
    except OSError as exc:
        return Output(None, "", f"{name} could not start: {exc}")
    with proc:
        try:
            out, _ = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc.pid)
            out = ""
            with contextlib.suppress(subprocess.TimeoutExpired):
                out, _ = proc.communicate(timeout=10)
            return Output(None, out or "", f"{name} did not finish within {timeout_s:g} s")
        except BaseException:
            _kill_group(proc.pid)
            proc.wait()
            raise
    return Output(proc.returncode, out)


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def tail(text: str, lines: int = 8) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def python_probe(script: str, args: Sequence[str], timeout_s: float) -> tuple[dict[str, Any], str]:
    """Run ``script`` with this Python in the job's environment; its last ``PREFLIGHT <json>``
    line, or {} and why there is none."""
    out = run_command([sys.executable, "-c", script, *args], timeout_s)
    for line in reversed(out.text.splitlines()):
        if line.startswith("PREFLIGHT "):
            result: dict[str, Any] = json.loads(line.removeprefix("PREFLIGHT "))
            return result, ""
    why = out.error or f"exit {out.code}"
    return {}, f"{why}: {tail(out.text)}" if out.text.strip() else why
