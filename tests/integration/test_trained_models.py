"""The trained sandbox pair (pycode-target, pycode-draft, pycode-draft-poor) on the sandbox, with
the shipped request set: figures that mean something.

- the smoke summary has real TPOT and ITL (enough tokens and chunks) and an acceptance curve that
  falls with draft position, with the acceptance rate at k=3 between 30 % and 85 %;
- the request set is shipped root-owned and sha256-verified, and its sha256 and rows are recorded;
- with the poor draft the speculation gate keeps the host on the baseline, for the reason recorded.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from specdeploy import datasets
from specdeploy.sandbox.request_set import PATH as SAMPLE

pytestmark = [pytest.mark.sandbox, pytest.mark.vllm]

REPO = Path(__file__).resolve().parents[2]
TIMEOUT = 2400


def trained_env() -> dict:
    """Read at call time: the fixtures set SPECDEPLOY_STATE_DIR after this module is imported."""
    return {**os.environ, "SPECDEPLOY_SANDBOX_MODELS": "trained"}


def pyinfra(inventory, *args):
    return subprocess.run(
        ["pyinfra", "-y", str(inventory), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        env=trained_env(),
    )


def tail(result, n=60):
    return "\n".join((result.stdout + result.stderr).splitlines()[-n:])


@pytest.fixture(scope="module")
def host(sandbox_services, sandbox_fleet):
    return sandbox_fleet["hosts"][0]["name"]


@pytest.fixture(scope="module")
def deployed(host):
    result = pyinfra(REPO / "inventories/sandbox.py", "deploys/serve.py", "--limit", host)
    assert result.returncode == 0, tail(result)
    return result


def record_of(sandbox_ssh, host):
    out = sandbox_ssh(host, "cat /var/lib/specdeploy/records/deployment.json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_smoke_figures_are_real_and_acceptance_falls_with_position(deployed, host, sandbox_ssh):
    record = record_of(sandbox_ssh, host)
    smoke = record["smoke"]
    thin = {k for k in smoke["not_enough_data"] if k != "p99_ttft_ms"}  # 16 requests: no p99
    assert not thin, smoke["not_enough_data"]
    assert smoke["median_tpot_ms"] > 1 and smoke["median_itl_ms"] > 1
    curve = smoke["per_position_acceptance"]
    assert len(curve) == 3 and curve[0] > curve[1] > curve[2] > 0, curve
    assert 30 <= smoke["spec_decode_acceptance_rate"] <= 85, smoke
    assert "pos1" in deployed.stdout + deployed.stderr  # the curve is in the printed summary


def test_request_set_is_shipped_verified_and_recorded(deployed, host, sandbox_ssh):
    described = datasets.describe(str(SAMPLE), "custom")
    path = described["host_path"]
    out = sandbox_ssh(host, f"stat -c '%U:%G %a' {datasets.HOST_DIR} {path} && sha256sum {path}")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.split("\n")
    assert lines[:2] == ["root:root 755", "root:root 644"]
    assert lines[2].split()[0] == described["sha256"]
    recorded = record_of(sandbox_ssh, host)["workload"]["request_set"]
    assert recorded["sha256"] == described["sha256"]
    assert recorded["rows"] == described["rows"]


def test_gate_falls_back_to_baseline_with_the_poor_draft(
    deployed, host, sandbox_ssh, sandbox_services, tmp_path
):
    poor = "specdeploy-sandbox/pycode-draft-poor"
    record = record_of(sandbox_ssh, host)
    spec = {
        **record["speculative_config"],
        "model": poor,
        "revision": sandbox_services["models"][poor]["main"],
    }
    gate = {"max_tpot_ratio": 0.95, "on_fail": "baseline"}
    inventory = tmp_path / "poor.py"
    inventory.write_text(
        "import runpy\n"
        f"_base = runpy.run_path({str(REPO / 'inventories/sandbox.py')!r})\n"
        f"sandbox = [(n, {{**d, 'speculative_config': {spec!r}, 'speculation_gate': {gate!r}}})\n"
        f"           for n, d in _base['sandbox'] if n == {host!r}]\n"
    )
    result = pyinfra(inventory, "deploys/serve.py")
    assert result.returncode == 0, tail(result)
    record = record_of(sandbox_ssh, host)
    assert record["role"] == "baseline", record["gate"]
    assert record["gate"]["passed"] is False
    assert "TPOT" in record["gate"]["reason"]
    active = sandbox_ssh(host, "systemctl is-active specdeploy-vllm-baseline.service")
    assert active.stdout.strip() == "active"
