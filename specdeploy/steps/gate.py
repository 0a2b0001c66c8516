"""The speculation gate (opt-in host data `speculation_gate`): after the smoke benchmark,
deploys/serve.py measures baseline and speculative on fresh servers, alternating; when speculation
is not shown faster than the margin at decision_alpha (gate_rule.py) the host ends on the baseline
unit (or the deploy fails), and the deployment record says why, with the numbers. A fall-back is
kept on re-runs until the units, the workload or the gate's settings change (or it is
`recheck_days` old); then the gate measures again.

With `speculation_gate.across_load` and a num_speculative_tokens_per_batch_size schedule deployed,
the gate measures the schedule, the baseline and the fixed k at every load level (issue 39) and
keeps the schedule only where compare_across_load's own rule proves it (gate_rule.
across_load_decision); the record keeps the per-level evidence."""

from __future__ import annotations

import hashlib
import json
import os
import threading
from contextlib import nullcontext
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from pyinfra import host, logger

from specdeploy.config import datasets
from specdeploy.config.record import BenchResult, DeploymentRecord, GateDecision
from specdeploy.config.schema import LoadLevel, ServeConfig, SpeculationGate
from specdeploy.config.timestamps import utc_iso, utc_stamp
from specdeploy.decide.decisions import (
    RANDOM_REQUESTS_WARNING,
    acceptance_summary,
    run_order,
    run_values,
)
from specdeploy.decide.gate_rule import (
    across_load_decision,
    gate_decision,
    gate_fingerprint,
    gate_needs_recheck,
    power_runs,
    smoke_outside_band,
)
from specdeploy.decide.load_rule import (
    SCHEDULE_KEY,
    level_label,
    proof_runs,
    rotating_rounds,
    schedule_config,
    tpot_by_level,
)
from specdeploy.host.bench import bench_time_limit
from specdeploy.host.server import enable_only, remove_measure_unit, switch_enabled, wait_healthy
from specdeploy.render.argv import flag_value
from specdeploy.render.units import RenderedUnit, render_unit
from specdeploy.report.paths import host_reports_dir, reports_root
from specdeploy.steps import turn
from specdeploy.steps.sampling import Sampler


def fingerprint(cfg: ServeConfig, speculative: RenderedUnit, baseline: RenderedUnit) -> dict:
    """What the gate's decision on this host depends on (gate_rule.gate_fingerprint)."""
    w = cfg.workload
    gate_cfg = cfg.speculation_gate
    return gate_fingerprint(
        speculative_unit_sha256=speculative.sha256,
        baseline_unit_sha256=baseline.sha256,
        workload={
            **w.model_dump(),
            "request_set": datasets.describe(w.dataset_path, w.dataset),
            "gate_runs": gate_cfg.runs,
        },
        max_tpot_ratio=gate_cfg.max_tpot_ratio,
        on_fail=gate_cfg.on_fail,
        alpha=cfg.decision_alpha,
        across_load=across.fingerprint() if (across := across_load_input(cfg)) else None,
    )


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


def across_load_input(cfg: ServeConfig) -> AcrossLoad | None:
    """speculation_gate.across_load on a deployed schedule, else None (the gate measures at one
    load). The fixed k: compare_fixed_k (the best single k tune found), else
    num_speculative_tokens (the schedule's largest k)."""
    gate_cfg, spec = cfg.speculation_gate, cfg.speculative_config
    if gate_cfg is None or not gate_cfg.across_load or not spec.get(SCHEDULE_KEY):
        return None
    k = cfg.compare_fixed_k or spec["num_speculative_tokens"]
    fixed_cfg = cfg.model_copy(update={"speculative_config": schedule_config(spec, None, k)})
    return AcrossLoad(
        schedule=[list(e) for e in spec[SCHEDULE_KEY]],
        fixed_k=k,
        fixed=render_unit(fixed_cfg, "speculative", measurement_arm="fixed"),
        levels=tuple(cfg.workload.effective_load_levels),
    )


@dataclass(frozen=True)
class GateInput:
    """What the gate measures and what its decision depends on, fixed while planning (the units are
    rendered then): the two production units, the gate's settings and their fingerprint; across
    load, the fixed k's unit and the levels."""

    speculative: RenderedUnit
    baseline: RenderedUnit
    settings: SpeculationGate
    alpha: float
    fingerprint: dict
    across_load: AcrossLoad | None = None


def gate_input(cfg: ServeConfig, rendered: RenderedUnit) -> GateInput | None:
    """Planning time: the gate's input when it runs for this unit (a speculative unit with
    `speculation_gate` set), else None."""
    if rendered.role != "speculative" or cfg.speculation_gate is None:
        return None
    baseline = render_unit(cfg, "baseline")
    return GateInput(
        rendered,
        baseline,
        cfg.speculation_gate,
        cfg.decision_alpha,
        fingerprint(cfg, rendered, baseline),
        across_load_input(cfg),
    )


@dataclass
class BoxGate:
    """A whole box's gate within one rolling restart (rollback.roll_servers, one call per host): the
    first instance rolled measures on its own GPUs, drained meanwhile; the box's other instances
    take its decision (same config, workload and settings; only the port and devices differ), so
    a box is measured once, not once per instance."""

    decisions: dict[str, GateDecision] = field(default_factory=dict)  # shared fingerprint ->

    @staticmethod
    def key(units: GateInput) -> str:
        """The fingerprint without the units' hashes (they name the instance's port)."""
        shared = dict(units.fingerprint)
        shared.pop("speculative_unit_sha256"), shared.pop("baseline_unit_sha256")
        return json.dumps(shared, sort_keys=True)


def class_key(units: GateInput, hardware: dict) -> str:
    """The class of identical hosts this server's gate decides for: its fingerprint without the
    units' hashes, the units' argv without the address and port (the release is in the venv's
    path), and the hardware (checks/preflight.hardware); 16 hex digits of its sha256."""
    shared = json.loads(BoxGate.key(units))
    shared["argv"] = {u.role: _addressless(u.argv) for u in (units.speculative, units.baseline)}
    shared["hardware"] = hardware
    return hashlib.sha256(json.dumps(shared, sort_keys=True).encode()).hexdigest()[:16]


def _addressless(argv: list[str]) -> list[str]:
    out = list(argv)
    for flag in ("--host", "--port"):
        if flag_value(out, flag) is not None:
            i = len(out) - 1 - out[::-1].index(flag)
            out[i + 1] = "*"
    return out


class FleetClasses:
    """The class decisions this control node knows: made in this process, or by an earlier run
    (`specdeploy rollout` runs one pyinfra per batch), kept as JSON under reports/classes/. A
    decision stands for its class while it would stand on a host (gate_needs_recheck: a fall-back
    expires after recheck_days)."""

    def __init__(self):
        # by the file's path: another reports folder (SPECDEPLOY_REPORTS) is another fleet
        self.known: dict[str, dict] = {}
        self.turns: dict[str, threading.Lock] = {}

    def turn(self, key: str | None):
        """Held while a host of class `key` decides: the hosts of one pyinfra run go in parallel
        (gevent makes this lock cooperative), so the class's others wait for its canary's decision
        instead of each measuring; a canary that fails leaves the next host to measure."""
        if key is None:
            return nullcontext()
        return self.turns.setdefault(key, threading.Lock())

    @staticmethod
    def path(key: str) -> Path:
        return reports_root() / "classes" / f"{key}.json"

    def find(self, key: str, recheck_days: float | None) -> dict | None:
        path = self.path(key)
        entry = self.known.get(str(path))
        if entry is None and path.exists():
            entry = json.loads(path.read_text())
        if entry is None:
            return None
        decision = entry["decision"]
        if gate_needs_recheck(decision, decision["fingerprint"], now=datetime.now(UTC),
                              recheck_days=recheck_days)["recheck"]:  # fmt: skip
            return None
        self.known[str(path)] = entry
        return entry

    def keep(self, key: str, decision: GateDecision, where: str) -> None:
        entry = {"class_key": key, "measured_on": where, "decision": decision.as_json()}
        path = self.path(key)
        self.known[str(path)] = entry
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.{os.getpid()}")
        partial.write_text(json.dumps(entry, indent=1))
        os.replace(partial, path)  # a reader sees the old decision or the new one, whole


CLASSES = FleetClasses()


def smoke_figures(smoke: BenchResult | None) -> dict:
    """What a sharing host's smoke run is compared on (decide/gate_rule.smoke_outside_band)."""
    if smoke is None:
        return {}
    return {"median_tpot_ms": smoke.median_tpot_ms,
            "acceptance_rate": smoke.counters.acceptance_rate}  # fmt: skip


def unit_it_ends_on(
    cfg: ServeConfig,
    rendered: RenderedUnit,
    checked: dict,
    units: GateInput | None,
    tokenizer: str,
    box: BoxGate | None = None,
    *,
    smoke: BenchResult | None = None,
    hardware: dict | None = None,
) -> tuple[RenderedUnit, dict, dict | None]:
    """The verified server's last step before its record: without a gate (`units` None) it ends on
    `rendered`, with one on what `speculation_gate` decides. Only that unit stays enabled (an
    earlier decision may have left the other one enabled). Returns (the unit, its health check,
    the gate record or None)."""
    decision = None
    if units is not None:
        rendered, checked, decision = speculation_gate(
            cfg, units, tokenizer, box, smoke=smoke, hardware=hardware
        )
    enable_only(cfg, rendered.role)
    return rendered, checked, decision


def speculation_gate(
    cfg: ServeConfig,
    units: GateInput,
    tokenizer: str,
    box: BoxGate | None = None,
    *,
    smoke: BenchResult | None = None,
    hardware: dict | None = None,
) -> tuple[RenderedUnit, dict, dict]:
    """`speculation_gate.runs` fresh-server runs per arm on the production units, in alternating
    rounds (B S, S B, ...); each run's median TPOT is one value of the one-sided rank test
    (decide/gate_rule.gate_decision). Across load (`units.across_load`: a deployed schedule
    and speculation_gate.across_load), three arms at every load level instead
    (_measure_across_load, gate_rule.across_load_decision). `box`: a whole box's rolling
    restart, where the instance measured first decides for the others (they are not measured).

    Returns (the unit the server ends on, healthy; its health check; the gate record). With
    on_fail=baseline and a failed gate that is the baseline unit, enabled, with the speculative
    unit disabled.

    `speculation_gate.share`: the class of identical hosts (class_key, from the units and the
    host's `hardware`) decides once, one host of the class at a time (FleetClasses.turn). Its first
    host measures, with enough runs for the class (power_runs); a later host of the class takes
    that decision (shared_from) when its smoke run (`smoke`) is like the canary's, else it is
    measured itself and flagged (`outlier`)."""
    # the server's turn (steps/turn.py): production may stop for an arm from here on
    turn.enter(cfg, turn.Phase.MEASURING)
    fleet_key = class_key(units, hardware or {}) if units.settings.share else None
    with CLASSES.turn(fleet_key):
        return _gate(cfg, units, tokenizer, box, smoke=smoke, fleet_key=fleet_key)


def _gate(
    cfg: ServeConfig,
    units: GateInput,
    tokenizer: str,
    box: BoxGate | None,
    *,
    smoke: BenchResult | None,
    fleet_key: str | None,
) -> tuple[RenderedUnit, dict, dict]:
    """speculation_gate within its class's turn."""
    sampler = Sampler(cfg, tokenizer=tokenizer)  # every fresh server renews the deploy lock first
    key = BoxGate.key(units) if box is not None else None
    measured_here = key is None or key not in box.decisions
    known, outlier = None, None
    if measured_here and fleet_key is not None:
        known = CLASSES.find(fleet_key, units.settings.recheck_days)
        why = smoke_outside_band(smoke_figures(smoke), known["decision"]["band"]) if known else []
        if why:
            canary = known["measured_on"]
            logger.warning(f"{host.print_prefix}speculation gate: not like its class's canary "
                           f"{canary}: {'; '.join(why)}: measured here")  # fmt: skip
            outlier = {"class_key": fleet_key, "canary": canary, "why": why}
            known = None
    if known is not None:  # a host of this class measured it; this one serves speculative
        measured_here = False
        last, checked = "speculative", {}
        canary = GateDecision.model_validate({**known["decision"], "class_key": fleet_key})
        decision = _shared(canary, units, source=known["measured_on"])
    elif measured_here:
        power = None
        if fleet_key is not None:
            power = power_runs(units.settings.class_cv, alpha=units.alpha)
        runs = max(units.settings.runs, power["runs"]) if power else units.settings.runs
        if units.across_load is not None:  # enough for the proof's test at alpha / L to decide
            runs = max(runs, proof_runs(len(units.across_load.levels), units.alpha))
            last, checked, decision = _measure_across_load(cfg, units, sampler, runs=runs)
        else:
            last, checked, decision = _measure(cfg, units, sampler, runs=runs)
        if fleet_key is not None:
            own = smoke_figures(smoke) or {"median_tpot_ms": None, "acceptance_rate": None}
            decision = GateDecision.model_validate({
                **decision.as_json(), "class_key": fleet_key, "power": power,
                "band": {"smoke_tpot_ms": own["median_tpot_ms"],
                         "acceptance_rate": own["acceptance_rate"],
                         "tolerance": units.settings.band,
                         "acceptance_tolerance": units.settings.acceptance_band},
                **({"outlier": outlier} if outlier else {}),
            })  # fmt: skip
            if outlier is None:  # an outlier does not speak for its class
                where = f"{host.name}/{cfg.instance_name}" if cfg.instance_name else host.name
                CLASSES.keep(fleet_key, decision, where)
        if key is not None:
            box.decisions[key] = decision
    else:  # another instance of this box measured it; this one serves speculative (smoked)
        last, checked = "speculative", {}
        decision = _shared(
            box.decisions[key], units, source=box.decisions[key].measured["instance"]
        )
    keep = decision.passed or decision.on_fail != "baseline"
    rendered = units.speculative if keep else units.baseline
    speculative = rendered.role == "speculative"
    # A fall-back serves with the baseline unit from now on (also after a reboot), its staged copy
    # refreshed so a re-run sees it unchanged: switched before its start where the gate's runs
    # wrote it, after where this instance's start first writes it (a decision shared in a box).
    fall_back = {"disable": units.speculative.name, "enable": rendered.name}
    if not keep and measured_here:
        switch_enabled(cfg, **fall_back)
    if last != rendered.role:  # the last server was the other arm's: start this one
        checked = sampler.start(rendered, install=not measured_here)
    elif not measured_here:  # it serves already: no restart, checked again
        checked = wait_healthy(cfg, rendered.name, speculative=speculative)
    if not keep and not measured_here:
        switch_enabled(cfg, **fall_back)
    return rendered, checked, decision


def _measure(
    cfg: ServeConfig, units: GateInput, sampler: Sampler, *, runs: int
) -> tuple[str, dict, dict]:
    """The gate's `runs` per arm on this server and their decision. Returns (the arm that ran last,
    its health check, the gate record)."""
    gate_cfg = units.settings
    rendered, baseline = units.speculative, units.baseline
    arms = {"baseline": baseline, "speculative": rendered}
    # the order depends on the arms' names alone (baseline first), not on the host
    order = run_order(list(arms), runs, mode="alternate")
    if cfg.workload.dataset == "random":
        logger.warning(f"{host.print_prefix}speculation gate: {RANDOM_REQUESTS_WARNING}")
    out = host_reports_dir(host.name)
    stamp = utc_stamp()
    own = f"{cfg.instance_name}-" if cfg.instance_name else ""  # a whole box: each its own files
    results: dict[str, list[BenchResult]] = {"baseline": [], "speculative": []}
    files: dict[str, list[str]] = {"baseline": [], "speculative": []}
    checked: dict = {}
    visit_s = cfg.health_timeout_s + bench_time_limit(cfg)  # a run: its server's start, its bench
    for i, arm in enumerate(order["order"]):
        name = f"gate-{own}{stamp}-{i:02d}-{arm}"
        # the baseline unit is written for its runs; the speculative one is already installed
        install = arm == "baseline"
        with sampler.sample(
            arms[arm], name=name, workload=cfg.workload, renew_s=visit_s, install=install
        ) as run:
            checked = run.checked
            meta = {"arm": arm, "gate": True, "index": i}
            results[arm].append(run.bench.run(local=out / f"{name}.json", meta=meta))
        files[arm].append(str(out / f"{name}.json"))
    decision = gate_decision(
        run_values(results["speculative"], "tpot"),
        run_values(results["baseline"], "tpot"),
        max_tpot_ratio=gate_cfg.max_tpot_ratio,
        on_fail=gate_cfg.on_fail,
        alpha=units.alpha,
    )
    evidence = {
        "run_order": order,
        "files": files,
        "acceptance": acceptance_summary([r.counters for r in results["speculative"]]),
        "method": f"{runs} fresh-server runs per arm in alternating rounds, the median TPOT of "
        "each run as one value, production units (prefix caching as deployed)",
    }
    return order["order"][-1], checked, _recorded(cfg, units, decision | evidence)


def _recorded(cfg: ServeConfig, units: GateInput, decision: dict) -> GateDecision:
    """A measured decision as the record keeps it: what it depends on, when, which units, and on
    a whole box the instance that measured it."""
    decision |= {
        "fingerprint": units.fingerprint,
        "decided_at": utc_iso(),
        "speculative_unit_sha256": units.speculative.sha256,
        "baseline_unit_sha256": units.baseline.sha256,
    }
    if cfg.instance_name:  # a whole box: measured on this instance alone, drained meanwhile
        devices = cfg.vllm_env.get("CUDA_VISIBLE_DEVICES") or cfg.vllm_env.get(
            "VLLM_CPU_OMP_THREADS_BIND"
        )
        decision["measured"] = {"instance": cfg.instance_name, "devices": devices,
                                "port": cfg.vllm_port}  # fmt: skip
    logger.info(f"{host.print_prefix}speculation gate: {decision['reason']}")
    return GateDecision.model_validate(decision)


def _measure_across_load(
    cfg: ServeConfig, units: GateInput, sampler: Sampler, *, runs: int
) -> tuple[str, dict, GateDecision]:
    """The gate across load: `runs` visits per arm (the deployed schedule on the production unit,
    the baseline, the fixed k on the measurement instance) in rotating rounds; each visit one
    fresh server and one benchmark per load level on it, lowest first (compare_across_load's
    discipline, measure/load_flow.py), so each level's runs of an arm come from distinct starts.
    Returns (the role the last server had, its health check, the gate record)."""
    across, gate_cfg = units.across_load, units.settings
    arms = {"baseline": units.baseline, "schedule": units.speculative, "fixed": across.fixed}
    order = rotating_rounds(list(arms), runs)
    if cfg.workload.dataset == "random":
        logger.warning(f"{host.print_prefix}speculation gate: {RANDOM_REQUESTS_WARNING}")
    workloads = [cfg.workload.at_level(lv) for lv in across.levels]
    visit_s = cfg.health_timeout_s + sum(bench_time_limit(cfg, w) for w in workloads)
    out, stamp = host_reports_dir(host.name), utc_stamp()
    own = f"{cfg.instance_name}-" if cfg.instance_name else ""  # a whole box: each its own files
    results: list[BenchResult] = []
    files: dict[str, list[str]] = {arm: [] for arm in arms}
    checked: dict = {}
    for i, arm in enumerate(order):
        for j, (level, workload) in enumerate(zip(across.levels, workloads, strict=True)):
            label = level_label(arm, level.concurrency)
            name = f"gate-{own}{stamp}-{i:02d}-{label}"
            # the visit's fresh server, renewed for the whole visit; the higher levels run on it.
            # The schedule's unit is the production one, already installed.
            with sampler.sample(
                arms[arm],
                name=name,
                workload=workload,
                renew_s=None if j else visit_s,
                install=arm != "schedule",
                same_server=j > 0,
            ) as run:
                if j == 0:
                    checked = run.checked
                meta = {"arm": label, "gate": True, "index": i, "fresh_server": j == 0}
                results.append(run.bench.run(local=out / f"{name}.json", meta=meta))
            files[arm].append(str(out / f"{name}.json"))
    remove_measure_unit(cfg)  # the fixed k's instance never outlives the gate
    decision = across_load_decision(
        tpot_by_level(results),
        schedule=across.schedule,
        fixed_k=across.fixed_k,
        on_fail=gate_cfg.on_fail,
        alpha=units.alpha,
    )
    schedule_runs = [r for r in results if r.run.arm.startswith("schedule@")]
    evidence = {
        "run_order": {"order": order, "rounds": runs, "mode": "rotating"},
        "files": files,
        "acceptance": acceptance_summary([r.counters for r in schedule_runs]),
        "method": f"{runs} visits per arm in rotating rounds, each a fresh server and one run per "
        f"load level ({', '.join(str(lv.concurrency) for lv in across.levels)}), lowest first; "
        "the median TPOT of each run as one value; production units (prefix caching as "
        f"deployed), the fixed k = {across.fixed_k} on the measurement instance",
    }
    last = {"schedule": "speculative"}.get(order[-1], order[-1])  # "fixed": stopped, removed
    return last, checked, _recorded(cfg, units, decision | evidence)


def _shared(measured: GateDecision, units: GateInput, *, source: str) -> GateDecision:
    """The measuring host's or instance's decision as this server's record keeps it: its own
    fingerprint (so a re-run settles on it), the numbers and where they were measured."""
    logger.info(f"{host.print_prefix}speculation gate: {measured.reason} (measured on {source})")
    return GateDecision.model_validate({
        **measured.as_json(),
        "fingerprint": units.fingerprint,
        "speculative_unit_sha256": units.speculative.sha256,
        "baseline_unit_sha256": units.baseline.sha256,
        "shared_from": source,
    })  # fmt: skip


class GateFailed(RuntimeError):
    pass


def _recheck(cfg: ServeConfig, previous: DeploymentRecord | None) -> dict:
    """gate_rule.gate_needs_recheck for this host's units and settings against the record."""
    speculative = render_unit(cfg, "speculative")
    return gate_needs_recheck(
        previous.gate.as_json() if previous and previous.gate else None,
        fingerprint(cfg, speculative, render_unit(cfg, "baseline")),
        now=datetime.now(UTC),
        recheck_days=cfg.speculation_gate.recheck_days,
    )


def gate_settled_unit(
    cfg: ServeConfig, rendered: RenderedUnit, previous: DeploymentRecord | None
) -> RenderedUnit:
    """Planning time, deploys/serve.py: when the gate already switched this host to the baseline
    and nothing it depends on changed since (units, workload, gate settings, age), keep serving the
    baseline: no re-measurement and no flip-flop on a re-run."""
    gate = previous.gate if previous else None
    if (
        rendered.role == "speculative"
        and cfg.speculation_gate is not None
        and cfg.speculation_gate.on_fail == "baseline"
        and gate is not None
        and not gate.passed
        and previous.role == "baseline"
        and not _recheck(cfg, previous)["recheck"]
    ):
        return render_unit(cfg, "baseline")
    return rendered


def gate_pending(cfg: ServeConfig, previous: DeploymentRecord | None) -> bool:
    """deploys/serve.py must verify (and so gate) again although the unit is unchanged: the gate was
    switched on, what it depends on changed since its decision, or it failed with on_fail=fail."""
    if cfg.speculation_gate is None:
        return False
    gate = previous.gate if previous else None
    if gate is None or _recheck(cfg, previous)["recheck"]:
        return True
    return not gate.passed and gate.on_fail == "fail"
