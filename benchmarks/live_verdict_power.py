"""The live verdict's false-verdict rate and power per hour of traffic, and the control arm's cost,
by simulation (decide/live_rule.py: simulated_windows, live_power).

    python benchmarks/live_verdict_power.py [--trials 400]

Prints figures for docs/guides/live-verdict.md; it is not a timed test
(tests/unit/decide/test_live_verdict.py is the fast check). Model: requests routed at random to the
control arm with probability control/instances, per-request TPOT with CV 0.3, the load moving
both arms together by a lognormal factor of spread 0.2 from window to window; 5-minute windows,
decisions over 12 usable windows, alpha 0.05, at least 20 requests per arm and window. "power"
is the chance that the hours given hold at least one decision with the right verdict (pays for a
ratio below 1, loses above); at ratio 1 it is the false-verdict rate.
"""

from __future__ import annotations

import argparse
import time

from specdeploy.decide.live_rule import control_arm_cost, live_power

RATES = (0.02, 0.05, 0.1, 0.2, 0.5, 2.0)  # requests per second on the whole box
RATIOS = (0.8, 0.9, 0.95, 1.0, 1.05, 1.1, 1.2)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=400)
    parser.add_argument("--instances", type=int, default=2)
    parser.add_argument("--control", type=int, default=1)
    args = parser.parse_args()
    started = time.time()
    print(f"box of {args.instances}, {args.control} on the baseline; {args.trials} trials each")
    for hours in (1.0, 2.0):
        print(f"\nchance of a right verdict within {hours:g} h (ratio 1.00: a false verdict)")
        print("req/s  usable " + " ".join(f"{r:>6.2f}" for r in RATIOS))
        for rate in RATES:
            row = [
                live_power(
                    r,
                    requests_per_s=rate,
                    instances=args.instances,
                    control=args.control,
                    hours=hours,
                    trials=args.trials,
                )
                for r in RATIOS
            ]
            print(
                f"{rate:>5g}  {row[0]['usable_windows']:>6.0%} "
                + " ".join(f"{p['power']:>6.0%}" for p in row)
            )
    print("\ncontrol arm's cost, share of the box's speculative gain given up")
    for instances, control in ((2, 1), (4, 1), (8, 1), (8, 2)):
        cost = control_arm_cost(instances, control, 1.0)
        print(
            f"  {control} of {instances} on the baseline: {cost:.1%} of the gain "
            f"(a 25 % gain: {control_arm_cost(instances, control, 0.25):.2%} of throughput)"
        )
    print(f"\n{time.time() - started:.0f} s")


if __name__ == "__main__":
    main()
