"""Replay of the verdict wing's recording (tests/integration/test_live_verdict.py): the windows
recomputed from the recorded /metrics snapshots give the decisions the live judge made, and the
autopilot replayed on them takes the same steps; phase 1 (the trained set) pays, phase 2 (the
traffic the probe found slowest for speculation) loses until the autopilot falls back; the probe
says why (acceptance collapses); the series the judge exported at the fall-back fire the alert with
the recorded ratio; the manual's chart is drawn from it."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from specdeploy.decide import live_rule
from specdeploy.observe import live_verdict
from tests.unit.replays import REPLAYS, approx_tree, load, recording

RECORDED = REPLAYS / "live_verdict"


@pytest.fixture(scope="module")
def state():
    return load(recording("live_verdict") / "live-verdict.json")  # fails without it


@pytest.fixture(scope="module")
def replayed(state):
    s = state["settings"]
    windows = live_rule.windows_from_snapshots(state["snapshots"], min_requests=s["min_requests"])
    return live_rule.live_decisions(
        windows, windows_per_decision=s["windows_per_decision"], alpha=s["alpha"]
    )


def test_the_recorded_windows_give_the_recorded_decisions_and_steps(state, replayed):
    phases = load(RECORDED / "phases.json")
    s = state["settings"]
    texts = [d["text"] for d in replayed["decisions"]]
    assert texts == approx_tree([step["text"] for step in state["steps"]])
    steps = live_rule.autopilot_replay(replayed["decisions"], mode=s["autopilot"], after=s["after"])
    assert [r["action"] for r in steps] == [step["action"] for step in state["steps"]]
    verdicts = [d["verdict"] for d in replayed["decisions"]]
    assert verdicts[: phases["phase1_steps"]][-1] == live_rule.PAYS
    assert verdicts[phases["phase1_steps"] :][-s["after"] :] == [live_rule.LOSES] * s["after"]
    assert steps[-1]["action"] == live_rule.FALL_BACK
    assert steps[-1]["state"]["serving"] == "baseline"


def test_no_decision_mixes_the_two_phases(state, replayed):
    """The window of phase 1's last requests, the last before phase 2's clients started, is skipped
    (too few), so every decision's windows lie wholly in one phase."""
    start = load(RECORDED / "phases.json")["phase2_start"]
    last = [w for w in replayed["windows"] if w["end"] <= start][-1]
    assert last["skipped"].startswith("too little traffic"), last
    # that window ends once phase 1's clients are done, just before phase 2's start
    for decision in replayed["decisions"]:
        assert decision["end"] <= last["start"] or decision["start"] >= last["end"], decision


def test_the_probe_says_acceptance_collapses_where_speculation_loses(replayed):
    """Phase 2's traffic is the probed one with the highest ratio, above 1, with a lower draft
    acceptance than phase 1's windows had."""
    probed = load(RECORDED / "probe.json")
    phase2 = load(RECORDED / "phases.json")["phase2_traffic"]
    assert phase2 == max(probed, key=lambda name: probed[name]["ratio"])
    assert probed[phase2]["ratio"] > 1
    phase1_acceptance = replayed["decisions"][0]["acceptance_rate"]
    assert probed[phase2]["speculative"]["acceptance_rate"] < phase1_acceptance


def series_from_export(text: str, minutes: int) -> list[dict]:
    """promtool input series holding the exporter's values steady for `minutes`."""
    out = []
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            value = "NaN" if sample.value != sample.value else f"{sample.value:g}"
            out.append({"series": f"{sample.name}{{{labels}}}", "values": f"{value}x{minutes}"})
    return out


@pytest.mark.needs_tool("promtool")
def test_the_series_exported_at_the_fall_back_fire_the_alert_with_the_recorded_ratio(
    state, replayed, tmp_path
):
    from tests.unit.observe.test_live_export import promtool_test

    host = state["host"]
    exported = live_verdict.metrics_text({host: (replayed, state)}).decode()
    ratio = replayed["current"]["ratio"]
    result = promtool_test(
        tmp_path,
        [
            {
                "interval": "1m",
                "input_series": series_from_export(exported, 20),
                "alert_rule_test": [
                    {
                        "alertname": "SpeculationLosesOnLiveTraffic",
                        "eval_time": "10m",
                        "exp_alerts": [
                            {
                                "exp_labels": {"host": host, "severity": "warning"},
                                "exp_annotations": {
                                    "summary": f"{host}: speculation is slower than the baseline "
                                    "on live traffic",
                                    "description": "The live verdict says loses at alpha (median "
                                    f"paired window ratio {ratio:.2g}); `specdeploy status` shows "
                                    "it with its interval and windows.",
                                },
                            }
                        ],
                    }
                ],
            }
        ],
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_status_says_loses_and_serving_the_baseline(state, tmp_path):
    (tmp_path / state["host"]).mkdir()
    (tmp_path / state["host"] / live_verdict.LIVE_FILE).write_text(
        (RECORDED / "live-verdict.json").read_text()
    )
    (line,) = live_verdict.status_lines([state["host"]], root=tmp_path)
    assert f"live verdict {state['host']}: loses" in line and "serving baseline" in line
    assert line == load(RECORDED / "fallback.json")["status_line"]


def test_the_chart_draws_every_decision_in_its_verdicts_colour(state, tmp_path, monkeypatch):
    from specdeploy.report import charts

    drawn = []
    real = charts.save
    monkeypatch.setattr(charts, "save", lambda fig, path, rect=(0, 0, 1, 1): (
        drawn.append(fig), real(fig, path, rect))[1])  # fmt: skip
    charts.live_chart(state, tmp_path / "live.png")
    (fig,) = drawn
    low = fig.axes[1]
    bars = [ln for ln in low.lines if ln.get_linewidth() == 3]
    verdicts = [d["verdict"] for d in live_rule.live_decisions(
        live_rule.windows_from_snapshots(state["snapshots"],
                                         min_requests=state["settings"]["min_requests"]),
        windows_per_decision=state["settings"]["windows_per_decision"])["decisions"]]  # fmt: skip
    assert [b.get_color() for b in bars] == [charts.LIVE_VERDICT_COLORS[v] for v in verdicts]
    assert (tmp_path / "live.png").stat().st_size > 0


def test_identical_arms_recorded_do_not_decide_and_their_noise_simulated_stays_under_alpha():
    """The A/A recording (both instances on the baseline after the fall-back, box-0 labelled
    speculative): its decision is undecided; decisions simulated at its traffic (requests per
    window) and its window-to-window noise (the spread of its log ratios) say pays or loses at
    most alpha of the time."""
    import math
    import random
    import statistics

    aa = load(recording("live_verdict_aa") / "live-verdict.json")
    s = aa["settings"]
    windows = live_rule.windows_from_snapshots(aa["snapshots"], min_requests=s["min_requests"])
    result = live_rule.live_decisions(
        windows, windows_per_decision=s["windows_per_decision"], alpha=s["alpha"]
    )
    assert [d["text"] for d in result["decisions"]] == approx_tree(
        [step["text"] for step in aa["steps"]]
    )
    assert [d["verdict"] for d in result["decisions"]] == [live_rule.UNDECIDED]
    used = [w for w in windows if w["ratio"] is not None]
    per_arm = statistics.median(w["baseline"]["requests"] for w in used)
    spread = statistics.stdev(math.log(w["ratio"]) for w in used)
    # a window's log ratio spreads by about request_cv * sqrt(2 / requests per arm)
    request_cv = spread * math.sqrt(per_arm / 2)
    rng = random.Random(20261205)
    verdicts = [
        live_rule.live_decisions(
            live_rule.simulated_windows(
                rng, s["windows_per_decision"], ratio=1.0, requests_per_window=2 * per_arm,
                request_cv=request_cv, min_requests=s["min_requests"],
            ),
            windows_per_decision=s["windows_per_decision"], alpha=s["alpha"],
        )["current"]["verdict"]
        for _ in range(2000)
    ]  # fmt: skip
    false_rate = sum(v not in (live_rule.UNDECIDED,) for v in verdicts) / len(verdicts)
    assert false_rate <= s["alpha"], false_rate
