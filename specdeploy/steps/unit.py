"""Step 5: install the rendered unit and env file; restart only when one of them changed.

A new unit is uploaded to a staging path first and moved into place in one `mv`, so systemd never
sees a half-written file; the unit and env file it replaces are kept under state_dir/rollback
(root's) for `restore_previous()`."""

from __future__ import annotations

import hashlib
import shlex
from io import StringIO

from pyinfra import host, logger
from pyinfra.api import deploy
from pyinfra.facts.files import Sha1File
from pyinfra.operations import files, server, systemd

from ..argv import argv_diff, argv_lines, unit_exec_argv
from ..config import ServeConfig
from ..facts import FileText
from ..render import RenderedUnit, render_env_file
from .secrets import Secret, secret_file


def sha1(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()


def pending_changes(cfg: ServeConfig, unit: RenderedUnit) -> tuple[bool, bool]:
    """Planning time, from facts: (the installed unit differs from `unit`, the env file differs from
    the rendered one). Also catches a unit edited by hand."""
    unit_differs = host.get_fact(Sha1File, path=cfg.unit_path(unit.name)) != sha1(unit.text)
    env_differs = host.get_fact(Sha1File, path=cfg.env_file) != sha1(render_env_file(cfg))
    return unit_differs, env_differs


@deploy("Install systemd unit")
def install_unit(cfg: ServeConfig, unit: RenderedUnit, *, start: bool = True, enable: bool = True):
    """Returns the operations whose change means the server must restart."""
    staged, target = cfg.staged_unit_path(unit.name), cfg.unit_path(unit.name)
    unit_differs, env_differs = pending_changes(cfg, unit)
    if unit_differs or env_differs:  # keep the current pair before either changes
        server.shell(
            name=f"Keep current {unit.name} and env file for rollback",
            commands=[keep_previous_command(cfg, unit.name)],
        )
    env_op = secret_file(
        name="Secrets env file (root, 0600)",
        path=cfg.env_file,
        secret=Secret(render_env_file(cfg)),
    )
    stage_op = files.put(
        name=f"Stage {unit.name}",
        src=StringIO(unit.text),
        dest=staged,
        user="root",
        group="root",
        mode="644",
    )
    swap = lambda: unit_differs or stage_op.did_change()  # noqa: E731
    server.shell(
        name=f"Swap in {unit.name} (previous kept for rollback)",
        commands=[f"cp -p {staged} {target}.tmp && mv -f {target}.tmp {target}"],  # validated paths
        _if=swap,
    )
    changed = lambda: swap() or env_op.did_change()  # noqa: E731
    systemd.daemon_reload(name="systemd daemon-reload", _if=swap)
    if enable:
        systemd.service(name=f"Enable {unit.name}", service=unit.name, enabled=True)
    if start:
        systemd.service(
            name=f"Restart {unit.name} (config changed)",
            service=unit.name,
            running=True,
            restarted=True,
            _if=changed,
        )
        systemd.service(name=f"{unit.name} running", service=unit.name, running=True)
    return changed


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
