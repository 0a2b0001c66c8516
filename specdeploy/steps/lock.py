"""A per-host deploy lock, so two deploys (two operators, two terminals, two control hosts) can
never interleave their changes on one host.

The lock is a file on the host, `/run/lock/<service_name>.deploy.lock`, created atomically
(`set -C`: O_EXCL) by the first operation of a deploy and removed by its last. It names its holder:
`user@controlhost`, the controlling pyinfra process id and the time it was taken, so a second deploy
stops with a message saying who holds it.

Both lock operations report "No changes" (they change no configuration), so a no-op re-run stays a
run of zero changes. They only act while pyinfra executes; during planning (`--dry`, or a run
without `-y`) the acquire operation only reads the lock and warns when someone else holds it.

Stale locks: the lock lives in /run (tmpfs), so a reboot clears it. A deploy that dies mid-way
leaves it behind; the next deploy from the *same* control host takes it over when the holder's pid
is no longer running there. A lock left by another control host is removed by hand after checking
that deploy is really gone: `specdeploy unlock INVENTORY --limit HOST` (or `rm` the file on the
host).
A deploy whose health check fails rolls the host back and releases the lock itself.
"""

from __future__ import annotations

import getpass
import os
import shlex
import socket

from pyinfra import host, logger
from pyinfra.api import StringCommand, operation

from ..config import LOCK_DIR, ServeConfig
from ..on_host import read_text, sh, sh_status
from ..timestamps import utc_iso


class LockHeld(RuntimeError):
    pass


def control_host() -> str:
    return socket.gethostname()


def holder_id() -> str:
    """Who we are: user@controlhost:pid (the pyinfra process that holds the lock)."""
    try:
        user = getpass.getuser()
    except Exception:
        user = str(os.getuid())
    return f"{user}@{control_host()}:{os.getpid()}"


def parse_holder(text: str) -> dict:
    """`holder=root@ctl:123 since=2024-...Z command=...` -> dict."""
    fields = {}
    for part in shlex.split(text.strip().splitlines()[0]) if text.strip() else []:
        if "=" in part:
            key, value = part.split("=", 1)
            fields[key] = value
    holder = fields.get("holder", "")
    who, _, pid = holder.rpartition(":")
    fields["who"], fields["pid"] = who or holder, int(pid) if pid.isdigit() else None
    fields["controlhost"] = fields["who"].split("@", 1)[-1]
    return fields


def describe(fields: dict) -> str:
    return f"{fields.get('who')} (pid {fields.get('pid')}, since {fields.get('since')})"


def _holder_is_stale(fields: dict) -> bool:
    """Only decidable for a lock taken from this control host: its process is gone."""
    if fields.get("controlhost") != control_host() or not fields.get("pid"):
        return False
    try:
        os.kill(fields["pid"], 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def read_lock(cfg: ServeConfig) -> dict | None:
    text = read_text(cfg.lock_path, missing_ok=True)
    return parse_holder(text) if text and text.strip() else None


def try_acquire(cfg: ServeConfig) -> dict | None:
    """Take the lock; None when taken, else the holder's fields (lock held by someone else)."""
    path = shlex.quote(cfg.lock_path)
    me = holder_id()
    line = shlex.join(
        [
            f"holder={me}",
            f"since={utc_iso()}",
            f"host={host.name}",
        ]
    )
    command = (
        f"mkdir -p {LOCK_DIR} && "
        f"if ( set -C; printf '%s\\n' {shlex.quote(line)} > {path} ) 2>/dev/null; "
        f"then echo ACQUIRED; else cat {path}; fi"
    )
    for _ in range(2):
        _ok, out, _ = sh_status(command)
        if out.strip() == "ACQUIRED":
            return None
        fields = parse_holder(out) if out.strip() else {}
        if fields.get("holder") == me:
            return None  # re-entrant: this process already holds it
        if fields and _holder_is_stale(fields):
            logger.warning(
                f"{host.print_prefix}taking over stale deploy lock of {describe(fields)}: "
                "that process is no longer running on this control host"
            )
            sh(f"rm -f {path}")
            continue
        return fields
    return fields


def release_now(cfg: ServeConfig) -> None:
    """Remove the lock if (and only if) this process holds it."""
    path = shlex.quote(cfg.lock_path)
    me = shlex.quote(f"holder={holder_id()} ")
    sh(f"if [ -f {path} ] && grep -qF -- {me} {path}; then rm -f {path}; fi", check=False)


def held_message(cfg: ServeConfig, fields: dict) -> str:
    return (
        f"{host.name}: another deploy holds the deploy lock {cfg.lock_path}: {describe(fields)}. "
        "Wait for it to finish. If that deploy is gone, remove the lock: "
        f"`specdeploy unlock INVENTORY --limit {host.name}` (or `rm {cfg.lock_path}` on the host)."
    )


@operation()
def acquire(cfg: ServeConfig):
    """First operation of a deploy: take the host's deploy lock (reports no change)."""
    if not host.state.is_executing:
        fields = read_lock(cfg)
        if fields and fields.get("holder") != holder_id() and not _holder_is_stale(fields):
            logger.warning(f"{host.print_prefix}{held_message(cfg, fields)}")
        return
    fields = try_acquire(cfg)
    if fields is not None:
        yield StringCommand(f"echo {shlex.quote(held_message(cfg, fields))} >&2; exit 75")


@operation()
def release(cfg: ServeConfig):
    """Last operation of a deploy: drop the lock (reports no change)."""
    if host.state.is_executing:
        release_now(cfg)
    return
    yield  # a generator that yields nothing
