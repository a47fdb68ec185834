"""How sure a comparison of activations is: spread over seeds and paired differences.

Two activations trained on the same seeds (the same initialisation draw and data order) are
compared seed by seed: the difference of their losses cancels what the seed does to both, so
its spread is what decides whether a gap is real. The interval is Student's t interval of the
mean paired difference (``scipy.stats.ttest_rel``), which assumes the differences are roughly
normal: with three seeds it is wide, as it should be.

One rule reads every gap, in every study (:func:`verdict`): a gap is "ahead" or "behind" only
where its interval excludes 0, otherwise it is "not resolved at N seeds"; and a sign "holds"
across cells only where every cell resolves the same way (:func:`sign_holds`). A mean's sign
alone is never a finding: at three seeds (two degrees of freedom) the interval is 4.3 standard
errors wide each side, and a cell whose mean was -0.001 came out +0.007 at a fourth seed.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from scipy import stats


@dataclass(frozen=True)
class Spread:
    """Mean and sample standard deviation (n - 1) of one activation's losses over seeds."""

    mean: float
    std: float
    n: int


@dataclass(frozen=True)
class PairedDifference:
    """``mean`` of ``a - b`` over the seeds both have, with its 95% interval ``[low, high]``;
    ``within_noise`` when the interval holds 0 (with one seed there is no interval at all)."""

    mean: float
    low: float
    high: float
    n: int

    @property
    def within_noise(self) -> bool:
        return not (self.low > 0 or self.high < 0)


AHEAD, BEHIND = "ahead", "behind"


def verdict(diff: PairedDifference) -> str:
    """``a - b`` as a finding, lower being better (a loss): ``ahead`` where the whole interval
    is below 0, ``behind`` where it is above, else ``not resolved at N seeds``."""
    if diff.high < 0:
        return AHEAD
    if diff.low > 0:
        return BEHIND
    return f"not resolved at {diff.n} seed{'' if diff.n == 1 else 's'}"


def resolved(verdict_text: str) -> bool:
    return verdict_text in (AHEAD, BEHIND)


def sign_holds(verdicts: list[str]) -> str | None:
    """``ahead`` or ``behind`` when every cell (an optimizer, a width) resolves that way; None
    when any cell is not resolved or the cells disagree: then the sign does not hold, whatever
    the means say."""
    if verdicts and all(v == AHEAD for v in verdicts):
        return AHEAD
    if verdicts and all(v == BEHIND for v in verdicts):
        return BEHIND
    return None


def spread(values: list[float]) -> Spread:
    if not values:
        raise ValueError("no values to summarise")
    std = statistics.stdev(values) if len(values) > 1 else math.nan
    return Spread(statistics.fmean(values), std, len(values))


def paired_difference(
    a: dict[int, float], b: dict[int, float], confidence: float = 0.95
) -> PairedDifference:
    """``a`` and ``b`` map seed -> loss; the seeds both have are paired."""
    seeds = sorted(set(a) & set(b))
    if not seeds:
        raise ValueError("the two sets of runs share no seed: nothing to pair")
    diffs = [a[s] - b[s] for s in seeds]
    mean = statistics.fmean(diffs)
    if len(seeds) < 2:
        return PairedDifference(mean, -math.inf, math.inf, 1)
    if statistics.pstdev(diffs) == 0:
        return PairedDifference(mean, mean, mean, len(seeds))
    interval = stats.ttest_rel([a[s] for s in seeds], [b[s] for s in seeds]).confidence_interval(
        confidence
    )
    return PairedDifference(mean, float(interval.low), float(interval.high), len(seeds))


def power_law_fit(sizes: list[float], losses: list[float]) -> tuple[float, float]:
    """``(a, b)`` of ``loss = a * size ** -b``, least squares in log-log space (needs three or
    more sizes to be worth drawing; two always fit exactly)."""
    if len(sizes) < 2:
        raise ValueError("a power law needs at least two sizes")
    fit = stats.linregress([math.log(s) for s in sizes], [math.log(v) for v in losses])
    return math.exp(fit.intercept), -fit.slope


@dataclass(frozen=True)
class Trend:
    """Least-squares ``slope`` of y on x with its 95% interval ``[low, high]`` (Student's t
    with n - 2 degrees of freedom); ``flat`` when the interval holds 0."""

    slope: float
    low: float
    high: float
    n: int

    @property
    def flat(self) -> bool:
        return not (self.low > 0 or self.high < 0)


def trend(xs: list[float], ys: list[float], confidence: float = 0.95) -> Trend:
    """How ``ys`` move with ``xs``: the question "does a gap shrink, hold or grow with width"
    asked of every seed's gap at every width (x = log2 width: the slope is per doubling). The
    points are taken as independent, which seeds paired within a width only approximate."""
    if len(set(xs)) < 2 or len(xs) < 3:
        raise ValueError("a trend needs three or more points at two or more x values")
    fit = stats.linregress(xs, ys)
    half = stats.t.ppf(0.5 + confidence / 2, len(xs) - 2) * fit.stderr
    return Trend(float(fit.slope), float(fit.slope - half), float(fit.slope + half), len(xs))
