"""Small, dependency-free statistics for comparing a speculative arm with its baseline.

median/mad/ratio_with_band/band_from_spread: the descriptive figures (median and unscaled MAD) and
the old interval-arithmetic noise band, kept for descriptive use (predict.py, benchmarks); it is NOT
a test and gives no error rate. Decisions use the exact rank permutation test below (rank_test,
ratio_interval), on run-level values. Everything here is deterministic: no resampling, no random
seed.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from functools import lru_cache


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


# --- exact rank permutation test over runs (issue 22) ---------------------------------------------
#
# The unit of evidence is one run on a freshly started server (one value per run). Two arms of n
# and m runs are compared by the exact two-sample permutation test on ranks (Wilcoxon-Mann-Whitney):
# under "the arms do not differ" every one of the C(n+m, n) ways to split the n+m run values into
# the two arms is equally likely, and the p-value is the share of splits at least as extreme as the
# observed one. The splits are counted exactly (a subset-sum count over the ranks, which is the
# enumeration of all splits without listing them), ties get midranks, so the test is exact at every
# sample size, and its false-verdict rate is at most alpha whatever the distribution of a run's
# value when the arms do not differ. Ranks make it
# robust to the one slow server start that swings a run by 1.7x (benchmarks/gpu_truth/REPORT.md).

ALTERNATIVES = ("two-sided", "less", "greater")
DEFAULT_ALPHA = 0.05  # host data `decision_alpha` once wired


def _doubled_midranks(values: Sequence[float]) -> list[int]:
    """2 x the midrank of each value (ties share the mean of their ranks), as integers."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    out = [0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for t in range(i, j + 1):  # ranks i+1 .. j+1 tied: midrank (i+j+2)/2, doubled i+j+2
            out[order[t]] = i + j + 2
        i = j + 1
    return out


@lru_cache(maxsize=256)
def subset_sum_counts(scores: tuple[int, ...], n: int) -> dict[int, int]:
    """{sum: number of n-element subsets of `scores` (a multiset of integers) with that sum}. The
    counts add up to C(len(scores), n): every split of the pooled runs into the two arms, counted
    once."""
    counts: list[dict[int, int]] = [{0: 1}] + [{} for _ in range(n)]
    for seen, s in enumerate(scores):
        for j in range(min(seen + 1, n), 0, -1):
            prev, cur = counts[j - 1], counts[j]
            for total, c in prev.items():
                cur[total + s] = cur.get(total + s, 0) + c
    return counts[n]


def rank_test(a: Sequence[float], b: Sequence[float], *, alternative: str = "two-sided") -> dict:
    """Exact permutation test on ranks of arm `a` against arm `b` (one value per run each).

    alternative: "less" (H1: a's values tend to be smaller), "greater", or "two-sided". p-value:
    the share of all C(n+m, n) splits whose rank sum of `a` is at least as extreme as observed
    ("two-sided": at least as far from its mean n(n+m+1)/2). Returns {p_value, u (Mann-Whitney U of
    `a`: pairs with a > b, ties count 1/2), splits (C(n+m, n)), min_p_value (the p of the most
    extreme split for this n and m without ties), alternative}."""
    if alternative not in ALTERNATIVES:
        raise ValueError(f"alternative must be one of {ALTERNATIVES}")
    n, m = len(a), len(b)
    if n == 0 or m == 0:
        raise ValueError("rank_test needs at least one run in each arm")
    ranks = _doubled_midranks([*a, *b])
    observed = sum(ranks[:n])
    dist = subset_sum_counts(tuple(sorted(ranks)), n)
    splits = math.comb(n + m, n)
    mean2 = n * (n + m + 1)  # E[doubled rank sum]
    if alternative == "less":
        hits = sum(c for t, c in dist.items() if t <= observed)
    elif alternative == "greater":
        hits = sum(c for t, c in dist.items() if t >= observed)
    else:
        dev = abs(observed - mean2)
        hits = sum(c for t, c in dist.items() if abs(t - mean2) >= dev)
    return {
        "p_value": hits / splits,
        "u": observed / 2 - n * (n + 1) / 2,
        "splits": splits,
        "min_p_value": min_p_value(n, m, alternative=alternative),
        "alternative": alternative,
    }


def min_p_value(n: int, m: int, *, alternative: str = "two-sided") -> float:
    """The smallest p-value the exact test can give with n and m runs (the most extreme split, no
    ties): 1/C(n+m, n) one-sided, 2/C(n+m, n) two-sided. 3 + 3 runs: 0.1 two-sided; 4 + 4: 0.029."""
    if n < 1 or m < 1:
        return 1.0
    c = math.comb(n + m, n)
    return min(1.0, (1 if alternative != "two-sided" else 2) / c)


def min_runs_per_arm(alpha: float, *, alternative: str = "two-sided") -> int:
    """The fewest runs per arm (equal arms) at which the exact test can reach `alpha` at all.
    alpha = 0.05: 4 two-sided (2/70 = 0.029), 3 one-sided (1/20 = 0.05)."""
    if not 0 < alpha < 1:
        raise ValueError("alpha must be in (0, 1)")
    n = 1
    while min_p_value(n, n, alternative=alternative) > alpha:
        n += 1
    return n


@lru_cache(maxsize=256)
def _u_cdf(n: int, m: int) -> tuple[float, ...]:
    """P(U <= u) for u = 0 .. n*m under the null, no ties (Mann-Whitney U of the first arm)."""
    dist = subset_sum_counts(tuple(range(1, n + m + 1)), n)
    base = n * (n + 1) // 2
    splits = math.comb(n + m, n)
    pmf = [0] * (n * m + 1)
    for s, c in dist.items():
        pmf[s - base] += c
    out, acc = [], 0
    for c in pmf:
        acc += c
        out.append(acc / splits)
    return tuple(out)


def attained_level(n: int, m: int, level: float, *, alternative: str = "two-sided") -> float:
    """The false-verdict probability actually spent when the exact test with n and m runs (no ties)
    rejects at p <= level: the largest achievable p-value <= level (0.0 when none is). Sequential
    looks carry the difference level - attained_level forward."""
    cdf = _u_cdf(n, m)
    best = 0.0
    for c in cdf:  # achievable one-sided p-values are the cdf values (U symmetric about nm/2)
        p = c if alternative != "two-sided" else min(1.0, 2 * c)
        if p <= level + 1e-12:
            best = max(best, p)
    return best


def ratio_interval(
    a: Sequence[float],
    b: Sequence[float],
    *,
    alpha: float,
    side: str = "two-sided",
    widest_if_unreachable: bool = False,
) -> dict:
    """Confidence interval for the ratio a/b (a = b x theta, a shift of log values) by inverting
    the exact rank test: the set of theta for which the test of a/theta against b does not reject at
    alpha (the Hodges-Lehmann/Moses interval). Its ends are order statistics of the n*m pairwise
    ratios a_i/b_j; its coverage is exact under the multiplicative-shift model whatever the run
    distribution, and the test rejects "theta = 1" exactly when 1 lies outside it (no ties).

    side: "two-sided" ([low, high]), "upper" (low = None: theta <= high with confidence) or "lower".
    Returns {low, high, confidence (the exact coverage, >= 1 - alpha), reached (False: too few runs
    for 1 - alpha), method}. A bound the runs cannot give at this alpha is None, unless
    widest_if_unreachable: then the widest interval the runs give (the extreme pairwise ratios)
    with its own, lower, confidence (3 + 3 runs: 90 %). Values of `b` must be > 0, of `a` >= 0."""
    if side not in ("two-sided", "upper", "lower"):
        raise ValueError("side must be two-sided, upper or lower")
    n, m = len(a), len(b)
    if n == 0 or m == 0 or min(a) < 0 or min(b) <= 0:
        raise ValueError("ratio_interval needs values >= 0 in a and > 0 in b")
    d = sorted(x / y for x in a for y in b)  # the pairwise ratios (log differences, exponentiated)
    cdf = _u_cdf(n, m)
    tail = alpha / 2 if side == "two-sided" else alpha
    k = -1  # the largest u with P(U <= u) <= tail
    for u, c in enumerate(cdf):
        if c <= tail + 1e-12:
            k = u
        else:
            break
    nm = n * m
    reached = k >= 0
    if not reached and not widest_if_unreachable:
        return {
            "low": None,
            "high": None,
            "confidence": None,
            "reached": False,
            "method": RATIO_INTERVAL_METHOD,
        }
    k = max(k, 0)
    miss = cdf[k]
    low = d[k] if side in ("two-sided", "lower") else None
    high = d[nm - 1 - k] if side in ("two-sided", "upper") else None
    return {
        "low": low,
        "high": high,
        "confidence": max(0.0, 1 - (2 * miss if side == "two-sided" else miss)),
        "reached": reached,
        "method": RATIO_INTERVAL_METHOD,
    }


RATIO_INTERVAL_METHOD = (
    "exact rank-test inversion over runs (Hodges-Lehmann/Moses): order statistics of the pairwise "
    "run ratios speculative_i / baseline_j"
)


def sign_test(values: Sequence[float], *, center: float = 1.0) -> dict:
    """Exact two-sided sign test of "the median of `values` is `center`" (e.g. per-host paired
    ratios against 1): values equal to the center are dropped. Returns {p_value, below, above}."""
    below = sum(1 for v in values if v < center)
    above = sum(1 for v in values if v > center)
    n = below + above
    if n == 0:
        return {"p_value": 1.0, "below": 0, "above": 0}
    k = min(below, above)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2**n
    return {"p_value": min(1.0, 2 * tail), "below": below, "above": above}


def holm(pvals: Mapping[int, float], alpha: float) -> set[int]:
    """Holm's step-down: the keys whose null is rejected with family-wise error <= alpha."""
    rejected = set()
    ordered = sorted(pvals, key=lambda k: (pvals[k], k))
    for i, k in enumerate(ordered):
        if pvals[k] <= alpha / (len(ordered) - i):
            rejected.add(k)
        else:
            break
    return rejected


# --- sequential looks -----------------------------------------------------------------------------

SEQUENTIAL_RULE = (
    "sequential looks at equal run counts per arm; the first look is at the fewest runs at which "
    "the exact test can go below alpha and spends only its most extreme split (2/70 = 0.029 at 4 "
    "+ 4 runs for alpha = 0.05, two-sided); the rest of alpha goes to the look at the run budget "
    "(spending 'first-last', the default) or is split evenly over every run count after the first"
    " ('even'), each look's unspent share (the exact test's p-values are discrete) carried to the"
    " next. The levels actually spent add up to <= alpha, so by the union bound the chance of any"
    " false verdict over all looks is <= alpha whatever the dependence between looks (Bonferroni "
    "over looks with carry-forward)"
)


SPENDING = ("even", "first-last")


def sequential_looks(
    max_runs: int,
    *,
    alpha: float = DEFAULT_ALPHA,
    alternative: str = "two-sided",
    spending: str = "first-last",
) -> list[dict]:
    """The looks of the sequential rule (SEQUENTIAL_RULE) for a budget of max_runs runs per arm:
    [{runs, level (the p-value threshold at that look), spent (the false-verdict probability it
    spends: the largest achievable p <= level)}]. Looks whose level no split can reach are left
    out (their share carries on). Empty when the budget cannot reach alpha at all.

    spending "first-last" (the default): two looks only, the first and the budget's end, which
    gets all the rest of alpha; "even": the rest split evenly over every later run count (stops a
    little earlier on medium effects, less power at the budget: at 8 runs per arm and a 10 %
    effect with CV 5 %, 82 % against 93 %; benchmarks/decision_rule.py compares them)."""
    if spending not in SPENDING:
        raise ValueError(f"spending must be one of {SPENDING}")
    first = min_runs_per_arm(alpha, alternative=alternative)
    while first < max_runs and min_p_value(first, first, alternative=alternative) >= alpha:
        first += 1  # a first look at exactly alpha would leave nothing for the later ones
    if max_runs < first:
        return []
    if max_runs == first:  # one look: the fixed-size test
        return [
            {
                "runs": first,
                "level": alpha,
                "spent": attained_level(first, first, alpha, alternative=alternative),
            }
        ]
    first_level = min_p_value(first, first, alternative=alternative)
    looks = [{"runs": first, "level": first_level, "spent": first_level}]
    left = alpha - first_level
    later = list(range(first + 1, max_runs + 1)) if spending == "even" else [max_runs]
    for i, n in enumerate(later):
        level = left / (len(later) - i)
        spent = attained_level(n, n, level, alternative=alternative)
        left -= spent
        if spent > 0:
            looks.append({"runs": n, "level": level, "spent": spent})
    if looks[-1]["runs"] != max_runs:  # the budget's end is always a look (it may never stop)
        looks.append({"runs": max_runs, "level": 0.0, "spent": 0.0})
    return looks
