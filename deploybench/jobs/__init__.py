"""One function per workflow step, and the entry point every rule's script calls.

A rule passes its job one spec (``params: spec=``, from :mod:`deploybench.planning.run_plan`) and names its
files; :func:`run_rule` calls the rule's job (:data:`JOBS`) with the spec and, by name, the
files and the workflow config its signature takes. So each setting is named once in the plan and
once in the job that reads it, and each file once in its rule and once in its job.

Each step writes its outputs whole (or not at all) and a provenance sidecar beside each result.
The jobs live by what they do: :mod:`.build` (checkpoint, export, conversion, repository),
:mod:`.measure` (the server, accuracy, perf, the preflight), :mod:`.pages` (charts, report
pages) and :mod:`.search`. Each imports what it needs inside its body, so importing this package
stays light (``deploybench.job_imports`` reads those imports from the jobs' code).
"""

from __future__ import annotations

import inspect
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .. import progress
from ..import_paths import confine_to_image
from ..process import stop_with_snakemake
from .build import convert, export, make_checkpoint, repository
from .measure import accuracy, merge_parts, perf, preflight
from .pages import plots, report
from .search import search_choice, search_plots, search_settings, search_step

log = logging.getLogger("deploybench")


def setup_logging(path: str | Path | None) -> None:
    """Log to the rule's log file (and stderr when there is none). Progress lines
    (:mod:`deploybench.progress`) go to stderr as well, which a ``script:`` job shares with the
    ``snakemake`` that runs it: they show in its terminal."""
    handler: logging.Handler
    terminal: list[logging.Handler] = []
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        handler = logging.FileHandler(path, mode="a")
        terminal = [progress.terminal_handler()]
    else:
        handler = logging.StreamHandler(sys.stderr)  # progress lines among the rest
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)
    progress.PROGRESS.handlers[:] = terminal  # and on to the root's handler


# ---------------------------------------------------------------------------- the search


# The job of each rule (`use rule ... as` variants included).
JOBS: dict[str, Callable[..., None]] = {
    "prepare_checkpoint": make_checkpoint,
    "export": export,
    "export_directory": export,
    "export_in_image": export,
    "export_directory_in_image": export,
    "convert": convert,
    "convert_directory": convert,
    "convert_batch": convert,
    "repository": repository,
    "accuracy": accuracy,
    "offline": perf,
    "online": perf,
    "offline_part": perf,
    "online_part": perf,
    "merge_parts": merge_parts,
    "search_repository": repository,
    "search_online": perf,
    "search_settings": search_settings,
    "search_step": search_step,
    "search_choice": search_choice,
    "search_plots": search_plots,
    "plots": plots,
    "model_report": report,
    "preflight_check": preflight,
}
# Inputs that only order the DAG; no job reads them.
DAG_ONLY_INPUTS = ("image", "preflight")


def job_arguments(
    job: Callable[..., None], rule: str, files: dict[str, Any], config: dict[str, Any]
) -> dict[str, Any]:
    """The keyword arguments of ``job``: each a file its rule names (one path, or a list for an
    input given as a list), or ``config``, the workflow's config."""
    if "config" in files:
        raise ValueError(f"rule {rule!r} names a file 'config', the name of the workflow's config")
    offered = {**files, "config": config}
    wanted = [p for p in inspect.signature(job).parameters.values() if p.kind == p.KEYWORD_ONLY]
    missing = [p.name for p in wanted if p.name not in offered]
    if missing:
        raise TypeError(
            f"rule {rule!r} names no file {missing[0]!r}, which job {job.__name__} takes; "
            f"it names: {', '.join(sorted(files))}"
        )
    return {p.name: offered[p.name] for p in wanted}


def rule_files(smk: Any) -> dict[str, Any]:
    """The named inputs, outputs and logs of the job Snakemake runs (names are unique across
    them); a list given for one name (a function's inputs, maybe none) stays a list."""
    files: dict[str, Any] = {}
    for kind in (smk.input, smk.output, smk.log):
        for name, value in kind.items():
            if kind is smk.input and name in DAG_ONLY_INPUTS:
                continue
            if name in files:
                raise ValueError(f"rule {smk.rule!r} names {name!r} twice")
            files[name] = [str(v) for v in value] if isinstance(value, list) else str(value)
    return files


def run_rule(smk: Any) -> None:
    """Entry point of every rule's script: the rule's job, called with its spec and files, logging
    to the rule's first log."""
    if smk.rule not in JOBS:
        raise ValueError(f"no job for rule {smk.rule!r}; valid choices: {', '.join(sorted(JOBS))}")
    setup_logging(smk.log[0] if smk.log else None)
    try:
        # In a container: nothing more from the driver's environment than Snakemake itself.
        confine_to_image()
        # Killed outright, Snakemake cannot stop its jobs: each stops itself when it sees it die.
        stop_with_snakemake()
        job = JOBS[smk.rule]
        job(smk.params.spec, **job_arguments(job, smk.rule, rule_files(smk), smk.config))
    except BaseException as error:
        # Snakemake sends whoever reads of the failure to the log file: it says why there too
        # (stderr gets the traceback as ever, and the job the same exit status).
        if smk.log:
            _log_failure(smk.rule, error)
        raise


def _log_failure(rule: str, error: BaseException) -> None:
    """The exception that ends a job, in its log: a stop signal in a line, an error with its
    traceback."""
    from ..server import Terminated

    if isinstance(error, KeyboardInterrupt):
        log.error("rule %s stopped by Ctrl-C (SIGINT)", rule)
    elif isinstance(error, Terminated):
        log.error("rule %s stopped by SIGTERM", rule)
    elif isinstance(error, SystemExit):
        log.error("rule %s exited with status %s", rule, error.code)
    else:
        log.error("rule %s failed", rule, exc_info=error)
