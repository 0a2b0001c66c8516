"""Small, dependency-free statistics for comparing a speculative arm with its baseline.

Samples are per-request latencies (e.g. TPOT in ms, lower is better) from one benchmark run of each
arm. Everything here is deterministic: no resampling, no random seed.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence


def median(xs: Sequence[float]) -> float:
    """The sample median (mean of the two middle values for an even count). Raises on no samples."""
    if not xs:
        raise ValueError("median of no samples")
    return float(statistics.median(xs))


def mad(xs: Sequence[float]) -> float:
    """Median absolute deviation from the median, UNSCALED: median(|x - median(xs)|).

    Multiply by 1.4826 for a consistent estimate of the standard deviation of normal data;
    unscaled, it is the half-width of the interval around the median that holds half of the samples
    (for symmetric data), which is the spread the noise band below uses."""
    m = median(xs)
    return median([abs(x - m) for x in xs])


def ratio_with_band(spec: Sequence[float], base: Sequence[float]) -> dict:
    """Ratio of medians spec/base with a noise band from both arms' spread.

    ratio = median(spec) / median(base)   (< 1: the speculative arm is faster, for latencies)
    low   = (median(spec) - mad(spec)) / (median(base) + mad(base))
    high  = (median(spec) + mad(spec)) / (median(base) - mad(base))
            (inf if the denominator is <= 0)

    The band is interval arithmetic on "median +/- one MAD" of each arm: the most and the least
    favourable ratio if each median moved by its own typical request-to-request deviation. It is a
    conservative noise band, not a confidence interval (the medians themselves are known more
    tightly than one MAD). `significant` is True when the whole band lies on one side of 1, i.e. the
    two arms differ by more than their spread: faster when high < 1, slower when low > 1.
    """
    return band_from_spread(median(spec), mad(spec), median(base), mad(base))


def band_from_spread(
    spec_median: float, spec_spread: float, base_median: float, base_spread: float
) -> dict:
    """`ratio_with_band` when only each arm's median and spread (MAD, or an estimate of it) are
    known."""
    ms, ds, mb, db = spec_median, spec_spread, base_median, base_spread
    if mb <= 0:
        raise ValueError("baseline median must be positive")
    if ds < 0 or db < 0:
        raise ValueError("spreads must be >= 0")
    low = (ms - ds) / (mb + db)
    high = (ms + ds) / (mb - db) if mb - db > 0 else math.inf
    return {"ratio": ms / mb, "low": low, "high": high, "significant": high < 1.0 or low > 1.0}
