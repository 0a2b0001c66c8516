"""deploys/tune.py's default flow (predict, then confirm) replayed on a live run: the trained
sandbox pair's target with its poor draft (pycode-draft-poor), tune_k 2-4, no warm-up, 4 requests
per run, measured on a sandbox host by tests/integration/test_trained_models.py
(test_tune_on_the_poor_draft_predicts_then_confirms_and_leaves_speculation_off records it as
`trained_tune`: raw/<host>/NN-<arm>.json, raw/<host>/conditions.json, raw/<host>/prediction.json,
summary.json, provenance.json).

The flow (tune_flow.predict_plan) is fed each arm's next recorded run in the order it asks for
them: it must ask for exactly the recorded runs in their order (the pins, then the confirm window
it chose from them), record exactly the recorded prediction and reach the recorded decision. Only
what holds for ANY recording of that live test is asserted: which of the flow's two paths a
recording took is read from its pins (a draft this poor sits within the machine's noise of the
baseline, so one pin run can land either side): every k predicted slower, so only the best k is
confirmed, 3 + 3 runs; or one predicted faster by noise, so the best and its neighbour, 4 runs
each. The decision's p-values are recomputed here from the raw JSONs without specdeploy's
statistics: no confirmed k is shown faster, so "leave speculation off"."""

from __future__ import annotations

import json
import shutil
from collections import Counter, deque
from pathlib import Path
from typing import NamedTuple

import pytest

from specdeploy.config.schema import config_from_data
from specdeploy.measure.arms import Arm, k_arm
from specdeploy.measure.tune_flow import predict_plan
from specdeploy.report import summary as report
from tests.unit.conftest import VALID
from tests.unit.replays import (
    approx_tree,
    assert_tune_leaves_speculation_off,
    load,
    recording,
)

NAME = "trained_tune"
KS = [2, 3, 4]  # the live test's tune_k
PIN_ARMS = ["baseline", "k2", "k4"]  # the baseline, the smallest and the largest k, once each
ALPHA = 0.05  # the live test's decision_alpha (the default)
RUNS_ONE_K = 3  # runs per arm at which choose_k can decide over one k at ALPHA (1/20)
RUNS_TWO_K = 4  # ... over two or three k (one-sided Holm: 1/70 <= 0.025)


class Replay(NamedTuple):
    path: Path  # the recording
    host: str
    cond: dict  # its conditions.json
    runs: list[dict]  # its runs in index order
    asked: list[dict]  # the runs in the order the replayed flow asked for them
    states: list[dict]  # each prediction state the replayed flow recorded, as written then


def recorded_host(path: Path) -> str:
    """The one host the recording measured (the live test limits the tune to it)."""
    (host,) = [d.name for d in (path / "raw").iterdir() if d.is_dir()]
    return host


def counted_arms(runs: list[dict]) -> list[str]:
    return [r["specdeploy"]["arm"] for r in runs if not r["specdeploy"]["warmup"]]


@pytest.fixture(scope="module")
def replay() -> Replay:
    """predict_plan with the recorded settings, driven by the recorded runs: each arm it asks for
    gets that arm's next recorded run. Every state it records is kept as JSON, as prediction.json
    held it at that moment (the flow updates one dict in place)."""
    path = recording(NAME)
    host = recorded_host(path)
    raw = path / "raw" / host
    cond = load(raw / "conditions.json")
    assert cond["tune_method"] == "predict" and cond["restart_between_samples"] is True, cond
    assert cond["ks"] == KS and cond["decision_alpha"] == ALPHA and cond["repeats"] is None, cond
    cfg = config_from_data({**VALID, "decision_alpha": cond["decision_alpha"]})
    runs = [load(f) for f in sorted(raw.glob("[0-9][0-9]-*.json"))]
    queues: dict[tuple[str, bool], deque] = {}
    for r in runs:
        queues.setdefault((r["specdeploy"]["arm"], r["specdeploy"]["warmup"]), deque()).append(r)
    asked: list[dict] = []
    states: list[dict] = []
    plan = predict_plan(
        cfg,
        ks=cond["ks"],
        repeats=cond["repeats"],
        warmup_runs=cond["warmup_runs"],
        read=lambda: list(asked),
        arm_for=lambda k: k_arm(cfg, k) if k else Arm("baseline", False),
        record=lambda state: states.append(json.loads(json.dumps(state))),
    )
    for arm, warm, same_server in plan:
        assert not same_server
        queue = queues.get((arm.label, warm))
        assert queue, f"the flow asked for a run the live run did not make: {arm.label}"
        asked.append(queue.popleft())
    return Replay(path, host, cond, runs, asked, states)


def recorded_prediction(r: Replay) -> dict:
    return load(r.path / "raw" / r.host / "prediction.json")


def test_the_flow_asks_for_exactly_the_recorded_runs_in_their_order(replay):
    r = replay
    assert [x["specdeploy"]["index"] for x in r.asked] == list(range(len(r.runs)))
    arms = counted_arms(r.asked)
    assert arms[:3] == PIN_ARMS, arms  # the pin phase
    prediction = recorded_prediction(r)
    window = ["baseline", *(f"k{k}" for k in prediction["confirm_k"])]
    assert set(arms[3:]) <= set(window), (arms, prediction["confirm_k"])  # then only the window
    counts = Counter(arms)
    for label in window:  # the pin runs count towards the window's runs
        if prediction["extensions"]:  # the best beside an added k gets runs of its own
            assert counts[label] >= prediction["runs_per_arm"], counts
        else:
            assert counts[label] == prediction["runs_per_arm"], counts
    for label in set(PIN_ARMS) - set(window):  # a pinned k outside the window keeps its pin run
        assert counts[label] == 1, counts


def test_the_prediction_is_the_recorded_one_and_follows_from_the_pins(replay):
    r = replay
    live = recorded_prediction(r)
    assert r.states[-1] == approx_tree(live)  # decisions exact, fitted figures to 1e-9
    counted = [x for x in r.runs if not x["specdeploy"]["warmup"]]
    pins = counted[:3]
    # per-position acceptance pooled over the pin runs, weighted by their drafts
    acc, drafts = [0.0] * max(KS), [0.0] * max(KS)
    for run in pins[1:]:
        for i, a in enumerate(run["spec_decode_per_position_acceptance_rates"]):
            acc[i] += a * run["spec_decode_num_drafts"]
            drafts[i] += run["spec_decode_num_drafts"]
    rates = [a / d for a, d in zip(acc, drafts, strict=True)]
    assert live["pinned_k"] == [2, 4]
    assert live["per_position_acceptance"] == pytest.approx(rates)
    rows = {row["k"]: row for row in live["rows"]}
    assert rows[0]["tpot_ms"] == pytest.approx(pins[0]["median_tpot_ms"])
    for k, run in ((2, pins[1]), (4, pins[2])):  # measured k keep their own run's L
        assert rows[k]["acceptance_length"] == pytest.approx(run["spec_decode_acceptance_length"])
    # the unmeasured k: L(3) = 1 + a_1 + a_2 + a_3 from the pooled rates
    assert rows[3]["acceptance_length_source"] == "per-position rates"
    assert rows[3]["acceptance_length"] == pytest.approx(1 + sum(rates[:3]))
    assert live["predicted_best_k"] == min(KS, key=lambda k: (rows[k]["tpot_ms"], k))


def test_the_confirm_window_is_the_one_the_pins_call_for(replay):
    """The state the flow recorded before its first confirm run: which path it took follows from
    the predicted rows (best k predicted slower than the baseline's pin run or not)."""
    r = replay
    live = recorded_prediction(r)
    first = r.states[0]
    assert first["extensions"] == 0
    rows = {row["k"]: row for row in live["rows"]}
    best = live["predicted_best_k"]
    if rows[best]["tpot_ms"] >= rows[0]["tpot_ms"]:  # predicted off: the best k alone, 3 + 3
        assert first["confirm_k"] == [best] and first["predicted_off"], first
        assert first["runs_per_arm"] == RUNS_ONE_K
        if not live["extensions"]:  # rounds rotating who goes first, the pin runs counted
            arms = counted_arms(r.asked)
            assert arms[3:] == ["baseline", f"k{best}", f"k{best}", "baseline"], arms
    else:  # predicted faster (by noise): the best and its neighbour, the runs choose_k needs
        neighbours = [k for k in KS if abs(KS.index(k) - KS.index(best)) <= 1]
        assert first["confirm_k"] == neighbours and not first.get("predicted_off"), first
        assert first["runs_per_arm"] == RUNS_TWO_K
    # an extension adds the k beyond the window's edge, one at a time
    assert set(first["confirm_k"]) <= set(live["confirm_k"])
    assert len(live["confirm_k"]) == len(first["confirm_k"]) + live["extensions"]


def test_the_decision_leaves_speculation_off_recomputed_from_the_raw_jsons(replay, tmp_path):
    r = replay
    shutil.copytree(r.path / "raw" / r.host, tmp_path / "raw" / r.host)
    report.write(tmp_path, "tune")
    h = load(tmp_path / "summary.json")["hosts"][r.host]
    live = load(r.path / "summary.json")["hosts"][r.host]
    assert h["choice"] == approx_tree(live["choice"])
    assert h["predict_flow"] == approx_tree(live["predict_flow"])
    prediction = recorded_prediction(r)
    confirmed = prediction["confirm_k"]
    tpot = {
        label: [x["median_tpot_ms"] for x in r.runs if x["specdeploy"]["arm"] == label]
        for label in ("baseline", *(f"k{k}" for k in confirmed))
    }
    assert_tune_leaves_speculation_off(h, tpot)  # no confirmed k shown faster, p recomputed
    flow = {row["k"]: row for row in h["predict_flow"]["rows"]}
    predicted = {row["k"]: row for row in prediction["rows"]}
    assert flow[3]["predicted_tpot_ms"] == pytest.approx(predicted[3]["tpot_ms"])
    counts = Counter(counted_arms(r.asked))
    for k in (0, *KS):  # the pin runs count: a pinned k outside the window keeps its one run
        assert flow[k]["measured_runs"] == counts[f"k{k}" if k else "baseline"], flow
    if 3 not in confirmed:
        assert flow[3]["role"] == "predicted only"
    md = (tmp_path / "summary.md").read_text()
    assert "predicted, then confirmed" in md and "none: leave speculation off" in md
    if prediction.get("predicted_off"):
        assert "Only the predicted best was confirmed" in md
