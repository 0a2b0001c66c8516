"""Small helpers for running commands on the current host inside python.call callbacks."""

from __future__ import annotations

import shlex

from pyinfra import host


class RemoteError(RuntimeError):
    pass


def run(command: str, *, check: bool = True) -> str:
    ok, output = host.run_shell_command(command=command)
    if check and not ok:
        raise RemoteError(f"{host.name}: `{command[:200]}` failed:\n{output.output[-4000:]}")
    return output.stdout


def journal_tail(unit: str, lines: int = 40) -> str:
    ok, output = host.run_shell_command(command=f"journalctl -u {shlex.quote(unit)} -n {lines} --no-pager -o cat")
    return output.output


def with_env_file(env_file: str, command: str) -> str:
    """Run `command` with the root-only env file's secrets exported (they never touch argv)."""
    path = shlex.quote(env_file)
    return f"set -a; [ -f {path} ] && . {path}; set +a; {command}"
