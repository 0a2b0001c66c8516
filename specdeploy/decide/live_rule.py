"""Speculation judged on live traffic: the control arm's windows, the windowed verdict and the
autopilot's decision. Pure functions: no host, no I/O, no clock (observe/live_verdict.py reads the
scrapes, the CLI and the exporter show what these return).

A box with a control arm (host data `speculation_control`) serves the same traffic on two arms
behind a balancer that routes each request at random: the speculative instances and the control
instances on the baseline unit (a class of plain hosts: its hosts are the instances, behind the
operator's balancer; render/control.py). Every `live_window_s` seconds each arm's counters are
read from vLLM's own /metrics (summed over the arm's instances), and one window holds, per arm,
the mean per-request TPOT (Δ sum / Δ count of vllm:request_time_per_output_token_seconds), the
requests that finished with a TPOT (that Δ count) and the speculative arm's draft acceptance.

The windows are paired in time: both arms' figures come from the same seconds of the same traffic
mix, so a load swing moves both and cancels in their ratio (speculative / baseline). Each window
compares the control instances with as many speculative instances (matched_instances: in turn,
window after window). Under "the arms do not differ", random routing makes the two arms of one
window exchangeable, so each
window's ratio is as likely above 1 as below it, independently of the other windows: the exact
sign test on the paired ratios (stats.sign_test, the project's exact test for paired ratios) has
a false-verdict rate <= alpha whatever the distribution of the window means and however the load
drifts between windows. The two-sample rank test (stats.rank_test) would need windows that are
exchangeable with each other, which drifting traffic is not.

A decision is made over each block of `live_windows` consecutive usable windows; blocks do not
overlap, so decisions are independent under the null: a false "loses" has probability <= alpha/2
per decision and N in a row <= (alpha/2)^N, which is what the autopilot's N consecutive decisions
buy. Windows in which either arm finished fewer than `live_min_requests` requests (or a counter
went back: a restarted server) are skipped and counted, never guessed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from specdeploy.decide.metrics import REQUESTS_FINISHED, TPOT_HISTOGRAM, sample_sum, samples
from specdeploy.decide.metrics import spec_decode_counters as _spec_decode_counters
from specdeploy.decide.stats import DEFAULT_ALPHA, median, sign_test

ARMS = ("speculative", "baseline")
LIVE_WINDOW_S = 300
LIVE_MIN_REQUESTS = 20
LIVE_WINDOWS = 12  # one decision an hour at 5-minute windows

PAYS, LOSES, UNDECIDED = "pays", "loses", "undecided"
LIVE_VERDICTS = (PAYS, LOSES, UNDECIDED)

LIVE_RULE = (
    "exact two-sided sign test on the paired window ratios (speculative / baseline mean TPOT of "
    "the same window, both arms behind one balancer routing at random, as many speculative "
    "instances as control ones, taken in turn) against 1, over a block of"
    " consecutive usable windows that no earlier decision used; pays when the ratios lie "
    "significantly below 1, loses when significantly above; the interval is the distribution-free"
    " order-statistic interval for the median ratio that the sign test inverts to. The chance of "
    "a false verdict (pays or loses on arms that do not differ) is <= alpha per decision, and of "
    "a false loses <= alpha/2; windows where either arm finished too few requests are skipped "
    "and counted"
)


# --- counters and windows -------------------------------------------------------------------------


def arm_counters(texts: Sequence[str]) -> dict[str, float]:
    """One arm's cumulative counters from its instances' /metrics texts, summed: tpot_sum (s),
    tpot_count (requests with a TPOT), requests (finished), draft_tokens, accepted_tokens, drafts.
    A counter an instance does not export counts 0 there (the baseline drafts nothing)."""
    out = dict.fromkeys(
        ("tpot_sum", "tpot_count", "requests", "draft_tokens", "accepted_tokens", "drafts"), 0.0
    )
    for text in texts:
        parsed = samples(text)
        out["tpot_sum"] += sample_sum(parsed, f"{TPOT_HISTOGRAM}_sum") or 0.0
        out["tpot_count"] += sample_sum(parsed, f"{TPOT_HISTOGRAM}_count") or 0.0
        out["requests"] += sample_sum(parsed, REQUESTS_FINISHED) or 0.0
        spec = _spec_decode_counters(text)
        out["draft_tokens"] += spec.get("num_draft_tokens", 0.0)
        out["accepted_tokens"] += spec.get("num_accepted_tokens", 0.0)
        out["drafts"] += spec.get("num_drafts", 0.0)
    return out


def arm_served(text: str) -> str:
    """The arm a server is on, from its own /metrics: "speculative" when it exports vLLM's
    spec-decode counters (as `specdeploy status` tells speculation is on), else "baseline"."""
    return "speculative" if _spec_decode_counters(text) else "baseline"


def _arm_window(before: Mapping[str, float], after: Mapping[str, float]) -> dict:
    delta = {key: after.get(key, 0.0) - before.get(key, 0.0) for key in after}
    count = delta.get("tpot_count", 0.0)
    proposed = delta.get("draft_tokens", 0.0)
    return {
        "requests": int(round(count)),
        "tpot_mean_s": delta["tpot_sum"] / count if count > 0 else None,
        "acceptance_rate": delta.get("accepted_tokens", 0.0) / proposed if proposed > 0 else None,
        "reset": any(v < 0 for v in delta.values()),
    }


def live_window(
    start: float,
    end: float,
    before: Mapping[str, Mapping[str, float]],
    after: Mapping[str, Mapping[str, float]],
    *,
    min_requests: int = LIVE_MIN_REQUESTS,
) -> dict:
    """One window from both arms' counters at its start and end ({arm: arm_counters(...)}):
    {start, end, speculative, baseline (each: requests, tpot_mean_s, acceptance_rate), ratio
    (speculative / baseline mean TPOT; None when skipped), skipped (None, or why)}."""
    arms = {arm: _arm_window(before[arm], after[arm]) for arm in ARMS}
    skipped = None
    if any(a["reset"] for a in arms.values()):
        skipped = "a counter went back (a server restarted)"
    else:
        few = [f"{arm} {a['requests']}" for arm, a in arms.items() if a["requests"] < min_requests]
        if few:
            skipped = f"too little traffic: {', '.join(few)} requests < {min_requests}"
        elif not arms["baseline"]["tpot_mean_s"]:
            skipped = "no baseline TPOT"
    for a in arms.values():
        del a["reset"]
    ratio = (
        None if skipped else arms["speculative"]["tpot_mean_s"] / arms["baseline"]["tpot_mean_s"]
    )
    return {"start": start, "end": end, **arms, "ratio": ratio, "skipped": skipped}


def _summed(counters: Sequence[Mapping[str, float]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for one in counters:
        for key, value in one.items():
            out[key] = out.get(key, 0.0) + value
    return out


def matched_instances(
    speculative: Sequence[str], baseline: Sequence[str], index: int
) -> tuple[list[str], list[str]]:
    """The instances window `index` compares: every instance of the smaller arm, and as many of
    the larger one, taken in turn window after window (all of them over time): the control
    instances against as many speculative ones, or, on a fallen-back box, its one speculative
    instance against one baseline instance at a time. Arms of equal size make the two arms of a
    window interchangeable when speculation makes no difference, which is what the sign test's
    exactness needs: a larger arm's mean is less noisy, and with skewed TPOTs its median sits
    higher than the smaller arm's, so unequal arms would lean one way."""
    spec, base = sorted(speculative), sorted(baseline)
    if not spec or not base or len(spec) == len(base):
        return spec, base

    def in_turn(larger: list[str], size: int) -> list[str]:
        start = (index * size) % len(larger)
        return (larger[start:] + larger[:start])[:size]

    if len(spec) > len(base):
        return in_turn(spec, len(base)), base
    return spec, in_turn(base, len(spec))


def windows_from_snapshots(
    snapshots: Sequence[Mapping], *, min_requests: int = LIVE_MIN_REQUESTS
) -> list[dict]:
    """Consecutive snapshots (taken at the window boundaries) as windows, in time order. A
    snapshot is {t, speculative, baseline}, each arm {instance name: counters}
    (matched_instances picks who counts in each window) or its counters already summed."""
    ordered = sorted(snapshots, key=lambda s: s["t"])
    out = []
    for index, (a, b) in enumerate(zip(ordered, ordered[1:], strict=False)):
        if "tpot_sum" in b["speculative"]:  # summed arms
            out.append(live_window(a["t"], b["t"], a, b, min_requests=min_requests))
            continue
        # instances in both snapshots (one that appeared or left in between is not compared)
        present = {arm: sorted(set(a[arm]) & set(b[arm])) for arm in ARMS}
        spec, base = matched_instances(present["speculative"], present["baseline"], index)
        chosen = {"speculative": spec, "baseline": base}
        before = {arm: _summed([a[arm][n] for n in chosen[arm]]) for arm in ARMS}
        after = {arm: _summed([b[arm][n] for n in chosen[arm]]) for arm in ARMS}
        if not all(after[arm] for arm in ARMS):
            empty = dict.fromkeys(("tpot_sum", "tpot_count"), 0.0)
            before = {arm: before[arm] or empty for arm in ARMS}
            after = {arm: after[arm] or empty for arm in ARMS}
        window = live_window(a["t"], b["t"], before, after, min_requests=min_requests)
        window["instances"] = chosen
        out.append(window)
    return out


# --- the verdict ----------------------------------------------------------------------------------


def min_live_windows(alpha: float = DEFAULT_ALPHA) -> int:
    """The fewest paired windows with which the two-sided sign test can go below alpha at all (all
    ratios on one side: p = 2 / 2^n): 6 at alpha 0.05 (p = 0.031)."""
    if not 0 < alpha < 1:
        raise ValueError("alpha must be in (0, 1)")
    return max(1, math.ceil(math.log2(2 / alpha)))


def median_interval(ratios: Sequence[float], *, alpha: float) -> dict:
    """The order-statistic interval [r_(k+1), r_(n-k)] for the median of the ratios, k the
    largest with 2 P(Bin(n, 1/2) <= k) <= alpha: distribution-free, coverage exactly
    1 - 2 P(Bin <= k) (>= 1 - alpha); 1 lies outside it exactly when the sign test rejects at
    alpha (no ratio equal to 1). Returns {low, high, confidence}; None bounds when n cannot
    reach alpha."""
    r = sorted(ratios)
    n = len(r)
    k, tail = -1, 0.0
    for j in range(n):
        below = sum(math.comb(n, i) for i in range(j + 1)) / 2**n
        if 2 * below <= alpha + 1e-12:
            k, tail = j, below
        else:
            break
    if k < 0:
        return {"low": None, "high": None, "confidence": None}
    return {"low": r[k], "high": r[n - 1 - k], "confidence": 1 - 2 * tail}


def live_decision(block: Sequence[Mapping], *, alpha: float = DEFAULT_ALPHA) -> dict:
    """The verdict over one block of usable windows (LIVE_RULE): {verdict, ratio (median of the
    paired ratios), low, high, confidence, p_value, windows, below, above, acceptance_rate (the
    speculative arm's, pooled over the block's windows by their requests), start, end, alpha,
    test, text}."""
    ratios = [w["ratio"] for w in block]
    if not ratios:
        raise ValueError("a live decision needs at least one usable window")
    test = sign_test(ratios, center=1.0)
    reachable = 2 / 2 ** len(ratios) <= alpha + 1e-12
    ratio = median(ratios)
    verdict = UNDECIDED
    if reachable and test["p_value"] <= alpha:
        verdict = PAYS if test["below"] > test["above"] else LOSES
    band = median_interval(ratios, alpha=alpha)
    rated = [
        (w["speculative"]["acceptance_rate"], w["speculative"]["requests"])
        for w in block
        if w["speculative"].get("acceptance_rate") is not None
    ]
    weight = sum(n for _, n in rated)
    out = {
        "verdict": verdict,
        "ratio": ratio,
        **band,
        "p_value": test["p_value"],
        "windows": len(ratios),
        "below": test["below"],
        "above": test["above"],
        "acceptance_rate": sum(a * n for a, n in rated) / weight if weight else None,
        "start": block[0]["start"],
        "end": block[-1]["end"],
        "alpha": alpha,
        "test": LIVE_RULE,
    }
    out["text"] = verdict_text(out)
    return out


def verdict_text(decision: Mapping) -> str:
    """ "pays 0.78x (0.71-0.86) over 12 windows", "loses 1.21x (...)", "undecided 0.97x (...)"."""
    if decision.get("ratio") is None:
        return f"{UNDECIDED}: {decision.get('why', 'no usable window yet')}"
    band = (
        f" ({decision['low']:.2f}-{decision['high']:.2f})"
        if decision.get("low") is not None
        else ""
    )
    return (
        f"{decision['verdict']} {decision['ratio']:.2f}x{band} over {decision['windows']} windows"
    )


def live_decisions(
    windows: Sequence[Mapping],
    *,
    windows_per_decision: int = LIVE_WINDOWS,
    alpha: float = DEFAULT_ALPHA,
) -> dict:
    """Every decision over the windows so far, in time order: one per block of
    `windows_per_decision` consecutive usable windows (non-overlapping). Returns {decisions,
    current (the latest decision, or an undecided placeholder), pending (usable windows toward the
    next decision), skipped (count of skipped windows), skipped_why ({reason: count}), windows
    (all of them)}."""
    if windows_per_decision < min_live_windows(alpha):
        raise ValueError(
            f"{windows_per_decision} windows per decision cannot reach alpha = {alpha:g} "
            f"(at least {min_live_windows(alpha)})"
        )
    usable = [w for w in windows if not w["skipped"]]
    why: dict[str, int] = {}
    for w in windows:
        if w["skipped"]:
            key = w["skipped"].split(":")[0]
            why[key] = why.get(key, 0) + 1
    full = len(usable) // windows_per_decision
    decisions = [
        live_decision(
            usable[i * windows_per_decision : (i + 1) * windows_per_decision], alpha=alpha
        )
        for i in range(full)
    ]
    pending = len(usable) - full * windows_per_decision
    if decisions:
        current = decisions[-1]
    else:
        current = {
            "verdict": UNDECIDED,
            "ratio": None,
            "windows": 0,
            "why": f"{pending} of {windows_per_decision} usable windows so far",
        }
        current["text"] = verdict_text(current)
    return {
        "decisions": decisions,
        "current": current,
        "pending": pending,
        "skipped": sum(why.values()),
        "skipped_why": why,
        "windows": list(windows),
    }


# --- the autopilot --------------------------------------------------------------------------------

AUTOPILOT_MODES = ("off", "alert", "fallback", "both")
AUTOPILOT_AFTER = 3  # consecutive decisions
KEEP, ALERT, FALL_BACK, RETURN = (
    "keep",
    "alert",
    "fall back to the baseline",
    "return to speculation",
)
DEPLOYED = "deployed back to speculation"  # not the autopilot's: a deploy ended a fall-back


def autopilot_start(serving: str = "speculative") -> dict:
    """The autopilot's state on a freshly deployed box: what the box serves (its speculative
    instances speculative, or, after a fall-back, all but one on the baseline) and the streaks."""
    if serving not in ARMS:
        raise ValueError(f"serving must be one of {ARMS}")
    return {"serving": serving, "loses_in_a_row": 0, "pays_in_a_row": 0, "switches": 0}


def autopilot_step(state: Mapping, decision: Mapping, *, mode: str, after: int = AUTOPILOT_AFTER):
    """One decision's effect: (new state, action, why). action is KEEP, ALERT, FALL_BACK or RETURN.

    A streak counts consecutive decisions with the same verdict; any other verdict (undecided
    too) ends it. Serving speculative: `after` loses in a row -> ALERT ("alert") or FALL_BACK
    ("fallback", "both"), the streaks start again from 0 (so the next switch needs `after` new
    decisions: no flapping). Fallen back (one speculative instance stays as the control arm, so
    the verdict goes on): `after` pays in a row -> RETURN only with "both"; with "fallback" it is
    said (ALERT) and the box stays on the baseline until a deploy. "off": always KEEP."""
    if mode not in AUTOPILOT_MODES:
        raise ValueError(f"mode must be one of {AUTOPILOT_MODES}")
    verdict = decision["verdict"]
    new = dict(state)
    new["loses_in_a_row"] = state["loses_in_a_row"] + 1 if verdict == LOSES else 0
    new["pays_in_a_row"] = state["pays_in_a_row"] + 1 if verdict == PAYS else 0
    if mode == "off":
        return new, KEEP, "autopilot off"
    evidence = decision.get("text", verdict)
    if state["serving"] == "speculative" and new["loses_in_a_row"] >= after:
        why = f"speculation lost {new['loses_in_a_row']} decisions in a row (last: {evidence})"
        if mode == "alert":
            return new, ALERT, why
        new.update(serving="baseline", loses_in_a_row=0, pays_in_a_row=0)
        new["switches"] = state["switches"] + 1
        return new, FALL_BACK, why
    if state["serving"] == "baseline" and new["pays_in_a_row"] >= after:
        why = f"speculation paid {new['pays_in_a_row']} decisions in a row (last: {evidence})"
        if mode != "both":
            return new, ALERT, why + "; a deploy returns the box to speculation"
        new.update(serving="speculative", loses_in_a_row=0, pays_in_a_row=0)
        new["switches"] = state["switches"] + 1
        return new, RETURN, why
    return new, KEEP, evidence


def autopilot_replay(
    decisions: Sequence[Mapping],
    *,
    mode: str,
    after: int = AUTOPILOT_AFTER,
    serving: str = "speculative",
) -> list[dict]:
    """Every decision's step from a fresh start: [{decision, action, why, state}] (the record of
    what the autopilot did and on which evidence, replayable from the recorded decisions)."""
    state = autopilot_start(serving)
    out = []
    for decision in decisions:
        state, action, why = autopilot_step(state, decision, mode=mode, after=after)
        out.append({"verdict": decision["verdict"], "action": action, "why": why, "state": state})
    return out


def control_count(instances: int, *, count: int | None = None, share: float | None = None) -> int:
    """Control instances of a box of `instances`: `count`, or the share rounded to the nearest
    (at least 1). The check refuses a count that leaves no speculative instance."""
    if count is not None:
        return count
    if share is None:
        return 0
    return max(1, round(share * instances))


def fallback_keeps(instances: int) -> int:
    """Speculative instances a fallen-back box keeps: one, the new control arm, where the box has
    at least 3 (a box of 2 keeping one would be the layout it fell back from: it ends wholly on
    the baseline, and its verdict stops until a deploy)."""
    return 1 if instances >= 3 else 0


# --- simulation: the verdict's false rate and power -----------------------------------------------


def simulated_windows(
    rng,
    count: int,
    *,
    ratio: float,
    requests_per_window: float,
    control_share: float = 0.5,
    request_cv: float = 0.3,
    drift: float = 0.2,
    min_requests: int = LIVE_MIN_REQUESTS,
    acceptance: float | None = 0.6,
) -> list[dict]:
    """`count` windows of a box whose speculative arm's TPOT is `ratio` x the baseline's:
    `requests_per_window` requests routed at random (each to the control arm with probability
    `control_share`), per-request TPOT with coefficient of variation `request_cv` (a window's mean
    then spreads by request_cv / sqrt(requests), lognormal), and the load moving both arms by a
    common lognormal factor of spread `drift` from window to window. `rng`: a random.Random."""
    out = []
    for i in range(count):
        level = rng.lognormvariate(0.0, drift)  # the window's load: the same for both arms
        total = max(0, round(rng.gauss(requests_per_window, math.sqrt(requests_per_window))))
        base_n = sum(1 for _ in range(total) if rng.random() < control_share)
        spec_n = total - base_n
        arms = {}
        for arm, n, scale in (("speculative", spec_n, ratio), ("baseline", base_n, 1.0)):
            sigma = request_cv / math.sqrt(n) if n else 0.0
            mean = 0.02 * level * scale * rng.lognormvariate(-sigma * sigma / 2, sigma) if n else 0
            arms[arm] = {
                "tpot_sum": mean * n,
                "tpot_count": float(n),
                "requests": float(n),
                "draft_tokens": 100.0 * n if arm == "speculative" and acceptance else 0.0,
                "accepted_tokens": 100.0 * n * acceptance
                if arm == "speculative" and acceptance
                else 0.0,
                "drafts": 0.0,
            }
        zero = {arm: dict.fromkeys(arms[arm], 0.0) for arm in ARMS}
        start = i * LIVE_WINDOW_S
        out.append(live_window(start, start + LIVE_WINDOW_S, zero, arms, min_requests=min_requests))
    return out


def live_power(
    ratio: float,
    *,
    requests_per_s: float,
    instances: int = 2,
    control: int = 1,
    window_s: int = LIVE_WINDOW_S,
    windows_per_decision: int = LIVE_WINDOWS,
    alpha: float = DEFAULT_ALPHA,
    request_cv: float = 0.3,
    drift: float = 0.2,
    min_requests: int = LIVE_MIN_REQUESTS,
    hours: float = 1.0,
    trials: int = 400,
    seed: int = 20261205,
) -> dict:
    """The chance that `hours` of traffic at `requests_per_s` on a box of `instances` (`control` on
    the baseline) gives at least one decision with the right verdict (pays for ratio < 1, loses
    for ratio > 1; for ratio == 1: any verdict at all, the false rate) by LIVE_RULE, simulated
    (simulated_windows, seeded: the same figures on every machine). Returns {power, decisions
    per trial, usable share of windows, ...the inputs}."""
    import random

    rng = random.Random(seed)
    count = int(hours * 3600 // window_s)
    # matched arms (matched_instances): each window compares the control instances with as many
    # speculative ones, so both arms see the control arm's share of the requests
    per_arm = requests_per_s * window_s * control / instances
    hits = usable = 0
    for _ in range(trials):
        windows = simulated_windows(
            rng,
            count,
            ratio=ratio,
            requests_per_window=2 * per_arm,
            control_share=0.5,
            request_cv=request_cv,
            drift=drift,
            min_requests=min_requests,
        )
        result = live_decisions(windows, windows_per_decision=windows_per_decision, alpha=alpha)
        usable += len(windows) - result["skipped"]
        verdicts = {d["verdict"] for d in result["decisions"]}
        if ratio < 1:
            hits += PAYS in verdicts
        elif ratio > 1:
            hits += LOSES in verdicts
        else:
            hits += bool(verdicts - {UNDECIDED})
    return {
        "power": hits / trials,
        "usable_windows": usable / (trials * count) if count else 0.0,
        "ratio": ratio,
        "requests_per_s": requests_per_s,
        "instances": instances,
        "control": control,
        "hours": hours,
        "windows_per_decision": windows_per_decision,
        "window_s": window_s,
        "alpha": alpha,
        "trials": trials,
    }


def control_arm_cost(instances: int, control: int, speculative_gain: float) -> float:
    """The share of a box's throughput the control arm gives up: `control` of `instances` serve
    without the gain (speculative_gain: e.g. 0.25 for tokens 25 % faster), so the box keeps
    (instances - control) / instances of it. One control instance of 4 at a 25 % gain: 6.25 %."""
    if not 0 <= control <= instances or instances < 1:
        raise ValueError("control must be between 0 and instances")
    return speculative_gain * control / instances
