"""The main job: roll out the speculative server on one host, prove it healthy, benchmark, record.
One flow for a plain host and a whole box (host data `instances`: N servers behind a local
HAProxy on vllm_port): a plain host is a layout of one server without a balancer
(steps/servers.py).

check -> GPU checks -> render -> install -> weights -> preflight -> unit -> argv proof (the host's
vLLM, steps/proof.py) -> health -> smoke -> (gate) -> record. A re-run with nothing changed
schedules no operation at all: every branch below is decided from facts.

The plain `pyinfra INVENTORY deploys/serve.py` is a rolling update: everything that can take a
server down (swap in the unit and env file, restart, health, smoke, gate, record, rollback) is ONE
`python.call` per host (steps/rollback.roll_servers) that pyinfra runs host by host (`_serial`),
or `max_unavailable` hosts at a time (`_parallel`); the first host that fails stops the hosts after
it. Within a whole box, `max_unavailable_instances` instances at a time are drained on the
balancer, restarted and verified on their own port, and put back. Everything before that call
(packages, venv, weights, preflight, staging) runs on all hosts at once and stops nothing.
pyinfra's `--no-wait` runs each host's operations on its own and would ignore that: the deploy
refuses it while planning (rollback.refuse_no_wait).
"""

from __future__ import annotations

import os
import time

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.operations import python

from specdeploy.checks import live
from specdeploy.checks.host_data import HostInputs, host_inputs
from specdeploy.config.problems import HostRefused
from specdeploy.config.schema import DATA_DEFAULTS
from specdeploy.host import pyinfra_speed
from specdeploy.render import control
from specdeploy.report import notes
from specdeploy.steps import balancer, dataset, install, lock, proof, unit, weights
from specdeploy.steps.preflight import preflight_every_server
from specdeploy.steps.rollback import fail_alone, host_turn, refuse_no_wait, roll_servers
from specdeploy.steps.servers import host_servers, instance_dirs, plan_server
from specdeploy.steps.verify import verify_needed


@deploy("specdeploy: serve vLLM with speculative decoding", data_defaults=DATA_DEFAULTS)
def serve(role: str = "speculative"):
    started = time.time()
    pyinfra_speed.compute_global_arguments_once()  # the deploy's entry, not an import, patches
    refuse_no_wait()  # before anything else: --no-wait would ignore the rolling restart
    # invalid host data stops the run before any host; the config, its Release and engine flags
    # are read here once and handed down to every step
    inputs = host_inputs()
    notes.serve_planned(host.name)  # what a failure before its turn leaves it serving: unchanged
    try:
        _serve(inputs, role, started)
    except HostRefused as refused:  # this host's own state: it fails alone, the others go on
        fail_alone(refused)


def _serve(inputs: HostInputs, role: str, started: float) -> None:
    cfg, pins = inputs.cfg, inputs.pins
    # a plain host's control class (speculation_control across the inventory's plain hosts serving
    # the same target and draft), refused as host data is if it cannot hold both arms; [] outside
    # (read only where this host asks for one: the inventory's data is parsed once for it)
    peers = (live.class_hosts(host.name, host.state.inventory)
             if cfg.speculation_control is not None and cfg.instances is None else [])  # fmt: skip
    # the driver, compute capability, dtype, GPU count and a whole box's split: before any download
    servers = host_servers(cfg, inputs.release, inputs.flags)
    names = [member.name for member in servers.members]
    # a control arm (speculation_control): a box's control instances, or a control host of a
    # class, are planned on the baseline unit; the live autopilot's fall-back
    # (observe/live_verdict.py) keeps only the first speculative
    fallen_back = os.environ.get(control.FALLBACK_ENV) == "1"
    plans = [plan_server(member, control.arm_of(cfg, peers or names,
                                                host.name if peers else member.name, role,
                                                fallen_back=fallen_back), servers)
             for member in servers.members]  # fmt: skip
    with lock.held(cfg):  # see steps/lock.py
        install.prepare_host(cfg)
        if servers.balanced:
            instance_dirs(servers)
        install.install_vllm(cfg, inputs.release)
        weights.download_token(cfg)
        weights.weights_are_roots(cfg)  # before root writes into the cache again
        shipped = dataset.ship_request_set(cfg)  # its upload op (None: a generated request set)
        if weights.fetch_weights(cfg):
            every = " of every instance" if servers.balanced else ""
            python.call(name=f"Preflight{every} (vocabulary, context, memory)",
                        function=preflight_every_server, plans=plans,
                        also_own=servers.also_own)  # fmt: skip
        else:  # the weights are there: refuse now, before any operation runs
            preflight_every_server(plans, servers.also_own)

        staged = balancer.stage(cfg, servers.members) if servers.balanced else None
        for plan in plans:
            plan.change = unit.install_unit(
                plan.member.cfg, plan.rendered, verified=plan.previous and plan.previous.unit
            )
            plan.needed = verify_needed(plan.member.cfg, plan.rendered, plan.previous,
                                        change=plan.change, pins=pins, shipped=shipped)  # fmt: skip
        # the host's own vLLM proves each changed argv before anything is swapped in
        proof.prove_changed(cfg, plans)
        what = (
            f"Rolling restart of {len(plans)} instances ({cfg.max_unavailable_instances} at a "
            "time), health, smoke, records; the balancer"
            if servers.balanced
            else "Restart, health check, smoke benchmark, deployment record"
        )
        # The rolling restart: this host's swap + restart + health + smoke + record, or its
        # rollback; an earlier failed host of this run holds it back untouched (steps/rollback.py).
        host_turn(
            cfg,
            what,
            roll_servers,
            servers=servers,
            plans=plans,
            balancer=staged,
            started=started,
            pins=pins,
            live_fallback=control.fallback_evidence(os.environ),
            _if=lambda: (
                bool(servers.single or servers.surplus or servers.resplit or servers.drained)
                or bool(staged and staged.pending())
                or any(plan.needed() for plan in plans)
            ),
        )
