"""Step 4: install the rendered unit and env file; restart only when one of them changed.

A new unit is uploaded to a staging path first and moved into place in one `mv`, so systemd never
sees a half-written file; the unit it replaces is kept under state_dir/rollback for `rollback()`."""

from __future__ import annotations

from io import StringIO

from pyinfra.api import deploy
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
    env_op = files.put(name="Secrets env file (root, 0600)", src=StringIO(render_env_file(cfg)), dest=env_file,
                       user="root", group="root", mode="600")
    stage_op = files.put(name=f"Stage {unit.name}", src=StringIO(unit.text), dest=staged, user="root",
                         group="root", mode="644")
    server.shell(
        name=f"Swap in {unit.name} (previous kept for rollback)",
        commands=[f"if [ -f {target} ]; then cp -p {target} {rollback_dir(cfg)}/{unit.name}; "
                  f"cp -p {env_file} {rollback_dir(cfg)}/{unit.name}.env 2>/dev/null || true; fi",
                  f"cp -p {staged} {target}.tmp && mv -f {target}.tmp {target}"],
        _if=stage_op.did_change,
    )
    changed = lambda: stage_op.did_change() or env_op.did_change()  # noqa: E731
    systemd.daemon_reload(name="systemd daemon-reload", _if=stage_op.did_change)
    if enable:
        systemd.service(name=f"Enable {unit.name}", service=unit.name, enabled=True)
    if start:
        systemd.service(name=f"Restart {unit.name} (config changed)", service=unit.name, running=True,
                        restarted=True, _if=changed)
        systemd.service(name=f"{unit.name} running", service=unit.name, running=True)
    return changed
