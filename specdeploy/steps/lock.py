"""A per-host deploy lock, so two deploys (two operators, two terminals, two control hosts) can
never interleave their changes on one host.

The lock is a file on the host, `/run/specdeploy/locks/<service_name>.deploy.lock`, created
atomically (`set -C`: O_EXCL, which also refuses to open through a symlink) by the first operation
of a deploy. It names its holder, `user@controlhost:pid/machine/start`: the controlling pyinfra
process, its control node (`machine`: the node's machine id and pid namespace, hashed) and when
that process started (so a pid the kernel hands out again, or another control node of the same
name, is never taken for the holder), and the time it was taken, so a second deploy stops with a
message saying who holds it.

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

A lease: the lock line also says until when it holds (`expires=`, the host's clock, which writes and
judges it alike): `lock_lease_s` (default: health_timeout_s plus the smoke benchmark's time limit
plus a margin, the longest step of a deploy). The deploy renews it when a longer step starts (pip
install, a download) and when a host's turn in the rolling restart comes; the speculation gate and
every measurement renew it before every sample (LeaseRenewal, handed to sampling/sampler.py: no
fresh server without it).
Every renewal also renews, through their own connections, the locks this process holds on the
run's other hosts whose lease is half spent: a host that waits hours for its turn in a serial run
of hundreds keeps its lock. A lease that expired is taken over from any control
host with a warning naming the old holder (a CI runner that died needs no manual unlock); a renewal
that finds the lock taken over fails the host before it changes anything more. A lock from this
control node (same machine, same name) whose process no longer runs here (its pid gone, or given to
a process started since) is taken over at once; one whose process still runs is never taken over.
A lock line of an older specdeploy (`user@controlhost:pid`, which cannot tell two control nodes of
one name apart) is this process's only when it is this process's holder exactly, and is otherwise
judged by its lease alone. The lock lives in /run (tmpfs), so a reboot clears it; `specdeploy
unlock INVENTORY --limit HOST` (or `rm` as root) removes one by hand.
"""

from __future__ import annotations

import functools
import getpass
import hashlib
import hmac
import os
import re
import secrets
import shlex
import socket
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime

from pyinfra import host, logger
from pyinfra.api import StringCommand, operation
from pyinfra.api.state import BaseStateCallback
from pyinfra.context import ctx_host

from specdeploy.config.schema import LOCK_PARENT_DIR, ServeConfig
from specdeploy.config.timestamps import utc_iso
from specdeploy.host.bench import bench_time_limit
from specdeploy.host.on_host import keep_alive, sh, sh_status
from specdeploy.report import notes

LEASE_GRACE_S = 120  # beyond the step it covers: connections, unit files, bookkeeping
ISO = "%Y-%m-%dT%H:%M:%SZ"


class LockHeld(RuntimeError):
    pass


class LockLost(RuntimeError):
    """A renewal found the lock no longer this process's: its lease ran out and another deploy
    took it over."""


def lease_seconds(cfg: ServeConfig) -> int:
    """How long a lock holds without renewal: `lock_lease_s`, else the longest step between two
    renewals — a server start (health_timeout_s) and the smoke benchmark at its time limit."""
    return cfg.lock_lease_s or cfg.health_timeout_s + bench_time_limit(cfg) + LEASE_GRACE_S


def control_host() -> str:
    return socket.gethostname()


_IMPORTED = time.time()  # this process's start where /proc cannot say (process_start)
# the key a machine id is hashed with: a holder names its control node without showing its id to
# the hosts (machine-id(5): an application uses it hashed, under a key of its own)
_MACHINE_KEY = b"specdeploy deploy lock holder"


def _first_line(path: str) -> str | None:
    try:
        with open(path) as file:
            return file.readline().strip() or None
    except OSError:
        return None


@functools.cache
def machine_key() -> str:
    """This control node as a lock holder names it, 16 hex digits: its machine id
    (/etc/machine-id; unreadable: the kernel's boot id, a random value per boot; neither: a random
    value of this process) with its pid namespace (a pid is only judged alive inside its own),
    hashed. Two control nodes of one host name never share it, so neither takes the other's live
    lock for a dead process of its own."""
    machine = _first_line("/etc/machine-id") or _first_line("/proc/sys/kernel/random/boot_id")
    try:
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        namespace = ""
    text = f"{machine or secrets.token_hex(16)} {namespace}".encode()
    return hmac.new(_MACHINE_KEY, text, hashlib.sha256).hexdigest()[:16]


def process_start(pid: int | str = "self") -> str | None:
    """When a process of this machine started: /proc/<pid>/stat's starttime (clock ticks since
    boot), or None where it cannot be read. psutil is not a dependency."""
    text = _first_line(f"/proc/{pid}/stat")
    fields = text.rpartition(")")[2].split() if text else []  # its name may hold spaces and ")"
    return fields[19] if len(fields) > 19 and fields[19].isdigit() else None  # field 22


@functools.cache
def _start_of(pid: int) -> str:
    return process_start(pid) or f"t{_IMPORTED:.6f}"


def own_start() -> str:
    """When this process started (process_start; without /proc: when this module was imported)."""
    return _start_of(os.getpid())


def holder_id() -> str:
    """Who we are: user@controlhost:pid/machine/start (the pyinfra process that holds the lock,
    on this control node, started then)."""
    try:
        user = getpass.getuser()
    except Exception:
        user = str(os.getuid())
    return f"{user}@{control_host()}:{os.getpid()}/{machine_key()}/{own_start()}"


def step_lease(cfg: ServeConfig, step_s: int | None = None) -> int:
    """The lease a renewal sets before a step that may take `step_s` (its own time limit)."""
    return max(lease_seconds(cfg), (step_s or 0) + LEASE_GRACE_S)


@dataclass(frozen=True)
class LeaseRenewal:
    """What a measurement renews before every sample (sampling/sampler.RenewsLease): every lock this
    process holds on the host for the step ahead, at least the lock's own lease (`lease_s`:
    lease_seconds). Handed down, so the sampling room below steps/ never imports this module."""

    lease_s: int

    def __call__(self, seconds: int) -> None:
        renew_held(max(self.lease_s, seconds + LEASE_GRACE_S))


def renewal(cfg: ServeConfig) -> LeaseRenewal:
    """The host's lease renewal for its samples (step_lease's rule)."""
    return LeaseRenewal(lease_seconds(cfg))


def parse_holder(text: str) -> dict:
    """`holder=root@ctl:123/machine/start since=2024-...Z host=...` -> dict (`machine` and
    `started` None in a line of an older specdeploy, `holder=root@ctl:123`)."""
    fields = {}
    first = text.strip().splitlines()[0] if text.strip() else ""
    try:
        parts = shlex.split(first)
    except ValueError:  # not a line this module wrote (an unbalanced quote): read it plainly
        parts = first.split()
    for part in parts:
        if "=" in part:
            key, value = part.split("=", 1)
            fields[key] = value
    holder = fields.get("holder", "")
    process, _, node = holder.partition("/")
    who, _, pid = process.rpartition(":")
    fields["who"], fields["pid"] = who or process, int(pid) if pid.isdigit() else None
    fields["controlhost"] = fields["who"].split("@", 1)[-1]
    machine, _, started = node.partition("/")
    fields["machine"], fields["started"] = machine or None, started or None
    return fields


def parse_time(text: str | None) -> datetime | None:
    try:
        return datetime.strptime(text or "", ISO).replace(tzinfo=UTC)
    except ValueError:
        return None


def describe(fields: dict) -> str:
    lease = f", lease until {fields['expires']}" if fields.get("expires") else ""
    pid = f"pid {fields.get('pid')}"
    if fields.get("machine"):
        pid += f", control node {fields['machine']}"
    return f"{fields.get('who')} ({pid}, since {fields.get('since')}{lease})"


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def holder_running(pid: int, started: str | None) -> bool:
    """The holder process runs on this control node: its pid runs and started when the lock says
    (a pid given to a process started since is not the holder). Where the start cannot be compared
    (no /proc), a running pid counts as the holder."""
    if not pid_alive(pid):
        return False
    now = process_start(pid)
    if now is None or not (started or "").isdigit():
        return True
    return now == started


def takeover_reason(fields: dict, now: datetime | None, *, here: str | None = None,
                    machine: str | None = None, running=None) -> str | None:  # fmt: skip
    """Why someone else's lock may be taken over, or None (it holds). `now`: the host's clock.
    A process of this control node (its machine key and name) that still runs keeps its lock
    whatever its lease says (it is alive: it renews); one that is gone, or a lease that expired
    (from any control node), is taken over. A line of an older specdeploy names no machine: its
    pid cannot be judged here (another control node may share this one's name), only its lease."""
    here, machine = here or control_host(), machine or machine_key()
    running = running or holder_running
    pid = fields.get("pid")
    if fields.get("machine") == machine and fields.get("controlhost") == here and pid:
        if running(pid, fields.get("started")):
            return None
        return "that process is no longer running on this control host"
    expires = parse_time(fields.get("expires"))
    if expires is not None and now is not None and expires <= now:
        return f"its lease expired at {fields['expires']} (host clock {now.strftime(ISO)})"
    return None


def peek_command(lock_path: str, *, parent: str = LOCK_PARENT_DIR) -> str:
    """Planning time: the lock's line and the host's clock, never through a symlink (the line of
    a planted link's target is not read, nor shown)."""
    directory = lock_path.rsplit("/", 1)[0]
    path = shlex.quote(lock_path)
    checks = " ".join(
        f"if [ -L {p} ]; then echo {shlex.quote(REFUSED)} {p} is a symbolic link; exit 0; fi;"
        for p in (shlex.quote(q) for q in dict.fromkeys([parent, directory, lock_path]))
    )
    return (
        f"{checks} if [ -f {path} ]; then head -n 1 {path}; "
        f"echo {HOST_NOW} $(date -u +{ISO}); fi; true"
    )


def read_lock(cfg: ServeConfig) -> tuple[dict | None, datetime | None]:
    """(the lock's fields, or {"refused": why}, or None when free; the host's clock)."""
    text = sh(peek_command(cfg.lock_path), check=False).strip()
    if text.startswith(REFUSED):
        return {"refused": text[len(REFUSED) :].strip()}, None
    line, now = split_answer(text)
    return (parse_holder(line) if line.strip() else None), now


REFUSED = "SPECDEPLOY-LOCK-REFUSED:"
ACQUIRED = "ACQUIRED"
RENEWED = "RENEWED"
HOST_NOW = "SPECDEPLOY-HOST-NOW:"

# Locks this process took, per host name (path -> its line without the expiry): released by
# release_now and by the failure hook, renewed by renew_held.
_HELD: dict[str, dict[str, str]] = {}
# When each of them runs out by the control node's clock, judged early (taken before the command
# that set it ran), and the lease it was given: (host name, path) -> (monotonic deadline, seconds).
_LEASES: dict[tuple[str, str], tuple[float, int]] = {}
# Hosts whose lock a renewal found taken over: their turn stops before any change.
_LOST: dict[str, str] = {}
# One renewal or release at a time per host (pyinfra's greenlets: a host's own turn and another
# host's renewal of it would race on the lock's `.renew` file).
_GUARDS: dict[str, threading.RLock] = {}


def _guard(name: str) -> threading.RLock:
    return _GUARDS.setdefault(name, threading.RLock())


def _expiry(lease_s: int | None) -> str:
    """Shell: `exp` set to the host's now + lease_s, ISO UTC (empty without a lease)."""
    if lease_s is None:
        return "exp=; "
    return f'exp=" expires=$(date -u -d "@$(( $(date +%s) + {int(lease_s)} ))" +{ISO})"; '


def _write_line(line: str) -> str:
    return f"printf '%s%s\\n' {shlex.quote(line)} \"$exp\""


def acquire_command(
    lock_path: str, line: str, *, lease_s: int | None = None, parent: str = LOCK_PARENT_DIR
) -> str:
    """The host command that takes the lock: prints ACQUIRED, or the holder's line, or REFUSED
    with why. The directory is made root-owned 0700 here (so only root can create anything in it),
    and a symlink anywhere on the way is refused, never followed; `set -C` opens with O_EXCL,
    which fails on an existing file and on a symlink alike. With `lease_s` the line gets
    `expires=` (the host's clock); a held lock's line is followed by the host's clock."""
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
    # an existing directory someone else made is refused, not taken back: `install -d` would
    # chown it silently, and what was planted inside could not be trusted
    owned = (
        f'[ "$(stat -c %u:%a {lock_dir})" = 0:700 ] || '
        f"{{ {refuse} {lock_dir} is $(stat -c %U:%a {lock_dir}), not root:700; exit 0; }}"
    )
    parent_owned = (
        f'[ "$(stat -c %u {parent})" = 0 ] && [ -z "$(find {parent} -maxdepth 0 -perm /022)" ] || '
        f"{{ {refuse} {parent} is $(stat -c %U:%a {parent}), not root-owned and closed to "
        "others; exit 0; }"
    )
    return (
        f"{checks} if [ -e {parent} ]; then {parent_owned}; fi; "
        f"if [ -e {lock_dir} ]; then {owned}; fi; "
        f"{make_dirs} || {{ {refuse} cannot create {lock_dir} as root; exit 0; }}; "
        f"{owned}; {_expiry(lease_s)}"
        f"if ( set -C; {_write_line(line)} > {path} ) 2>/dev/null; "
        f"then echo {ACQUIRED}; "
        f"elif [ -L {path} ] || [ ! -f {path} ]; then {refuse} {path} is not a regular file; "
        f"else head -n 1 {path}; echo {HOST_NOW} $(date -u +{ISO}); fi"
    )


def renew_command(lock_path: str, holder: str, line: str, lease_s: int) -> str:
    """Rewrite the lock's expiry if (and only if) it is a regular file naming `holder`: a new file
    (O_EXCL) renamed over it, so a reader never sees half a line; prints RENEWED, or the line of
    whoever holds it now."""
    path, me = shlex.quote(lock_path), shlex.quote(f"holder={holder} ")
    new = shlex.quote(lock_path + ".renew")
    return (
        f"{_expiry(lease_s)}"
        f"if [ -f {path} ] && [ ! -L {path} ] && grep -qF -- {me} {path}; then rm -f {new} && "
        f"( set -C; {_write_line(line)} > {new} ) && mv -f {new} {path} && echo {RENEWED}; "
        f"else head -n 1 {path} 2>/dev/null; true; fi"
    )


def remove_if_unchanged_command(lock_path: str, seen: str) -> str:
    """Remove a stale lock only if its line is still the one judged stale (another deploy taking
    it over at the same moment has written its own)."""
    path = shlex.quote(lock_path)
    return (
        f'if [ -f {path} ] && [ ! -L {path} ] && [ "$(head -n 1 {path})" = {shlex.quote(seen)} ]; '
        f"then rm -f {path}; fi"
    )


def release_command(lock_path: str, holder: str) -> str:
    """Remove the lock only when it is a regular file (not a link) naming `holder`."""
    path, me = shlex.quote(lock_path), shlex.quote(f"holder={holder} ")
    return f"if [ -f {path} ] && [ ! -L {path} ] && grep -qF -- {me} {path}; then rm -f {path}; fi"


def split_answer(text: str) -> tuple[str, datetime | None]:
    """The acquire command's answer for a held lock: (its line, the host's clock)."""
    lines, now = [], None
    for entry in text.strip().splitlines():
        if entry.startswith(HOST_NOW):
            now = parse_time(entry[len(HOST_NOW) :].strip())
        else:
            lines.append(entry)
    return (lines[0] if lines else ""), now


def try_acquire(cfg: ServeConfig) -> dict | None:
    """Take the lock; None when taken, else the holder's fields (lock held by someone else), or
    {"refused": why} when the lock's place is not what root alone controls."""
    me = holder_id()
    line = shlex.join([f"holder={me}", f"since={utc_iso()}", f"host={host.name}"])
    lease = lease_seconds(cfg)
    command = acquire_command(cfg.lock_path, line, lease_s=lease)
    fields: dict = {}
    for _ in range(2):
        deadline = time.monotonic() + lease
        _ok, out, _ = sh_status(command)
        text = out.strip()
        if text == ACQUIRED:
            _hold(cfg.lock_path, line, deadline, lease)
            return None
        if text.startswith(REFUSED):
            return {"refused": text[len(REFUSED) :].strip()}
        seen, now = split_answer(text)
        fields = parse_holder(seen) if seen else {}
        if fields.get("holder") == me:  # re-entrant: this process already holds it
            _hold(cfg.lock_path, _without_expiry(seen), _deadline(fields, now), lease)
            return None
        reason = takeover_reason(fields, now) if fields else None
        if reason:
            logger.warning(
                f"{host.print_prefix}taking over the deploy lock {cfg.lock_path} of "
                f"{describe(fields)}: {reason}"
            )
            sh(remove_if_unchanged_command(cfg.lock_path, seen))
            continue
        return fields
    return fields


def _hold(path: str, line: str, deadline: float, lease: int) -> None:
    """Register a lock this process holds on the current host (its line without the expiry): it
    is renewed with the others (renew_held, renew_waiting) and released on failure."""
    _HELD.setdefault(host.name, {})[path] = line
    _LEASES[host.name, path] = (deadline, lease)


def _without_expiry(line: str) -> str:
    return re.sub(r" expires=\S*$", "", line)


def _deadline(fields: dict, now: datetime | None) -> float:
    """When a lock found already ours runs out by the control node's clock: what its line leaves
    by the host's clock; not known: now (due at the next renewal)."""
    expires = parse_time(fields.get("expires"))
    left = (expires - now).total_seconds() if expires and now else 0.0
    return time.monotonic() + max(0.0, left)


def renew_held(seconds: int) -> None:
    """Execution time: every lock this process holds on the current host lasts `seconds` more
    (step_lease), and so does each lock it holds on another host of the run whose lease is half
    spent (renew_waiting). Raises LockLost when this host's was taken over meanwhile: the caller
    stops before it changes anything more."""
    if not _HELD:
        return  # nothing taken by this process (a measurement's unit tests, say)
    with _guard(host.name):
        if host.name in _LOST:
            raise LockLost(_LOST[host.name])
        for path in sorted(_HELD.get(host.name, {})):
            _renew_one(path, int(seconds))
    renew_waiting()


def _renew_one(path: str, seconds: int) -> None:
    """Renew one lock of the current host (its guard held); LockLost when it is not ours now."""
    line = _HELD[host.name][path]
    deadline = time.monotonic() + seconds
    out = sh(renew_command(path, holder_id(), line, seconds))
    if out.strip() == RENEWED:
        _LEASES[host.name, path] = (deadline, seconds)
        return
    _HELD[host.name].pop(path, None)
    _LEASES.pop((host.name, path), None)
    who = describe(parse_holder(out)) if out.strip() else "nobody (it was removed)"
    _LOST[host.name] = (
        f"{host.name}: the deploy lock {path} is no longer this deploy's: its lease ran "
        f"out and it is now held by {who}. Nothing more was changed here; run again when "
        "that deploy is done (raise lock_lease_s if a step takes longer than the lease)"
    )
    raise LockLost(_LOST[host.name])


def leases_due(now: float | None = None) -> list[tuple[str, str]]:
    """(host name, path) of the locks this process holds elsewhere than on the current host whose
    lease has less than half left: a waiting host's lock must not run out before its turn."""
    now = time.monotonic() if now is None else now
    return sorted(
        (name, path)
        for name, paths in _HELD.items()
        if name != host.name
        for path in paths
        if (lease := _LEASES.get((name, path))) and lease[0] - now < lease[1] / 2
    )


def renew_waiting() -> list[str]:
    """Renew, each through its own host's connection, the locks leases_due names, for as long as
    they were given. A host that does not answer or whose lock was taken over is only warned
    about here: its own turn renews first and stops there (LockLost). Returns the renewed hosts."""
    renewed = []
    for name, path in leases_due():
        other = host.state.inventory.get_host(name)
        with _guard(name), ctx_host.use(other):
            if path not in _HELD.get(name, {}):
                continue  # released meanwhile (its turn ended)
            try:
                _renew_one(path, _LEASES[name, path][1])
                renewed.append(name)
            except Exception as error:  # LockLost, or the host is unreachable
                logger.warning(f"{other.print_prefix}deploy lock lease not renewed: {error}")
    if renewed:
        shown = ", ".join(renewed[:5]) + (" ..." if len(renewed) > 5 else "")
        logger.info(f"{host.print_prefix}renewed the deploy lock of waiting host(s): {shown}")
    return renewed


def release_path(lock_path: str) -> None:
    """Remove the lock at `lock_path` on the current host if (and only if) this process holds it."""
    with _guard(host.name):
        sh(release_command(lock_path, holder_id()), check=False)
        _HELD.get(host.name, {}).pop(lock_path, None)
        _LEASES.pop((host.name, lock_path), None)


def release_now(cfg: ServeConfig) -> None:
    """Remove the lock if (and only if) this process holds it."""
    release_path(cfg.lock_path)


class ReleaseOnFailure(BaseStateCallback):
    """pyinfra's failure hook for the lock: when any operation fails on a host (and the failure is
    not ignored), the lock this process took there is removed at once. pyinfra runs no later
    operation on a failed host, so the deploy's last operation (`release`) would never come."""

    @staticmethod
    def operation_host_error(state, host, op_hash, retry_count: int = 0, max_retries: int = 0):
        try:
            arguments = state.get_op_data_for_host(host, op_hash).global_arguments
            if arguments.get("_ignore_errors") or arguments.get("_continue_on_error"):
                return  # the deploy goes on on this host: it still needs its lock
        except Exception:
            pass
        if os.environ.get(notes.ROLLOUT_REPORT_ENV):  # under `specdeploy rollout`
            try:
                what = ", ".join(sorted(state.get_op_meta(op_hash).names)) or op_hash
            except Exception:
                what = op_hash
            # the host's note, unless its step left a truer one first (a rollback, a hold-back)
            cause = f"{host.name}: operation failed: {what} (see pyinfra's output)"
            entry = {"host": host.name, "cause": cause, "rolled_back": False}
            after = notes.after_failed_operation(host.name)
            notes.note({**entry, "after": after} if after else entry, first_only=True)
        held = sorted(_HELD.get(host.name, ()))
        if not held:
            return
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
            f"{host.name}: deploy lock: {fields['refused']}, so it was refused and not followed "
            "(nothing was read or written through it, nothing on the host changed) — someone "
            f"other than root made it: find out who, remove it as root (`rm {cfg.lock_path}`; "
            f"the directory must be root's, mode 0700), and run again"
        )
    return (
        f"{host.name}: deploy lock: another deploy holds {cfg.lock_path}: {describe(fields)} — "
        "wait for it to finish (or for its lease to run out); if that deploy is gone, remove the "
        f"lock: `specdeploy unlock INVENTORY --limit {host.name}` (or `rm {cfg.lock_path}` on "
        "the host)"
    )


@operation()
def acquire(cfg: ServeConfig):
    """First operation of a deploy: take the host's deploy lock (reports no change)."""
    install_failure_hook(host.state)
    if not host.state.is_executing:
        fields, now = read_lock(cfg)  # a warning only: the lock is taken at execution time
        if fields and fields.get("holder") != holder_id() and not takeover_reason(fields, now):
            logger.warning(f"{host.print_prefix}{held_message(cfg, fields)}")
        host.noop(f"deploy lock {cfg.lock_path} is taken when the deploy runs")
        return
    fields = try_acquire(cfg)
    if fields is not None:
        yield StringCommand(f"echo {shlex.quote(held_message(cfg, fields))} >&2; exit 75")
        return
    host.noop(f"deploy lock {cfg.lock_path} is this deploy's")


@operation()
def renew(seconds: int):
    """Before a step longer than the lease (pip install, a download): the locks this process holds
    here last `seconds` more (reports no change)."""
    if host.state.is_executing:
        renew_held(seconds)
        host.noop(f"deploy lock lease: {seconds} s from now")
    else:
        host.noop(f"deploy lock lease: {seconds} s from when this runs")
    return
    yield  # a generator that yields nothing


@operation()
def release(cfg: ServeConfig):
    """Last operation of a deploy: drop the lock (reports no change)."""
    if host.state.is_executing:
        release_now(cfg)
        notes.note({"host": host.name, "done": True}, first_only=True)  # every step of it ran
        host.noop(f"deploy lock {cfg.lock_path} released (if this deploy held it)")
    else:
        host.noop(f"deploy lock {cfg.lock_path} is released when the deploy ends")
    return
    yield  # a generator that yields nothing


@contextmanager
def held(cfg: ServeConfig):
    """The frame of every deploy that may take a server out of service: the lock is its first
    operation and its release the last (planning time: what runs between is scheduled inside).
    Its connection is kept alive meanwhile: the host may wait hours for its turn."""
    keep_alive(cfg.ssh_keepalive_s)
    acquire(name="Take the host's deploy lock", cfg=cfg)
    yield
    release(name="Release the host's deploy lock", cfg=cfg)
