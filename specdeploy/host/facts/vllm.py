"""What a host has for vLLM: the installed release in a venv and the model snapshots in its HF
cache."""

from __future__ import annotations

import re
import shlex

from specdeploy.host.facts.base import Fact, json_or_none
from specdeploy.host.scripts import source


class VllmVersion(Fact):
    """The installed version of the vLLM distribution in a venv, or None."""

    def command(self, venv: str, package: str) -> str:
        code = f"import importlib.metadata as m; print(m.version({package!r}))"
        python = shlex.quote(f"{venv}/bin/python")
        return f"if [ -x {python} ]; then {python} -c {shlex.quote(code)} 2>/dev/null || true; fi"

    def process(self, output):
        return "\n".join(output).strip() or None


class PythonVersion(Fact):
    """The interpreter a release's venv runs on: the venv's own python where the venv is there,
    else the host's `python3` (the install makes the venv with `python3 -m venv`): {"version":
    "3.12.3", "executable": "/usr/bin/python3"}, or None where neither runs."""

    def command(self, venv: str) -> str:
        code = 'import sys; print("%d.%d.%d" % sys.version_info[:3], sys.executable)'
        python = shlex.quote(f"{venv}/bin/python")
        return (
            f'p={python}; [ -x "$p" ] || p=python3; "$p" -c {shlex.quote(code)} 2>/dev/null || true'
        )

    def process(self, output):
        words = "\n".join(output).split(maxsplit=1)
        if not words or not re.fullmatch(r"\d+\.\d+\.\d+", words[0]):
            return None
        return {"version": words[0], "executable": words[1].strip() if len(words) > 1 else ""}


class ModelSnapshot(Fact):
    """A complete model snapshot in the host's HF cache (config, vocab, weight bytes), or None."""

    def command(self, hf_home: str, repo: str, revision: str) -> str:
        args = " ".join(shlex.quote(a) for a in (hf_home, repo, revision))
        return f"python3 -c {shlex.quote(source('model_facts'))} {args}"

    def process(self, output):
        return json_or_none(output)
