"""Memory: peak RSS of every checkpoint, export and convert job at full size vs its ``mem_mb``.

Runs the workflow's real jobs one at a time (one ``snakemake`` call per job) for every export
each configured model uses, and every conversion that runs without a GPU (ONNX fp16), at the
full sizes of ``config/config.yaml``, and samples the summed RSS of the job's whole process tree
(tf2onnx's child included) every 50 ms. (Snakemake's own ``benchmark:`` sampling missed
tf2onnx's short peak.) TensorRT, TF-TRT and TorchScript fp16 conversions need a GPU and are not
measured here. Last, it checks that jobs run side by side cannot exceed the machine: the local
profile's ``mem_mb`` (the most the scheduler lets running jobs declare together) must fit in
the machine's memory, and each job's peak within its declaration.

    .venv/bin/python benchmarks/export_memory.py [--models bert,resnet50] [--workdir DIR]

Exit status 1 if a job's peak exceeds its declared ``mem_mb`` or the 12 GB ceiling.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import yaml

from deploybench.io import MIB
from deploybench.models import CHECKPOINT_FILES, framework_of
from deploybench.planning.workflow_config import all_runs, resolve

REPO = Path(__file__).resolve().parent.parent
CEILING_MB = 12 * 1024
GOAL_MB = 8 * 1024
CPU_CONVERTERS = {"onnx-fp16"}


def export_targets(config: dict, model: str) -> list[str]:
    """The checkpoint and every distinct export the model's configured formats start from."""
    settings = config["models"][model]
    ckpt = CHECKPOINT_FILES[framework_of(settings["module"])]
    targets = [f"results/{model}/checkpoint/{ckpt}"]
    exports = {
        (export, config["formats"][export]["artifact"])
        for export in {config["formats"][fmt]["export"] for fmt in settings["formats"]}
    }
    for export, artifact in sorted(exports):
        targets.append(
            f"results/{model}/export/{export}/{settings['export']['precision']}/{artifact}"
        )
    return targets + cpu_conversions(config, model)


def cpu_conversions(config: dict, model: str) -> list[str]:
    """One conversion per converter that runs without a GPU (the first GPU that uses it)."""
    seen, targets = set(), []
    for path in all_runs(config):
        run = resolve(config, *path.split("/"))
        if run.model == model and run.converter in CPU_CONVERTERS and run.converter not in seen:
            seen.add(run.converter)
            targets.append(f"results/{path}/convert/{run.format_settings['artifact']}")
    return targets


def parallel_check() -> tuple[bool, str]:
    """The local profile lets running jobs declare at most its ``mem_mb`` together."""
    profile = yaml.safe_load((REPO / "profiles" / "local" / "config.yaml").read_text())
    limit = int(profile["resources"]["mem_mb"])
    machine = psutil.virtual_memory().total / MIB
    ok = limit <= machine
    return ok, (
        f"local profile: running jobs declare at most mem_mb={limit} together "
        f"({profile['cores']} cores); machine memory {machine:.0f} MB; "
        f"ratio {limit / machine:.2f} -> {'fits' if ok else 'EXCEEDS THE MACHINE'} "
        "(with every peak within its declaration, parallel jobs cannot exceed the machine)"
    )


def run_measured(cmd: list[str]) -> tuple[int, float, float]:
    """Run ``cmd``; return its exit status, the peak summed RSS (MB) of its descendants (the job,
    not Snakemake itself) and the wall time (s)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    parent = psutil.Process(proc.pid)
    peak, start = 0, time.monotonic()
    while proc.poll() is None:
        total = 0
        for child in parent.children(recursive=True):
            with contextlib.suppress(psutil.Error):
                total += child.memory_info().rss
        peak = max(peak, total)
        time.sleep(0.05)
    if proc.returncode:
        print(proc.stderr.read().decode()[-3000:] if proc.stderr else "", file=sys.stderr)
    return proc.returncode, peak / MIB, time.monotonic() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", help="comma-separated model entries (default: all)")
    parser.add_argument("--workdir", type=Path, help="keep the run here (default: a temp dir)")
    args = parser.parse_args()

    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    models = args.models.split(",") if args.models else sorted(config["models"])
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="deploybench-memory-"))
    targets = [t for m in models for t in export_targets(config, m)]
    (workdir / "config").mkdir(parents=True, exist_ok=True)
    shutil.copy2(REPO / "config" / "config.yaml", workdir / "config" / "config.yaml")
    base = [
        str(Path(sys.executable).parent / "snakemake"),
        "--snakefile", str(REPO / "Snakefile"),
        "--directory", str(workdir),
        "--cores", "1",
    ]  # fmt: skip
    # --resources takes several values: it goes after the target
    limit = ["--resources", f"mem_mb={CEILING_MB}"]
    failures = 0
    print(f"running {len(targets)} jobs in {workdir}, one at a time ...", flush=True)
    print("\n| job | seconds | peak RSS (MB) | declared mem_mb | peak / declared | verdict |")
    print("| --- | ---: | ---: | ---: | ---: | --- |")
    for target in targets:
        model = target.split("/")[1]
        declared = config["models"][model]["export"]["mem_mb"]
        code, rss, seconds = run_measured([*base, target, *limit])
        ok = code == 0 and rss <= declared and rss <= CEILING_MB
        failures += not ok
        goal = "" if rss <= GOAL_MB else " (above the 8 GB goal)"
        verdict = "FAILED" if code else ("ok" if ok else "EXCEEDS")
        print(
            f"| {target.removeprefix('results/')} | {seconds:.0f} | {rss:.0f} | {declared} | "
            f"{rss / declared:.2f} | {verdict}{goal} |",
            flush=True,
        )
    if not args.workdir:
        shutil.rmtree(workdir, ignore_errors=True)
    fits, line = parallel_check()
    print(f"\n{line}")
    return 1 if failures or not fits else 0


if __name__ == "__main__":
    raise SystemExit(main())
