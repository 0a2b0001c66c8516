"""Steps 6-8 of one server, at execution time inside the rolling restart (steps/rollback.py): its
health check and smoke benchmark, the speculation gate when host data asks for it, and the
deployment record — plus, while planning, whether that must run at all."""

from __future__ import annotations

from pyinfra import host, logger

from specdeploy.config.record import DeploymentRecord
from specdeploy.config.schema import ServeConfig
from specdeploy.host.facts.systemd import ServiceActive
from specdeploy.host.facts.vllm import VllmVersion
from specdeploy.releases.capabilities import Release
from specdeploy.render.units import RenderedUnit
from specdeploy.sampling.sampler import Sampler
from specdeploy.steps import dataset, gate, install, lock, record, smoke, turn
from specdeploy.steps.preflight import ServerPreflight
from specdeploy.steps.proof import ArgvProof, validated_by


def verify_and_record(
    cfg: ServeConfig,
    rendered: RenderedUnit,
    started: float,
    *,
    preflight: ServerPreflight,
    pins: dict | None = None,
    gate_input: gate.GateInput | None = None,
    box_gate: gate.BoxGate | None = None,
    proof: ArgvProof | None = None,
    previous: DeploymentRecord | None = None,
    schedule_proof: dict | None = None,
    draft_choice: dict | None = None,
    pinned_release: Release | None,
    live_fallback: dict | None = None,
) -> DeploymentRecord:
    """Health check, smoke benchmark, gate and deployment record of the server `rendered` names.
    `preflight`: its weights and preflight, from planning or right after the download.
    `gate_input`: the speculation gate's units and fingerprint, fixed while planning (None: no gate
    for this unit). `box_gate`: a whole box's rolling restart, which gates the box once. `proof`:
    the host's vLLM's proof of this run's unit (steps/proof.py; None: its unit did not change),
    `previous`: the record as the run found it; the record says what validated the unit.
    `schedule_proof`: what planning found for a deployed schedule (steps/schedule_proof.py).
    `draft_choice`: the kept draft choice for this server's fingerprint (steps/draft_choice.py).
    `pinned_release`: the pin's Release, looked up at the deploy's start (the record names its
    table). `live_fallback`: the live autopilot's evidence when this run is its fall-back."""
    # the server's benchmarks and restarts, resolved here once and handed down: the smoke run and
    # the gate receive it, not the host data; every fresh server renews the deploy lock first
    sampler = Sampler(cfg, preflight.tokenizer, lock.renewal(cfg))
    checked, result, timings = smoke.health_and_smoke(sampler, rendered)
    # opt-in (speculation_gate): smoke A/B; may leave the host on the baseline
    rendered, checked, decision = gate.unit_it_ends_on(
        sampler, rendered, checked, gate_input, box_gate,
        smoke=result, hardware=preflight.result.hardware,
    )  # fmt: skip
    if decision is not None and not decision.passed and decision.on_fail == "fail":
        # before the record: the rollback puts the old unit back, and the record must keep
        # describing what the host runs (status, compare and tune read its pins)
        raise gate.GateFailed(f"{host.name}: speculation gate failed: {decision.reason}")
    removed = install.prune_venvs(cfg)  # verified: older releases can go
    turn.enter(cfg, turn.Phase.RECORDING)
    entry = record.write_record(
        cfg,
        rendered,
        vllm_version=host.get_fact(VllmVersion, venv=cfg.venv, package=cfg.vllm_package),
        pruned_venvs=removed,
        snapshots=preflight.snapshots,
        preflight=preflight.result,
        health=checked,
        smoke=result,
        started=started,
        gate=decision,
        validated_by=validated_by(pinned_release, rendered, proof, previous),
        schedule_proof=schedule_proof,
        draft_choice=draft_choice,
        live_fallback=live_fallback,
        timings=timings,
        revisions=pins or {},
    )
    turn.enter(cfg, turn.Phase.SERVING_VERIFIED)  # what runs is what the record says
    return entry


def verify_needed(cfg: ServeConfig, rendered, previous, *, change, pins: dict, shipped):
    """Planning time: whether a server's restart-health-smoke-record call must run (read when
    pyinfra runs it): its unit or env file is changing, the record's unit, gate, workload or pins
    differ from this run's, or it is not active."""
    active = host.get_fact(ServiceActive, unit=rendered.name)
    up_to_date = (
        previous is not None
        and previous.unit.sha256 == rendered.sha256
        and not gate.gate_pending(cfg, previous, rendered.cuda_boot)
    )
    stale_workload = dataset.workload_changes(previous, cfg)
    if stale_workload:
        logger.warning(
            f"{host.print_prefix}{cfg.service_name}: the record's workload differs from the "
            f"host data ({', '.join(stale_workload)}): health, smoke and record run again, "
            "no restart"
        )
    # the record names the refs this run pinned (status, compare and tune read them back): a ref
    # asked for differently but resolving to the same commit rewrites the record, no restart
    stale_pins = previous is not None and previous.revisions != pins
    settled = up_to_date and active == "active" and not stale_workload and not stale_pins
    if settled and not change.will_change() and not (shipped and shipped.will_change):
        host.noop(f"{rendered.name} is active and its record is this run's")
    return lambda: change.pending() or not settled or bool(shipped and shipped.did_change())
