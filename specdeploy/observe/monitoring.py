"""Prometheus for the fleet: file-based service discovery, scrape config, rules, Grafana dashboard.

`specdeploy render INVENTORY --out DIR` calls `write_prometheus(DIR/prometheus, ...)`, which writes:

* `targets/<job>.json`: file_sd targets, one per host, labelled `host`, `group` (the host's
  inventory groups as `,a,b,`: filter with `group=~".*,canary,.*"`), `target_model`, `draft_model`,
  `k`, `served_model` and `vllm_version`; a whole box (host data `instances`): one per instance, on
  its own port, labelled `instance_name` too (never through the balancer: speculation counters of
  several servers mixed in one scrape mean nothing), and its balancer's HAProxy exporter
  (`balancer_metrics_port`) in `targets/specdeploy-balancer.json`, labelled `host` and `group`;
* `prometheus.yml`: a complete config (scrape jobs over those files + the rule files). Hosts whose
  `vllm_api_key` differs are in different jobs; a job's key is read from `api-keys/<job>.key`
  (0600, `authorization.credentials_file`), never written into the config itself;
* `rules.yml` (templates/monitoring/rules.yml): recording rules for acceptance, TPOT/ITL medians,
  request rate and KV usage per host, and alerts built on them;
* `baselines.yml`: per-host constants the alerts compare with, from the newest smoke benchmark the
  deploy saved on this control node (`reports/<host>/smoke-*.json`);
* `grafana-dashboard.json` (templates/monitoring/grafana-dashboard.json).

Where Prometheus reaches /metrics: vLLM serves /metrics on its API port (`vllm_host:vllm_port`).
A host bound to all addresses (`vllm_host = "0.0.0.0"`) is scraped at its inventory address
(`ssh_hostname`, else the host name); a host bound to one address is scraped there; a host on
loopback (the default, 127.0.0.1) cannot be scraped from another machine and gets no target, with a
warning: bind it to a private address, or put a proxy in front and point Prometheus at that.
vLLM 0.32.0 does not ask for the API key on /metrics (only /v1, /v2, /inference, /cohere), so an
address Prometheus can reach is one everybody on that network can reach: bind to a private network.
"""

from __future__ import annotations

import glob
import ipaddress
import json
import os
import shutil
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from specdeploy.config.schema import ServeConfig
from specdeploy.decide.load_rule import SCHEDULE_KEY, proof_range
from specdeploy.report.load_summary import kept_proof_of

JOB = "specdeploy-vllm"
BALANCER_JOB = "specdeploy-balancer"  # a job of its own: job=~"specdeploy-vllm.*" is vLLM only
MONITORING_TEMPLATES = ("rules.yml", "grafana-dashboard.json")
LIVE_RULES = "live-verdict.yml"  # only where a host has a control arm (speculation_control)


def monitoring_dir() -> Path:
    # the package's templates (specdeploy/templates), read as every template is: a package resource
    return Path(str(resources.files("specdeploy").joinpath("templates", "monitoring")))


def scrape_address(name: str, data: dict[str, Any], cfg: ServeConfig) -> str | None:
    """host:port Prometheus scrapes for this host; None when vLLM listens on loopback only."""
    bind = cfg.vllm_host.strip("[]")
    if bind in ("", "0.0.0.0", "::"):
        address = data.get("ssh_hostname") or name
    elif bind == "localhost" or _is_loopback(bind):
        return None
    else:
        address = bind
    if ":" in address:  # IPv6 literal
        address = f"[{address.strip('[]')}]"
    return f"{address}:{cfg.vllm_port}"


def _is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def target_labels(name: str, groups: list[str], cfg: ServeConfig) -> dict[str, str]:
    return {
        "host": name,
        "group": "," + ",".join(sorted(groups)) + "," if groups else "",
        "target_model": cfg.target_model,
        "draft_model": cfg.draft_model or "",
        "k": str(cfg.speculative_config.get("num_speculative_tokens", "")),
        "served_model": cfg.effective_served_name,
        "vllm_version": cfg.vllm_version,
    }


def scrape_targets(name: str, groups: list[str], data: dict[str, Any], cfg: ServeConfig):
    """(address, labels) of each vLLM server of this host: the host's one, or each instance of a
    whole box (address None: loopback, no target)."""
    from specdeploy.render.instances import expand

    members = expand(cfg).instances
    if not members:
        return [(scrape_address(name, data, cfg), target_labels(name, groups, cfg))]
    return [
        (
            scrape_address(name, data, m.cfg),
            target_labels(name, groups, cfg) | {"instance_name": m.name},
        )
        for m in members
    ]


def balancer_target(name: str, groups: list[str], data: dict[str, Any], cfg: ServeConfig):
    """A whole box's HAProxy exporter target, or None (no balancer, or loopback)."""
    if cfg.instances is None:
        return None
    server = scrape_address(
        name, data, cfg.model_copy(update={"vllm_port": cfg.balancer_metrics_port})
    )
    labels = {k: v for k, v in target_labels(name, groups, cfg).items() if k in ("host", "group")}
    return {"targets": [server], "labels": labels} if server else None


def latest_smoke(reports: Path, host: str) -> dict | None:
    """The newest smoke benchmark JSON the deploy fetched for this host, or None."""
    files = sorted(glob.glob(str(reports / host / "smoke-*.json")), key=os.path.getmtime)
    for path in reversed(files):
        try:
            return json.loads(Path(path).read_text())
        except (OSError, ValueError):
            continue
    return None


def baseline_rules(
    baselines: dict[str, dict],
    proven: dict[str, int] | None = None,
    unproven: list[str] | None = None,
) -> dict:
    """Recording rules with one constant per host (what the deploy measured), for the alerts;
    `proven`: {host: the largest batch its schedule's kept proof proves (decide/load_rule.
    proof_range), else max_num_seqs}; `unproven`: hosts whose schedule no kept proof proves."""
    rules = []
    for host, smoke in sorted(baselines.items()):
        tpot = smoke.get("median_tpot_ms")
        accept = smoke.get("spec_decode_acceptance_rate")
        if isinstance(tpot, (int, float)) and tpot > 0:
            rules.append(
                {
                    "record": "specdeploy:smoke_tpot_seconds",
                    "expr": f"vector({tpot / 1000:.6g})",
                    "labels": {"host": host},
                }
            )
        if isinstance(accept, (int, float)):
            rules.append(
                {
                    "record": "specdeploy:smoke_acceptance_ratio",
                    "expr": f"vector({accept / 100:.6g})",
                    "labels": {"host": host},
                }
            )
    schedule = [
        {"record": "specdeploy:proven_batch_size_max", "expr": f"vector({top})",
         "labels": {"host": host}}
        for host, top in sorted((proven or {}).items())
    ]  # fmt: skip
    # every host says whether its schedule is unproven (1) or not (0), so the alert's expression
    # has data on every host and cannot go silent where no schedule is unproven
    hosts_said = sorted({*(proven or {}), *(unproven or [])})
    schedule += [
        {"record": "specdeploy:schedule_unproven",
         "expr": f"vector({int(host in (unproven or []))})", "labels": {"host": host}}
        for host in hosts_said
    ]  # fmt: skip
    groups = [{"name": "specdeploy-baselines", "rules": rules}]
    if schedule:  # a group of its own: the smoke baselines stay the first group
        groups.append({"name": "specdeploy-schedules", "rules": schedule})
    return {"groups": groups}


@dataclass
class ScrapeJob:
    """One scrape job: its file_sd targets (`targets/<name>.json`) and, for hosts with an API key,
    the file Prometheus reads the key from (relative to prometheus.yml)."""

    name: str
    key_file: str | None = None
    targets: list[dict[str, Any]] = field(default_factory=list)  # file_sd: {targets, labels}


@dataclass
class PrometheusFiles:
    """What write_prometheus wrote (the CLI's summary line)."""

    jobs: list[str]  # the vLLM scrape jobs
    targets: int  # vLLM servers scraped, in all jobs
    balancers: int  # whole boxes' HAProxy exporters (BALANCER_JOB)
    skipped_loopback: list[str]  # hosts whose vLLM listens on loopback only: no target
    baselines: list[str]  # hosts with a smoke baseline


def prometheus_config(
    jobs: list[ScrapeJob], *, scrape_interval: str = "15s", live: bool = False
) -> dict:
    scrape_configs = []
    for job in jobs:
        entry: dict[str, Any] = {
            "job_name": job.name,
            "metrics_path": "/metrics",
            "file_sd_configs": [{"files": [f"targets/{job.name}.json"]}],
        }
        if job.key_file:
            entry["authorization"] = {"type": "Bearer", "credentials_file": job.key_file}
        scrape_configs.append(entry)
    return {
        "global": {"scrape_interval": scrape_interval, "evaluation_interval": scrape_interval},
        "rule_files": ["rules.yml", "baselines.yml"] + ([LIVE_RULES] if live else []),
        "scrape_configs": scrape_configs,
    }


def _write(path: Path, text: str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch(mode=mode)
    os.chmod(path, mode)
    path.write_text(text)


def write_prometheus(
    out: Path,
    hosts: list[tuple[str, list[str], dict[str, Any], ServeConfig]],
    *,
    reports: Path,
    warn=print,
) -> PrometheusFiles:
    """Write the Prometheus directory for these hosts (name, groups, host data, config). Relative
    paths inside prometheus.yml are relative to it, as Prometheus resolves them."""
    import yaml

    jobs: dict[str | None, ScrapeJob] = {}  # api key (or None) -> job
    skipped, baselines = [], {}
    proven: dict[str, int] = {}
    unproven: list[str] = []
    balancers = []
    for name, groups, data, cfg in hosts:
        targets = [(a, labels) for a, labels in scrape_targets(name, groups, data, cfg) if a]
        if not targets:
            skipped.append(name)
            warn(
                f"{name}: vllm_host {cfg.vllm_host} is loopback: no Prometheus target (bind a "
                "private address, or scrape through a proxy on the host)"
            )
            continue
        key = cfg.vllm_api_key or None
        if key not in jobs:
            index = sum(1 for k in jobs if k is not None) + 1
            job_name = JOB if key is None else f"{JOB}-key{index}"
            jobs[key] = ScrapeJob(job_name, f"api-keys/{job_name}.key" if key else None)
        jobs[key].targets += [{"targets": [a], "labels": labels} for a, labels in targets]
        balancer = balancer_target(name, groups, data, cfg)
        if balancer:
            balancers.append(balancer)
        smoke = latest_smoke(reports, name)
        if smoke:
            baselines[name] = smoke
        # without a schedule, max_num_seqs: no batch leaves it, so the alert has data and is quiet;
        # a schedule: the range its kept proof proves, else it is unproven (no range at all)
        if SCHEDULE_KEY not in cfg.speculative_config:
            proven[name] = cfg.effective_max_num_seqs
        elif schedule := proof_range(kept_proof_of(reports, cfg, name)):
            proven[name] = schedule[1]
        else:
            unproven.append(name)
    if (out / "api-keys").is_dir():
        shutil.rmtree(out / "api-keys")  # keys of jobs that no longer exist must not linger
    if (out / "targets").is_dir():
        shutil.rmtree(out / "targets")
    for key, job in jobs.items():
        _write(out / "targets" / f"{job.name}.json", json.dumps(job.targets, indent=2) + "\n")
        if key:
            _write(out / job.key_file, key + "\n", mode=0o600)
    scraped = list(jobs.values())
    if balancers:  # HAProxy's exporter asks for no key; it shows no request content
        scraped.append(ScrapeJob(BALANCER_JOB, None, balancers))
        _write(out / "targets" / f"{BALANCER_JOB}.json", json.dumps(balancers, indent=2) + "\n")
    header = "# Written by `specdeploy render`; regenerate rather than edit.\n"
    # a control arm's live verdict: its rules (and the alert when its exporter goes missing)
    live = any(cfg.speculation_control is not None for _, _, _, cfg in hosts)
    config = prometheus_config(scraped, live=live)
    _write(out / "prometheus.yml", header + yaml.safe_dump(config, sort_keys=False))
    rules = baseline_rules(baselines, proven, unproven)
    _write(out / "baselines.yml", header + yaml.safe_dump(rules))
    for name in MONITORING_TEMPLATES:
        shutil.copyfile(monitoring_dir() / name, out / name)
    if live:
        shutil.copyfile(monitoring_dir() / LIVE_RULES, out / LIVE_RULES)
    elif (out / LIVE_RULES).exists():
        (out / LIVE_RULES).unlink()  # no control arm any more: no alert on a missing verdict
    return PrometheusFiles(
        jobs=[job.name for job in jobs.values()],
        targets=sum(len(job.targets) for job in jobs.values()),
        balancers=len(balancers),
        skipped_loopback=skipped,
        baselines=sorted(baselines),
    )
