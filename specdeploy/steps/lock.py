"""A per-host deploy lock, so two deploys (two operators, two terminals, two control hosts) can
never interleave their changes on one host.

The lock is a file on the host, `/run/specdeploy/locks/<service_name>.deploy.lock`, created
atomically (`set -C`: O_EXCL, which also refuses to open through a symlink) by the first operation
of a deploy. It names its holder: `user@controlhost`, the controlling pyinfra process id and the
time it was taken, so a second deploy stops with a message saying who holds it.

Nobody but root can plant it: the acquire command itself creates the directory root-owned, mode
0700 (`install -d -m 700 -o root`), and refuses (never follows) a symlink at the directory, its
parent or the lock file — the old place, `/run/lock`, is mode 1777, where any local user could
pre-create the predictable file or a symlink that root then read.

Released on every exit path of a deploy, not only by its last operation: a failure hook
(`ReleaseOnFailure`, a pyinfra state callback on `operation_host_error`) removes the lock this
process holds on a host the moment any operation fails there (pip, apt, a download, preflight,
health, a host held back by the rolling restart), and the health/rollback call releases it in its
own except path too. Only a killed control process leaves it behind.

Both lock operations report "No changes" (they change no configuration), so a no-op re-run stays a
run of zero changes. They only act while pyinfra executes; during planning (`--dry`, or a run
without `-y`) the acquire operation only reads the lock and warns when someone else holds it.

Stale locks: the lock lives in /run (tmpfs), so a reboot clears it. A lock whose recorded control
host is this one and whose pid no longer runs here is taken over with a warning. A lock left by
another control host (a CI runner that died) cannot be judged from here: remove it after checking
that deploy is really gone, `specdeploy unlock INVENTORY --limit HOST` (or `rm` the file on the
host as root).
"""

from __future__ import annotations

import getpass
import os
import shlex
import socket

from pyinfra import host, logger
from pyinfra.api import StringCommand, operation
from pyinfra.api.state import BaseStateCallback
from pyinfra.context import ctx_host

from ..config import LOCK_PARENT_DIR, ServeConfig
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


REFUSED = "SPECDEPLOY-LOCK-REFUSED:"
ACQUIRED = "ACQUIRED"

# Locks this process took, per host name: released by release_now and by the failure hook.
_HELD: dict[str, set[str]] = {}


def acquire_command(lock_path: str, line: str, *, parent: str = LOCK_PARENT_DIR) -> str:
    """The host command that takes the lock: prints ACQUIRED, or the holder's line, or REFUSED
    with why. The directory is made root-owned 0700 here (so only root can create anything in it),
    and a symlink anywhere on the way is refused, never followed; `set -C` opens with O_EXCL,
    which fails on an existing file and on a symlink alike."""
    directory = lock_path.rsplit("/", 1)[0]
    path, lock_dir, parent = (shlex.quote(p) for p in (lock_path, directory, parent))
    refuse = f"echo {shlex.quote(REFUSED)}"
    checks = " ".join(
        f"if [ -L {p} ]; then {refuse} {p} is a symbolic link; exit 0; fi;"
        for p in dict.fromkeys([parent, lock_dir, path])
    )
    make_dirs = (
        f"install -d -m 755 -o root -g root {parent} && "
        f"install -d -m 700 -o root -g root {lock_dir}"
    )
    owned = (
        f'[ "$(stat -c %u:%a {lock_dir})" = 0:700 ] || '
        f"{{ {refuse} {lock_dir} is not root-owned mode 0700; exit 0; }}"
    )
    return (
        f"{checks} {make_dirs} || {{ {refuse} cannot create {lock_dir} as root; exit 0; }}; "
        f"{owned}; "
        f"if ( set -C; printf '%s\\n' {shlex.quote(line)} > {path} ) 2>/dev/null; "
        f"then echo {ACQUIRED}; "
        f"elif [ -L {path} ] || [ ! -f {path} ]; then {refuse} {path} is not a regular file; "
        f"else cat {path}; fi"
    )


def release_command(lock_path: str, holder: str) -> str:
    """Remove the lock only when it is a regular file (not a link) naming `holder`."""
    path, me = shlex.quote(lock_path), shlex.quote(f"holder={holder} ")
    return f"if [ -f {path} ] && [ ! -L {path} ] && grep -qF -- {me} {path}; then rm -f {path}; fi"


def try_acquire(cfg: ServeConfig) -> dict | None:
    """Take the lock; None when taken, else the holder's fields (lock held by someone else), or
    {"refused": why} when the lock's place is not what root alone controls."""
    path = shlex.quote(cfg.lock_path)
    me = holder_id()
    line = shlex.join([f"holder={me}", f"since={utc_iso()}", f"host={host.name}"])
    command = acquire_command(cfg.lock_path, line)
    fields: dict = {}
    for _ in range(2):
        _ok, out, _ = sh_status(command)
        text = out.strip()
        if text == ACQUIRED:
            _HELD.setdefault(host.name, set()).add(cfg.lock_path)
            return None
        if text.startswith(REFUSED):
            return {"refused": text[len(REFUSED) :].strip()}
        fields = parse_holder(out) if text else {}
        if fields.get("holder") == me:
            _HELD.setdefault(host.name, set()).add(cfg.lock_path)
            return None  # re-entrant: this process already holds it
        if fields and _holder_is_stale(fields):
            logger.warning(
                f"{host.print_prefix}taking over stale deploy lock of {describe(fields)}: "
                "that process is no longer running on this control host"
            )
            sh(f"rm -f {path}")  # a regular file in a root-only directory (checked above)
            continue
        return fields
    return fields


def release_path(lock_path: str) -> None:
    """Remove the lock at `lock_path` on the current host if (and only if) this process holds it."""
    sh(release_command(lock_path, holder_id()), check=False)
    _HELD.get(host.name, set()).discard(lock_path)


def release_now(cfg: ServeConfig) -> None:
    """Remove the lock if (and only if) this process holds it."""
    release_path(cfg.lock_path)


class ReleaseOnFailure(BaseStateCallback):
    """pyinfra's failure hook for the lock: when any operation fails on a host (and the failure is
    not ignored), the lock this process took there is removed at once. pyinfra runs no later
    operation on a failed host, so the deploy's last operation (`release`) would never come."""

    @staticmethod
    def operation_host_error(state, host, op_hash, retry_count: int = 0, max_retries: int = 0):
        held = sorted(_HELD.get(host.name, ()))
        if not held:
            return
        try:
            arguments = state.get_op_data_for_host(host, op_hash).global_arguments
            if arguments.get("_ignore_errors") or arguments.get("_continue_on_error"):
                return  # the deploy goes on on this host: it still needs its lock
        except Exception:
            pass
        with ctx_host.use(host):
            for path in held:
                try:
                    release_path(path)
                    logger.warning(f"{host.print_prefix}deploy failed: released {path}")
                except Exception as error:  # the host may be unreachable: say so, go on
                    logger.warning(f"{host.print_prefix}could not release {path}: {error}")


def install_failure_hook(state) -> None:
    """Register ReleaseOnFailure once per pyinfra state (planning time, any host)."""
    if not any(isinstance(h, ReleaseOnFailure) for h in state.callback_handlers):
        state.add_callback_handler(ReleaseOnFailure())


def held_message(cfg: ServeConfig, fields: dict) -> str:
    if "refused" in fields:
        return (
            f"{host.name}: the deploy lock {cfg.lock_path} was refused, not followed: "
            f"{fields['refused']}. Someone other than root made it; find out who, remove it as "
            "root, and run again."
        )
    return (
        f"{host.name}: another deploy holds the deploy lock {cfg.lock_path}: {describe(fields)}. "
        "Wait for it to finish. If that deploy is gone, remove the lock: "
        f"`specdeploy unlock INVENTORY --limit {host.name}` (or `rm {cfg.lock_path}` on the host)."
    )


@operation()
def acquire(cfg: ServeConfig):
    """First operation of a deploy: take the host's deploy lock (reports no change)."""
    install_failure_hook(host.state)
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
