"""The main job: roll out the speculative server on one host, prove it healthy, benchmark, record.

config -> checks -> render -> install -> weights -> preflight -> unit -> health -> smoke -> record.
A re-run with nothing changed schedules no operation at all: every branch below is decided from facts.
"""

from __future__ import annotations

import time

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.operations import python

from . import compare
from .checks import check_config
from .config import DATA_DEFAULTS, ServeConfig
from .facts import AcceleratorMemory, JsonFile, MemoryBytes, ServiceActive, VllmVersion
from .preflight import evaluate
from .render import RenderedUnit, render_unit
from .rollout import show_unit_diff, verify_or_rollback
from .steps import dataset, health, install, lock, record, smoke, unit, weights


def host_config() -> ServeConfig:
    """The current host's validated config; raises ConfigError (listing every problem) before any
    operation is scheduled, so an invalid host is never touched."""
    return check_config(host.name, host.data.dict())


def run_preflight(cfg: ServeConfig):
    snaps = weights.snapshots(cfg)
    missing = [role for role, snap in snaps.items() if snap is None]
    if missing:
        raise RuntimeError(
            f"{host.name}: preflight: {', '.join(missing)} weights are not complete on the host"
        )
    result = evaluate(
        cfg,
        snaps["target"],
        snaps.get("draft"),
        host.get_fact(AcceleratorMemory),
        host.get_fact(MemoryBytes),
    )
    result.raise_if_failed(host.name)
    return snaps, result


def verify_and_record(
    cfg: ServeConfig, rendered: RenderedUnit, started: float, *, run_smoke: bool = True
) -> dict:
    """Health check, smoke benchmark and deployment record (runs at execution time)."""
    snaps, pre = run_preflight(cfg)
    verify_started = time.monotonic()
    checked = health.wait_healthy(cfg, rendered.name, speculative=rendered.role == "speculative")
    result = smoke.smoke(cfg, snaps["target"]["path"]) if run_smoke else None
    timings = {
        "server_start_seconds": checked["seconds_to_healthy"],
        "checks_and_smoke_seconds": round(
            time.monotonic() - verify_started - checked["seconds_to_healthy"], 1
        ),
    }
    if result is not None and rendered.role == "speculative":
        counters = result["specdeploy"]["server_counters"]
        if not counters["drafts"]:
            raise health.HealthError(
                f"{host.name}: spec-decode counters did not grow during the smoke benchmark"
            )
    gate = None  # opt-in (host data speculation_gate): smoke A/B; may leave the host on the baseline unit
    if result is not None and rendered.role == "speculative" and cfg.speculation_gate is not None:
        rendered, checked, gate = compare.speculation_gate(cfg, rendered, snaps["target"]["path"])
    compare.disable_other_role(cfg, rendered)
    entry = record.build_record(
        cfg,
        rendered,
        vllm_version=host.get_fact(VllmVersion, venv=cfg.venv, package=cfg.vllm_package),
        snapshots=snaps,
        preflight=pre,
        health=checked,
        smoke=result,
        started=started,
        role=rendered.role,
        gate=gate,
        timings=timings,
    )
    record.write_record(cfg, entry)
    if gate is not None and not gate["passed"] and gate["on_fail"] == "fail":
        raise compare.GateFailed(f"{host.name}: speculation gate failed: {gate['reason']}")
    return entry


@deploy("specdeploy: serve vLLM with speculative decoding", data_defaults=DATA_DEFAULTS)
def serve(role: str = "speculative"):
    started = time.time()
    cfg = host_config()
    rendered = render_unit(cfg, role)
    rendered = compare.gate_settled_unit(
        cfg, rendered, host.get_fact(JsonFile, path=record.record_path(cfg))
    )
    lock.acquire(name="Take the host's deploy lock", cfg=cfg)  # first operation; see steps/lock.py
    show_unit_diff(cfg, rendered)  # printed while planning, so `--dry` shows the argv diff

    install.prepare_host(cfg)
    install.install_vllm(cfg)
    dataset.ship_request_set(cfg)
    if weights.fetch_weights(cfg):
        python.call(name="Preflight (vocabulary, context, memory)", function=run_preflight, cfg=cfg)
    else:
        run_preflight(cfg)  # weights already there: refuse now, before any operation runs

    changed = unit.install_unit(cfg, rendered)
    previous = host.get_fact(JsonFile, path=record.record_path(cfg))
    active = host.get_fact(ServiceActive, unit=rendered.name)
    up_to_date = (
        previous is not None
        and previous.get("unit", {}).get("sha256") == rendered.sha256
        and not compare.gate_pending(cfg, previous)
    )

    # A failing health check on a changed host restores the previous unit + env file (rollout.py).
    python.call(
        name="Health check, smoke benchmark, deployment record",
        function=verify_or_rollback,
        verify=verify_and_record,
        changed=changed,
        cfg=cfg,
        rendered=rendered,
        started=started,
        _if=lambda: changed() or not up_to_date or active != "active",
    )
    lock.release(name="Release the host's deploy lock", cfg=cfg)  # last operation
