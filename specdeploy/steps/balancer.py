"""The local balancer of a whole box (instances = ...): HAProxy from the host's apt, its root-only
config and its own hardened unit, staged while planning. Nothing here starts, reloads or drains it:
the rolling restart does, at execution time (server.start_balancer, server.drain)."""

from __future__ import annotations

from dataclasses import dataclass
from io import StringIO

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.facts.deb import DebPackages
from pyinfra.facts.files import Sha1File
from pyinfra.operations import apt, files

from specdeploy.checks.capabilities import BALANCER_PACKAGES
from specdeploy.config.schema import ServeConfig
from specdeploy.host.facts.systemd import ServiceActive
from specdeploy.render.units import render_balancer
from specdeploy.steps.unit import sha1


@dataclass
class BalancerChange:
    """What `stage` planned: must the balancer be (re)loaded or started at execution time?"""

    config_differs: bool
    unit_differs: bool
    active: str
    ops: tuple = ()

    def pending(self) -> bool:
        return self.needs_reload() or self.active != "active"

    def needs_reload(self) -> bool:
        staged = any(op is not None and op.did_change() for op in self.ops)
        return self.config_differs or self.unit_differs or staged


@deploy("Local balancer (HAProxy)")
def stage(cfg: ServeConfig, members: list) -> BalancerChange:
    """Install HAProxy (only when missing), put its config (root, 0600: it names the admin socket)
    and unit in place. Decided from facts: a re-run with nothing changed schedules nothing that
    changes."""
    if any(name not in host.get_fact(DebPackages) for name in BALANCER_PACKAGES):
        apt.packages(name=f"Debian packages {', '.join(BALANCER_PACKAGES)}",
                     packages=BALANCER_PACKAGES, update=True)  # fmt: skip
    else:
        host.noop(f"Debian packages {', '.join(BALANCER_PACKAGES)} are installed")
    config, unit = render_balancer(cfg, members)
    config_differs = host.get_fact(Sha1File, path=config.path) != sha1(config.text)
    unit_differs = host.get_fact(Sha1File, path=cfg.unit_path(unit.name)) != sha1(unit.text)
    config_op = files.put(
        name=f"Balancer config {config.path}",
        src=StringIO(config.text),
        dest=config.path,
        user="root",
        group="root",
        mode="600",
    )
    unit_op = files.put(
        name=f"Balancer unit {unit.name}",
        src=StringIO(unit.text),
        dest=cfg.unit_path(unit.name),
        user="root",
        group="root",
        mode="644",
    )
    active = host.get_fact(ServiceActive, unit=unit.name)
    return BalancerChange(config_differs, unit_differs, active, (config_op, unit_op))
