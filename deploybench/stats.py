"""Confidence intervals over repeated trials, and whether two measurements differ.

A point measured ``n`` times is summarised by its mean and the half-width of its 95 %
confidence interval, Student's t over the trials: ``t(0.975, n-1) * s / sqrt(n)``. Two
measurements differ *significantly* when their means are further apart than their combined
half-widths (``sqrt(h_a² + h_b²)``): the interval of the difference of two independent means.
One trial has no interval (NaN) and so never differs significantly from anything. A leaf
module: the standard library only (no scipy here), so every job and benchmark can import it.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

CONFIDENCE = 0.95
# t(0.975, df) for df = 1..30 (two-sided 95 %); beyond, the Cornish-Fisher expansion below is
# within 1e-5 of the exact quantile.
_T975 = (
    12.706204736, 4.302652730, 3.182446305, 2.776445105, 2.570581836,
    2.446911851, 2.364624252, 2.306004135, 2.262157163, 2.228138852,
    2.200985160, 2.178812830, 2.160368656, 2.144786688, 2.131449546,
    2.119905299, 2.109815578, 2.100922040, 2.093024054, 2.085963447,
    2.079613845, 2.073873068, 2.068657610, 2.063898562, 2.059538553,
    2.055529439, 2.051830516, 2.048407142, 2.045229642, 2.042272456,
)  # fmt: skip
_Z975 = 1.959963984540054


def t_critical(df: int) -> float:
    """Student's t quantile for a two-sided 95 % interval with ``df`` degrees of freedom."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be at least 1, not {df}")
    if df <= len(_T975):
        return _T975[df - 1]
    z = _Z975
    g1 = (z**3 + z) / 4
    g2 = (5 * z**5 + 16 * z**3 + 3 * z) / 96
    g3 = (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384
    return z + g1 / df + g2 / df**2 + g3 / df**3


@dataclass(frozen=True)
class Interval:
    """A mean over ``n`` trials and its 95 % half-width (NaN with fewer than two trials)."""

    mean: float
    half_width: float
    n: int

    @property
    def relative(self) -> float:
        """The half-width as a fraction of the mean (NaN without an interval or at mean 0)."""
        return self.half_width / abs(self.mean) if self.mean else math.nan

    def within(self, max_pct: float) -> bool:
        """Whether the interval is at most ``max_pct`` % of the mean (False without one)."""
        return not math.isnan(self.relative) and self.relative * 100 <= max_pct


def interval(values: Sequence[float]) -> Interval:
    """The mean of ``values`` and its 95 % confidence half-width (Student's t)."""
    if not values:
        raise ValueError("no values to summarise")
    mean = statistics.fmean(values)
    n = len(values)
    if n < 2:
        return Interval(mean, math.nan, n)
    return Interval(mean, t_critical(n - 1) * statistics.stdev(values) / math.sqrt(n), n)


@dataclass(frozen=True)
class Change:
    """``after`` against ``before``: their ratio with its 95 % half-width, and whether the
    difference lies outside the two intervals combined."""

    ratio: float
    ratio_half_width: float
    significant: bool


def change(before: Interval, after: Interval) -> Change:
    """How ``after`` differs from ``before`` (ratio after/before; the ratio's half-width by
    the delta method, the relative half-widths added in quadrature)."""
    combined = math.hypot(before.half_width, after.half_width)
    significant = not math.isnan(combined) and abs(after.mean - before.mean) > combined
    if before.mean == 0:
        return Change(math.nan, math.nan, significant)
    ratio = after.mean / before.mean
    rel = math.hypot(before.relative, after.relative) if after.mean else math.nan
    return Change(ratio, abs(ratio) * rel, significant)


def ratio_to(measured: Interval, reference: float) -> tuple[float, float]:
    """``measured`` over an exact ``reference`` (a published figure): the ratio and its
    half-width."""
    if reference == 0:
        return math.nan, math.nan
    return measured.mean / reference, measured.half_width / abs(reference)
