"""The ``deploybench`` command (also ``python -m deploybench``).

``deploybench compare A B``: B's perf results against A's, point by point (see
:mod:`deploybench.compare`). Exit status 0: no regression; 1: a regression; 2: a usage error
(a path that is not there, nothing in common, a bad config or threshold).

``deploybench summary [RUN ...]``: each run's accuracy verdict, points and files in a few lines
(see :mod:`deploybench.summary`); with none, the runs under `targets`. Exit status 0, or 2 for a
path that is not a run directory.

``deploybench canary --device cpu|gpu --out DIR``: whether this machine's tritonserver and
perf_analyzer serve and measure FP32 and FP16 on the device, in a minute at most (see
:mod:`deploybench.canary`). Exit status 0, or 1 naming the step that failed.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .errors import DeploybenchError

DEFAULT_CONFIG = Path("config") / "config.yaml"
USAGE_ERROR = 2


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="deploybench")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    compare = commands.add_parser(
        "compare",
        help="compare two result trees point by point, within their 95 % intervals",
        description="B against A at every (run, scenario, batch, concurrency) both hold: "
        "throughput and p99 latency, ratio B/A ± its 95 % half-width, and whether the change "
        "lies outside the two runs' combined intervals. A significant change worse than the "
        "threshold is a regression (exit status 1).",
    )
    compare.add_argument("a", type=Path, help="the baseline: a result tree or a run directory")
    compare.add_argument("b", type=Path, help="compared with A: a result tree or a run directory")
    compare.add_argument(
        "--threshold",
        type=float,
        metavar="PCT",
        help="a regression: a significant change worse than PCT %% "
        "(default: compare.regression_pct of the config)",
    )
    compare.add_argument(
        "--configfile",
        type=Path,
        help=f"the workflow config (default: {DEFAULT_CONFIG}, else the source tree's)",
    )
    compare.add_argument("--csv", type=Path, metavar="PATH", help="also write the table as CSV")
    summary = commands.add_parser(
        "summary",
        help="one run's accuracy, points (throughput ± 95 %%, p99, stable or why not) and files",
        description="A run directory in a few lines: the accuracy verdict, a row per measured "
        "point of each scenario, and the paths of its CSVs, charts and report pages.",
    )
    summary.add_argument(
        "run",
        type=Path,
        nargs="*",
        help="run directories, e.g. results/tft/cpu/onnx/fp32; none: the runs under `targets` "
        "in config/config.yaml (what `make demo` and a plain `snakemake` run)",
    )
    canary = commands.add_parser(
        "canary",
        help="in a minute: this machine's tritonserver and perf_analyzer, FP32 and FP16",
        description="A tiny TorchScript model served by the python backend (KIND_GPU on a GPU) "
        "with an FP32 and an FP16 input: one checked request and one short perf_analyzer run "
        "each. Stops at the first failing step and names it (exit status 1).",
    )
    canary.add_argument("--device", choices=("cpu", "gpu"), default="gpu")
    canary.add_argument("--out", type=Path, required=True, help="canary.json and the logs")
    canary.add_argument("--deadline-s", type=float, default=60.0, help="default: %(default)s")
    args = parser.parse_args(argv)
    try:
        if args.command == "summary":
            return run_summary(args)
        if args.command == "canary":
            return run_canary(args)
        return run_compare(args)
    except DeploybenchError as error:
        print(f"deploybench {args.command}: {error}", file=sys.stderr)
        return USAGE_ERROR


def run_summary(args: argparse.Namespace) -> int:
    from .summary import summary

    runs = args.run or [Path("results", target) for target in load_config(None)["targets"]]
    print("\n\n".join(summary(run) for run in runs))
    return 0


def run_canary(args: argparse.Namespace) -> int:
    from . import canary

    report = canary.run(args.device, args.out, args.deadline_s)
    for step in report.steps:
        print(
            f"canary {step.step}: {'ok' if step.passed else 'FAILED'} ({step.seconds:.1f} s) "
            f"{step.detail}"
        )
    failed = report.failed
    if failed is None:
        print(f"canary: passed on {args.device} ({args.out / 'canary.json'})")
        return 0
    print(f"canary: step {failed.step!r} failed; see {args.out}", file=sys.stderr)
    return 1


def run_compare(args: argparse.Namespace) -> int:
    from .compare import compare_trees
    from .io import write_csv

    threshold, config = args.threshold, None
    if threshold is None or args.configfile is not None:  # a named config is checked anyway
        config = load_config(args.configfile)
        configured = float(config["compare"]["regression_pct"])
        threshold = configured if threshold is None else threshold
    result = compare_trees(args.a, args.b, threshold)
    print(f"# {result.b} against {result.a}\n")
    print(markdown(result.points))
    print()
    for note in [*result.notes, *published_label_notes(config, result.points)]:
        print(f"Note: {note}")
    print(result.summary())
    if args.csv:
        write_csv(args.csv, result.points.to_dict("records"), list(result.points.columns))
        print(f"Written: {args.csv}")
    regressions = result.regressions
    if regressions.empty:
        return 0
    print(f"\n{len(regressions)} regression(s):")
    for row in regressions.to_dict("records"):
        print(f"- {describe(row)}")
    return 1


def load_config(path: Path | None) -> dict[str, Any]:
    """The workflow config, validated against the schema (defaults filled in)."""
    from snakemake.exceptions import WorkflowError
    from snakemake.utils import validate

    from .errors import ConfigError
    from .images import source_tree
    from .planning.workflow_config import load_yaml

    schema = source_tree() / "config" / "schema" / "config.schema.yaml"
    if path is None:
        path = DEFAULT_CONFIG if DEFAULT_CONFIG.is_file() else source_tree() / DEFAULT_CONFIG
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    config = load_yaml(path)
    try:
        validate(config, str(schema))
    except WorkflowError as error:
        raise ConfigError(f"{path} does not match {schema}: {error}") from error
    return dict(config)


def published_label_notes(config: dict[str, Any] | None, points: Any) -> list[str]:
    """For each compared run whose published figures are labelled otherwise than what ran
    (``models.<m>.published_ran``, e.g. TFT's ts-trace "fp16" rows ran fp32): the report's note,
    named by the run. None without the config or the published reference (config/reference/)."""
    import pandas as pd

    from .images import source_tree
    from .report_published import published_notes

    published = source_tree() / "config" / "reference" / "published.csv"
    if not published.is_file() or points.empty:
        return []
    if config is None:
        try:
            config = load_config(None)
        except DeploybenchError:
            return []
    reference = pd.read_csv(published)
    # a run's name, or "A → B" for two run directories compared whatever their names
    names = dict.fromkeys(n for run in points["run"].unique() for n in str(run).split(" → "))
    return [
        f"{name}: {note}"
        for name in names
        if name.count("/") == 3
        for note in published_notes(config, reference, name)
    ]


def markdown(points: Any) -> str:
    from .compare import METRIC_HEADINGS, METRIC_UNITS
    from .report_cells import markdown_table

    columns = {"run": "Run", "scenario": "Scenario", "batch": "Batch"}
    columns["concurrency"] = "Concurrency"
    units = METRIC_UNITS
    intervals = {}
    for metric, label in METRIC_HEADINGS.items():
        for part in ("a", "b", "ratio"):
            heading = "B/A" if part == "ratio" else f"{part.upper()} ({units[metric]})"
            columns[f"{metric}_{part}"] = f"{label} {heading}"
            intervals[f"{metric}_{part}"] = f"{metric}_{part}_ci95"
    columns["verdict"] = "Verdict"
    return markdown_table(points, columns, intervals)


def describe(row: dict[str, Any]) -> str:
    """One compared point in words, with the ratios of its regressed metrics."""
    from .compare import METRIC_LABELS, REGRESSION, format_interval

    where = f"{row['run']} {row['scenario']} batch {row['batch']} concurrency {row['concurrency']}"
    moved = [
        f"{label} B/A {format_interval(row[f'{m}_ratio'], row[f'{m}_ratio_ci95'])}"
        for m, label in METRIC_LABELS.items()
        if row[f"{m}_verdict"] == REGRESSION
    ]
    return f"{where}: " + "; ".join(moved)
