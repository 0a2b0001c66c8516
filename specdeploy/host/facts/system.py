"""The machine's room: free disk under a path (`df`) and memory (`/proc/meminfo`)."""

from __future__ import annotations

import shlex

from specdeploy.host.facts.base import Fact


class FreeDiskBytes(Fact):
    """Free bytes on the filesystem holding `path` (or its nearest existing parent); 0: unread."""

    def command(self, path: str) -> str:
        return (
            f'p={shlex.quote(path)}; while [ ! -e "$p" ]; do p=$(dirname "$p"); done; '
            'df -Pk "$p" | tail -n 1'
        )

    def process(self, output):
        return int(output[-1].split()[3]) * 1024 if output else 0


class MemoryBytes(Fact):
    """MemTotal and MemAvailable in bytes."""

    def command(self) -> str:
        return "grep -E '^(MemTotal|MemAvailable):' /proc/meminfo"

    def process(self, output):
        values = {} if output else {"MemTotal": 0, "MemAvailable": 0}  # unread: the check refuses
        for line in output:
            name, amount = line.split(":")
            values[name] = int(amount.split()[0]) * 1024
        return {"total": values["MemTotal"], "available": values["MemAvailable"]}
