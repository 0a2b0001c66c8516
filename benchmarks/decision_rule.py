"""Calibration of the decision rule (issue 22): false-verdict rate and power by simulation.

    python benchmarks/decision_rule.py [--trials 20000] [--seed 22]

Prints figures, it is not a timed test (tests/unit/decide/test_decision_rule.py is the fast check).
Every simulated run is one run-level value (one fresh server start's median TPOT, ms). Spread
models:

- normal: mean 10, sd 0.5 (CV 5 %), the issue's figure for the old rule;
- sandbox: CV 2 % run to run, the trained sandbox pair (ratio 0.46);
- h200: baseline CV 0.05 % (0.02 ms spread at 5.24 ms), speculative with the measured swing: one
  start in three runs in the slow mode, 1.35x slower (benchmarks/gpu_truth/REPORT.md). "Identical
  arms" under this model draws both arms from the speculative (swinging) distribution.

Tables: (1) compare at a fixed number of runs per arm, the old interval-arithmetic band
(median +/- unscaled MAD) against the exact rank test; (2) the sequential compare (next_step) per
run budget and spending scheme: false-verdict rate, power, mean runs per arm (deploys/compare.py
runs next_step with spending 'first-last' and budget compare_max_repeats, default 8); (3) the gate
(gate_next_step, max_tpot_ratio 0.95); (4) choose_k on seven identical k (+ an identical baseline).
A false verdict on identical arms is "better" or "worse"; power is the share of "better" for a real
speed-up. The binomial simulation error of a rate p is sqrt(p(1-p)/trials) (0.15 % at p = 0.05 and
20,000 trials).
"""

from __future__ import annotations

import argparse
import math
import random
import time
from collections import Counter

from specdeploy.decide.choose import choose_k
from specdeploy.decide.decisions import BETTER, DECIDE, WORSE, compare_values, next_step
from specdeploy.decide.gate_rule import gate_next_step
from specdeploy.decide.stats import min_p_value, ratio_with_band, sequential_looks


def normal(mean: float, cv: float):
    return lambda rng: rng.gauss(mean, cv * mean)


def h200_spec(mean: float):
    def draw(rng):
        fast = rng.gauss(mean, 0.01 * mean)
        return fast * 1.35 if rng.random() < 1 / 3 else fast

    return draw


SCENARIOS = {
    # name: (speculative draw, baseline draw)
    "normal null (identical, CV 5 %)": (normal(10, 0.05), normal(10, 0.05)),
    "normal 10 % faster": (normal(9, 0.05), normal(10, 0.05)),
    "sandbox null (identical, CV 2 %)": (normal(10, 0.02), normal(10, 0.02)),
    "sandbox 10 % faster": (normal(9, 0.02), normal(10, 0.02)),
    "sandbox trained pair 0.46": (normal(4.6, 0.02), normal(10, 0.02)),
    "h200 null (both arms swing)": (h200_spec(5.24), h200_spec(5.24)),
    "h200 10 % faster (spec swings)": (h200_spec(0.9 * 5.24), normal(5.24, 0.0005)),
}


def old_verdict(spec, base) -> str:
    """The rule before issue 22: interval arithmetic on median +/- unscaled MAD."""
    if len(spec) < 2 or len(base) < 2:
        return "too few runs"
    band = ratio_with_band(spec, base)
    if band["high"] < 1:
        return BETTER
    if band["low"] > 1:
        return WORSE
    return "within noise"


def pct(x: float) -> str:
    return f"{100 * x:5.1f} %"


def fixed_table(trials: int, rng: random.Random) -> None:
    print("## (1) compare at a fixed number of runs per arm: share of 'better' or 'worse'")
    print("   (old band rule / exact rank test at alpha = 0.05; the test's smallest p in brackets)")
    ns = range(2, 9)
    print(f"{'scenario':34s}" + "".join(f"{f'n={n} [{min_p_value(n, n):.3f}]':>22s}" for n in ns))
    for name, (spec_draw, base_draw) in SCENARIOS.items():
        cells = []
        for n in ns:
            old = new = 0
            for _ in range(trials):
                s = [spec_draw(rng) for _ in range(n)]
                b = [base_draw(rng) for _ in range(n)]
                old += old_verdict(s, b) in (BETTER, WORSE)
                new += compare_values(s, b)["verdict"] in (BETTER, WORSE)
            cells.append(f"{pct(old / trials)} / {pct(new / trials)}")
        print(f"{name:34s}" + "".join(f"{c:>22s}" for c in cells))
    print()


def sequential_table(trials: int, rng: random.Random) -> None:
    print("## (2) sequential compare (next_step), alpha = 0.05: decided share, mean runs per arm")
    for spending in ("even", "first-last"):
        for budget in (4, 5, 6, 8):
            looks = [lk["runs"] for lk in sequential_looks(budget, spending=spending)]
            print(f"- spending {spending!r}, budget {budget} runs per arm, looks at {looks}:")
            for name, (spec_draw, base_draw) in SCENARIOS.items():
                verdicts, runs = Counter(), 0
                for _ in range(trials):
                    s, b = [], []
                    while True:
                        step = next_step(s, b, max_runs=budget, spending=spending)
                        if step["action"] == DECIDE:
                            break
                        s.append(spec_draw(rng))
                        b.append(base_draw(rng))
                    verdicts[step["result"]["verdict"]] += 1
                    runs += len(s)
                sig = (verdicts[BETTER] + verdicts[WORSE]) / trials
                print(
                    f"    {name:34s} better {pct(verdicts[BETTER] / trials)}  worse "
                    f"{pct(verdicts[WORSE] / trials)}  (either {pct(sig)})  mean runs per arm "
                    f"{runs / trials:4.2f}"
                )
    print()


GATE_SCENARIOS = {
    "identical arms (sandbox CV 2 %)": (normal(10, 0.02), normal(10, 0.02)),
    "at the margin: ratio 0.95 (CV 2 %)": (normal(9.5, 0.02), normal(10, 0.02)),
    "ratio 0.85 (CV 2 %)": (normal(8.5, 0.02), normal(10, 0.02)),
    "trained pair 0.46 (CV 2 %)": (normal(4.6, 0.02), normal(10, 0.02)),
    "poor draft, ratio 1.3 (CV 2 %)": (normal(13, 0.02), normal(10, 0.02)),
    "h200 identical (both swing)": (h200_spec(5.24), h200_spec(5.24)),
    "h200 ratio 0.85 (spec swings)": (h200_spec(0.85 * 5.24), normal(5.24, 0.0005)),
}


def gate_table(trials: int, rng: random.Random) -> None:
    print("## (3) the gate (gate_next_step), max_tpot_ratio 0.95, alpha 0.05")
    print("   kept = speculation kept; conclusive fall-back = significantly slower than the margin")
    for budget in (3, 4, 6):
        looks = [lk["runs"] for lk in sequential_looks(budget, alternative="less")]
        print(f"- budget {budget} runs per arm, looks at {looks}:")
        for name, (spec_draw, base_draw) in GATE_SCENARIOS.items():
            kept = concl = runs = 0
            for _ in range(trials):
                s, b = [spec_draw(rng), spec_draw(rng)], [base_draw(rng), base_draw(rng)]
                while True:
                    step = gate_next_step(
                        s, b, max_tpot_ratio=0.95, on_fail="baseline", max_runs=budget
                    )
                    if step["action"] == DECIDE:
                        break
                    s.append(spec_draw(rng))
                    b.append(base_draw(rng))
                kept += step["result"]["passed"]
                concl += (not step["result"]["passed"]) and step["result"]["conclusive"]
                runs += len(s)
            print(
                f"    {name:36s} kept {pct(kept / trials)}  conclusive fall-back "
                f"{pct(concl / trials)}  mean runs per arm {runs / trials:4.2f}"
            )
    print()


def choose_k_table(trials: int, rng: random.Random) -> None:
    print("## (4) choose_k on seven identical k (normal, mean 10, sd 0.5), alpha 0.05")
    for runs in (3, 4, 5, 8):
        for with_base in (False, True):
            rec = Counter()
            for _ in range(trials):
                tpot = {k: [rng.gauss(10, 0.5) for _ in range(runs)] for k in range(1, 8)}
                base = [rng.gauss(10, 0.5) for _ in range(runs)] if with_base else None
                c = choose_k(tpot, baseline=base)
                rec["off" if c["recommended_k"] is None else c["recommended_k"]] += 1
            label = "with an identical baseline" if with_base else "no baseline arm"
            dist = ", ".join(
                f"{k}: {pct(v / trials).strip()}" for k, v in sorted(rec.items(), key=str)
            )
            wrong = 1 - rec[("off" if with_base else 1)] / trials
            print(f"    {runs} runs, {label:27s} {dist}  (not the designed answer: {pct(wrong)})")
    curve = {1: 0.62, 2: 0.52, 3: 0.48, 4: 0.50, 5: 0.54, 6: 0.58, 7: 0.63}
    print(
        "  choose_k on a real k curve (TPOT ratio to baseline by k: "
        + ", ".join(f"{k}: {r}" for k, r in curve.items())
        + "; CV 2 %), with the baseline arm:"
    )
    for runs in (3, 4, 5, 8):
        rec = Counter()
        for _ in range(trials):
            tpot = {k: [rng.gauss(10 * r, 0.2 * r) for _ in range(runs)] for k, r in curve.items()}
            c = choose_k(tpot, baseline=[rng.gauss(10, 0.2) for _ in range(runs)])
            rec["off" if c["recommended_k"] is None else c["recommended_k"]] += 1
        dist = ", ".join(f"{k}: {pct(v / trials).strip()}" for k, v in sorted(rec.items(), key=str))
        print(f"    {runs} runs per arm: {dist}")
    print()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trials", type=int, default=20000)
    ap.add_argument("--seed", type=int, default=22)
    ap.add_argument("--only", choices=["fixed", "sequential", "gate", "choose_k"])
    args = ap.parse_args()
    rng = random.Random(args.seed)
    err = math.sqrt(0.05 * 0.95 / args.trials)
    print(f"# decision rule calibration: {args.trials} trials per cell, seed {args.seed}")
    print(f"# simulation error of a 5 % rate: +/- {100 * err:.2f} % (one sd)\n")
    t0 = time.time()
    tables = {
        "fixed": fixed_table,
        "sequential": sequential_table,
        "gate": gate_table,
        "choose_k": choose_k_table,
    }
    for name, fn in tables.items():
        if args.only in (None, name):
            fn(args.trials, rng)
    print(f"# {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
