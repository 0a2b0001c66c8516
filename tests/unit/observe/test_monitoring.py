"""`specdeploy render`'s Prometheus directory: targets, labels, keys by file, baselines, rules."""

import json
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from specdeploy.config.schema import config_from_data
from specdeploy.observe.monitoring import monitoring_dir, scrape_address, write_prometheus
from tests.unit import REPO


def host(name, data, groups=("gpu",)):
    return (name, list(groups), data, config_from_data(data))


def test_scrape_address_follows_the_bind_address(valid_data):
    cfg = config_from_data(valid_data)  # default vllm_host 127.0.0.1
    assert scrape_address("h1", {}, cfg) is None
    anywhere = config_from_data({**valid_data, "vllm_host": "0.0.0.0", "vllm_port": 8100})
    assert scrape_address("h1", {"ssh_hostname": "10.0.0.5"}, anywhere) == "10.0.0.5:8100"
    assert scrape_address("gpu-1.internal", {}, anywhere) == "gpu-1.internal:8100"
    private = config_from_data({**valid_data, "vllm_host": "10.1.2.3"})
    assert scrape_address("h1", {"ssh_hostname": "x"}, private) == "10.1.2.3:8000"
    v6 = config_from_data({**valid_data, "vllm_host": "fd00::5"})
    assert scrape_address("h1", {}, v6) == "[fd00::5]:8000"


def test_targets_labels_keys_and_loopback(tmp_path, valid_data):
    public = {**valid_data, "vllm_host": "0.0.0.0"}
    keyed = {**public, "vllm_api_key": "sk-secret-1"}
    warnings = []
    summary = write_prometheus(
        tmp_path,
        [
            host("a", {**public, "ssh_hostname": "10.0.0.1"}, ["canary", "prod"]),
            host("b", {**keyed, "ssh_hostname": "10.0.0.2"}),
            host("c", {**keyed, "ssh_hostname": "10.0.0.3"}),
            host("local", valid_data),
        ],
        reports=tmp_path / "no-reports",
        warn=warnings.append,
    )
    assert summary.skipped_loopback == ["local"] and "loopback" in warnings[0]
    assert summary.jobs == ["specdeploy-vllm", "specdeploy-vllm-key1"]
    plain = json.loads((tmp_path / "targets/specdeploy-vllm.json").read_text())
    assert plain == [
        {
            "targets": ["10.0.0.1:8000"],
            "labels": {
                "host": "a",
                "group": ",canary,prod,",
                "target_model": "Qwen/Qwen3-8B",
                "draft_model": "Qwen/Qwen3-0.6B",
                "k": "5",
                "served_model": "Qwen/Qwen3-8B",
                "vllm_version": "0.32.0",
            },
        }
    ]
    with_key = json.loads((tmp_path / "targets/specdeploy-vllm-key1.json").read_text())
    assert [t["labels"]["host"] for t in with_key] == ["b", "c"]

    config_text = (tmp_path / "prometheus.yml").read_text()
    assert "sk-secret-1" not in config_text  # the key only in its own file
    config = yaml.safe_load(config_text)
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert "authorization" not in jobs["specdeploy-vllm"]
    key_file = jobs["specdeploy-vllm-key1"]["authorization"]["credentials_file"]
    assert (tmp_path / key_file).read_text().strip() == "sk-secret-1"
    assert stat.S_IMODE((tmp_path / key_file).stat().st_mode) == 0o600
    for path in tmp_path.rglob("*"):
        if path.is_file() and path.name != Path(key_file).name:
            assert "sk-secret-1" not in path.read_text(), path
    assert config["rule_files"] == ["rules.yml", "baselines.yml"]
    assert (tmp_path / "grafana-dashboard.json").is_file()


def test_baselines_come_from_the_newest_smoke_json(tmp_path, valid_data):
    reports = tmp_path / "reports" / "a"
    reports.mkdir(parents=True)
    old = reports / "smoke-1.json"
    old.write_text(json.dumps({"median_tpot_ms": 99.0, "spec_decode_acceptance_rate": 10.0}))
    new = reports / "smoke-2.json"
    new.write_text(json.dumps({"median_tpot_ms": 12.5, "spec_decode_acceptance_rate": 64.0}))
    import os

    os.utime(old, (1, 1))
    data = {**valid_data, "vllm_host": "0.0.0.0"}
    out = tmp_path / "prom"
    summary = write_prometheus(
        out, [host("a", data), host("b", data)], reports=tmp_path / "reports", warn=print
    )
    assert summary.baselines == ["a"]
    rules = yaml.safe_load((out / "baselines.yml").read_text())["groups"][0]["rules"]
    assert rules == [
        {
            "record": "specdeploy:smoke_tpot_seconds",
            "expr": "vector(0.0125)",
            "labels": {"host": "a"},
        },
        {
            "record": "specdeploy:smoke_acceptance_ratio",
            "expr": "vector(0.64)",
            "labels": {"host": "a"},
        },
    ]


def test_render_cli_writes_the_prometheus_dir(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "specdeploy.cli",
            "render",
            "inventories/prod.py",
            "--out",
            str(tmp_path),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    # the example fleet binds to loopback: no targets, a warning per host, files still written
    assert result.stderr.count("is loopback") == 3
    assert (tmp_path / "prometheus" / "prometheus.yml").is_file()


def rule_expressions() -> dict[str, str]:
    groups = yaml.safe_load((monitoring_dir() / "rules.yml").read_text())["groups"]
    return {r.get("record") or r["alert"]: r["expr"] for g in groups for r in g["rules"]}


def test_rules_use_only_recorded_series_or_vllm_metrics():
    exprs = rule_expressions()
    recorded = {name for name in exprs if name.startswith("specdeploy:")}
    baseline = {"specdeploy:smoke_tpot_seconds", "specdeploy:smoke_acceptance_ratio",
                "specdeploy:proven_batch_size_max", "specdeploy:schedule_unproven"}  # fmt: skip
    for name, expr in exprs.items():
        for series in re.findall(r"specdeploy:[a-z0-9_:]+", expr):
            assert series in recorded | baseline, f"{name} uses unknown {series}"
        if not name.startswith("specdeploy:"):  # alerts: one comparison, so a test can `bool` it
            assert len(re.findall(r" (?:<|>|==|!=|<=|>=) ", expr)) == 1, name


def test_dashboard_queries_filter_by_host():
    dashboard = json.loads((monitoring_dir() / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    assert len(exprs) >= 10
    for expr in exprs:
        for selector in re.findall(r"(?:vllm|specdeploy):[a-z0-9_:]+(\{[^}]*\})?", expr):
            assert 'host=~"$host"' in selector, expr
        for selector in re.findall(r"haproxy_[a-z_]+(\{[^}]*\})?", expr):  # a box's balancer
            assert 'host=~"$host"' in selector and 'job="specdeploy-balancer"' in selector, expr
    names = {v["name"] for v in dashboard["templating"]["list"]}
    assert names == {"datasource", "host"}


@pytest.mark.needs_tool("promtool")
def test_promtool_accepts_rules_and_rendered_config(tmp_path, valid_data):
    data = {**valid_data, "vllm_host": "0.0.0.0", "vllm_api_key": "k"}
    reports = tmp_path / "reports" / "a"
    reports.mkdir(parents=True)
    (reports / "smoke-1.json").write_text(
        json.dumps({"median_tpot_ms": 12.5, "spec_decode_acceptance_rate": 64.0})
    )
    write_prometheus(tmp_path, [host("a", data)], reports=tmp_path / "reports", warn=print)
    result = subprocess.run(
        ["promtool", "check", "config", str(tmp_path / "prometheus.yml")],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 23 rules found" in result.stdout and "SUCCESS: 4 rules found" in result.stdout


# --- a whole box (issue 23) -------------------------------------------------------------------


def test_whole_box_targets_per_instance_and_its_balancer(tmp_path, valid_data):
    data = {**valid_data, "vllm_host": "0.0.0.0", "instances": 2, "ssh_hostname": "10.0.0.7"}
    single = {**valid_data, "vllm_host": "0.0.0.0", "ssh_hostname": "10.0.0.8"}
    summary = write_prometheus(
        tmp_path, [host("box", data), host("one", single)], reports=tmp_path / "r", warn=print
    )
    assert summary.targets == 3 and summary.balancers == 1
    targets = json.loads((tmp_path / "targets/specdeploy-vllm.json").read_text())
    assert [t["targets"] for t in targets] == [
        ["10.0.0.7:8001"],
        ["10.0.0.7:8002"],
        ["10.0.0.8:8000"],
    ]
    names = [t["labels"].get("instance_name") for t in targets]
    assert names == ["specdeploy-vllm-0", "specdeploy-vllm-1", None]  # a single server: unchanged
    assert targets[0]["labels"]["host"] == "box"
    (balancer,) = json.loads((tmp_path / "targets/specdeploy-balancer.json").read_text())
    assert balancer == {"targets": ["10.0.0.7:8404"], "labels": {"host": "box", "group": ",gpu,"}}
    jobs = {j["job_name"]: j for j in yaml.safe_load((tmp_path / "prometheus.yml").read_text())[
        "scrape_configs"]}  # fmt: skip
    assert jobs["specdeploy-balancer"]["file_sd_configs"] == [
        {"files": ["targets/specdeploy-balancer.json"]}
    ]
    assert "authorization" not in jobs["specdeploy-balancer"]


def test_whole_box_on_loopback_gets_no_target(tmp_path, valid_data):
    warnings = []
    data = {**valid_data, "instances": 2}  # vllm_host 127.0.0.1
    summary = write_prometheus(
        tmp_path, [host("box", data)], reports=tmp_path, warn=warnings.append
    )
    assert summary.skipped_loopback == ["box"] and summary.balancers == 0
    assert not (tmp_path / "targets/specdeploy-balancer.json").exists()


PROMEX = REPO / "tests/unit/data/haproxy-2.6/promex_one_down.txt"


@pytest.mark.needs_tool("promtool")
def test_backend_down_alert_on_haproxys_own_series(tmp_path):
    """promtool's rule test on the series HAProxy 2.6's exporter printed with one instance down
    (data/haproxy-2.6/promex_one_down.txt): DOWN alerts after 2m, MAINT (a drained instance) and
    UP do not."""
    recorded = {}
    for line in PROMEX.read_text().splitlines():
        match = re.fullmatch(r'haproxy_server_status\{proxy="instances",server="([^"]+)",'
                             r'state="(\w+)"\} (\d)', line)  # fmt: skip
        if match:
            recorded[(match.group(1), match.group(2))] = int(match.group(3))
    assert recorded[("specdeploy-vllm-0", "DOWN")] == 1 and recorded[("specdeploy-vllm-1", "UP")]

    def series(server, state, value):
        labels = f'job="specdeploy-balancer",host="box",proxy="instances",server="{server}"'
        return {"series": f'haproxy_server_status{{{labels},state="{state}"}}',
                "values": f"{value}x10"}  # fmt: skip

    inputs = [series(s, state, v) for (s, state), v in recorded.items()]
    inputs.append(series("specdeploy-vllm-1", "MAINT", 1))  # as if drained, for the test
    inputs.append({"series": 'up{job="specdeploy-balancer",host="box"}', "values": "1x10"})
    test = {
        "rule_files": [str(monitoring_dir() / "rules.yml")],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": inputs,
                "alert_rule_test": [
                    {
                        "eval_time": "1m",
                        "alertname": "SpecdeployBalancerBackendDown",
                        "exp_alerts": [],
                    },  # fmt: skip
                    {
                        "eval_time": "3m",
                        "alertname": "SpecdeployBalancerBackendDown",
                        "exp_alerts": [
                            {
                                "exp_labels": {
                                    "job": "specdeploy-balancer",
                                    "host": "box",
                                    "proxy": "instances",
                                    "server": "specdeploy-vllm-0",
                                    "state": "DOWN",
                                    "severity": "warning",
                                },
                                "exp_annotations": {
                                    "summary": "box: instance specdeploy-vllm-0 is down in its "
                                    "balancer",
                                    "description": "The balancer's /health check of "
                                    "specdeploy-vllm-0 fails, so it sends that instance no "
                                    "requests: the host serves with less capacity. Run "
                                    "`specdeploy status`.",
                                },
                            }
                        ],
                    },
                    {"eval_time": "3m", "alertname": "SpecdeployBalancerDown", "exp_alerts": []},
                ],
            }
        ],
    }
    path = tmp_path / "test.yml"
    path.write_text(yaml.safe_dump(test))
    result = subprocess.run(
        ["promtool", "test", "rules", str(path)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_exporter_port_is_no_instances(valid_data):
    from specdeploy.render import instances

    listed = [{"gpus": [0], "port": 8404}, {"gpus": [1], "port": 8002}]
    cfg = config_from_data({**valid_data, "instances": listed})
    assert instances.expand(cfg).problems == [
        "specdeploy-vllm-0 port 8404 is also the balancer's metrics (balancer_metrics_port)'s"
    ]
    moved = config_from_data({**valid_data, "instances": listed, "balancer_metrics_port": 9404})
    assert instances.expand(moved).problems == []


def promtool_test(tmp_path, inputs: list[dict], checks: list[dict]) -> None:
    """Runs promtool's rule unit test of rules.yml on these series (one sample a minute)."""
    test = {
        "rule_files": [str(monitoring_dir() / "rules.yml")],
        "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": inputs, "alert_rule_test": checks}],
    }
    path = tmp_path / "test.yml"
    path.write_text(yaml.safe_dump(test))
    result = subprocess.run(
        ["promtool", "test", "rules", str(path)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def fired(alert: str, at: str, *alerts: tuple[dict, dict]) -> dict:
    """An alert_rule_test entry: `alert` at `at` fires once for each (labels, annotations)."""
    expected = [{"exp_labels": labels, "exp_annotations": notes} for labels, notes in alerts]
    return {"eval_time": at, "alertname": alert, "exp_alerts": expected}


@pytest.mark.needs_tool("promtool")
def test_stuck_server_alerts_while_a_busy_and_an_idle_one_do_not(tmp_path):
    """Issue 36 item 7: a server holding running requests while its token counter stands still
    (a wedged engine whose /health answers) alerts; one emitting tokens, and an idle one, do
    not. Fails if the rule is removed or keys on completions only (NaN when none complete)."""

    def server(name, running, tokens):
        labels = f'job="specdeploy-vllm",instance="{name}:8000",host="{name}"'
        return [
            {"series": f'vllm:num_requests_running{{{labels},engine="0"}}', "values": running},
            {"series": f'vllm:generation_tokens_total{{{labels},engine="0"}}', "values": tokens},
        ]

    inputs = server("stuck", "3x20", "500x20")  # requests in, no token out
    inputs += server("busy", "3x20", "0+400x20")
    inputs += server("idle", "0x20", "100x20")
    stuck = {"job": "specdeploy-vllm", "instance": "stuck:8000", "host": "stuck",
             "severity": "critical"}  # fmt: skip
    notes = {
        "summary": "stuck: requests run but no token comes out",
        "description": "3 requests running and no token generated for 2 minutes while /health "
        "may still answer (a wedged GPU or engine). Restart the server's unit; `specdeploy "
        "status`.",
    }
    promtool_test(
        tmp_path,
        inputs,
        [
            fired("SpecdeployServerStuck", "3m"),
            fired("SpecdeployServerStuck", "10m", (stuck, notes)),
        ],
    )


@pytest.mark.needs_tool("promtool")
def test_instance_left_in_maintenance_alerts_after_a_roll_would_have_ended(tmp_path):
    """Issue 36 item 7: an instance drained (MAINT) for a roll's minutes does not alert; one left
    in MAINT past 30 minutes (its control node died mid-roll) does."""
    labels = 'job="specdeploy-balancer",host="box",proxy="instances"'
    inputs = [
        {"series": f'haproxy_server_status{{{labels},server="left",state="MAINT"}}',
         "values": "1x45"},
        {"series": f'haproxy_server_status{{{labels},server="rolled",state="MAINT"}}',
         "values": "1x5 0x40"},
    ]  # fmt: skip
    left = {"job": "specdeploy-balancer", "host": "box", "proxy": "instances", "server": "left",
            "state": "MAINT", "severity": "warning"}  # fmt: skip
    alert = "SpecdeployBalancerInstanceInMaintenance"
    notes = {
        "summary": "box: instance left has been in maintenance for 30 minutes",
        "description": "The balancer sends left no requests: longer than a roll takes, so the "
        "deploy that drained it likely died. Check it with `specdeploy status`, then run the "
        "deploy again or re-enable it in the balancer.",
    }
    promtool_test(tmp_path, inputs, [fired(alert, "20m"), fired(alert, "40m", (left, notes))])
