"""Step 4: install the rendered unit and env file; restart only when one of them changed.

A new unit is uploaded to a staging path first and moved into place in one `mv`, so systemd never
sees a half-written file; the unit it replaces is kept under state_dir/rollback for `rollback()`."""

from __future__ import annotations

import hashlib
import shlex
from io import StringIO

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.facts.files import Sha1File
from pyinfra.operations import files, server, systemd

from ..config import ServeConfig
from ..render import RenderedUnit, env_file_path, render_env_file

UNIT_DIR = "/etc/systemd/system"


def rollback_dir(cfg: ServeConfig) -> str:
    return f"{cfg.state_dir}/rollback"


@deploy("Install systemd unit")
def install_unit(cfg: ServeConfig, unit: RenderedUnit, *, start: bool = True, enable: bool = True):
    """Returns the operations whose change means the server must restart."""
    staged = f"/etc/specdeploy/staged-{unit.name}"
    target = f"{UNIT_DIR}/{unit.name}"
    env_file = env_file_path(cfg)
    env_text = render_env_file(cfg)
    # Decided from facts now: does the installed unit / env file differ from the rendered one? (Also
    # catches a unit edited by hand.) Only then keep the current pair for rollback, before either changes.
    unit_differs = (
        host.get_fact(Sha1File, path=target) != hashlib.sha1(unit.text.encode()).hexdigest()
    )
    env_differs = (
        host.get_fact(Sha1File, path=env_file) != hashlib.sha1(env_text.encode()).hexdigest()
    )
    if unit_differs or env_differs:
        server.shell(
            name=f"Keep current {unit.name} and env file for rollback",
            commands=[keep_previous_command(cfg, unit.name)],
        )
    env_op = files.put(
        name="Secrets env file (root, 0600)",
        src=StringIO(env_text),
        dest=env_file,
        user="root",
        group="root",
        mode="600",
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
        commands=[f"cp -p {staged} {target}.tmp && mv -f {target}.tmp {target}"],
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
    """Copy the installed unit and env file to state_dir/rollback (only when a unit is installed)."""
    target, env_file, keep = f"{UNIT_DIR}/{name}", env_file_path(cfg), rollback_dir(cfg)
    return (
        f"if [ -f {target} ]; then mkdir -p {keep} && cp -p {target} {keep}/{name}; "
        f"if [ -f {env_file} ]; then cp -p {env_file} {keep}/{name}.env; else rm -f {keep}/{name}.env; fi; fi"
    )


def restore_previous(cfg: ServeConfig, name: str) -> list[str] | None:
    """Execution time (inside python.call): put the kept unit + env file back, daemon-reload and restart.
    Returns the restored unit's argv, or None (and stops the service) when there was no previous unit."""
    from ..rollout import unit_exec_argv
    from .remote import run

    target, env_file, keep = f"{UNIT_DIR}/{name}", env_file_path(cfg), rollback_dir(cfg)
    staged = f"/etc/specdeploy/staged-{name}"
    text = run(f"cat {keep}/{name} 2>/dev/null || true", check=False)
    if not text.strip():
        run(f"systemctl stop {name} || true", check=False)
        return None
    run(
        " && ".join(
            [
                f"cp -p {keep}/{name} {target}.tmp",
                f"mv -f {target}.tmp {target}",
                f"cp -p {target} {staged}",  # the next deploy compares against what really runs
                f"if [ -f {keep}/{name}.env ]; then cp -p {keep}/{name}.env {env_file}; fi",
                "systemctl daemon-reload",
                f"(systemctl reset-failed {shlex.quote(name)} || true)",
                f"systemctl restart {shlex.quote(name)}",
            ]
        )
    )
    return unit_exec_argv(text)
