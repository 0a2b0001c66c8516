"""The local balancer of a whole box (instances = ...): HAProxy from the host's apt, its root-only
config and its own hardened unit, staged while planning beside the live ones: the rolling restart
swaps them in at the host's turn (BalancerChange.swap_in), then starts or reloads it
(server.start_balancer), so a held-back or rolled-back host never loads the new topology."""

from __future__ import annotations

import posixpath
import shlex
from dataclasses import dataclass
from io import StringIO

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.facts.deb import DebPackages
from pyinfra.facts.files import Sha1File
from pyinfra.operations import apt, files

from specdeploy.config.schema import SECRETS_DIR, ServeConfig
from specdeploy.host import server
from specdeploy.host.facts.systemd import ServiceActive
from specdeploy.releases.capabilities import BALANCER_PACKAGES
from specdeploy.render.units import render_balancer
from specdeploy.steps.unit import sha1


@dataclass
class BalancerChange:
    """What `stage` planned: must the balancer be (re)loaded or started at execution time?"""

    config_differs: bool
    unit_differs: bool
    active: str
    ops: tuple = ()
    swaps: tuple[tuple[str, str, str], ...] = ()  # (staged, live, kept for rollback) paths
    swapped: bool = False  # swap_in put a staged file in place this run

    def pending(self) -> bool:
        return self.needs_reload() or self.active != "active"

    def needs_reload(self) -> bool:
        staged = any(op is not None and op.did_change() for op in self.ops)
        return self.config_differs or self.unit_differs or staged

    def swap_in(self) -> None:
        """Execution time, the host's turn: each staged file that differs from the live one
        replaces it in one `mv`, the live one kept first (restore puts it back)."""
        for staged, live, kept in self.swaps:
            staged, live, kept = map(shlex.quote, (staged, live, kept))
            out = server.sh(
                f"if cmp -s {staged} {live}; then echo SAME; else "
                f"if [ -f {live} ]; then cp -p {live} {kept}; else rm -f {kept}; fi; "
                f"cp -p {staged} {live}.tmp && mv -f {live}.tmp {live} && echo SWAPPED; fi"
            )
            self.swapped |= out.strip().endswith("SWAPPED")
        if self.swapped:
            server.sh("systemctl daemon-reload")

    def restore(self) -> None:
        """The balancer failed after swap_in: the kept files back (a first balancer: none)."""
        for _, live, kept in self.swaps if self.swapped else ():
            live, kept = shlex.quote(live), shlex.quote(kept)
            server.sh(f"if [ -f {kept} ]; then mv -f {kept} {live}; else rm -f {live}; fi")
        if self.swapped:
            server.sh("systemctl daemon-reload")


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
    staged_config = f"{SECRETS_DIR}/staged-{posixpath.basename(config.path)}"
    config_op = files.put(
        name=f"Stage balancer config {config.path} (swapped in by the rolling restart)",
        src=StringIO(config.text),
        dest=staged_config,
        user="root",
        group="root",
        mode="600",
    )
    unit_op = files.put(
        name=f"Stage balancer unit {unit.name} (swapped in by the rolling restart)",
        src=StringIO(unit.text),
        dest=cfg.staged_unit_path(unit.name),
        user="root",
        group="root",
        mode="644",
    )
    active = host.get_fact(ServiceActive, unit=unit.name)
    swaps = (
        (staged_config, config.path, cfg.kept_unit_path(posixpath.basename(config.path))),
        (cfg.staged_unit_path(unit.name), cfg.unit_path(unit.name), cfg.kept_unit_path(unit.name)),
    )
    return BalancerChange(config_differs, unit_differs, active, (config_op, unit_op), swaps)
