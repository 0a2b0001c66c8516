"""Printed, not asserted: a rollout's wall time for 100, 200 and 1,000 hosts, from measured
per-host step times (issue 37). Arithmetic over `specdeploy rollout`'s own plan: no host is run;
the batches are the product's (`specdeploy.flows.rollout.plan_batches`), not modelled here.

    python -m tests.rollout_model [--runs-per-arm 6] [--classes 1] [--markdown]

The shape modelled is `specdeploy rollout`'s: a canary host first, then batches; within a batch,
hosts restart `max_unavailable` at a time (each restart: stop, start, health, smoke; the next
one waits for it). Two ramps:

* default: batch 1, max_unavailable 1 — every host restarts after the one before it;
* 10 % ramp (`--batches 10%`): batches of 10 % of the hosts after the canary (as the rollout
  sizes them: whole hosts, at least one), either restarted one at a time
  inside the batch (max_unavailable 1: the ramp only adds pauses to look at the batch) or all at
  once (max_unavailable = batch width: a batch costs one host's restart).

Gating:

* per host: every host runs the speculation gate itself (the gate's default `runs`, 3 per arm,
  README.md:138) inside its own restart;
* per class: one canary per hardware class runs the gate with `--runs-per-arm` runs per arm
  (default 6, standing for a 90 %-power computation of the class gate), the rest of the class
  restart ungated.

Every input figure names where it was measured (file:line). The H200 figures are a GPU server's;
the per-batch overhead is the control node's, measured on the sandbox.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

from specdeploy.flows.rollout import batch_size, plan_batches

# --- measured inputs, each with its source -------------------------------------------------
# vLLM server start to ready (its /health answers) on one H200, warm compile cache (a rolling
# restart of a host that already served): /work/shared/gpu/first-measurements.md:38, the
# speculative unit 68 s; :36, the baseline unit's second start 81 s. A cold compile cache:
# first-measurements.md:37, 139 s (the speculative unit), :36, 145 s (the baseline).
SPEC_START_WARM_S, BASE_START_WARM_S = 68.0, 81.0
SPEC_START_COLD_S, BASE_START_COLD_S = 139.0, 145.0
# One benchmark (the smoke, or one gate run) started ahead of its server, go -> result, on the
# H200: benchmarks/README.md:16 (bench_early/REPORT.md): 8.6 s.
BENCH_RUN_S = 8.6
# The control node's fixed cost per batch (one pyinfra run: connect, facts, plan, locks). NOT yet
# measured at fleet size: an assumption of 5 s, benchmarks/rollout_time.py's target for a no-op
# re-run of 4 hosts (its docstring); `rollout_time.py --noop-hosts 6` measures it, and
# plan_fleet.py the planning part per host. Change it with --batch-overhead-s.
BATCH_OVERHEAD_S = 5.0


@dataclass(frozen=True)
class Steps:
    start_s: float = SPEC_START_WARM_S  # the deployed (speculative) unit, to ready
    base_start_s: float = BASE_START_WARM_S  # the gate's baseline arm, to ready
    bench_s: float = BENCH_RUN_S
    batch_overhead_s: float = BATCH_OVERHEAD_S

    def restart(self) -> float:
        """One host: start to ready (health included), then the smoke benchmark."""
        return self.start_s + self.bench_s

    def gate(self, runs_per_arm: int) -> float:
        """The speculation gate on one host: the baseline arm's server start and its runs, then
        the speculative unit's start again and its runs (steps/gate.py measures both arms)."""
        return self.base_start_s + self.start_s + 2 * runs_per_arm * self.bench_s


@dataclass(frozen=True)
class Plan:
    hosts: int
    ramp: str  # `specdeploy rollout --batches` after the canary ("1": the default, "10%")
    max_unavailable: int  # hosts restarting at once inside a batch
    gating: str  # "none", "per host", "per class"
    runs_per_arm: int = 6
    host_runs_per_arm: int = 3
    classes: int = 1

    @property
    def canaries(self) -> int:
        """One canary per class when classes are gated, else one."""
        return self.classes if self.gating == "per class" else 1

    def batches(self) -> list[int]:
        """The widths of the batches after the canary, as `specdeploy rollout` plans them."""
        hosts = [(f"host-{i}", ["canary"] if i < self.canaries else []) for i in range(self.hosts)]
        return [len(batch) for batch in plan_batches(hosts, "canary", self.ramp)[1:]]


def wall_time_s(plan: Plan, steps: Steps = Steps()) -> float:
    per_host_gate = steps.gate(plan.host_runs_per_arm) if plan.gating == "per host" else 0.0
    one_host = steps.restart() + per_host_gate
    # The canaries: each waits for the one before.
    canary_each = one_host + (steps.gate(plan.runs_per_arm) if plan.gating == "per class" else 0)
    total = plan.canaries * (steps.batch_overhead_s + canary_each)
    for width in plan.batches():
        waves = math.ceil(width / plan.max_unavailable)  # restarts inside a batch, in turn
        total += steps.batch_overhead_s + waves * one_host
    return total


def ramp_plans(hosts: int, gating: str, runs_per_arm: int, classes: int) -> dict[str, Plan]:
    ten_percent = batch_size("10%", hosts)
    common = dict(hosts=hosts, gating=gating, runs_per_arm=runs_per_arm, classes=classes)
    return {
        "default (batch 1, max_unavailable 1)": Plan(ramp="1", max_unavailable=1, **common),
        "10 % ramp, max_unavailable 1": Plan(ramp="10%", max_unavailable=1, **common),
        "10 % ramp, max_unavailable = batch": Plan(
            ramp="10%", max_unavailable=ten_percent, **common
        ),
    }


def hours(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.0f} min"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs-per-arm", type=int, default=6, help="the class gate's runs per arm")
    parser.add_argument("--classes", type=int, default=1, help="hardware classes (one canary each)")
    parser.add_argument("--cold", action="store_true", help="cold compile cache on every start")
    parser.add_argument("--batch-overhead-s", type=float, default=BATCH_OVERHEAD_S)
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    steps = Steps(
        start_s=SPEC_START_COLD_S if args.cold else SPEC_START_WARM_S,
        base_start_s=BASE_START_COLD_S if args.cold else BASE_START_WARM_S,
        batch_overhead_s=args.batch_overhead_s,
    )
    print(
        f"per host: restart {steps.restart():.0f} s; gate {args.runs_per_arm}+{args.runs_per_arm}"
        f" {steps.gate(args.runs_per_arm):.0f} s, 3+3 {steps.gate(3):.0f} s;"
        f" per batch {steps.batch_overhead_s:.0f} s; classes {args.classes}"
    )
    sizes = (100, 200, 1000)
    header = ["ramp", "gating"] + [f"{n} hosts" for n in sizes]
    rows = []
    for gating in ("none", "per host", "per class"):
        for ramp in ramp_plans(100, gating, args.runs_per_arm, args.classes):
            cells = [
                hours(
                    wall_time_s(ramp_plans(n, gating, args.runs_per_arm, args.classes)[ramp], steps)
                )
                for n in sizes
            ]
            rows.append([ramp, gating, *cells])
    if args.markdown:
        print("| " + " | ".join(header) + " |")
        print("|" + "---|" * len(header))
        for row in rows:
            print("| " + " | ".join(row) + " |")
    else:
        widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
        for row in [header, *rows]:
            print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)))


if __name__ == "__main__":
    main()
