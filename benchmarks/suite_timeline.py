"""Where the test suite's time goes: a pytest plugin that writes one line per test, and a
summary of those lines.

    PYTHONPATH=. PYTEST_ADDOPTS="-p benchmarks.suite_timeline" make test
    .venv/bin/python benchmarks/suite_timeline.py suite-timeline.tsv

Each line: the process (a pytest-xdist worker writes its own lines), the test, when it started
(seconds since that process's start), its wall time, the cores the whole machine left idle
meanwhile (/proc/stat: idle and iowait, every core), and the CPU that process and the children it
has reaped used (a job started by SLURM or another worker is not counted). On a machine where the
suite is all that runs, idle core-seconds are what more workers could use. The summary prints
per module its tests' wall time, CPU, and the machine's idle core-seconds and share of its
cores while they ran.
``SUITE_TIMELINE`` names the file (default: suite-timeline.tsv in the working directory).
"""

from __future__ import annotations

import argparse
import collections
import os
import resource
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

OUT = Path(os.environ.get("SUITE_TIMELINE", "suite-timeline.tsv"))
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
STARTED = time.monotonic()


def idle_core_seconds() -> float:
    """Idle and iowait time of every core since boot."""
    with open("/proc/stat") as stat:
        fields = stat.readline().split()[1:]
    return (int(fields[3]) + int(fields[4])) / CLOCK_TICKS


def cpu_seconds() -> float:
    """This process's CPU and that of the children it has reaped."""
    own, children = (
        resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
    )
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    start, idle, cpu = time.monotonic(), idle_core_seconds(), cpu_seconds()
    yield
    line = (
        f"{os.getpid()}\t{item.nodeid}\t{start - STARTED:.1f}\t{time.monotonic() - start:.2f}"
        f"\t{idle_core_seconds() - idle:.2f}\t{cpu_seconds() - cpu:.2f}\n"
    )
    with OUT.open("a") as out:  # one write a line: workers append to one file
        out.write(line)


def summary(path: Path, top: int) -> None:
    per_module: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0.0])
    for line in path.read_text().splitlines():
        _, nodeid, _, wall, idle, cpu = line.split("\t")
        module = per_module[nodeid.split("::", 1)[0]]
        module[0] += float(wall)
        module[1] += float(cpu)
        module[2] += float(idle)
    cores = os.cpu_count() or 1
    print(f"{'wall s':>8} {'cpu s':>8} {'idle core-s':>12} {'idle share':>10}  module")
    for name, (wall, cpu, idle) in sorted(per_module.items(), key=lambda kv: -kv[1][0])[:top]:
        share = idle / (wall * cores) if wall else 0.0
        print(f"{wall:8.0f} {cpu:8.0f} {idle:12.0f} {share:10.0%}  {name}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("timeline", type=Path, nargs="?", default=OUT)
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args()
    summary(args.timeline, args.top)


if __name__ == "__main__":
    main()
