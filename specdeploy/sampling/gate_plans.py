"""The speculation gate's measurement: its two plans over runs.run_samples, on the production units
(steps/gate.py plans the units while planning and keeps the step; decide/gate_rule.py decides).

* at one load: `runs` fresh-server runs per arm in alternating rounds (B S, S B, ...); each run's
  median TPOT is one value of the one-sided rank test (gate_rule.gate_decision);
* across load (a deployed schedule and speculation_gate.across_load): the deployed schedule on the
  production unit, the baseline and the fixed k on the measurement instance, `runs` visits per arm
  in rotating rounds, each visit a fresh server and one run per load level on it, lowest first
  (runs.visits, as compare_across_load's), decided by gate_rule.across_load_decision."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from pyinfra import host, logger

from specdeploy.config.record import BenchResult
from specdeploy.config.schema import LoadLevel, SpeculationGate, Workload
from specdeploy.config.timestamps import utc_stamp
from specdeploy.decide.decisions import (
    RANDOM_REQUESTS_WARNING,
    acceptance_summary,
    run_order,
    run_values,
)
from specdeploy.decide.gate_rule import across_load_decision, gate_decision
from specdeploy.decide.load_rule import level_label, tpot_by_level
from specdeploy.render.units import RenderedUnit
from specdeploy.sampling.runs import run_samples, visits
from specdeploy.sampling.sampler import Sample, Sampler


@dataclass(frozen=True)
class AcrossLoad:
    """What the gate across load measures beside the two production units: the deployed schedule,
    the fixed k's unit (the measurement instance: the speculative config without the schedule,
    as compare_across_load's fixed arm) and the load levels."""

    schedule: list[list[int]]
    fixed_k: int
    fixed: RenderedUnit
    levels: tuple[LoadLevel, ...]

    def fingerprint(self) -> dict:
        """What the decision depends on beyond the production units (the fixed unit is theirs
        with another k, so its hash, which names a box instance's port, stays out)."""
        return {"schedule": self.schedule, "fixed_k": self.fixed_k,
                "levels": [lv.model_dump() for lv in self.levels]}  # fmt: skip


@dataclass(frozen=True)
class Instance:
    """A whole box's instance the gate measures on alone (drained meanwhile): its name, its devices
    (CUDA_VISIBLE_DEVICES, or the CPU threads it is bound to) and its port."""

    name: str
    devices: str | None
    port: int

    def measured(self) -> dict:
        """What the gate record says of where it was measured."""
        return {"instance": self.name, "devices": self.devices, "port": self.port}


@dataclass(frozen=True)
class GateInput:
    """What the gate measures and what its decision depends on, fixed while planning (the units are
    rendered then): the two production units, the gate's settings and their fingerprint, the
    workload it measures, on a whole box the instance; across load, the fixed k's unit and the
    levels."""

    speculative: RenderedUnit
    baseline: RenderedUnit
    settings: SpeculationGate
    alpha: float
    fingerprint: dict
    workload: Workload
    instance: Instance | None = None
    across_load: AcrossLoad | None = None
    env_file: dict = field(default_factory=dict)  # render/units.env_file_keys: no secret

    @property
    def own(self) -> str:
        """The prefix of this server's gate files: a box's instances each have their own."""
        return f"{self.instance.name}-" if self.instance else ""


class Measured(NamedTuple):
    """The gate's runs on this server: the role the last server had ("fixed": stopped, removed),
    its health check, and gate_rule's decision with its evidence (run order, files, acceptance,
    method)."""

    last: str
    checked: dict
    decision: dict


def measure_gate(sampler: Sampler, units: GateInput, *, runs: int, out_dir: Path) -> Measured:
    """The gate's plan for `units` (across load when units.across_load), `runs` per arm, its raw
    files `gate-<own><stamp>-NN-<arm>.json` in `out_dir` (GateInput.own: a whole box's instances
    each have their own)."""
    workload = units.workload
    if workload.dataset == "random":
        logger.warning(f"{host.print_prefix}speculation gate: {RANDOM_REQUESTS_WARNING}")
    prefix = f"gate-{units.own}{utc_stamp()}"
    if units.across_load is not None:
        return _across_load(sampler, units, runs=runs, workload=workload, prefix=prefix,
                            out_dir=out_dir)  # fmt: skip
    return _at_one_load(sampler, units, runs=runs, workload=workload, prefix=prefix,
                        out_dir=out_dir)  # fmt: skip


def _files(ran, out_dir: Path, arms) -> dict[str, list[str]]:
    files: dict[str, list[str]] = {arm: [] for arm in arms}
    for r in ran:
        files[r.sample.meta["arm"].split("@")[0]].append(str(out_dir / f"{r.sample.name}.json"))
    return files


def _at_one_load(
    sampler: Sampler, units: GateInput, *, runs: int, workload: Workload, prefix: str,
    out_dir: Path,
) -> Measured:  # fmt: skip
    arms = {"baseline": units.baseline, "speculative": units.speculative}
    # the order depends on the arms' names alone (baseline first), not on the host
    order = run_order(list(arms), runs, mode="alternate")
    visit_s = sampler.visit_seconds([workload])  # a run: its server's start, its bench
    plan = (
        Sample(
            arms[arm],
            f"{prefix}-{i:02d}-{arm}",
            workload,
            {"arm": arm, "gate": True, "index": i},
            renew_s=visit_s,
            install=arm == "baseline",  # the speculative unit is already installed
        )
        for i, arm in enumerate(order["order"])
    )
    ran = list(run_samples(sampler, plan, out_dir))
    results: dict[str, list[BenchResult]] = {arm: [] for arm in arms}
    for r in ran:
        results[r.sample.meta["arm"]].append(r.result)
    decision = gate_decision(
        run_values(results["speculative"], "tpot"),
        run_values(results["baseline"], "tpot"),
        max_tpot_ratio=units.settings.max_tpot_ratio,
        on_fail=units.settings.on_fail,
        alpha=units.alpha,
    )
    evidence = {
        "run_order": order,
        "files": _files(ran, out_dir, arms),
        "acceptance": acceptance_summary([r.counters for r in results["speculative"]]),
        "method": f"{runs} fresh-server runs per arm in alternating rounds, the median TPOT of "
        "each run as one value, production units (prefix caching as deployed)",
    }
    return Measured(order["order"][-1], ran[-1].checked, decision | evidence)


def _across_load(
    sampler: Sampler, units: GateInput, *, runs: int, workload: Workload, prefix: str,
    out_dir: Path,
) -> Measured:  # fmt: skip
    across = units.across_load
    arms = {"baseline": units.baseline, "schedule": units.speculative, "fixed": across.fixed}
    workloads = [workload.at_level(lv) for lv in across.levels]
    visit_s = sampler.visit_seconds(workloads)  # the visit's fresh server, renewed for the visit
    plan = (
        Sample(
            arms[v.arm],
            f"{prefix}-{v.index:02d}-{level_label(v.arm, v.level.concurrency)}",
            workloads[v.at],
            {
                "arm": level_label(v.arm, v.level.concurrency),
                "gate": True,
                "index": v.index,
                "fresh_server": v.at == 0,
            },  # fmt: skip
            renew_s=None if v.at else visit_s,
            install=v.arm != "schedule",  # the schedule's unit is the production one
            same_server=v.at > 0,
        )
        for v in visits(list(arms), across.levels, runs)
    )
    ran = list(run_samples(sampler, plan, out_dir))
    sampler.end_measure_unit()  # the fixed k's instance never outlives the gate
    results = [r.result for r in ran]
    decision = across_load_decision(
        tpot_by_level(results),
        schedule=across.schedule,
        fixed_k=across.fixed_k,
        on_fail=units.settings.on_fail,
        alpha=units.alpha,
    )
    order = [r.sample.meta["arm"].split("@")[0] for r in ran if r.sample.meta["fresh_server"]]
    schedule_runs = [r for r in results if r.run.arm.startswith("schedule@")]
    evidence = {
        "run_order": {"order": order, "rounds": runs, "mode": "rotating"},
        "files": _files(ran, out_dir, arms),
        "acceptance": acceptance_summary([r.counters for r in schedule_runs]),
        "method": f"{runs} visits per arm in rotating rounds, each a fresh server and one run per "
        f"load level ({', '.join(str(lv.concurrency) for lv in across.levels)}), lowest first; "
        "the median TPOT of each run as one value; production units (prefix caching as "
        f"deployed), the fixed k = {across.fixed_k} on the measurement instance",
    }
    checked = next(r.checked for r in reversed(ran) if not r.sample.same_server)
    last = {"schedule": "speculative"}.get(order[-1], order[-1])  # "fixed": stopped, removed
    return Measured(last, checked, decision | evidence)
