"""The kit's TFT rows beside the published A100 ``ts-trace`` rows, as a Markdown table.

    python benchmarks/gpu/kit/beside_published.py RESULTS [--gpu H100-pip] [--published-gpu A100]

``RESULTS`` is the folder that holds ``results/`` (the kit's ``results.tar.gz`` unpacked). For
each scenario and point the kit measured, one line: the published row at the same batch and
concurrency that ``tft/<published GPU>/ts-trace/fp32`` reproduces (``report_published.published_rows``:
TFT's data set, electricity, not the page's traffic rows; DLE's A100 "FP16" rows, which ran fp32
weights: ``models.tft.published_ran``), then
each precision the kit ran: throughput ± its 95 % interval and p99, then the energy per
inference ± its 95 % interval over the trials (``energy_per_inference_j``, in mJ: NVML's energy
counter over perf_analyzer's measured windows, the GPU board only; docs/energy.md), marked when
a thermal or hardware slowdown throttled the GPU; a point of a scenario whose job was stopped partway (its share of the
call ran out) is marked "(partial)". Points the kit measured that the page did not publish show
"—"; energy not measured shows "—" and the line under the table says why (``energy_status``);
a CSV written before energy was measured has no such columns and shows the same. The columns
name the GPU and driver nvidia-smi gave the run's jobs (its provenance), not only the entry.
What differs (GPU, the python backend, no NGC image, the kit's sizing) is said under the table.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

import pandas as pd

from deploybench.cli import load_config
from deploybench.partial import finished_rows, partial_path, read
from deploybench.report_published import published_rows
from deploybench.summary import measured_on

REPO = Path(__file__).resolve().parents[3]
PUBLISHED = REPO / "config" / "reference" / "published.csv"
CONFIG = REPO / "config" / "config.yaml"
# the run the published ts-trace rows reproduce (their "FP16" label ran fp32)
REPRODUCED = "tft/{gpu}/ts-trace/fp32"
SCENARIOS = ("offline", "online")


def run_dir(results: Path, gpu: str, precision: str) -> Path:
    return results / "results" / "tft" / gpu / "ts-trace" / precision


def measured(results: Path, gpu: str, precision: str, scenario: str) -> pd.DataFrame | None:
    """The scenario's points: its CSV, else the finished points its job kept when it was
    stopped partway (deploybench.partial), marked ``partial``; None when neither exists."""
    path = run_dir(results, gpu, precision) / f"{scenario}.csv"
    if path.exists():
        return pd.read_csv(path)
    kept = partial_path(path)
    if not kept.exists():
        return None
    rows = finished_rows(read(kept))
    return pd.DataFrame(rows).assign(partial=True) if rows else None


def machine(results: Path, gpu: str, precision: str) -> str:
    """What ran the run's measurements (its provenance: the GPU and driver nvidia-smi named,
    else the CPU); the entry before any measurement."""
    return measured_on(run_dir(results, gpu, precision)) or gpu


def _present(value: Any) -> bool:
    """A CSV cell that holds a value: not absent, not empty (pandas reads empty as NaN)."""
    if value is None:
        return False
    if isinstance(value, float) and math.isnan(value):
        return False
    return str(value).strip() != ""


def _flag(value: Any) -> bool:
    """A CSV's boolean cell (pandas gives a bool, or text in a column with empty cells)."""
    return _present(value) and str(value).strip().lower() in ("true", "1")


def throughput_cell(point: pd.Series) -> str:
    """The point's throughput ± its 95 % half-width (none with one trial)."""
    half = point.get("throughput_ci95")
    return f"{point.throughput:.1f}" + (f" ± {float(half):.1f}" if _present(half) else "")


def trials_text(frames: list[pd.DataFrame | None]) -> str:
    """How many trials the runs' points had ("2 trials a point"), from their rows."""
    counts = sorted(
        {int(t) for f in frames if f is not None and "trials" in f for t in f["trials"].dropna()}
    )
    if not counts:
        return "trials a point not recorded"
    return " or ".join(map(str, counts)) + (
        " trial a point" if counts == [1] else " trials a point"
    )


def energy_cell(point: pd.Series) -> str:
    """The point's energy per inference in mJ ± its 95 % half-width (none with one trial), and
    "throttled (<reasons>)" when a thermal or hardware slowdown throttled the GPU in a trial
    (``throttled``; its reasons with their fractions); "—" when not measured (the
    columns empty, or absent from an older CSV)."""
    joules = point.get("energy_per_inference_j")
    if not _present(joules):
        return "—"
    cell = f"{float(joules) * 1000:.3g}"
    half = point.get("energy_per_inference_j_ci95")
    if _present(half):
        cell += f" ± {float(half) * 1000:.2g}"
    if _flag(point.get("throttled")):
        reasons = point.get("throttle_reasons")
        cell += f" (throttled: {reasons})" if _present(reasons) else " (throttled)"
    return cell


def energy_statuses(frames: list[pd.DataFrame | None]) -> list[str]:
    """The distinct ``energy_status`` of a run's rows ("nvml", "rapl", "not measured: <why>"),
    in order; "no energy columns" for a CSV written before energy was measured."""
    statuses: dict[str, None] = {}
    for frame in frames:
        if frame is None:
            continue
        if "energy_status" not in frame.columns:
            statuses["no energy columns (a CSV from before energy was measured)"] = None
            continue
        for status in frame["energy_status"]:
            statuses[str(status) if _present(status) else "not recorded"] = None
    return list(statuses)


def table(results: Path, gpu: str, published_gpu: str, precisions: list[str]) -> str:
    config = load_config(CONFIG)
    dataset = config["models"]["tft"]["dataset"]
    published = published_rows(config, pd.read_csv(PUBLISHED), REPRODUCED.format(gpu=published_gpu))
    header = ["scenario", "batch", "concurrency", f"{published_gpu} published: infer/s, p99 ms"]
    header += [
        f"{machine(results, gpu, p)} ({gpu} {p}): infer/s ± 95 %, p99 ms; mJ/infer ± 95 %"
        for p in precisions
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    frames: dict[str, list[pd.DataFrame | None]] = {p: [] for p in precisions}
    for scenario in SCENARIOS:
        runs = {p: measured(results, gpu, p, scenario) for p in precisions}
        for precision, frame in runs.items():
            frames[precision].append(frame)
        points = sorted(
            {
                (int(r.batch), int(r.concurrency))
                for frame in runs.values()
                if frame is not None
                for r in frame.itertuples()
            }
        )
        for batch, concurrency in points:
            row = published[
                (published["scenario"] == scenario)
                & (published["batch"] == batch)
                & (published["concurrency"] == concurrency)
            ]
            if len(row) > 1:
                raise SystemExit(f"{len(row)} published rows for {scenario} {batch}x{concurrency}")
            cells = [scenario, str(batch), str(concurrency)]
            cells.append(
                f"{row.iloc[0].throughput:.1f}, {row.iloc[0].p99_latency_ms:.1f}"
                if len(row)
                else "—"
            )
            for precision in precisions:
                frame = runs[precision]
                hit = (
                    frame[(frame["batch"] == batch) & (frame["concurrency"] == concurrency)]
                    if frame is not None
                    else frame
                )
                if hit is None or hit.empty:
                    cells.append("—")
                    continue
                point = hit.iloc[0]
                cells.append(
                    f"{throughput_cell(point)}, {point.p99_latency_ms:.2f}"
                    + ("" if point.stable else " (unstable)")
                    + (" (partial)" if _flag(point.get("partial")) else "")
                    + f"; {energy_cell(point)}"
                )
            lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    lines.append(
        f"{published_gpu}: DLE's published `ts-trace` rows of TFT on {dataset} (labelled FP16, "
        "ran fp32 weights; the NGC "
        f"images the seed page names, native `pytorch_libtorch` backend). {gpu}: this "
        "workflow's kit, served by pytriton's Triton 2.51 python backend (a "
        "host-memory hop per request), no NGC image, the kit's sizing "
        f"({trials_text([f for p in precisions for f in frames[p]])})."
    )
    lines.append("")
    lines.append(
        "Energy: `energy_per_inference_j` × 1000, its 95 % interval over the trials; the GPU "
        "board's energy (NVML's total-energy counter over perf_analyzer's measured windows), not "
        f"the host's nor the wall's (docs/energy.md). {published_gpu}: not published."
    )
    for precision in precisions:
        statuses = energy_statuses(frames[precision])
        if statuses:
            lines.append(f"- {gpu} {precision}: energy {'; '.join(statuses)}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", type=Path, help="the folder holding results/")
    parser.add_argument("--gpu", default="H100-pip")
    parser.add_argument("--published-gpu", default="A100")
    parser.add_argument("--precisions", nargs="+", default=["fp32", "fp16"])
    args = parser.parse_args(argv)
    print(table(args.results, args.gpu, args.published_gpu, args.precisions))
    return 0


if __name__ == "__main__":
    sys.exit(main())
