"""Hardening on the sandbox with the real server under systemd: systemd bringing a SIGKILLed server
back, and a weight download interrupted mid-way. The API key only in the root-only env files, the
non-root server under NoNewPrivileges/ProtectSystem/ProtectHome/PrivateTmp and the host suite with
the key set are shown on the whole box (test_whole_box.py), whose first deploy sets the key."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.sandbox, pytest.mark.vllm]

REPO = Path(__file__).resolve().parents[2]
UNIT = "specdeploy-vllm.service"
HUB = "/var/lib/specdeploy/hf/hub"
DRAFT_DIR = f"{HUB}/models--specdeploy-sandbox--tiny-llama-draft"


def tail(result, n=80):
    return "\n".join((result.stdout + result.stderr).splitlines()[-n:])


def run(*command, timeout=1800):
    return subprocess.run(
        list(command),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=os.environ.copy(),
    )


@pytest.fixture(scope="module")
def hosts(sandbox_services, sandbox_fleet):
    return [h["name"] for h in sandbox_fleet["hosts"]]


@pytest.fixture(scope="module")
def deployed(hosts):
    result = run("pyinfra", "-y", "inventories/sandbox.py", "deploys/serve.py")
    assert result.returncode == 0, tail(result)
    return result


def show(ssh, host, *props):
    out = ssh(host, f"systemctl show {' '.join('-p ' + p for p in props)} {UNIT}")
    return dict(line.split("=", 1) for line in out.strip().splitlines())


def code(ssh, host, path, key=None):
    auth = f"-H 'Authorization: Bearer {key}'" if key else ""
    return ssh(
        host,
        f"curl -s -o /dev/null -w '%{{http_code}}' {auth} http://127.0.0.1:8000{path}",
        check=False,
    )


def test_sigkilled_server_comes_back_via_systemd_restart(deployed, hosts, ssh):
    host = hosts[0]
    before = show(ssh, host, "MainPID", "NRestarts")
    ssh(host, f"kill -KILL {before['MainPID']}")
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        now = show(ssh, host, "MainPID", "NRestarts", "ActiveState")
        if int(now["NRestarts"]) > int(before["NRestarts"]) and code(ssh, host, "/health") == "200":
            break
        time.sleep(3)
    else:
        pytest.fail(
            f"{host}: not back after SIGKILL: {now}\n"
            f"{ssh(host, f'journalctl -u {UNIT} -n 30 -o cat')}"
        )
    assert now["MainPID"] != before["MainPID"] and now["ActiveState"] == "active"
    assert code(ssh, host, "/v1/models") == "200"


def test_interrupted_weight_download_completes_on_rerun(deployed, hosts, ssh):
    host = hosts[0]
    blob = ssh(host, f"readlink -f {DRAFT_DIR}/snapshots/*/model.safetensors").strip()
    sha = ssh(host, f"sha256sum {blob}").split()[0]
    size = int(ssh(host, f"stat -c %s {blob}"))
    # Start the download afresh and cut it mid-file: the state huggingface_hub (2.x) leaves when
    # killed mid-transfer is a partial process-unique blobs/<etag>.<8 hex>.incomplete, no blob, no
    # snapshot link, and (ours) no completion marker. A re-run downloads the file again and renames
    # it into place.
    ssh(
        host,
        f"set -e; cp {blob} /root/draft.full; rm -rf {DRAFT_DIR}/snapshots/*/.specdeploy-complete "
        f"{DRAFT_DIR}/snapshots/*/model.safetensors {blob}; "
        f"head -c {size // 3} /root/draft.full > {blob}.0badc0de.incomplete; "
        "rm -f /root/draft.full; "
        f"chown -R root:root {DRAFT_DIR}",
    )
    before = show(ssh, host, "MainPID")
    result = run(
        "pyinfra", "-y", "inventories/sandbox.py", "deploys/serve.py", "--limit", host, timeout=900
    )
    assert result.returncode == 0, tail(result)
    assert "Download draft" in result.stdout + result.stderr, tail(result)
    assert ssh(host, f"sha256sum {blob}").split()[0] == sha, "the resumed blob is corrupt"
    assert (
        ssh(host, f"find {DRAFT_DIR}/snapshots -xtype l | wc -l").strip() == "0"
    )  # no dangling links
    assert ssh(host, f"readlink -f {DRAFT_DIR}/snapshots/*/model.safetensors").strip() == blob
    ssh(host, f"rm -f {blob}.0badc0de.incomplete")  # the dead process's temp file: never read again
    assert ssh(host, f"ls {DRAFT_DIR}/snapshots/*/.specdeploy-complete", check=False)
    assert show(ssh, host, "MainPID") == before  # same unit: the server was not restarted
    again = run(
        "pyinfra", "-y", "inventories/sandbox.py", "deploys/serve.py", "--limit", host, timeout=600
    )
    assert again.returncode == 0 and "Download" not in again.stdout + again.stderr, tail(again)
