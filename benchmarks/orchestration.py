"""Orchestration: how long Snakemake takes to plan the full matrix, and to find nothing to do.

Side by side in one run, each the median of ``--repeat`` calls:

* **bare**: Snakemake's own floor, a dry run of a one-rule Snakefile (interpreter start,
  plugin loading, DAG of one job);
* **full matrix**: a dry run, in an empty working directory, of every model x every configured
  GPU x its formats x precisions, with plots and one report page per model over all GPUs
  (goal <= 5 s);
* **scaling** (``--clones K [K ...]``): the same dry run with every GPU entry cloned K times
  (``A100`` and ``A100_c2`` ... ``A100_cK``, the same settings), so the DAG grows K-fold; each
  size's seconds per 1,000 jobs, and the ratio of the largest size's to the smallest's (a
  linear DAG: within 1.2, and under 3 s per 1,000 jobs). The sizes take turns (one run of each
  per round, ``--repeat`` rounds);
* **Snakemake's floor** at each of those sizes, in the same rounds: a dry run of a generated
  workflow with as many jobs, each the least a job of this workflow is (a chain of ``script:``
  rules, each with an input, an output, a log, one ``params`` and one ``resources`` function),
  and the matrix's seconds over it: what this workflow's jobs cost beyond Snakemake's own
  per-job work;
* **no-op**: ``snakemake all cpu report`` in a working directory where they are complete: it
  must schedule 0 jobs (goal <= 5 s). The size of that DAG is counted with ``--forceall -n``.

    .venv/bin/python benchmarks/orchestration.py [--complete DIR] [--repeat 3] [--clones 1 4 8]

DIR is a working directory where ``snakemake all cpu report`` has finished (``make demo`` and
``snakemake cpu report`` in the source tree, or a copy of the tests' smoke run after
``snakemake report``). Without ``--complete`` the no-op line is skipped.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
SNAKEMAKE = str(Path(sys.executable).parent / "snakemake")
GOAL_S = 5.0
BARE = 'rule all:\n    output: "done"\n    shell: "touch {output}"\n'
FLOOR_CHAIN = 4  # rules a floor item's jobs chain through
FLOOR_HEAD = """
wildcard_constraints:
    item=r"i[0-9]+",


rule all:
    input:
        expand("out/{{item}}/{last}.txt", item=[f"i{{k}}" for k in range({items})]),
"""
FLOOR_RULE = """
rule step{i}:
    input:
        {input}
    output:
        "out/{{item}}/{i}.txt",
    log:
        "logs/{{item}}/{i}.log",
    params:
        spec=lambda w: {{"item": w.item}},
    resources:
        runtime=lambda w: 10,
    script:
        "job.py"
"""


def floor_snakefile(jobs: int) -> str:
    """A workflow of about ``jobs`` jobs (a multiple of FLOOR_CHAIN, plus its target), each
    the least a job of this workflow is: a ``script:`` job with an input (the one before it in
    its chain), an output, a log, one ``params`` and one ``resources`` function."""
    items = max(1, round(jobs / FLOOR_CHAIN))
    rules = [FLOOR_HEAD.format(last=FLOOR_CHAIN - 1, items=items)]
    for i in range(FLOOR_CHAIN):
        source = f'"out/{{item}}/{i - 1}.txt",' if i else "[],"
        rules.append(FLOOR_RULE.format(i=i, input=source))
    return "\n".join(rules)


def snakemake(workdir: Path, *args: str, snakefile: Path = REPO / "Snakefile") -> tuple[float, str]:
    cmd = [SNAKEMAKE, "--snakefile", str(snakefile), "--directory", str(workdir), "--cores", "2"]
    start = time.perf_counter()
    result = subprocess.run([*cmd, *args], capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - start
    out = result.stdout + result.stderr
    if result.returncode:
        raise SystemExit(f"snakemake {' '.join(args)} failed in {workdir}:\n{out[-3000:]}")
    return seconds, out


def planned(out: str) -> int:
    """The total of a dry run's job table (0 when there is nothing to do)."""
    match = re.search(r"^total\s+(\d+)$", out, re.MULTILINE)
    return int(match.group(1)) if match else 0


def median_run(repeat: int, workdir: Path, *args: str, **kw: Path) -> tuple[float, str]:
    runs = [snakemake(workdir, *args, **kw) for _ in range(repeat)]
    return statistics.median(s for s, _ in runs), runs[-1][1]


PER_THOUSAND_GOAL_S = 3.0  # seconds per 1,000 jobs of a dry run, at every size
LINEAR_GOAL = 1.2  # the largest size's seconds per job over the smallest's, at most


def cloned(config: dict, clones: int) -> dict:
    """An overlay: every GPU entry of ``config`` ``clones`` times (the copies named
    ``<gpu>_c<i>``), and the ``all`` report set over every one of them."""
    gpus = {
        f"{name}_c{i}": settings
        for name, settings in config["gpus"].items()
        for i in range(2, clones + 1)
    }
    every = sorted([*config["gpus"], *gpus])
    return {"gpus": gpus, "report": {"sets": {"all": {"gpus": every}}}}


@dataclasses.dataclass
class Size:
    """One matrix size's medians: the matrix's dry run, and the floor's at as many jobs."""

    seconds: float
    jobs: int
    floor_seconds: float
    floor_jobs: int


def matrix_runs(root: Path, config: dict, sizes: list[int], repeat: int) -> dict[int, Size]:
    """Clones K -> the medians of a dry run of ``report`` over the cloned matrix and of the
    floor workflow at as many jobs. Each round runs every size's matrix, then its floor, so
    that a change in the machine's load in the meantime weighs on every size and on both sides
    alike (the ratios compare them). The first round's matrix runs count the floors' jobs."""
    calls: dict[int, tuple[Path, str, str, str, str]] = {}
    for clones in sizes:
        workdir = root / f"matrix_x{clones}"
        (workdir / "config").mkdir(parents=True)
        (workdir / "config" / "config.yaml").write_text(yaml.safe_dump(config))
        overlay = workdir / "overlay.yaml"
        overlay.write_text(yaml.safe_dump(cloned(config, clones)))
        # --configfile takes several values: the targets go before it
        calls[clones] = (workdir, "-n", "report", "--configfile", str(overlay))
    runs: dict[int, list[tuple[float, str]]] = {clones: [] for clones in sizes}
    floors: dict[int, list[tuple[float, str]]] = {clones: [] for clones in sizes}
    for _ in range(repeat):
        for clones, (workdir, *args) in calls.items():
            runs[clones].append(snakemake(workdir, *args))
            floor = root / f"floor_x{clones}"
            if not floor.exists():
                floor.mkdir()
                (floor / "job.py").touch()
                jobs = planned(runs[clones][0][1])
                (floor / "Snakefile").write_text(floor_snakefile(jobs))
            floors[clones].append(snakemake(floor, "-n", snakefile=floor / "Snakefile"))
    return {
        clones: Size(
            seconds=statistics.median(s for s, _ in runs[clones]),
            jobs=planned(runs[clones][-1][1]),
            floor_seconds=statistics.median(s for s, _ in floors[clones]),
            floor_jobs=planned(floors[clones][-1][1]),
        )
        for clones in sizes
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--complete", type=Path, help="a workdir where `all cpu report` is done")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--clones", type=int, nargs="+", default=[1], help="matrix sizes: each GPU entry K times"
    )
    args = parser.parse_args()

    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    with tempfile.TemporaryDirectory(prefix="deploybench-orchestration-") as tmp:
        root = Path(tmp)
        bare_dir = root / "bare"
        bare_dir.mkdir()
        (bare_dir / "Snakefile").write_text(BARE)
        bare, _ = median_run(args.repeat, bare_dir, "-n", snakefile=bare_dir / "Snakefile")
        sizes = matrix_runs(root, config, sorted(set(args.clones)), args.repeat)

    version = subprocess.run(
        [SNAKEMAKE, "--version"], capture_output=True, text=True, check=True
    ).stdout.strip()
    print(f"snakemake {version}, medians of {args.repeat}")
    print(
        "| measurement | jobs | seconds | s / 1,000 jobs | / goal (5 s) | / bare Snakemake "
        "| / floor |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    print(f"| bare Snakemake dry run (1 rule) | 1 | {bare:.2f} | | {bare / GOAL_S:.2f} | 1.00 | |")
    failed = False
    for k, size in sizes.items():
        gpus = len(config["gpus"]) * k
        rows = (
            (
                f"full matrix dry run ({len(config['models'])} models x {gpus} gpus)",
                size.jobs,
                size.seconds,
            ),
            (
                f"floor: {FLOOR_CHAIN}-rule chains of script jobs",
                size.floor_jobs,
                size.floor_seconds,
            ),
        )
        for label, jobs, seconds in rows:
            print(
                f"| {label} | {jobs} | {seconds:.2f} | {seconds / jobs * 1000:.2f} "
                f"| {seconds / GOAL_S:.2f} | {seconds / bare:.2f} "
                f"| {seconds / jobs / (size.floor_seconds / size.floor_jobs):.2f} |"
            )
        failed |= size.seconds / size.jobs * 1000 > PER_THOUSAND_GOAL_S
    if 1 in sizes:
        failed |= sizes[1].seconds > GOAL_S
    if args.complete:
        targets = ("all", "cpu", "report")
        _, out = snakemake(args.complete, "-n", "--forceall", *targets)
        dag_jobs = planned(out)
        noop, out = median_run(args.repeat, args.complete, *targets)
        scheduled = planned(out)
        print(
            f"| no-op run after a complete run ({dag_jobs} jobs in its DAG) | {scheduled} "
            f"| {noop:.2f} | | {noop / GOAL_S:.2f} | {noop / bare:.2f} | |"
        )
        failed |= noop > GOAL_S or scheduled != 0
    if len(sizes) > 1:
        small, large = sizes[min(sizes)], sizes[max(sizes)]
        ratio = (large.seconds / large.jobs) / (small.seconds / small.jobs)
        floor_ratio = (large.floor_seconds / large.floor_jobs) / (
            small.floor_seconds / small.floor_jobs
        )
        print(
            f"\nseconds per job at {large.jobs} jobs over that at {small.jobs}: {ratio:.2f} "
            f"(linear: <= {LINEAR_GOAL}); the floor's: {floor_ratio:.2f}"
        )
        failed |= ratio > LINEAR_GOAL
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
