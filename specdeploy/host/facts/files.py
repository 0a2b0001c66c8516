"""A file on the host: its JSON, its text, its sha1. Each command prints its own failure instead
of exiting non-zero where the file is simply not there, so "missing" is a value."""

from __future__ import annotations

import shlex

from specdeploy.host.facts.base import Fact, json_or_none


class JsonFile(Fact):
    """A JSON document on the host (e.g. the deployment record), or None."""

    def command(self, path: str) -> str:
        # missing: no output (None); present but unreadable: the fact fails, never "nothing there"
        return f"if [ -e {shlex.quote(path)} ]; then cat {shlex.quote(path)}; fi"

    def process(self, output):
        return json_or_none(output)


class FileText(Fact):
    """A text file's content, or None."""

    def command(self, path: str) -> str:
        return f"if [ -e {shlex.quote(path)} ]; then cat {shlex.quote(path)}; fi"

    def process(self, output):
        return "\n".join(output) if output else None


class FileSha1(Fact):
    """A file's sha1, "missing", or "unreadable" (root-only without sudo, or no output)."""

    def command(self, path: str) -> str:
        p = shlex.quote(path)
        return (
            f"if [ -e {p} ]; then {{ sha1sum {p} 2>/dev/null || echo unreadable; }}"
            " | cut -d' ' -f1; else echo missing; fi"
        )

    def process(self, output):
        return output[-1].strip() if output else "unreadable"
