"""Keep what a kit call brought back: ``benchmarks/gpu/results/<date>-<gpu>/``, to commit.

    python benchmarks/gpu/kit/keep.py FILES_AT [--results benchmarks/gpu/results]

``FILES_AT`` is the folder the device tool put the call's ``$OUT`` files in. They are copied as
they came (``run.log``, ``environment.json``, ``canary.json``, ``summary.txt``,
``beside_published.md``, ...) and ``results.tar.gz`` is unpacked beside them (the runs' CSVs,
trials, provenance, configs and logs; never artifacts). The folder is named by the call's date
and the GPU nvidia-smi named there (``environment.json``), e.g.
``2026-11-27-NVIDIA_H100_80GB_HBM3``; ``kept.json`` records this checkout's commit (the tree that
was sent, if unchanged since: ``dirty`` says) and when. Prints the folder; refuses to overwrite one.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import shutil
import sys
import tarfile
from pathlib import Path

from deploybench.provenance import git_state

REPO = Path(__file__).resolve().parents[3]
ARCHIVE = "results.tar.gz"


def folder_name(environment: dict) -> str:
    """``<date>-<gpu>``: the call's date, the first GPU's name as nvidia-smi gave it."""
    date = str(environment.get("date") or dt.date.today().isoformat())[:10]
    smi = environment.get("nvidia_smi") or []
    gpu = smi[0].split(",")[0] if smi else environment.get("gpu_entry", "unknown")
    return f"{date}-{re.sub(r'[^A-Za-z0-9.-]+', '_', gpu.strip()).strip('_')}"


def keep(files_at: Path, results: Path) -> Path:
    environment = json.loads((files_at / "environment.json").read_text())
    target = results / folder_name(environment)
    if target.exists():
        raise SystemExit(f"keep: {target} exists; move it away or keep elsewhere (--results)")
    target.mkdir(parents=True)
    for path in sorted(files_at.iterdir()):
        if path.is_file() and path.name != ARCHIVE:
            shutil.copy2(path, target / path.name)
    archive = files_at / ARCHIVE
    if archive.exists():
        with tarfile.open(archive) as packed:
            packed.extractall(target, filter="data")
    kept = {
        "tree": git_state(REPO),  # this checkout's commit, and whether the tree differs from it
        "kept": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }
    (target / "kept.json").write_text(json.dumps(kept, indent=1) + "\n")
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files_at", type=Path, help="the folder holding the call's $OUT files")
    parser.add_argument("--results", type=Path, default=REPO / "benchmarks" / "gpu" / "results")
    args = parser.parse_args(argv)
    print(keep(args.files_at, args.results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
