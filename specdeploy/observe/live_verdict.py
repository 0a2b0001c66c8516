"""The live verdict on a running box, or a class of plain hosts, with a control arm: read both arms'
/metrics once a window, judge (decide/live_rule.py), keep what was seen and decided on the control
node, export it to Prometheus (prometheus_client) and say it in `specdeploy status`.

One `LiveJudge` per box, and one per control class of plain hosts (render/control.class_key),
named by its class (render/control.class_name) where a box's is named by its host: there each
host is what an instance is on a box. Each `observe()` is one window boundary: every instance's
(or class host's) /metrics (the same text Prometheus scrapes), summed per arm
(live_rule.arm_counters). The windows, the decisions and the autopilot's steps are written to
`<reports>/<host or class>/live-verdict.json` after each boundary, so a restarted judge,
`specdeploy status` and a replay read the same evidence.

Exported series (one set per box or class, its name in the `host` label; the verdict is a label,
so an alert matches on it and never on a comparison that a NaN would silence):

* `speculation_live_ratio{host, verdict}`: the latest decision's median paired ratio
  (speculative / baseline TPOT), `speculation_live_ratio_low` / `_high` its interval;
* `speculation_live_verdict{host, verdict}`: 1 for the current verdict, 0 for the others (every
  verdict always has a series);
* `speculation_live_windows{host, kind}`: usable, skipped, pending (toward the next decision);
* `speculation_live_alpha{host}`: the false-verdict rate each decision is made at;
* `speculation_live_autopilot{host, serving}`: 1 for what the box serves by the autopilot.
"""

from __future__ import annotations

import json
import math
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from prometheus_client import CollectorRegistry, Gauge, generate_latest

from specdeploy.config.schema import ServeConfig, config_from_data
from specdeploy.config.timestamps import utc_iso
from specdeploy.decide import live_rule
from specdeploy.render.control import (
    EVIDENCE_ENV,
    FALLBACK_ENV,
    class_key,
    class_name,
    control_classes,
    control_instances,
)
from specdeploy.render.instances import expand
from specdeploy.report.paths import reports_root

LIVE_FILE = "live-verdict.json"


def live_path(host: str, root: Path | None = None) -> Path:
    return (root or reports_root()) / host / LIVE_FILE


def arm_urls(
    cfg: ServeConfig,
    *,
    fallen_back: bool = False,
    address=None,
    hosts: Mapping[str, ServeConfig] | None = None,
) -> dict[str, dict[str, str]]:
    """{arm: {instance name: its /metrics URL}}: a box's instances, or with `hosts` ({host name:
    config}: a control class) its hosts. `address(name, cfg)` gives host:port as the control node
    reaches it (monitoring.scrape_address; None: loopback), else the server's own base_url."""
    members = list(hosts.items()) if hosts else [(m.name, m.cfg) for m in expand(cfg).instances]
    names = [name for name, _ in members]
    control = set(control_instances(cfg, names, fallen_back=fallen_back))
    out: dict[str, dict[str, str]] = {arm: {} for arm in live_rule.ARMS}
    for name, own in members:
        where = address(name, own) if address else own.base_url.removeprefix("http://")
        if where is None:
            raise ValueError(
                f"{name}: vllm_host {own.vllm_host} is loopback: the live judge cannot read its "
                "/metrics from here (bind a private address, as for Prometheus)"
            )
        out["baseline" if name in control else "speculative"][name] = f"http://{where}/metrics"
    return out


def _get(url: str, timeout: float = 10.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as answer:
        return answer.read().decode()


class LiveJudge:
    """A box's (or a control class's) live verdict over time; `state` is what live-verdict.json
    holds. `host`: the box's host, or the class's name; `hosts`: a class's {host name: config}
    (its settings agree: checks/live.check_classes; `cfg` is one of them)."""

    def __init__(
        self,
        host: str,
        cfg: ServeConfig,
        *,
        path: Path | None = None,
        fetch: Callable[[str], str] | None = None,
        clock: Callable[[], float] = time.time,
        address=None,
        hosts: Mapping[str, ServeConfig] | None = None,
    ):
        self.host, self.cfg, self.fetch, self.clock = host, cfg, fetch, clock
        self.address, self.hosts = address, dict(hosts) if hosts else None
        # what an autopilot's roll limits the serve run to: the box's host, or the class's hosts
        self.targets = sorted(self.hosts) if self.hosts else [host]
        self.path = path or live_path(host)
        self.state = self._load()

    def _load(self) -> dict:
        try:
            state = json.loads(self.path.read_text())
        except (OSError, ValueError):
            state = None
        if not state or state.get("host") != self.host:
            state = {
                "host": self.host,
                "settings": self.settings(),
                "snapshots": [],
                "autopilot": live_rule.autopilot_start(),
                "steps": [],
            }
        if self.hosts:
            state["hosts"] = self.targets
        return state

    def settings(self) -> dict:
        cfg = self.cfg
        return {
            "window_s": cfg.live_window_s,
            "windows_per_decision": cfg.live_windows,
            "min_requests": cfg.live_min_requests,
            "alpha": cfg.decision_alpha,
            "autopilot": cfg.speculation_autopilot,
            "after": cfg.speculation_autopilot_after,
        }

    def observe(self, texts: Mapping[str, Mapping[str, str]] | None = None) -> dict:
        """One window boundary: every instance's counters now (`texts`: {arm: {instance:
        /metrics text}}, else fetched), then the verdict and the autopilot's steps on every new
        decision. Returns `result()`."""
        if texts is None:
            urls = arm_urls(self.cfg, address=self.address, hosts=self.hosts)
            fetch = self.fetch or _get  # read at call time: a test replaces the module's
            every = {n: fetch(u) for us in urls.values() for n, u in us.items()}
            # each instance's arm is what it serves, read from its own /metrics (a speculative
            # server exports vLLM's spec-decode counters), not what the host data meant it to
            texts = {arm: {} for arm in live_rule.ARMS}
            for name, text in every.items():
                texts[live_rule.arm_served(text)][name] = text
        snap = {
            "t": self.clock(),
            **{
                arm: {n: live_rule.arm_counters([text]) for n, text in texts[arm].items()}
                for arm in live_rule.ARMS
            },
        }
        self.state["snapshots"].append(snap)
        self._deployed_back(snap)
        result = self.result()
        settings = self.state["settings"]
        for decision in result["decisions"][self.state.setdefault("decided", 0) :]:
            self.state["decided"] += 1
            new, action, why = live_rule.autopilot_step(
                self.state["autopilot"],
                decision,
                mode=settings["autopilot"],
                after=settings["after"],
            )
            self.state["autopilot"] = new
            self.state["steps"].append(
                {
                    "verdict": decision["verdict"],
                    "text": decision["text"],
                    "action": action,
                    "why": why,
                    "start": decision["start"],
                    "end": decision["end"],
                }
            )
        self.save()
        return result

    def _deployed_back(self, snap: dict) -> None:
        """A fallen-back box that serves more speculative instances than a fall-back keeps was
        deployed again: back to speculation, the streaks from zero (said in the steps)."""
        pilot = self.state["autopilot"]
        served = len(snap["speculative"])
        size = served + len(snap["baseline"])
        if pilot["serving"] == "baseline" and len(snap["speculative"]) > live_rule.fallback_keeps(
            size
        ):
            self.state["autopilot"] = live_rule.autopilot_start() | {"switches": pilot["switches"]}
            self.state["steps"].append(
                {
                    "verdict": None,
                    "text": None,
                    "action": live_rule.DEPLOYED,
                    "why": f"{served} of {size} {'hosts' if self.hosts else 'instances'} serve "
                    "speculation again",
                    "start": snap["t"],
                    "end": snap["t"],
                }  # fmt: skip
            )

    def result(self) -> dict:
        s = self.state["settings"]
        windows = live_rule.windows_from_snapshots(
            self.state["snapshots"], min_requests=s["min_requests"]
        )
        return live_rule.live_decisions(
            windows, windows_per_decision=s["windows_per_decision"], alpha=s["alpha"]
        )

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.state, indent=1) + "\n")
        tmp.replace(self.path)

    def pending_action(self) -> dict | None:
        """The latest autopilot step when it asks to roll the box (fall back or return)."""
        steps = self.state["steps"]
        if steps and steps[-1]["action"] in (live_rule.FALL_BACK, live_rule.RETURN):
            return steps[-1]
        return None


def step_evidence(judge: LiveJudge, step: dict) -> dict:
    """What an autopilot step that rolls the box stands on, for the records of that roll: the
    step's action and why, the decisions of its streak (their texts), the windows they cover (how
    many, from when to when), alpha, and the judge's file that holds every snapshot."""
    after = judge.state["settings"]["after"]
    streak = judge.result()["decisions"][-after:]
    return {
        "action": step["action"],
        "why": step["why"],
        "decisions": [d["text"] for d in streak],
        "windows": sum(d["windows"] for d in streak),
        "from": utc_iso(streak[0]["start"]) if streak else None,
        "to": utc_iso(streak[-1]["end"]) if streak else None,
        "alpha": judge.state["settings"]["alpha"],
        "evidence": str(judge.path),
    }


def roll_command(
    inventory: str, host: str | Sequence[str], step: dict, evidence: dict | None = None
) -> tuple[list[str], dict[str, str]]:
    """The ordinary rolling path for an autopilot step that rolls the box or the class (argv,
    environment): `pyinfra INVENTORY deploys/serve.py --limit HOST` (a class: a --limit per host;
    the serve run rolls them max_unavailable at a time), with FALLBACK_ENV set for a fall-back
    (the box or class keeps one speculative instance or host as its control arm) and the step's
    `evidence` (step_evidence) for its records; nothing set for a return."""
    env = {}
    if step["action"] == live_rule.FALL_BACK:
        env[FALLBACK_ENV] = "1"
        if evidence is not None:
            env[EVIDENCE_ENV] = json.dumps(evidence, sort_keys=True)
    hosts = [host] if isinstance(host, str) else list(host)
    limits = [word for name in hosts for word in ("--limit", name)]
    return ["pyinfra", "-y", inventory, "deploys/serve.py", *limits], env


def export(registry: CollectorRegistry, results: Mapping[str, tuple[dict, dict]]) -> None:
    """The series of the module docstring into `registry`, for {host: (result, judge state)}."""
    ratio = Gauge(
        "speculation_live_ratio",
        "Median paired window ratio speculative / baseline TPOT of the latest live decision",
        ["host", "verdict"],
        registry=registry,
    )
    low = Gauge(
        "speculation_live_ratio_low",
        "Lower bound of speculation_live_ratio at 1 - alpha",
        ["host", "verdict"],
        registry=registry,
    )
    high = Gauge(
        "speculation_live_ratio_high",
        "Upper bound of speculation_live_ratio at 1 - alpha",
        ["host", "verdict"],
        registry=registry,
    )
    verdict = Gauge(
        "speculation_live_verdict",
        "1 for the current live verdict, 0 for the others",
        ["host", "verdict"],
        registry=registry,
    )
    windows = Gauge(
        "speculation_live_windows",
        "Windows of the live verdict by kind",
        ["host", "kind"],
        registry=registry,
    )
    alpha = Gauge(
        "speculation_live_alpha",
        "False-verdict rate of each live decision",
        ["host"],
        registry=registry,
    )
    serving = Gauge(
        "speculation_live_autopilot",
        "1 for what the autopilot has the box serve",
        ["host", "serving"],
        registry=registry,
    )
    for host, (result, state) in results.items():
        current = result["current"]
        name = current["verdict"]

        def number(x):
            return math.nan if x is None else x

        ratio.labels(host, name).set(number(current.get("ratio")))
        low.labels(host, name).set(number(current.get("low")))
        high.labels(host, name).set(number(current.get("high")))
        for v in live_rule.LIVE_VERDICTS:
            verdict.labels(host, v).set(1 if v == name else 0)
        usable = len(result["windows"]) - result["skipped"]
        windows.labels(host, "usable").set(usable)
        windows.labels(host, "skipped").set(result["skipped"])
        windows.labels(host, "pending").set(result["pending"])
        alpha.labels(host).set(state["settings"]["alpha"])
        for arm in live_rule.ARMS:
            serving.labels(host, arm).set(1 if state["autopilot"]["serving"] == arm else 0)


def metrics_text(results: Mapping[str, tuple[dict, dict]]) -> bytes:
    """The exposition text of `export` (for a textfile collector or an HTTP answer)."""
    registry = CollectorRegistry()
    export(registry, results)
    return generate_latest(registry)


def live_summary(host: str, root: Path | None = None) -> dict | None:
    """A box's (or class's) live verdict as the judge last left it (None: no judge for it):
    {verdict, text, ratio, low, high, confidence, windows, skipped, pending, alpha, autopilot,
    serving, hosts (a class's; None for a box)}."""
    try:
        state = json.loads(live_path(host, root).read_text())
    except (OSError, ValueError):
        return None
    s = state["settings"]
    windows = live_rule.windows_from_snapshots(state["snapshots"], min_requests=s["min_requests"])
    result = live_rule.live_decisions(
        windows, windows_per_decision=s["windows_per_decision"], alpha=s["alpha"]
    )
    current = result["current"]
    return {
        "verdict": current["verdict"],
        "text": current["text"],
        **{key: current.get(key) for key in ("ratio", "low", "high", "confidence", "windows")},
        "skipped": result["skipped"],
        "pending": result["pending"],
        "alpha": s["alpha"],
        "autopilot": s["autopilot"],
        "serving": state["autopilot"]["serving"],
        "hosts": state.get("hosts"),
    }


def judge_names(hosts: Sequence[str], configs: Mapping[str, ServeConfig]) -> list[str]:
    """The judges `hosts` are judged by, once each in their order: a host's own name (a box), or
    its control class's (render/control.class_name; `configs`: the inventory's {name: config})."""
    out: list[str] = []
    for host in hosts:
        cfg = configs.get(host)
        name = class_name(cfg) if cfg is not None and class_key(cfg) is not None else host
        if name not in out:
            out.append(name)
    return out


def status_lines(hosts: Sequence[str], root: Path | None = None) -> list[str]:
    """What `specdeploy status` says of each box's or class's live verdict (`hosts`: their judges'
    names; those without a judge: none)."""
    lines = []
    for host in hosts:
        summary = live_summary(host, root)
        if summary is None:
            continue
        skipped = f", {summary['skipped']} skipped" if summary["skipped"] else ""
        pilot = (
            ""
            if summary["autopilot"] == "off"
            else f"; autopilot {summary['autopilot']}: serving {summary['serving']}"
        )
        members = f" ({len(summary['hosts'])} hosts)" if summary["hosts"] else ""
        lines.append(
            f"live verdict {host}{members}: {summary['text']} (alpha {summary['alpha']:g}"
            f"{skipped}, {summary['pending']} toward the next){pilot}"
        )
    return lines


class _LiveCollector:
    """prometheus_client collector: the judges' latest results, as `export` writes them."""

    def __init__(self, judges: Sequence[LiveJudge]):
        self.judges = judges

    def collect(self):
        registry = CollectorRegistry()
        export(registry, {j.host: (j.result(), j.state) for j in self.judges})
        yield from registry.collect()


def judges_for(inventory: str, *, limit=None, group_data=None, warn=print) -> list[LiveJudge]:
    """A judge per box of the inventory with a control arm (speculation_control), and one per
    control class of plain hosts (render/control.control_classes, over the whole inventory) with a
    host in `limit`. A class the checks refuse (checks/live.check_classes) raises ConfigError."""
    from specdeploy.checks.host_data import check_config
    from specdeploy.checks.live import check_classes
    from specdeploy.config.inventory import hosts_with_data, limit_hosts
    from specdeploy.config.problems import ConfigError
    from specdeploy.observe.monitoring import scrape_address

    hosts = hosts_with_data(inventory, group_data)
    chosen = set(limit_hosts([(n, g) for n, g, _ in hosts], limit, inventory))
    datas = {name: data for name, _, data in hosts}
    configs = {}
    for name, data in datas.items():  # the limit's hosts checked; the others only for classes
        if name in chosen:
            configs[name] = check_config(name, data)
        else:
            try:
                configs[name] = config_from_data(data)
            except ValueError:  # pydantic's ValidationError: in no class, refused where deployed
                continue
    problems = check_classes(configs)
    if problems:
        raise ConfigError(problems)
    judges = []
    for name in datas:
        cfg = configs[name]
        if name not in chosen or cfg.speculation_control is None or cfg.instances is None:
            continue
        judge = LiveJudge(name, cfg, address=lambda _, c, n=name: scrape_address(n, datas[n], c))
        arm_urls(cfg, address=judge.address)  # loopback: refused now, not at the first window
        judges.append(judge)
    for members in control_classes(configs).values():
        if not chosen.intersection(members):
            continue
        cfg = configs[members[0]]
        judge = LiveJudge(class_name(cfg), cfg, hosts={m: configs[m] for m in members},
                          address=lambda n, c: scrape_address(n, datas[n], c))  # fmt: skip
        arm_urls(cfg, address=judge.address, hosts=judge.hosts)
        judges.append(judge)
    if not judges:
        warn(
            "no host of this inventory has a control arm (speculation_control) on a box or "
            "across a class of plain hosts"
        )
    return judges


def roll_if_asked(judge: LiveJudge, inventory: str, *, run=None, warn=print) -> dict | None:
    """The autopilot's pending roll (fall back or return), through the ordinary serve path, once
    per step: the step records the command's exit status."""
    import os
    import subprocess

    step = judge.pending_action()
    if step is None or "rolled" in step:
        return None
    argv, env = roll_command(inventory, judge.targets, step, step_evidence(judge, step))
    warn(f"live verdict {judge.host}: {step['action']}: {step['why']}")
    runner = run or (lambda a, e: subprocess.run(a, env={**os.environ, **e}).returncode)
    step["rolled"] = runner(argv, env)
    judge.save()
    return step


def run_live(
    inventory: str,
    *,
    limit=None,
    group_data=None,
    metrics_port: int | None = None,
    once: bool = False,
    out=None,
    sleep=time.sleep,
) -> int:
    """`specdeploy live`: every box's judge reads both arms once a window (each host's own
    live_window_s), exports the verdicts on `metrics_port` (prometheus_client), prints each new
    decision and rolls a box when its autopilot says so. `once`: one boundary, the status lines."""
    import sys

    out = out or sys.stdout
    judges = judges_for(inventory, limit=limit, group_data=group_data,
                        warn=lambda m: print(m, file=out))  # fmt: skip
    if not judges:
        return 1
    if metrics_port is not None:
        from prometheus_client import REGISTRY, start_http_server

        REGISTRY.register(_LiveCollector(judges))
        start_http_server(metrics_port)
    due = {j.host: 0.0 for j in judges}
    while True:
        now = time.time()
        for judge in judges:
            if now < due[judge.host]:
                continue
            due[judge.host] = now + judge.state["settings"]["window_s"]
            seen = len(judge.state["steps"])
            try:
                judge.observe()
            except OSError as error:  # an instance down: this boundary is lost, not guessed
                print(f"live verdict {judge.host}: /metrics not read ({error})", file=out)
                continue
            for step in judge.state["steps"][seen:]:
                print(f"live verdict {judge.host}: {step['text']} -> {step['action']}", file=out)
            if judge.state["settings"]["autopilot"] in ("fallback", "both"):
                roll_if_asked(judge, inventory, warn=lambda m: print(m, file=out))
        if once:
            for line in status_lines([j.host for j in judges], root=judges[0].path.parents[1]):
                print(line, file=out)
            return 0
        sleep(max(1.0, min(due.values()) - time.time()))
