"""Small helpers for running commands on the current host inside python.call callbacks."""

from __future__ import annotations

import re
import shlex

from pyinfra import host


class RemoteError(RuntimeError):
    pass


def run(command: str, *, check: bool = True) -> str:
    ok, output = host.run_shell_command(command=command)
    if check and not ok:
        raise RemoteError(f"{host.name}: `{command[:200]}` failed:\n{output.output[-4000:]}")
    return output.stdout


ERROR_LINE = re.compile(r"\b(ERROR|Error|Exception|error:)")


def journal_tail(unit: str, lines: int = 20, errors: int = 20) -> str:
    """The unit's last `lines` journal lines, preceded by the last `errors` error lines from further
    back: vLLM's root cause usually sits above a long traceback."""
    ok, output = host.run_shell_command(
        command=f"journalctl -u {shlex.quote(unit)} -n 600 --no-pager -o cat"
    )
    text = output.stdout_lines
    last = text[-lines:]
    earlier = [line for line in text[:-lines] if ERROR_LINE.search(line) and "  File " not in line][
        -errors:
    ]
    if not earlier:
        return "\n".join(last)
    return "\n".join(["[earlier errors]", *earlier, "[last lines]", *last])


def with_env_file(env_file: str, command: str) -> str:
    """Run `command` with the root-only env file's secrets exported (they never touch argv)."""
    path = shlex.quote(env_file)
    return f"set -a; [ -f {path} ] && . {path}; set +a; {command}"
