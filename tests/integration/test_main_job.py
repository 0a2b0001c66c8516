"""The main job end to end, in the fast tier: what CI proves on every change with real components.

A fresh 2-host sandbox fleet, reached as production is (the non-root `deploy` user with sudo,
pinned host keys), and `pyinfra inventories/sandbox.py deploys/serve.py` with the trained pair:
1. the first deploy: installs, weights, unit, health, smoke and the record on both hosts;
2. a rolling config change (num_speculative_tokens 3 -> 2) sampled by each host's /health every
   0.5 s: never both hosts down, each restarted (new MainPID), both records updated;
3. a no-op re-run: no operation changes anything, no server restarts;
4. `specdeploy status`: exit 0 on the fleet; exit 1 naming the drift after a hand-edited unit;
5. the testinfra host suite (tests/host) on both hosts.

Every other live proof is in the live tier (tests/wings.py, `make test-live`). The order of the
tests is the order of the job: each builds on the state the one before left.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from specdeploy.checks.host_data import check_config
from specdeploy.config.inventory import host_data
from specdeploy.render.argv import serve_argv, unit_exec_argv

pytestmark = [pytest.mark.sandbox, pytest.mark.vllm]

REPO = Path(__file__).resolve().parents[2]
UNIT = "/etc/systemd/system/specdeploy-vllm.service"
RECORD = "/var/lib/specdeploy/records/specdeploy-vllm.json"
BASE_K, NEW_K = 3, 2  # group_data/sandbox.py's k, and the rolling change's


def trained_env() -> dict:
    """The trained pair (the demo's): read at call time, the fixtures set the state dir."""
    return {**os.environ, "SPECDEPLOY_SANDBOX_MODELS": "trained"}


def run(*command: str, timeout: float = 1800) -> subprocess.CompletedProcess:
    return subprocess.run(
        list(command), cwd=REPO, capture_output=True, text=True, timeout=timeout,
        env=trained_env(),
    )  # fmt: skip


def tail(result, n=80):
    return "\n".join((result.stdout + result.stderr).splitlines()[-n:])


def deploy(inventory: Path) -> subprocess.CompletedProcess:
    result = run("pyinfra", "-y", str(inventory), "deploys/serve.py")
    assert result.returncode == 0, tail(result)
    return result


def service_state(ssh, host) -> dict:
    out = ssh(host, "systemctl show -p ActiveState -p MainPID -p ExecMainStartTimestampMonotonic "
                    "specdeploy-vllm.service")  # fmt: skip
    return dict(line.split("=", 1) for line in out.strip().splitlines())


def record_of(ssh, host) -> dict:
    return json.loads(ssh(host, f"cat {RECORD}"))


def config_of(inventory: Path, host: str):
    old = os.environ.get("SPECDEPLOY_SANDBOX_MODELS")
    os.environ["SPECDEPLOY_SANDBOX_MODELS"] = "trained"  # group_data reads it at load time
    try:
        return check_config(host, host_data(str(inventory), cwd=str(REPO))[host])
    finally:
        if old is None:
            os.environ.pop("SPECDEPLOY_SANDBOX_MODELS")
        else:
            os.environ["SPECDEPLOY_SANDBOX_MODELS"] = old


def unit_sha256(ssh, host) -> str:
    return hashlib.sha256(ssh(host, f"cat {UNIT}").encode()).hexdigest()


def k_of(ssh, host) -> int:
    argv = unit_exec_argv(ssh(host, f"cat {UNIT}"))
    return json.loads(argv[argv.index("--speculative-config") + 1])["num_speculative_tokens"]


@pytest.fixture(scope="module")
def hosts(sandbox_services, sandbox_fleet) -> list[str]:
    names = [h["name"] for h in sandbox_fleet["hosts"]]
    assert len(names) == 2, f"the main job runs on a 2-host fleet, not {names}"
    return names


@pytest.fixture(scope="module")
def inventories(hosts, tmp_path_factory) -> dict[str, Path]:
    """The sandbox inventory as shipped ("base"), and with k = NEW_K on every host ("changed")."""
    changed = tmp_path_factory.mktemp("main-job") / "changed_k.py"
    changed.write_text(
        "import runpy\n"
        f"_base = runpy.run_path({str(REPO / 'inventories/sandbox.py')!r})\n"
        f"_group = runpy.run_path({str(REPO / 'group_data/sandbox.py')!r})\n"
        f"_spec = {{**_group['speculative_config'], 'num_speculative_tokens': {NEW_K}}}\n"
        "sandbox = [(n, {**d, 'speculative_config': _spec}) for n, d in _base['sandbox']]\n"
    )
    return {"base": REPO / "inventories/sandbox.py", "changed": changed}


@pytest.fixture(scope="module")
def first_deploy(hosts, inventories) -> subprocess.CompletedProcess:
    return deploy(inventories["base"])


def test_first_deploy_serves_the_trained_pair_with_smoke_and_record(first_deploy, hosts, ssh):
    out = first_deploy.stdout + first_deploy.stderr
    for host in hosts:
        cfg = config_of(REPO / "inventories/sandbox.py", host)
        assert cfg.speculative_config["num_speculative_tokens"] == BASE_K
        assert ssh(host, "systemctl is-active specdeploy-vllm.service").strip() == "active"
        assert ssh(host, "systemctl is-enabled specdeploy-vllm.service").strip() == "enabled"
        models = json.loads(ssh(host, "curl -sf http://127.0.0.1:8000/v1/models"))
        assert [m["id"] for m in models["data"]] == ["pycode"]
        # the service runs as its own user, not root and not the deploy user
        assert ssh(host, "systemctl show -p User --value specdeploy-vllm.service").strip() not in (
            "", "root", "deploy",
        )  # fmt: skip
        record = record_of(ssh, host)
        assert record["role"] == "speculative" and record["unit"]["argv"] == serve_argv(cfg)
        assert record["unit"]["sha256"] == unit_sha256(ssh, host)
        assert record["speculative_config"] == cfg.speculative_config
        assert record["draft"]["resolved_sha"] == cfg.speculative_config["revision"]
        assert record["vocab"]["decision"] == "shared vocabulary"
        # the smoke benchmark: the shipped request set, every request answered, speculation on
        smoke = record["smoke"]
        assert smoke["completed"] == cfg.workload.num_prompts and smoke["median_tpot_ms"] > 0
        assert record["smoke_counters"]["drafts"] > 0
        assert record["workload"]["request_set"]["rows"] > 0
        files = sorted((REPO / "reports" / host).glob("smoke-*.json"))
        assert files and json.loads(files[-1].read_text())["completed"] == smoke["completed"]
        assert f"{host}" in out
    assert "pos1" in out  # the acceptance curve is in the printed summary


def test_a_rolling_config_change_never_takes_both_hosts_down(
    first_deploy, hosts, inventories, ssh, health_timeline
):
    before = {h: service_state(ssh, h) for h in hosts}
    records = {h: record_of(ssh, h) for h in hosts}
    with health_timeline(hosts) as timeline:
        deploy(inventories["changed"])
    timeline.assert_one_down_at_a_time()
    print({h: f"down {timeline.down_seconds(h):.1f} s" for h in hosts})
    for host in hosts:
        state = service_state(ssh, host)
        assert state["ActiveState"] == "active" and state["MainPID"] != before[host]["MainPID"]
        record = record_of(ssh, host)
        assert record["speculative_config"]["num_speculative_tokens"] == NEW_K == k_of(ssh, host)
        assert record["unit"]["sha256"] != records[host]["unit"]["sha256"]
        assert record["unit"]["sha256"] == unit_sha256(ssh, host)
        assert record["unit"]["argv"] == serve_argv(config_of(inventories["changed"], host))


def test_a_rerun_with_nothing_changed_changes_nothing(first_deploy, hosts, inventories, ssh):
    before = {h: service_state(ssh, h) for h in hosts}
    result = deploy(inventories["changed"])
    changed = re.findall(r"\[(\S+)\] (Success|Changed)", result.stdout)
    assert changed == [], f"operations ran on a no-op re-run: {changed}\n{tail(result)}"
    assert {h: service_state(ssh, h) for h in hosts} == before  # same MainPID and start time


def status(inventory: Path, *args: str) -> subprocess.CompletedProcess:
    return run(sys.executable, "-m", "specdeploy.cli", "status", str(inventory), *args,
               timeout=300)  # fmt: skip


def test_status_is_clean_then_names_a_hand_edited_unit(first_deploy, hosts, inventories, ssh):
    result = status(inventories["changed"], "--json", "--interval", "1")
    assert result.returncode == 0, tail(result)
    entries = {e["host"]: e for e in json.loads(result.stdout)}
    assert set(entries) == set(hosts)
    for entry in entries.values():
        assert entry["ok"] and entry["healthy"] and entry["matches_data"], entry
        assert entry["unit"]["drift"] is False and entry["record"]["k"] == NEW_K

    edited = hosts[-1]
    assert "--max-num-seqs 2 " in ssh(edited, f"cat {UNIT}")
    ssh(edited, f"cp -p {UNIT} /root/unit.orig && sed -i 's/--max-num-seqs 2 /--max-num-seqs 3 /' "
                f"{UNIT}")  # fmt: skip
    try:
        result = status(inventories["changed"], "--json", "--interval", "1")
        assert result.returncode == 1, tail(result)
        entries = {e["host"]: e for e in json.loads(result.stdout)}
        assert entries[hosts[0]]["ok"] and entries[hosts[0]]["unit"]["drift"] is False
        entry = entries[edited]
        assert entry["unit"]["drift"] is True and entry["unit"]["keys"] == ["--max-num-seqs"]
        assert any(p.startswith("unit drift:") and "--max-num-seqs" in p for p in entry["problems"])
        table = status(inventories["changed"], "--interval", "1")
        assert table.returncode == 1 and "unit drift" in table.stdout, tail(table)
    finally:
        ssh(edited, f"mv -f /root/unit.orig {UNIT} && systemctl daemon-reload")
    assert status(inventories["changed"], "--json", "--interval", "1").returncode == 0


def test_the_host_suite_passes_on_both_hosts(first_deploy, hosts, inventories):
    result = run(sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "tests/host",
                 "--inventory", str(inventories["changed"]), timeout=600)  # fmt: skip
    assert result.returncode == 0, tail(result, 120)
    passed = re.findall(r"^tests/host/\S+::(\S+)\[?(\S*?)\]? PASSED", result.stdout, re.M)
    assert passed and "failed" not in result.stdout, tail(result, 120)
    for host in hosts:
        assert host in result.stdout, f"the host suite did not run on {host}"
