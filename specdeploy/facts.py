"""Custom pyinfra facts: what is on a host right now, read without changing anything."""

from __future__ import annotations

import json
import shlex

from pyinfra.api import FactBase

from .host_scripts import source


def _json_or_none(output: list[str]):
    text = "\n".join(output).strip()
    return json.loads(text) if text else None


class VllmVersion(FactBase):
    """The installed version of the vLLM distribution in a venv, or None."""

    def command(self, venv: str, package: str) -> str:
        code = f"import importlib.metadata as m; print(m.version({package!r}))"
        python = shlex.quote(f"{venv}/bin/python")
        return f"if [ -x {python} ]; then {python} -c {shlex.quote(code)} 2>/dev/null || true; fi"

    def process(self, output):
        text = "\n".join(output).strip()
        return text or None


class ModelSnapshot(FactBase):
    """Facts about a complete model snapshot in the host's HF cache (config, vocab, weight bytes)."""

    def command(self, hf_home: str, repo: str, revision: str) -> str:
        args = " ".join(shlex.quote(a) for a in (hf_home, repo, revision))
        return f"python3 -c {shlex.quote(source('model_facts'))} {args}"

    def process(self, output):
        return _json_or_none(output)


class AcceleratorMemory(FactBase):
    """Total memory of each NVIDIA GPU in bytes; an empty list on hosts without one."""

    def command(self) -> str:
        return (
            "command -v nvidia-smi >/dev/null && "
            "nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits || true"
        )

    def process(self, output):
        return [int(float(line.strip())) * 1024 * 1024 for line in output if line.strip()]


class FreeDiskBytes(FactBase):
    """Free bytes on the filesystem that holds `path` (or its nearest existing parent)."""

    def command(self, path: str) -> str:
        return (
            f'p={shlex.quote(path)}; while [ ! -e "$p" ]; do p=$(dirname "$p"); done; '
            'df -Pk "$p" | tail -n 1'
        )

    def process(self, output):
        return int(output[-1].split()[3]) * 1024


class MemoryBytes(FactBase):
    """MemTotal and MemAvailable in bytes."""

    def command(self) -> str:
        return "grep -E '^(MemTotal|MemAvailable):' /proc/meminfo"

    def process(self, output):
        values = {}
        for line in output:
            name, amount = line.split(":")
            values[name] = int(amount.split()[0]) * 1024
        return {"total": values["MemTotal"], "available": values["MemAvailable"]}


class JsonFile(FactBase):
    """A JSON document on the host (e.g. the deployment record), or None."""

    def command(self, path: str) -> str:
        # missing: no output (None); present but unreadable: the fact fails, never "nothing there"
        return f"if [ -e {shlex.quote(path)} ]; then cat {shlex.quote(path)}; fi"

    def process(self, output):
        return _json_or_none(output)


class FileText(FactBase):
    """A text file's content, or None."""

    def command(self, path: str) -> str:
        return f"if [ -e {shlex.quote(path)} ]; then cat {shlex.quote(path)}; fi"

    def process(self, output):
        return "\n".join(output) if output else None


class ServiceActive(FactBase):
    """`systemctl is-active UNIT` (active, inactive, failed, activating...)."""

    def command(self, unit: str) -> str:
        return f"systemctl is-active {shlex.quote(unit)} || true"

    def process(self, output):
        return output[-1].strip() if output else "unknown"
