"""The trained sandbox pair (pycode-target, pycode-draft, pycode-draft-poor) on the sandbox, with
the shipped request set: figures that mean something.

- the smoke summary has real TPOT and ITL (enough tokens and chunks) and an acceptance curve that
  falls with draft position, with the acceptance rate at k=3 between 30 % and 85 %;
- the request set is shipped root-owned and sha256-verified, and its sha256 and rows are recorded;
- deploys/compare.py, replaying that request set, finds speculation faster than the baseline with
  the good draft (TPOT ratio below 1 with its whole noise band);
- deploys/tune.py's default flow (predict, then confirm) pins k from the baseline, the smallest and
  the largest k, predicts L(k) from the pinned runs' per-position acceptance and measures the
  predicted best's neighbourhood: recomputed here from the raw bench JSONs;
- with the poor draft the speculation gate keeps the host on the baseline, for the reason recorded.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
from pathlib import Path

import pytest
from specdeploy_sandbox.request_set import PATH as SAMPLE

from specdeploy import datasets

pytestmark = [pytest.mark.sandbox, pytest.mark.vllm]

REPO = Path(__file__).resolve().parents[2]
TIMEOUT = 2400
INVENTORY = REPO / "inventories/sandbox.py"


def trained_env() -> dict:
    """Read at call time: the fixtures set SPECDEPLOY_STATE_DIR after this module is imported."""
    return {**os.environ, "SPECDEPLOY_SANDBOX_MODELS": "trained"}


def pyinfra(inventory, *args, env=None):
    return subprocess.run(
        ["pyinfra", "-y", str(inventory), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        env={**trained_env(), **(env or {})},
    )


def tail(result, n=60):
    return "\n".join((result.stdout + result.stderr).splitlines()[-n:])


def measure(kind: str, host: str, **settings) -> Path:
    """deploys/<kind>.py (compare or tune) on one host with SPECDEPLOY_<KIND>_<NAME> settings;
    returns its report folder."""
    run = f"test-trained-{kind}-{os.getpid()}"
    env = {f"SPECDEPLOY_{kind.upper()}_{name}": str(v) for name, v in settings.items()}
    result = pyinfra(
        INVENTORY, f"deploys/{kind}.py", "--limit", host, env={**env, "SPECDEPLOY_RUN": run}
    )
    assert result.returncode == 0, tail(result)
    return REPO / "reports" / run


@pytest.fixture(scope="module")
def host(sandbox_services, sandbox_fleet):
    return sandbox_fleet["hosts"][0]["name"]


@pytest.fixture(scope="module")
def deployed(host):
    result = pyinfra(INVENTORY, "deploys/serve.py", "--limit", host)
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


def test_compare_finds_speculation_faster_with_the_good_draft(deployed, host, sandbox_ssh):
    """Two fresh-server runs per arm (arms alternate), replaying the shipped request set: the TPOT
    ratio and its whole noise band lie below 1, recomputed here from the raw bench JSONs."""
    out = measure("compare", host, REPEATS=2, WARMUP_RUNS=0, APC_PROFILE=0)
    h = json.loads((out / "summary.json").read_text())["hosts"][host]
    tpot = h["ratios"]["tpot"]
    assert tpot["verdict"] == "better" and tpot["high"] < 1, tpot

    described = datasets.describe(str(SAMPLE), "custom")
    wanted = {json.loads(row)["output_tokens"] for row in SAMPLE.read_text().splitlines() if row}
    medians: dict[str, list[float]] = {"baseline": [], "speculative": []}
    for f in sorted((out / "raw" / host).glob("[0-9][0-9]-*.json")):
        r = json.loads(f.read_text())
        command = r["specdeploy"]["command"]
        # the shipped request set, at its checksum-verified path on the host
        assert command[command.index("--dataset-name") + 1] == "custom", command
        assert command[command.index("--dataset-path") + 1] == described["host_path"], command
        # per-request output lengths are the rows' own output_tokens (--custom-output-len -1)
        assert set(r["output_lens"]) <= wanted and len(set(r["output_lens"])) > 1, r["output_lens"]
        medians[r["specdeploy"]["arm"]].append(r["median_tpot_ms"])
    assert [len(v) for v in medians.values()] == [2, 2], medians
    ratio = statistics.median(medians["speculative"]) / statistics.median(medians["baseline"])
    assert tpot["ratio"] == pytest.approx(ratio)
    assert ratio < 1
    # the deployed speculative unit serves again afterwards
    active = sandbox_ssh(host, "systemctl is-active specdeploy-vllm.service")
    assert active.stdout.strip() == "active"


def test_tune_predicts_then_confirms(deployed, host, sandbox_ssh):
    """tune_k 1-3, one run per arm (the flow, not the statistics: those are unit-tested): the pin
    phase measures the baseline, k=1 and k=3 on fresh servers; L(k) comes from their pooled
    per-position acceptance; the confirm phase measures k=2, the one k not pinned; the report shows
    predicted next to measured TPOT for it."""
    out = measure("tune", host, METHOD="predict", K="1-3", REPEATS=1, WARMUP_RUNS=0)
    raw = [json.loads(f.read_text()) for f in sorted((out / "raw" / host).glob("[0-9]*.json"))]
    arms = [r["specdeploy"]["arm"] for r in raw]
    assert arms[:3] == ["baseline", "k1", "k3"] and arms[3:] == ["k2"], arms
    assert all(r["specdeploy"]["fresh_server"] for r in raw)

    # per-position acceptance pooled over the pin runs, weighted by their drafts
    acc, drafts = [0.0] * 3, [0.0] * 3
    for r in raw[1:3]:
        for i, a in enumerate(r["spec_decode_per_position_acceptance_rates"]):
            acc[i] += a * r["spec_decode_num_drafts"]
            drafts[i] += r["spec_decode_num_drafts"]
    rates = [a / d for a, d in zip(acc, drafts, strict=True)]
    prediction = json.loads((out / "raw" / host / "prediction.json").read_text())
    assert prediction["pinned_k"] == [1, 3]
    assert prediction["per_position_acceptance"] == pytest.approx(rates)
    rows = {row["k"]: row for row in prediction["rows"]}
    # measured k keep their own run's L; k=2 gets L(2) = 1 + a_1 + a_2 from the pooled rates
    for k, r in ((1, raw[1]), (3, raw[2])):
        assert rows[k]["acceptance_length"] == pytest.approx(r["spec_decode_acceptance_length"])
    assert rows[2]["acceptance_length_source"] == "per-position rates"
    assert rows[2]["acceptance_length"] == pytest.approx(1 + rates[0] + rates[1])
    assert rows[2]["tpot_ms"] > 0 and prediction["predicted_best_k"] in (1, 2, 3)

    flow = json.loads((out / "summary.json").read_text())["hosts"][host]["predict_flow"]
    k2 = {row["k"]: row for row in flow["rows"]}[2]
    assert k2["role"] == "confirmed" and k2["measured_runs"] == 1
    assert k2["measured_tpot_ms"] == pytest.approx(raw[3]["median_tpot_ms"])
    assert k2["predicted_tpot_ms"] == pytest.approx(rows[2]["tpot_ms"])
    assert "predicted, then confirmed" in (out / "summary.md").read_text()
    active = sandbox_ssh(host, "systemctl is-active specdeploy-vllm.service")
    assert active.stdout.strip() == "active"


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
