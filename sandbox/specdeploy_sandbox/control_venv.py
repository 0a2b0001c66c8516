"""The control node's own vLLM venv ($SPECDEPLOY_CACHE/venv-vllm), installed from the sandbox
wheelhouse with the same recipe the hosts use. The model generator and the tests that feed rendered
argv to vLLM's own parser run in it."""

from __future__ import annotations

import fcntl
import os
import subprocess
from pathlib import Path

from specdeploy.capabilities import alias_for
from specdeploy.steps.install import install_commands

from . import wheelhouse

PACKAGE, VERSION = wheelhouse.PINNED_RELEASE.split("==")


def venv_dir(cache_dir: str | os.PathLike | None = None) -> Path:
    return Path(cache_dir or wheelhouse.cache_dir_default()) / "venv-vllm"


def _version(python: Path, dist: str) -> str | None:
    code = f"import importlib.metadata as m; print(m.version({dist!r}))"
    result = subprocess.run([str(python), "-c", code], capture_output=True, text=True)
    return result.stdout.strip() if result.returncode == 0 else None


def ensure(cache_dir: str | os.PathLike | None = None) -> Path:
    """Returns the venv's python, installing or repairing the venv when needed (idempotent)."""
    cache = Path(cache_dir or wheelhouse.cache_dir_default())
    cache.mkdir(parents=True, exist_ok=True)
    # one installer at a time (two fleets coming up, a test beside the model generator): the
    # second finds the venv the first made
    with open(cache / "venv-vllm.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _ensure(cache)


def _ensure(cache: Path) -> Path:
    venv = venv_dir(cache)
    python = venv / "bin" / "python"
    installed = _version(python, PACKAGE) if python.exists() else None
    alias = alias_for(PACKAGE, VERSION)
    if installed == VERSION and (alias is None or _version(python, alias[0]) == alias[1]):
        return python
    wheels = wheelhouse.ensure(cache, requirements=wheelhouse.DEMO_REQUIREMENTS)  # its release
    # --no-compile: pip byte-compiles all 22k files of the release on one core (69 s of a 129 s
    # install here, before the models can train); only root runs this venv, so Python writes the
    # .pyc of what it imports on first use instead (the hosts' venvs are root's and read-only to the
    # server: they keep pip's compile)
    commands = install_commands(
        str(venv),
        PACKAGE,
        VERSION,
        ["--no-compile", "--no-index", "--find-links", str(wheels)],
        pip_install=installed != VERSION,
    )
    subprocess.run(
        ["bash", "-ec", " && ".join(commands)],
        check=True,
        env={**os.environ, "PIP_CONFIG_FILE": "/dev/null"},
    )
    return python
