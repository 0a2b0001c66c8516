"""The one way a test says it needs a tool the machine may lack (promtool, haproxy, socat,
systemd-analyze, Chromium, the docs' Python packages): found, the test runs; missing, it skips on a
developer's machine and FAILS under CI (`CI=true`, which `.ci/run` sets), because CI installs
every tool (`make deps`: `.ci/install-system-deps.sh` and the `test`/`docs` extras), so a missing
one there is a broken setup, never a reason for a green run to prove less.

Use `@pytest.mark.needs_tool("promtool")` on a test or module (`tests/conftest.py` calls
`need_tool` before it runs), or `need_tool(...)` / `need_module(...)` inside a fixture or test that
needs the path or the module. `tests/unit/project/test_tools.py` tests this helper and that no test
skips on a missing tool any other way.
"""

from __future__ import annotations

import importlib
import os
import shutil
from types import ModuleType
from typing import NoReturn

import pytest

# The Debian package that brings each tool (what .ci/install-system-deps.sh installs).
PACKAGES = {
    "promtool": "prometheus",
    "prometheus": "prometheus",
    "haproxy": "haproxy",
    "socat": "socat",
    "systemd-analyze": "systemd",
    "chromium": "chromium",
    "chromium-browser": "chromium",
    "google-chrome": "chromium",
    "systemd-nspawn": "systemd-container",
    "debootstrap": "debootstrap",
    "ip": "iproute2",
    "ssh": "openssh-client",
    "zstd": "zstd",
}
# Daemons such as haproxy install into sbin, which a non-root user's PATH may not hold.
SBIN = os.pathsep.join(("/usr/local/sbin", "/usr/sbin", "/sbin"))
NOT_CI = ("", "0", "false", "no")


def under_ci() -> bool:
    """Whether this run is CI's (`CI` set, as CI services and `.ci/run` set it, and not "false")."""
    return os.environ.get("CI", "").strip().lower() not in NOT_CI


def which(name: str) -> str | None:
    """The tool's path on PATH, or in sbin; None when the machine lacks it."""
    return shutil.which(name) or shutil.which(name, path=SBIN)


def install_hint(name: str) -> str:
    return f"Debian: apt-get install {PACKAGES.get(name, name)}; `make deps` installs it"


def missing(what: str, hint: str) -> NoReturn:
    """Skip the test, or fail it under CI, saying what is missing and how to install it."""
    message = f"{what} missing ({hint})"
    if under_ci():
        pytest.fail(f"{message}: CI installs every tool the tests use", pytrace=False)
    pytest.skip(message)


def need_tool(*names: str, hint: str | None = None) -> str:
    """The path of the first of `names` found (alternative names of one tool: chromium,
    chromium-browser; or an absolute path); skips, or fails under CI, naming the package (or
    `hint`: how to get a tool apt does not bring) when none is found."""
    for name in names:
        found = which(name)
        if found:
            return found
    missing(" or ".join(names), hint or install_hint(names[0]))


def need_module(name: str, hint: str) -> ModuleType:
    """The imported Python module; skips, or fails under CI, when it is not installed."""
    try:
        return importlib.import_module(name)
    except ImportError:
        missing(f"the Python package {name}", hint)
