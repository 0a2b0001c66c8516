"""The speculation gate (opt-in host data `speculation_gate`): after the smoke benchmark,
deploys/serve.py measures baseline and speculative on fresh servers; when speculation does not beat
the baseline by the margin the host ends on the baseline unit (or the deploy fails), and the
deployment record says why, with the numbers."""

from __future__ import annotations

from pyinfra import host, logger

from ..bench import run_bench
from ..config import ServeConfig
from ..record import DeploymentRecord
from ..render import RenderedUnit, render_unit
from ..reports import host_reports_dir
from ..server import start_fresh, switch_enabled, warm_up
from ..timestamps import utc_stamp
from .decisions import gate_decision, per_request_tpot_ms


def speculation_gate(
    cfg: ServeConfig, rendered: RenderedUnit, tokenizer: str
) -> tuple[RenderedUnit, dict | None, dict]:
    """Smoke A/B on the production units: baseline, then speculative, one fresh server and one
    `--save-detailed` benchmark each; per-request TPOT decides (decisions.gate_decision).

    Returns (the unit the host ends on, its health check, the gate record). With on_fail=baseline
    and a failed gate the host ends on the baseline unit, enabled, with the speculative unit
    disabled."""
    gate_cfg = cfg.speculation_gate
    baseline = render_unit(cfg, "baseline")
    out = host_reports_dir(host.name)
    stamp = utc_stamp()
    results, checked = {}, {}
    # the baseline unit is written for its run; the speculative one is already installed
    for arm, unit in (("baseline", baseline), ("speculative", rendered)):
        speculative = arm == "speculative"
        checked = start_fresh(cfg, unit, speculative=speculative, install=not speculative)
        warm_up(cfg, cfg.workload)
        name = f"gate-{stamp}-{arm}"
        results[arm] = run_bench(
            cfg,
            tokenizer=tokenizer,
            name=name,
            local=out / f"{name}.json",
            extra=["--save-detailed"],
            meta={"arm": arm, "gate": True},
        )
    decision = gate_decision(
        per_request_tpot_ms(results["speculative"]),
        per_request_tpot_ms(results["baseline"]),
        max_tpot_ratio=gate_cfg.max_tpot_ratio,
        on_fail=gate_cfg.on_fail,
    )
    decision.update(
        {
            "speculative_unit_sha256": rendered.sha256,
            "baseline_unit_sha256": baseline.sha256,
            "files": {arm: str(out / f"gate-{stamp}-{arm}.json") for arm in results},
            "median_tpot_ms_from_bench": {
                arm: r.get("median_tpot_ms") for arm, r in results.items()
            },
            "acceptance": results["speculative"]["specdeploy"]["server_counters"],
            "method": "one fresh server and one benchmark per arm (baseline first), "
            "per-request TPOT, "
            "production units (prefix caching as deployed)",
        }
    )
    logger.info(f"{host.print_prefix}speculation gate: {decision['reason']}")
    if decision["passed"] or gate_cfg.on_fail != "baseline":
        return rendered, checked, decision
    # refreshes the staged copy deploys/serve.py compares against: a re-run sees the baseline
    # unit unchanged
    switch_enabled(cfg, disable=rendered.name, enable=baseline.name)
    checked = start_fresh(cfg, baseline, speculative=False, install=False)
    return baseline, checked, decision


class GateFailed(RuntimeError):
    pass


def gate_settled_unit(
    cfg: ServeConfig, rendered: RenderedUnit, previous: DeploymentRecord | None
) -> RenderedUnit:
    """Planning time, deploys/serve.py: when the gate already switched this host to the baseline for
    exactly this speculative unit and gate setting, keep serving the baseline (no re-measurement and
    no flip-flop on a re-run). Change the config (or the gate) to measure again."""
    gate = (previous.gate if previous else None) or {}
    if (
        rendered.role == "speculative"
        and cfg.speculation_gate is not None
        and gate
        and not gate.get("passed")
        and gate.get("on_fail") == "baseline"
        and previous.role == "baseline"
        and gate.get("speculative_unit_sha256") == rendered.sha256
        and gate.get("max_tpot_ratio") == cfg.speculation_gate.max_tpot_ratio
        and cfg.speculation_gate.on_fail == "baseline"
    ):
        return render_unit(cfg, "baseline")
    return rendered


def gate_pending(cfg: ServeConfig, previous: DeploymentRecord | None) -> bool:
    """deploys/serve.py must verify (and so gate) again although the unit is unchanged: the gate was
    switched on or its setting changed since the record, or it failed with on_fail=fail."""
    if cfg.speculation_gate is None:
        return False
    gate = (previous.gate if previous else None) or {}
    if (
        not gate
        or gate.get("max_tpot_ratio") != cfg.speculation_gate.max_tpot_ratio
        or gate.get("on_fail") != cfg.speculation_gate.on_fail
    ):
        return True
    return not gate.get("passed") and gate.get("on_fail") == "fail"
