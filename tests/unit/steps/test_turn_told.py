"""A host's turn that fails the way it says (rolled back, held back) fails the host in pyinfra
plainly: its own message once, as an error, no traceback and no 'Unexpected error in Python
callback' — shown with pyinfra itself on @local."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.unit import REPO

DEPLOY = """
from pyinfra import host
from specdeploy.config.schema import config_from_data
from specdeploy.steps import rollback
from tests.unit.conftest import VALID

def turn():
    raise rollback.{kind}("new config failed its health check: restored; the host is healthy again")

def other():
    raise ValueError("a failure nobody explained")

cfg = config_from_data(VALID)
rollback.host_turn(cfg, "Rolling restart", {function})
"""


def run_pyinfra(tmp_path, kind: str, function: str) -> subprocess.CompletedProcess:
    (tmp_path / "deploy.py").write_text(DEPLOY.format(kind=kind, function=function))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    pyinfra = os.path.join(os.path.dirname(sys.executable), "pyinfra")
    return subprocess.run([pyinfra, "-y", "@local", "deploy.py"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip


@pytest.mark.parametrize("kind", ["RolledBack", "HeldBack"])
def test_an_explained_failure_fails_the_host_in_its_own_words(tmp_path, kind):
    result = run_pyinfra(tmp_path, kind, "turn")
    out = result.stdout + result.stderr
    assert result.returncode != 0, out
    assert out.count("restored; the host is healthy again") == 1, out
    assert "Traceback" not in out and "Unexpected error" not in out, out


def test_an_unexplained_failure_keeps_pyinfra_s_traceback(tmp_path):
    result = run_pyinfra(tmp_path, "RolledBack", "other")
    out = result.stdout + result.stderr
    assert result.returncode != 0
    assert "Traceback" in out and "a failure nobody explained" in out, out
