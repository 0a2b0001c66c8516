"""The speculation gate (opt-in host data `speculation_gate`): after the smoke benchmark,
deploys/serve.py measures baseline and speculative on fresh servers, alternating; when speculation
is not shown faster than the margin at decision_alpha (gate_rule.py) the host ends on the baseline
unit (or the deploy fails), and the deployment record says why, with the numbers. A fall-back is
kept on re-runs until the units, the workload or the gate's settings change (or it is
`recheck_days` old); then the gate measures again.

With `speculation_gate.across_load` and a num_speculative_tokens_per_batch_size schedule deployed,
the gate measures the schedule, the baseline and the fixed k at every load level (issue 39) and
keeps the schedule only where compare_across_load's own rule proves it (gate_rule.
across_load_decision); the record keeps the per-level evidence.

This module is the step: which decision stands for this server (measured here, taken from its box's
first instance or from its class's canary), the unit it ends on, and the record of the decision.
How the runs are measured is sampling/gate_plans.py's; what they decide, decide/gate_rule.py's."""

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
from specdeploy.config.schema import ServeConfig
from specdeploy.config.timestamps import utc_iso
from specdeploy.decide.gate_rule import (
    BEST_PROVEN,
    gate_fingerprint,
    gate_needs_recheck,
    power_runs,
    served_config,
    smoke_outside_band,
)
from specdeploy.decide.load_rule import SCHEDULE_KEY, proof_runs, schedule_config
from specdeploy.host.facts.cuda_boot import CudaBootInfo
from specdeploy.render.argv import flag_value
from specdeploy.render.units import RenderedUnit, env_file_keys, exec_start, render_unit
from specdeploy.report.paths import host_reports_dir, reports_root
from specdeploy.sampling.gate_plans import AcrossLoad, GateInput, Instance, measure_gate
from specdeploy.sampling.sampler import Sampler
from specdeploy.steps import turn


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


def across_load_input(cfg: ServeConfig, cuda_boot: CudaBootInfo | None = None) -> AcrossLoad | None:
    """speculation_gate.across_load on a deployed schedule, else None (the gate measures at one
    load). The fixed k: compare_fixed_k (the best single k tune found), else
    num_speculative_tokens (the schedule's largest k). `cuda_boot`: the production unit's."""
    gate_cfg, spec = cfg.speculation_gate, cfg.speculative_config
    if gate_cfg is None or not gate_cfg.across_load or not spec.get(SCHEDULE_KEY):
        return None
    k = cfg.compare_fixed_k or spec["num_speculative_tokens"]
    fixed_cfg = cfg.model_copy(update={"speculative_config": schedule_config(spec, None, k)})
    return AcrossLoad(
        schedule=[list(e) for e in spec[SCHEDULE_KEY]],
        fixed_k=k,
        fixed=render_unit(fixed_cfg, "speculative", measurement_arm="fixed", cuda_boot=cuda_boot),
        levels=tuple(cfg.workload.effective_load_levels),
    )


def gate_input(cfg: ServeConfig, rendered: RenderedUnit) -> GateInput | None:
    """Planning time: the gate's input when it runs for this unit (a speculative unit with
    `speculation_gate` set), else None."""
    if rendered.role != "speculative" or cfg.speculation_gate is None:
        return None
    baseline = render_unit(cfg, "baseline", cuda_boot=rendered.cuda_boot)
    instance = None
    if cfg.instance_name:  # a whole box: measured on this instance alone, drained meanwhile
        env = cfg.vllm_env
        devices = env.get("CUDA_VISIBLE_DEVICES") or env.get("VLLM_CPU_OMP_THREADS_BIND")
        instance = Instance(cfg.instance_name, devices, cfg.vllm_port)
    return GateInput(
        rendered,
        baseline,
        cfg.speculation_gate,
        cfg.decision_alpha,
        fingerprint(cfg, rendered, baseline),
        workload=cfg.workload,
        instance=instance,
        across_load=across_load_input(cfg, rendered.cuda_boot),
        env_file=env_file_keys(cfg),
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
    units' hashes; both units' whole text but their address (ExecStart without --host and --port:
    the release's venv, every flag, each Environment= line such as the attention backend,
    CPUAffinity); the env file's names and non-secret values; and the hardware
    (checks/preflight.hardware: GPUs, driver and CUDA, or the CPU's model, logical CPUs and memory).
    16 hex digits of its sha256."""
    shared = json.loads(BoxGate.key(units))
    shared["units"] = {u.role: _addressless_text(u) for u in (units.speculative, units.baseline)}
    shared["env_file"] = units.env_file
    shared["hardware"] = hardware
    return hashlib.sha256(json.dumps(shared, sort_keys=True).encode()).hexdigest()[:16]


def _addressless_text(unit: RenderedUnit) -> str:
    """The unit's text with its one address line, ExecStart=, rendered without the address."""
    lines = [
        f"ExecStart={exec_start(_addressless(unit.argv))}"
        if line.startswith("ExecStart=")
        else line
        for line in unit.text.splitlines()
    ]
    return "\n".join(lines)


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
    sampler: Sampler,
    rendered: RenderedUnit,
    checked: dict,
    units: GateInput | None,
    box: BoxGate | None = None,
    *,
    smoke: BenchResult | None = None,
    hardware: dict | None = None,
) -> tuple[RenderedUnit, dict, dict | None]:
    """The verified server's last step before its record: without a gate (`units` None) it ends on
    `rendered`, with one on what `speculation_gate` decides. Only that unit stays enabled (an
    earlier decision may have left the other one enabled). Returns (the unit, its health check,
    the gate record or None). `sampler`: the server's benchmarks and restarts, as the verify step
    built it (every fresh server renews the deploy lock first)."""
    decision = None
    if units is not None:
        rendered, checked, decision = speculation_gate(
            sampler, units, box, smoke=smoke, hardware=hardware
        )
    sampler.enable_only(rendered.role)
    return rendered, checked, decision


def speculation_gate(
    sampler: Sampler,
    units: GateInput,
    box: BoxGate | None = None,
    *,
    smoke: BenchResult | None = None,
    hardware: dict | None = None,
) -> tuple[RenderedUnit, dict, dict]:
    """`speculation_gate.runs` fresh-server runs per arm on the production units, in alternating
    rounds (B S, S B, ...); each run's median TPOT is one value of the one-sided rank test
    (decide/gate_rule.gate_decision). Across load (`units.across_load`: a deployed schedule
    and speculation_gate.across_load), three arms at every load level instead
    (sampling/gate_plans.py, gate_rule.across_load_decision). `box`: a whole box's rolling
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
    turn.enter(sampler.cfg, turn.Phase.MEASURING)
    fleet_key = class_key(units, hardware or {}) if units.settings.share else None
    with CLASSES.turn(fleet_key):
        return _gate(sampler, units, box, smoke=smoke, fleet_key=fleet_key)


def _gate(
    sampler: Sampler,
    units: GateInput,
    box: BoxGate | None,
    *,
    smoke: BenchResult | None,
    fleet_key: str | None,
) -> tuple[RenderedUnit, dict, dict]:
    """speculation_gate within its class's turn."""
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
        last, checked, measured = measure_gate(
            sampler, units, runs=runs, out_dir=host_reports_dir(host.name)
        )
        decision = _recorded(units, measured)
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
                where = f"{host.name}/{units.instance.name}" if units.instance else host.name
                CLASSES.keep(fleet_key, decision, where)
        if key is not None:
            box.decisions[key] = decision
    else:  # another instance of this box measured it; this one serves speculative (smoked)
        last, checked = "speculative", {}
        decision = _shared(
            box.decisions[key], units, source=box.decisions[key].measured["instance"]
        )
    keep = decision.passed or decision.on_fail == "fail"
    # on_fail = best_proven: the configuration the runs proved faster than the baseline, served
    # as the speculative unit (its own argv), and the baseline only when none was proven
    instead = None if keep else best_proven_unit(sampler.cfg, units.speculative, decision)
    rendered = units.speculative if keep else (instead or units.baseline)
    speculative = rendered.role == "speculative"
    to_baseline = rendered is units.baseline
    # A fall-back serves with the baseline unit from now on (also after a reboot), its staged copy
    # refreshed so a re-run sees it unchanged: switched before its start where the gate's runs
    # wrote it, after where this instance's start first writes it (a decision shared in a box).
    fall_back = {"disable": units.speculative.name, "enable": rendered.name}
    if to_baseline and measured_here:
        sampler.switch_enabled(**fall_back)
    if instead is not None:  # another argv under the speculative unit's name: written, started
        checked = sampler.start(rendered, install=True)
    elif last != rendered.role:  # the last server was the other arm's: start this one
        checked = sampler.start(rendered, install=not measured_here)
    elif not measured_here:  # it serves already: no restart, checked again
        checked = sampler.healthy(rendered.name, speculative=speculative)
    if to_baseline and not measured_here:
        sampler.switch_enabled(**fall_back)
    return rendered, checked, decision


def best_proven_unit(
    cfg: ServeConfig, speculative: RenderedUnit, decision: GateDecision
) -> RenderedUnit | None:
    """on_fail = best_proven: the speculative unit serving the configuration the gate proved
    faster than the baseline (decide/gate_rule.served_config), or None (the baseline)."""
    if decision.on_fail != BEST_PROVEN:
        return None
    served = served_config(cfg.speculative_config, decision.as_json())
    if served is None:
        return None
    logger.info(f"{host.print_prefix}speculation gate: serving {decision['served_instead']['what']}"
                " instead (proven faster than the baseline)")  # fmt: skip
    alternative = cfg.model_copy(update={"speculative_config": served})
    return render_unit(alternative, "speculative", cuda_boot=speculative.cuda_boot)


def _recorded(units: GateInput, decision: dict) -> GateDecision:
    """A measured decision as the record keeps it: what it depends on, when, which units, and on
    a whole box the instance that measured it."""
    decision |= {
        "fingerprint": units.fingerprint,
        "decided_at": utc_iso(),
        "speculative_unit_sha256": units.speculative.sha256,
        "baseline_unit_sha256": units.baseline.sha256,
    }
    if units.instance:  # a whole box: measured on this instance alone, drained meanwhile
        decision["measured"] = units.instance.measured()
    logger.info(f"{host.print_prefix}speculation gate: {decision['reason']}")
    return GateDecision.model_validate(decision)


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


def _recheck(
    cfg: ServeConfig, previous: DeploymentRecord | None, cuda_boot: CudaBootInfo | None
) -> dict:
    """gate_rule.gate_needs_recheck for this host's units and settings against the record."""
    speculative = render_unit(cfg, "speculative", cuda_boot=cuda_boot)
    return gate_needs_recheck(
        previous.gate.as_json() if previous and previous.gate else None,
        fingerprint(cfg, speculative, render_unit(cfg, "baseline", cuda_boot=cuda_boot)),
        now=datetime.now(UTC),
        recheck_days=cfg.speculation_gate.recheck_days,
    )


def gate_settled_unit(
    cfg: ServeConfig, rendered: RenderedUnit, previous: DeploymentRecord | None
) -> RenderedUnit:
    """Planning time, deploys/serve.py: when the gate already switched this host to the baseline
    and nothing it depends on changed since (units, workload, gate settings, age), keep serving the
    baseline (or, on_fail = best_proven, the configuration it proved instead): no re-measurement
    and no flip-flop on a re-run."""
    gate = previous.gate if previous else None
    if (
        rendered.role != "speculative"
        or cfg.speculation_gate is None
        or cfg.speculation_gate.on_fail not in ("baseline", BEST_PROVEN)
        or gate is None
        or gate.passed
    ):
        return rendered
    instead = best_proven_unit(cfg, rendered, gate) if previous.role == "speculative" else None
    if previous.role == "baseline" or instead is not None:
        if not _recheck(cfg, previous, rendered.cuda_boot)["recheck"]:
            return instead or render_unit(cfg, "baseline", cuda_boot=rendered.cuda_boot)
    return rendered


def gate_pending(
    cfg: ServeConfig, previous: DeploymentRecord | None, cuda_boot: CudaBootInfo | None = None
) -> bool:
    """deploys/serve.py must verify (and so gate) again although the unit is unchanged: the gate was
    switched on, what it depends on changed since its decision, or it failed with on_fail=fail.
    `cuda_boot`: the host's CudaBoot fact the units render from (steps/unit.cuda_boot)."""
    if cfg.speculation_gate is None:
        return False
    gate = previous.gate if previous else None
    if gate is None or _recheck(cfg, previous, cuda_boot)["recheck"]:
        return True
    return not gate.passed and gate.on_fail == "fail"
