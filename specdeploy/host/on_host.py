"""The one way deploy code touches the current host outside pyinfra operations and facts.

pyinfra applies the privilege settings of host data (`_sudo`, `_sudo_user`, `_sudo_password`,
`_su_user`, ...) to operations and facts, but not to `host.run_shell_command`, `host.put_file` or
`host.get_file` called from `python.call` callbacks. Every callback of specdeploy (health, smoke,
compare, tune, gate, rollback, the lock, the record) goes through the functions here instead, which
pass those settings on; so a fleet reached as a non-root deploy user with sudo behaves like root.

* `sh` runs a shell command and returns stdout; a failure raises HostCommandError with the output.
* `read_text` returns a file's text; a missing file is None only with `missing_ok`, and a file that
  cannot be read is always an error, never "nothing there".
* `write_text` writes a file atomically, its content on stdin (never argv, never a temp file
  readable by anyone but root), then sets owner and mode before it is moved into place.
"""

from __future__ import annotations

import re
import shlex

from pyinfra import host
from pyinfra.api.arguments import CONNECTOR_ARGUMENT_KEYS, pop_global_arguments

# Connector arguments that are about one command, not about who runs it.
_PER_COMMAND = {"_stdin", "_timeout", "_get_pty", "_success_exit_codes"}
_MISSING = "specdeploy: no such file"  # read_text's marker on stderr for a missing file


class HostCommandError(RuntimeError):
    pass


def privilege_arguments() -> dict:
    """The host's sudo/su/doas settings (and shell/env settings) from its data, as pyinfra's own
    argument resolution computes them for an operation on this host."""
    arguments, _ = pop_global_arguments(host.state, host, {})
    return {
        key: value
        for key, value in arguments.items()
        if key in CONNECTOR_ARGUMENT_KEYS and key not in _PER_COMMAND
    }


def sh_status(command: str, *, stdin: str | None = None, timeout: int | None = None):
    """(ok, stdout, combined output) of one shell command, with the host's privilege settings."""
    extra = {"_stdin": stdin} if stdin is not None else {}
    if timeout is not None:
        extra["_timeout"] = timeout
    ok, output = host.run_shell_command(command=command, **privilege_arguments(), **extra)
    return ok, output.stdout, output


def sh(command: str, *, check: bool = True, stdin: str | None = None, timeout: int | None = None):
    """Run `command` on the host (as root under `_sudo`); its stdout. Raises HostCommandError when
    it fails and `check` is true."""
    ok, stdout, output = sh_status(command, stdin=stdin, timeout=timeout)
    if check and not ok:
        shown = command if len(command) < 300 else command[:300] + " ..."
        raise HostCommandError(f"{host.name}: `{shown}` failed:\n{output.stderr[-4000:]}")
    return stdout


TIMED_OUT = 124  # coreutils timeout's exit status when it stopped the command
KILL_AFTER_S = 30  # SIGTERM first; SIGKILL this long after, for a process that ignores it
TIME_LIMIT_GRACE_S = 60  # pyinfra's own limit on top of the host's, for a connection that hangs


def keep_alive(seconds: int) -> bool:
    """SSH keepalive every `seconds` on the current host's open connection (pyinfra's SSH connector
    sets one only from ssh_config's ServerAliveInterval). False where there is no SSH transport
    (the local or a docker connector, or not connected)."""
    client = getattr(host.connector, "client", None)
    transport = client.get_transport() if client is not None else None
    if transport is None or not seconds:
        return False
    transport.set_keepalive(seconds)
    return True


def with_time_limit(command: str, seconds: int, message: str) -> str:
    """`command` stopped on the host after `seconds` (coreutils `timeout`, so the process dies with
    the limit rather than outliving a dropped connection), then `message` on stderr and exit 124.
    Its stdin is the command's."""
    return (
        f"timeout -k {KILL_AFTER_S} {int(seconds)} sh -c {shlex.quote(command)} || {{ rc=$?; "
        f"if [ $rc -eq {TIMED_OUT} ]; then printf '%s\\n' {shlex.quote(message)} >&2; fi; "
        "exit $rc; }"
    )


def read_text(path: str, *, missing_ok: bool = False) -> str | None:
    """A file's text. None when it does not exist and `missing_ok`; any other failure raises."""
    quoted = shlex.quote(path)
    command = (
        f"if [ -e {quoted} ]; then cat {quoted}; else echo {shlex.quote(_MISSING)} >&2; exit 3; fi"
    )
    ok, stdout, output = sh_status(command)
    if ok:
        return stdout + "\n" if stdout else ""  # pyinfra hands output over line by line
    if missing_ok and output.stderr.strip() == _MISSING:
        return None
    raise HostCommandError(f"{host.name}: cannot read {path}: {output.stderr.strip()}")


def write_text(
    path: str, text: str, *, mode: str = "644", owner: str = "root", group: str = "root"
) -> None:
    """Write `text` to `path` atomically: a private temp file beside it (umask 077), content on
    stdin, owner and mode set, then one `mv`. A reader sees the old file or the new one."""
    if not re.fullmatch(r"[0-7]{3,4}", mode):
        raise ValueError(f"bad mode {mode!r}")
    directory, quoted = shlex.quote(path.rsplit("/", 1)[0] or "/"), shlex.quote(path)
    owner_group = shlex.quote(f"{owner}:{group}")
    sh(
        f"umask 077 && tmp=$(mktemp -p {directory} .specdeploy.XXXXXX) && "
        f'cat > "$tmp" && chown {owner_group} "$tmp" && chmod {mode} "$tmp" && '
        f'mv -f "$tmp" {quoted} || {{ rm -f "$tmp"; exit 1; }}',
        stdin=text,
    )


def journal_command(unit: str, lines: int = 600, *, whole_unit: bool = False) -> str:
    """The unit's journal of its last invocation only (earlier runs' errors would mislead), or of
    the unit as a whole when systemd names no invocation (or `whole_unit`)."""
    quoted = shlex.quote(unit)
    options = f"-n {lines} --no-pager -o cat"
    if whole_unit:
        return f"journalctl -u {quoted} {options}"
    return (
        f"id=$(systemctl show -p InvocationID --value {quoted} 2>/dev/null); "
        f'if [ -n "$id" ]; then journalctl _SYSTEMD_INVOCATION_ID="$id" {options}; '
        f"else journalctl -u {quoted} {options}; fi"
    )


def journal_tail(unit: str, lines: int = 20, errors: int = 20, *, restarted: bool) -> str:
    """The unit's last invocation, summarised for a failure message (`summarize_journal`). Under
    Restart=on-failure the last invocation may be a restart that has not failed yet: when the unit
    `restarted` and that invocation holds no exception, the unit's whole recent journal is read
    instead. A unit that did not restart is its last invocation alone: an exception of an earlier
    run of the unit is not this failure's root cause. Every caller says which it is."""
    _ok, stdout, _ = sh_status(journal_command(unit))
    text = stdout.splitlines()
    if restarted and root_cause(text) is None:
        _ok, stdout, _ = sh_status(journal_command(unit, whole_unit=True))
        text = stdout.splitlines() or text
    return summarize_journal(text, lines, errors)


def summarize_journal(text: list[str], lines: int = 20, errors: int = 20) -> str:
    """vLLM's own refusal first (the first exception line that is not a wrapper such as "Engine core
    initialization failed. See root cause above"), then the last `errors` error lines from further
    back, then the last `lines` lines: the root cause usually sits above a long traceback."""
    last = text[-lines:]
    earlier = [line for line in text[:-lines] if ERROR_LINE.search(line) and "  File " not in line][
        -errors:
    ]
    cause = root_cause(text)
    parts = [f"[root cause] {cause}"] if cause else []
    if earlier:
        parts += ["[earlier errors]", *earlier]
    return "\n".join([*parts, "[last lines]", *last] if parts else last)


def root_cause(text: list[str]) -> str | None:
    """The exception vLLM raised first in these journal lines (`ValueError: ...`,
    `torch.OutOfMemoryError: ...`), without its process and logger prefix; a wrapper exception only
    when there is nothing else."""
    found = [m.group(1) for m in map(EXCEPTION_LINE.match, text) if m]
    specific = [line for line in found if not any(w in line for w in WRAPPER_EXCEPTIONS)]
    return (specific or found or [None])[0]


# Any line worth showing from further back: a logger's ERROR, an exception line (`ValueError:`,
# `torch.OutOfMemoryError:`, no word boundary inside those names), or a tool's `error:`.
ERROR_LINE = re.compile(r"\bERROR\b|\w*(Error|Exception):|\berror:")
# A line that is an exception, after vLLM's "(EngineCore pid=N) " and "ERROR date time [file:line] "
# prefixes; mentions inside a message (a WARNING naming `OSError: ...`) do not count.
EXCEPTION_LINE = re.compile(
    r"^(?:\(\S+ pid=\d+\)\s+)?(?:(?:ERROR|CRITICAL)\s+\S+\s+\S+\s+\[[^\]]*\]\s+)?"
    r"((?:[A-Za-z_]\w*\.)*\w*(?:Error|Exception): .+)$"
)
# Exceptions that point elsewhere for their cause.
WRAPPER_EXCEPTIONS = ("See root cause above",)
