"""Base root filesystem for sandbox hosts.

A plain `debootstrap --variant=minbase` Debian bookworm with systemd, sshd, sudo and python3 —
nothing the deploy should install itself (no python3-venv, curl or libnuma1: the deploy apt-installs
them from the sandbox's Debian repository) — and a non-root `deploy` user with password-less sudo,
the shape of a production fleet's login (inventories/prod.py). It is
cached as a zstd tarball under `$SPECDEPLOY_CACHE` (default
`/var/cache/specdeploy`) and extracted once into a shared, read-only *lower*
directory that every host overlays.
"""

from __future__ import annotations

import fcntl
import glob
import hashlib
import logging
import os
import re
import shutil
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path

log = logging.getLogger(__name__)

SUITE = "bookworm"
PACKAGES = [
    "systemd",
    "systemd-sysv",
    "dbus",
    "openssh-server",
    "python3",
    "iproute2",
    "procps",
    "ca-certificates",
    "sudo",
]
DEPLOY_USER = "deploy"  # what inventories/sandbox.py logs in as; root SSH is for test fixtures only
# Units that only slow boot down or hang without network.
MASKED_UNITS = [
    "apt-daily.timer",
    "apt-daily.service",
    "apt-daily-upgrade.timer",
    "apt-daily-upgrade.service",
    "getty@.service",
    "getty.target",
    "console-getty.service",
    "systemd-timesyncd.service",
    "e2scrub_all.timer",
    "e2scrub_reap.service",
    "fstrim.timer",
    "man-db.timer",
    "systemd-networkd-wait-online.service",
    "ssh.socket",
]
DEFAULT_MIRROR = "http://deb.debian.org/debian"
# Bump when the recipe below changes so stale caches are rebuilt.
RECIPE_VERSION = "2"


def cache_dir() -> Path:
    return Path(os.environ.get("SPECDEPLOY_CACHE", "/var/cache/specdeploy"))


def recipe_id() -> str:
    h = hashlib.sha256(
        "|".join(
            [RECIPE_VERSION, SUITE, ",".join(PACKAGES), ",".join(MASKED_UNITS), DEPLOY_USER]
        ).encode()
    ).hexdigest()[:10]
    return f"{SUITE}-{h}"


def tarball_path() -> Path:
    return cache_dir() / "rootfs" / f"{recipe_id()}.tar.zst"


def base_dir() -> Path:
    """The extracted, shared lower layer."""
    return cache_dir() / "rootfs" / recipe_id()


def apt_mirror() -> str:
    """The Debian mirror the control node's apt uses (the only way out)."""
    files = ["/etc/apt/sources.list"] + sorted(glob.glob("/etc/apt/sources.list.d/*"))
    for f in files:
        try:
            text = Path(f).read_text()
        except OSError:
            continue
        if f.endswith(".sources"):
            # deb822: stanzas separated by blank lines
            for stanza in re.split(r"\n\s*\n", text):
                fields = {}
                for line in stanza.splitlines():
                    if line.startswith("#") or ":" not in line:
                        continue
                    k, v = line.split(":", 1)
                    fields[k.strip().lower()] = v.strip()
                suites = fields.get("suites", "").split()
                if SUITE in suites and "deb" in fields.get("types", "").split():
                    uri = fields.get("uris", "").split()
                    if uri and "security" not in uri[0]:
                        return uri[0].rstrip("/")
        else:
            for line in text.splitlines():
                m = re.match(r"^\s*deb\s+(\[[^\]]*\]\s+)?(\S+)\s+(\S+)", line)
                if m and m.group(3) == SUITE and "security" not in m.group(2):
                    return m.group(2).rstrip("/")
    return DEFAULT_MIRROR


@contextmanager
def _lock(name: str):
    d = cache_dir() / "rootfs"
    d.mkdir(parents=True, exist_ok=True)
    with open(d / f".{name}.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _run(cmd, **kw):
    log.debug("run: %s", cmd)
    return subprocess.run(cmd, check=True, **kw)


def _customize(root: Path) -> None:
    """Make the debootstrapped tree boot cleanly as an nspawn container."""
    etc = root / "etc"
    # Fresh machine-id per boot (systemd generates a transient one when empty).
    (etc / "machine-id").write_text("")
    dbus_mid = root / "var/lib/dbus/machine-id"
    if dbus_mid.exists() or dbus_mid.is_symlink():
        dbus_mid.unlink()
    # Empty resolv.conf: no DNS inside, so nothing hangs on lookups.
    rc = etc / "resolv.conf"
    if rc.exists() or rc.is_symlink():
        rc.unlink()
    rc.write_text("")
    (etc / "hostname").write_text("sandbox\n")
    # No apt sources pointing to the outside world that timers might use.
    for unit in MASKED_UNITS:
        link = etc / "systemd/system" / unit
        link.parent.mkdir(parents=True, exist_ok=True)
        if link.exists() or link.is_symlink():
            link.unlink()
        link.symlink_to("/dev/null")
    # sshd: key only, root by key.
    sshd_d = etc / "ssh/sshd_config.d"
    sshd_d.mkdir(parents=True, exist_ok=True)
    (sshd_d / "specdeploy.conf").write_text(
        "PasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\n"
        "PermitRootLogin prohibit-password\n"
        "UseDNS no\n"
        "MaxStartups 100:30:200\n"
        "MaxSessions 100\n"
    )
    # Host keys are generated per host; remove the ones baked by the package.
    for k in (etc / "ssh").glob("ssh_host_*"):
        k.unlink()
    # No host-key generation at boot (we provision keys per host).
    (root / "root/.ssh").mkdir(mode=0o700, parents=True, exist_ok=True)
    # The deploy user: a login shell, password-less sudo, keys provisioned per host.
    _run(["chroot", str(root), "useradd", "-m", "-s", "/bin/bash", "-G", "sudo", DEPLOY_USER])
    sudoers = etc / "sudoers.d" / DEPLOY_USER
    sudoers.write_text(f"{DEPLOY_USER} ALL=(ALL:ALL) NOPASSWD:ALL\n")
    os.chmod(sudoers, 0o440)
    # Journald: keep it small and volatile.
    jd = etc / "systemd/journald.conf.d"
    jd.mkdir(parents=True, exist_ok=True)
    (jd / "specdeploy.conf").write_text("[Journal]\nStorage=volatile\nRuntimeMaxUse=32M\n")
    # /tmp as tmpfs is fine in nspawn, but make sure the dir exists with sticky bit.
    tmp = root / "tmp"
    tmp.mkdir(exist_ok=True)
    os.chmod(tmp, 0o1777)
    # Clean apt caches to keep the tarball small.
    for p in (root / "var/cache/apt/archives").glob("*.deb"):
        p.unlink()
    shutil.rmtree(root / "var/lib/apt/lists", ignore_errors=True)
    (root / "var/lib/apt/lists/partial").mkdir(parents=True, exist_ok=True)


def build_tarball(force: bool = False) -> Path:
    """debootstrap the base image and store it as a zstd tarball (cached)."""
    tb = tarball_path()
    with _lock("build"):
        if tb.exists() and not force:
            return tb
        work = tb.parent / f".build-{os.getpid()}"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        mirror = apt_mirror()
        t0 = time.monotonic()
        log.info("debootstrap %s from %s into %s", SUITE, mirror, work)
        try:
            _run(
                [
                    "debootstrap",
                    "--variant=minbase",
                    f"--include={','.join(PACKAGES)}",
                    "--components=main",
                    SUITE,
                    str(work),
                    mirror,
                ],
                stdout=subprocess.DEVNULL if not log.isEnabledFor(logging.DEBUG) else None,
            )
            _customize(work)
            tmp_tb = tb.with_suffix(".tmp")
            _run(
                [
                    "tar",
                    "--numeric-owner",
                    "--xattrs",
                    "--acls",
                    "-C",
                    str(work),
                    "-I",
                    "zstd -T0 -3",
                    "-cf",
                    str(tmp_tb),
                    ".",
                ]
            )
            os.replace(tmp_tb, tb)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        log.info("base rootfs built in %.0fs: %s", time.monotonic() - t0, tb)
        return tb


def ensure_base() -> Path:
    """Return the extracted lower dir, building/extracting it when missing."""
    base = base_dir()
    marker = base.with_name(base.name + ".ok")
    if marker.exists() and base.is_dir():
        return base
    tb = build_tarball()
    with _lock("extract"):
        if marker.exists() and base.is_dir():
            return base
        shutil.rmtree(base, ignore_errors=True)
        tmp = base.with_name(base.name + f".extract-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        _run(
            [
                "tar",
                "--numeric-owner",
                "--xattrs",
                "--xattrs-include=*",
                "--acls",
                "-C",
                str(tmp),
                "-I",
                "zstd -T0",
                "-xpf",
                str(tb),
            ]
        )
        os.replace(tmp, base)
        marker.write_text(str(tb) + "\n")
    return base
