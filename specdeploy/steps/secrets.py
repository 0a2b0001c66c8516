"""Secret files on the host (the server's env file, the download token), root:root 0600.

`files.put` would not do: under `_sudo` it stages the file in a temp path as the SSH user, and
`--diff` prints old and new content. Here the content travels on stdin of one root command that
writes a private temp file and moves it into place (`on_host.write_text`); the operation compares
checksums, so it changes (and restarts what depends on it) only when the secret changed. No value
reaches argv, pyinfra's output at any verbosity, or a file another user can read.

The checksum compared is that of the text as it lands on the host (`as_written`): pyinfra ends
every stdin line with a newline, so a token without one is stored with one. Comparing against the
bare value made the token file "change" on every run.
"""

from __future__ import annotations

import hashlib
import shlex

from pyinfra import host
from pyinfra.api import FunctionCommand, StringCommand, operation
from pyinfra.facts.files import File, Sha1File

from specdeploy.host.on_host import write_text


class Secret:
    """A value that prints as <secret> wherever pyinfra shows an operation's arguments."""

    def __init__(self, value: str):
        self.value = value

    def __repr__(self) -> str:
        return "<secret>"

    __str__ = __repr__


def as_written(value: str) -> str:
    """The file's exact text once written through stdin (pyinfra adds a final newline)."""
    return value if value.endswith("\n") else value + "\n"


def written_sha1(value: str) -> str:
    return hashlib.sha1(as_written(value).encode()).hexdigest()


def pip_options_text(pip_args: list[str]) -> str | None:
    """pip_install_args as a requirements file pip reads with `-r` (index URLs may hold a token,
    so they never go on a command line, where ps and sudo's log show them); None when there are
    none."""
    return shlex.join(pip_args) if pip_args else None


def env_text(values: dict[str, str | None]) -> str | None:
    """A root-only file of shell assignments a command sources (`. file`), or None when empty."""
    lines = [f"{name}={shlex.quote(value)}" for name, value in values.items() if value]
    return "\n".join(lines) if lines else None


def sourced(path: str | None, command: str) -> str:
    """`command` with the variables of the root-only file at `path` exported into it: the command
    line names the file, never the values."""
    if path is None:
        return command
    return f"set -a && . {shlex.quote(path)} && set +a && {command}"


def _write(path: str, secret: Secret) -> None:
    write_text(path, as_written(secret.value), mode="600")


@operation()
def secret_file(path: str, secret: Secret | None):
    """Ensure `path` holds exactly the secret's text (root:root 0600), or is absent when None."""
    current = host.get_fact(Sha1File, path=path)  # read through root (_sudo), never printed
    if secret is None:
        if current is not None:
            yield StringCommand(f"rm -f {shlex.quote(path)}")
        else:
            host.noop(f"{path} is absent")
        return
    if current != written_sha1(secret.value):
        yield FunctionCommand(_write, (path, secret), {})
        return
    info = host.get_fact(File, path=path) or {}
    if (info.get("user"), info.get("group"), info.get("mode")) != ("root", "root", 600):
        quoted = shlex.quote(path)
        yield StringCommand(f"chown root:root {quoted} && chmod 600 {quoted}")
        return
    host.noop(f"{path} is up to date (same sha1, root:root 0600)")
