"""Step 3: target and draft weights at their pinned revisions, into the host's HF cache: root's,
read-only to the server."""

from __future__ import annotations

import shlex

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.facts.files import FindDirectories, FindFiles, FindLinks
from pyinfra.operations import server

from specdeploy.config.problems import HostRefused
from specdeploy.config.schema import ServeConfig
from specdeploy.host.facts.system import FreeDiskBytes
from specdeploy.host.facts.vllm import ModelSnapshot
from specdeploy.host.scripts import source
from specdeploy.steps import lock
from specdeploy.steps.secrets import Secret, env_text, secret_file, sourced


def snapshots(cfg: ServeConfig) -> dict[str, dict | None]:
    return {
        role: host.get_fact(ModelSnapshot, hf_home=cfg.hf_home, repo=repo, revision=rev)
        for role, repo, rev in cfg.hub_models
    }


@deploy("Token for model downloads")
def download_token(cfg: ServeConfig):
    """The HF token in its own root-only file; rotating it changes this file only (no restart)."""
    secret = Secret(cfg.hf_token) if cfg.hf_token else None
    secret_file(name=f"HF token file {cfg.hf_token_file} (root, 0600)", path=cfg.hf_token_file,
                secret=secret)  # fmt: skip
    # the mirror's URL may carry credentials: a root-only file the download sources, never argv
    hub_env = env_text({"HF_ENDPOINT": cfg.hf_endpoint})
    secret_file(name=f"Hub mirror file {cfg.hub_env_file} (root, 0600)", path=cfg.hub_env_file,
                secret=Secret(hub_env) if hub_env else None)  # fmt: skip


@deploy("Fetch model weights")
def fetch_weights(cfg: ServeConfig) -> bool:
    """Schedules downloads for missing snapshots; returns True when any was missing."""
    present = snapshots(cfg)
    missing = [(role, repo, rev) for role, repo, rev in cfg.hub_models if present[role] is None]
    if not missing:
        pinned = ", ".join(f"{repo}@{rev}" for _, repo, rev in cfg.hub_models)
        host.noop(f"weights {pinned} are in {cfg.hf_home}")
        return False
    free = host.get_fact(FreeDiskBytes, path=cfg.hf_home)
    needed = int(cfg.min_free_disk_gb * (1 << 30))
    if free < needed:
        raise HostRefused(
            f"{host.name}: only {free / (1 << 30):.1f} GiB free under {cfg.hf_home}, "
            "min_free_disk_gb is "
            f"{cfg.min_free_disk_gb}; free space or raise the disk before fetching "
            f"{', '.join(r for _, r, _ in missing)}"
        )
    # The token file is written first, so a gated repo downloads on a fresh host too; it is the
    # download's alone (HF_TOKEN_PATH), never the server's environment.
    env = f"HF_TOKEN_PATH={shlex.quote(cfg.hf_token_file)} HF_HUB_DISABLE_TELEMETRY=1 "
    # every cache of the download (Xet chunks too) under state_dir, never root's home
    env += f"HF_HOME={shlex.quote(cfg.hf_home)} "
    script = shlex.quote(source("fetch_weights"))
    limit = str(cfg.download_timeout_s or "auto")  # the script stops itself at its limit
    # downloads may outlast the lease: renewed for all of them (3600 s each where the script sizes
    # its own limit)
    seconds = (cfg.download_timeout_s or 3600) * len(missing)
    lock.renew(name="Deploy lock lease: the downloads", seconds=lock.step_lease(cfg, seconds))
    for role, repo, rev in missing:
        # the script sizes what it will fetch and refuses below that + min_free_disk_gb; it stops
        # itself at its time limit
        args = shlex.join(
            [cfg.hf_home, repo, rev, limit, str(cfg.download_min_mb_per_s), host.name, str(needed)]
        )
        command = f"{env}{shlex.quote(cfg.venv + '/bin/python')} -c {script} {args}"
        command = sourced(cfg.hub_env_file if cfg.hf_endpoint else None, command)
        server.shell(name=f"Download {role} {repo}@{rev}", commands=[command])
    return True  # written by root, root's: the server only reads them (ReadOnlyPaths=)


def foreign_entries(cfg: ServeConfig) -> list[str]:
    """Everything under the HF cache that is not root's (files, directories, links) or that
    others may write (files, directories; a link's own mode means nothing)."""
    found: list[str] = []
    for kind in (FindFiles, FindDirectories, FindLinks):
        found += host.get_fact(kind, path=cfg.hf_home, args=["!", "-user", "root"]) or []
    for kind in (FindFiles, FindDirectories):
        found += host.get_fact(kind, path=cfg.hf_home, args=["-perm", "/022"]) or []
    return found


@deploy("Weights are root's")
def weights_are_roots(cfg: ServeConfig):
    """Root writes the weights (downloads, refs, markers) and the server only reads them, so
    nothing under the cache may be the service user's: a tree an older deploy gave it is taken
    back once, and what others may write loses that. `find -P` never follows a link and
    `chown -h` changes a link itself."""
    foreign = foreign_entries(cfg)
    if not foreign:  # the no-change path: every entry is root's already
        host.noop(f"every entry under {cfg.hf_home} is root's and closed to others")
        return
    hf_home = shlex.quote(cfg.hf_home)
    server.shell(
        name=f"{cfg.hf_home}: {len(foreign)} entries back to root (the server only reads them)",
        commands=[
            f"find -P {hf_home} -mindepth 1 ! -user root -exec chown -h root:root {{}} +",
            f"find -P {hf_home} -mindepth 1 ! -type l -perm /022 -exec chmod go-w {{}} +",
        ],
    )
