"""deploys/compare.py and deploys/tune.py: measure every host under its deploy lock, then write the
fleet report.

A whole box (host data `instances`) is measured on ONE instance, the last: it is drained on the
balancer (no new requests, those in flight answered, then maintenance), measured on its own GPUs
(or cores) and port with its own measurement unit, brought back on its deployed unit healthy
(measure_plan's finally) and put back in the balancer, while the other instances keep serving on
vllm_port. Its conditions (so summary.json and summary.md) name the instance and its devices."""

from __future__ import annotations

from pyinfra import host, logger
from pyinfra.api import deploy
from pyinfra.operations import python

from specdeploy.checks.host_data import host_inputs_as_deployed
from specdeploy.config.problems import ConfigError, Problem
from specdeploy.config.schema import DATA_DEFAULTS, ServeConfig
from specdeploy.host import pyinfra_speed, server
from specdeploy.measure.arms import Arm
from specdeploy.measure.draft_flow import DraftPlan
from specdeploy.measure.harness import measure_plan
from specdeploy.measure.load_flow import LoadProof
from specdeploy.measure.plans import compare_measurement, draft_measurement, tune_measurement
from specdeploy.render import instances
from specdeploy.render.argv import EngineFlags
from specdeploy.report import summary as report
from specdeploy.report.draft_summary import APPLY, choice_fingerprint, keep_choices
from specdeploy.report.load_summary import keep_proofs
from specdeploy.report.paths import raw_dir, run_dir
from specdeploy.steps import dataset, lock, schedule_proof
from specdeploy.steps.rollback import host_turn, refuse_no_wait
from specdeploy.steps.servers import available_devices

_REPORTED_HOSTS: dict[str, int] = {}  # report dir -> hosts finished when the report was written


def measured_instance(
    cfg: ServeConfig, flags: EngineFlags | None = None
) -> instances.Instance | None:
    """Planning time: the instance of a whole box that compare/tune measure (the last one, split
    from the facts as the deploy split it); None for a host with one server. `flags`: the engine
    flags the measurement's start parsed."""
    if cfg.instances is None:
        return None
    layout = instances.expand(cfg, available_devices(cfg, host.get_fact), flags=flags)
    if layout.problems:
        todo = "fix instances (deploys/serve.py refuses this split too)"
        raise ConfigError([Problem(host.name, "instances", p, todo) for p in layout.problems])
    return layout.instances[-1]


def box_conditions(cfg: ServeConfig, member: instances.Instance) -> dict:
    return {
        "instance": member.name,
        "instance_port": member.port,
        "devices": member.devices_text,
        "instances": len(cfg.instances) if isinstance(cfg.instances, list) else cfg.instances,
        "balancer": {"drained": True, "vllm_port": cfg.vllm_port},
    }


def _measure(
    cfg: ServeConfig,
    *,
    kind: str,
    plan: list[tuple[Arm, bool]],
    cond: dict,
    box: ServeConfig | None = None,
) -> None:
    """`cfg`: the host's, or the measured instance's config when `box` (the host's) is given."""
    out = raw_dir(kind, host.name)
    name = cfg.service_name
    lock.renew_held(lock.lease_seconds(box or cfg))  # this host's turn: LockLost before any change
    try:
        if box is not None:  # the balancer stops sending it requests; the others serve
            server.drain(box, name, timeout_s=server.drain_timeout_s(box))
        readmit = (box.balancer_socket, name) if box is not None else None
        measure_plan(cfg, plan, out_dir=out, conditions={"kind": kind, **cond}, readmit=readmit)
    except Exception:
        lock.release_now(box or cfg)  # back on its deployed unit (measure_plan's finally)
        if box is not None and server.is_healthy(cfg):
            server.undrain(box, name)  # healthy again: serving beats a half-measured host
        raise
    if box is not None:
        server.undrain(box, name)  # measure_plan's finally health-checked its deployed unit


def _write_report(kind: str) -> None:
    """Runs on every host after all hosts measured; the first one writes the fleet report."""
    directory = run_dir(kind)
    finished = len(list((directory / "raw").glob("*/conditions.json")))
    if _REPORTED_HOSTS.get(str(directory)) == finished:
        return
    _REPORTED_HOSTS[str(directory)] = finished
    summary = report.write(directory, kind)
    keep_proofs(directory, summary)  # each schedule's proof, by its fingerprint, for the deploys
    if kind == "choose_draft":  # each host's choice, by its fingerprint, for the deploy's record
        keep_choices(directory, summary)
    logger.info(
        f"{host.print_prefix}report: {directory}/summary.md ({', '.join(summary['charts'])})"
    )
    for name, h in summary["hosts"].items():  # across load levels (report/load_summary.py)
        verdict = (h.get("recommendation") or {}).get("verdict") or (h.get("proof") or {}).get(
            "verdict"
        )
        if verdict:
            print(f"{name}: {verdict}")
            if h.get("host_data_change"):
                print(f"  {h['host_data_change']}")
    if kind == "choose_draft":
        for name, h in summary["hosts"].items():
            print(f"{name}: {h['decision']['verdict']}")
            print(f"  {h['host_data_change']}")
            if h["decision"]["recommended"] is not None:
                print(f"  {APPLY}")
    if kind == "tune":
        for name, h in summary["hosts"].items():
            if "choice" not in h:
                continue
            c = h["choice"]
            if c["recommended_k"] is None:
                print(f"{name}: {c['verdict']} (currently k = {h['current_k']})")
            else:
                print(
                    f"{name}: recommended num_speculative_tokens = {c['recommended_k']} (best "
                    f"{c['best_k']}, currently {h['current_k']})"
                )
            print(f"  {h['host_data_change'] or 'no change needed'}")


MEASUREMENTS = {
    "compare": ("specdeploy: baseline vs speculative A/B", compare_measurement),
    "tune": ("specdeploy: num_speculative_tokens sweep", tune_measurement),
    "choose_draft": ("specdeploy: which draft, at which k", draft_measurement),
}


def measurement_deploy(kind: str):
    """deploys/compare.py and deploys/tune.py: measure every host under the deploy lock, then the
    fleet report."""
    title, make_plan = MEASUREMENTS[kind]

    @deploy(title, data_defaults=DATA_DEFAULTS)
    def _measure_fleet():
        pyinfra_speed.compute_global_arguments_once()  # the deploy's entry, not an import, patches
        refuse_no_wait()  # --no-wait would take every host off its unit at once
        # the record's pins: what the host really serves; its Release and engine flags, read once
        cfg, release, flags, _ = host_inputs_as_deployed()
        member = measured_instance(cfg, flags)  # a whole box: one instance, drained; None: the host
        measured = member.cfg if member else cfg
        plan, cond, what = make_plan(measured, release=release, flags=flags)
        if isinstance(plan, DraftPlan):  # the choice's, which the deploy that applies it matches
            cond = {**cond, "choice_fingerprint": choice_fingerprint(
                measured, schedule_proof.host_hardware(measured))}  # fmt: skip
        if isinstance(plan, LoadProof):  # the proof's fingerprint, which a deploy must match
            fingerprint = schedule_proof.measured_fingerprint(
                measured, plan.measured_schedule(), candidate=plan.schedule is not None
            )
            cond = {**cond, "proof_fingerprint": fingerprint}
        if member is not None:
            cond = {**cond, **box_conditions(cfg, member)}
            what = f"{what} on {member.name} ({member.devices_text}), drained from the balancer"
        with lock.held(cfg):  # no serve deploy meanwhile
            dataset.ship_request_set(cfg)  # the request set every arm replays
            if isinstance(plan, DraftPlan):  # the candidates that passed every check
                plan.stage()
            # a measured host is off its deployed unit: at most max_unavailable hosts at once
            host_turn(cfg, what, _measure, cfg=measured, kind=kind, plan=plan, cond=cond,
                      box=cfg if member else None)  # fmt: skip
        python.call(name=f"Report {run_dir(kind)}", function=_write_report, kind=kind)

    _measure_fleet()
