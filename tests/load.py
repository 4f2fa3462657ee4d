"""Run a command with CPU-burning processes beside it, as when another job shares the machine:
``python3 -m tests.load [--burners N] -- COMMAND ...`` (``make test-under-load``;
docs/tests.md). Its exit status is the command's.

Each burner is a busy Python loop, a core's worth of load at normal priority, started before the
command and killed after it, or by the kernel when this process dies (no burner outlives it).
Stdlib and :mod:`deploybench.process` only: it starts before ``make test`` has made the venv.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
from collections.abc import Sequence

from deploybench.process import die_with_parent

BURN = "while True: pass"


def burners(count: int) -> list[subprocess.Popen[bytes]]:
    """``count`` busy processes that die with this one."""
    return [
        subprocess.Popen(
            [sys.executable, "-c", BURN],
            stdin=subprocess.DEVNULL,
            preexec_fn=die_with_parent(signal.SIGKILL),  # noqa: PLW1509 - it only calls prctl
        )
        for _ in range(count)
    ]


def run_beside(command: Sequence[str], count: int) -> int:
    """``command``'s exit status, run with ``count`` burners beside it. Ctrl-C reaches the
    command from the terminal, SIGTERM is passed on to it: either way it stops as it would
    alone, and the burners stop after it."""
    load = burners(count)
    try:
        pids = ", ".join(str(b.pid) for b in load)
        print(f"load: {count} CPU-burning process(es) (pids {pids}) beside: {' '.join(command)}")
        sys.stdout.flush()
        hook = die_with_parent(signal.SIGTERM)
        child = subprocess.Popen(command, preexec_fn=hook)  # noqa: PLW1509 - it only calls prctl
        signal.signal(signal.SIGTERM, lambda *_: child.send_signal(signal.SIGTERM))
        while True:
            try:
                return child.wait()
            except KeyboardInterrupt:
                continue  # the terminal sent the command SIGINT too: it stops as it does
    finally:
        for burner in load:
            burner.kill()
            burner.wait()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python3 -m tests.load",
        description="Run COMMAND with CPU-burning processes beside it (a shared machine).",
    )
    parser.add_argument(
        "--burners",
        type=int,
        default=1,
        metavar="N",
        help="busy processes beside the command, a core each (default: %(default)s)",
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND ...")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command: python3 -m tests.load [--burners N] -- COMMAND ...")
    if args.burners < 0:
        parser.error(f"--burners must be 0 or more, not {args.burners}")
    return run_beside(command, args.burners)


if __name__ == "__main__":
    sys.exit(main())
