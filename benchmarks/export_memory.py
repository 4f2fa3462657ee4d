"""Memory: peak RSS of every checkpoint and export job at full size vs the ``mem_mb`` it declares.

Runs the workflow's real jobs (``snakemake`` with one core, so no two jobs share the machine
while they are measured) for every export each configured model uses, at the full sizes of
``config/config.yaml``, and reads the peak RSS that Snakemake's ``benchmark:`` records for each
job (the job's whole process tree, tf2onnx's subprocess included). Conversions (TensorRT, TF-TRT,
fp16) need a GPU and are not measured here.

    .venv/bin/python benchmarks/export_memory.py [--models bert,resnet50] [--workdir DIR]

Exit status 1 if a job's peak exceeds its declared ``mem_mb`` or the 12 GB ceiling.
"""

from __future__ import annotations

import argparse
import csv
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from deploybench.models import CHECKPOINT_FILES, framework_of

REPO = Path(__file__).resolve().parent.parent
CEILING_MB = 12 * 1024
GOAL_MB = 8 * 1024


def export_targets(config: dict, model: str) -> list[str]:
    """The checkpoint and every distinct export the model's configured formats start from."""
    settings = config["models"][model]
    ckpt = CHECKPOINT_FILES[framework_of(settings["module"])]
    targets = [f"results/{model}/checkpoint/{ckpt}"]
    exports = {
        (config["formats"][fmt]["export"], config["formats"][fmt]["artifact"])
        for fmt in settings["formats"]
    }
    for export, artifact in sorted(exports):
        targets.append(
            f"results/{model}/export/{export}/{settings['export']['precision']}/{artifact}"
        )
    return targets


def peak_rss_mb(benchmark_tsv: Path) -> tuple[float, float]:
    with benchmark_tsv.open() as f:
        row = next(csv.DictReader(f, delimiter="\t"))
    return float(row["max_rss"]), float(row["s"])


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
    cmd = [
        str(Path(sys.executable).parent / "snakemake"),
        "--snakefile", str(REPO / "Snakefile"),
        "--directory", str(workdir),
        "--cores", "1",
        "--resources", f"mem_mb={CEILING_MB}",
        "--keep-going",
        *targets,
    ]  # fmt: skip
    print(f"running {len(targets)} jobs in {workdir} ...", flush=True)
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        print(result.stderr[-4000:], file=sys.stderr)

    failures = 0
    print("\n| job | seconds | peak RSS (MB) | declared mem_mb | peak / declared | verdict |")
    print("| --- | ---: | ---: | ---: | ---: | --- |")
    for target in targets:
        model = target.split("/")[1]
        declared = config["models"][model]["export"]["mem_mb"]
        tsv = workdir / f"{target}.benchmark.tsv"
        if not tsv.exists():
            print(f"| {target} | – | – | {declared} | – | FAILED (no benchmark record) |")
            failures += 1
            continue
        rss, seconds = peak_rss_mb(tsv)
        ok = rss <= declared and rss <= CEILING_MB
        failures += not ok
        goal = "" if rss <= GOAL_MB else " (above the 8 GB goal)"
        print(
            f"| {target.removeprefix('results/')} | {seconds:.0f} | {rss:.0f} | {declared} | "
            f"{rss / declared:.2f} | {'ok' if ok else 'EXCEEDS'}{goal} |"
        )
    if not args.workdir:
        shutil.rmtree(workdir, ignore_errors=True)
    return 1 if failures or result.returncode else 0


if __name__ == "__main__":
    raise SystemExit(main())
