"""A preflight's checks as the job reports them: one line per check, and the error that fails the
job when any check failed."""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import PreflightError
from .spec import FAIL, WARN, Check, PreflightSpec


def table(checks: Sequence[Check]) -> str:
    """One line per check: status, name, detail, and for a failure its fix."""
    lines = []
    for c in checks:
        detail = " ".join(c.detail.split())  # one line, whatever Triton's message spans
        fix = f"  fix: {c.fix}" if c.status in (FAIL, WARN) and c.fix else ""
        lines.append(f"{c.status.upper():<4}  {c.name:<19}  {detail}{fix}")
    return "\n".join(lines)


def failure_message(spec: PreflightSpec, checks: Sequence[Check]) -> str:
    failed = [c for c in checks if c.status == FAIL]
    lines = [
        (
            f"preflight of image {spec['image']} on gpu {spec['gpu']} ({spec['gpu_name']}): "
            f"{len(failed)} check(s) failed"
        )
    ]
    for c in failed:
        lines.append(f"- {c.name}: {' '.join(c.detail.split())}")
        lines.append(f"  fix: {c.fix}")
    return "\n".join(lines)


def raise_on_failure(spec: PreflightSpec, checks: Sequence[Check]) -> None:
    if any(c.status == FAIL for c in checks):
        raise PreflightError(failure_message(spec, checks))
