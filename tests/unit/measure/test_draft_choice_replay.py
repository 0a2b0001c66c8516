"""deploys/choose_draft.py replayed on a live run: the trained sandbox pair's target with three
candidates (the trained draft, the poor one, one with another vocabulary), tune_k 1-4, no warm-up,
4 requests per run, measured on a sandbox host by tests/integration/test_choose_draft.py (recorded
as `trained_choose_draft`: raw/<host>/NN-<arm>.json, conditions.json, draft_choice.json,
summary.json; and, once applied by the serve deploy, the host's deployment record as
`trained_choose_draft_record`).

The flow (draft_flow.DraftPlan) is fed the recorded runs in the order it asks for them: it must ask
for exactly the recorded arms in their order (the pins, then the proving rounds it chose from them)
and record exactly the recorded choice; the report rebuilds the same decision from the raw files,
and the record's choice replays through the rules from itself. The winner's p-value is recomputed
here without specdeploy's statistics. On the recorded per-position acceptance, swapping two
candidates' evidence swaps their ranking: the choice follows the traffic's evidence, not the name.
"""

from __future__ import annotations

import json
import shutil
from types import SimpleNamespace

import pytest

from specdeploy.checks.draft_candidates import CandidateCheck
from specdeploy.config.problems import Problem
from specdeploy.config.schema import DraftCandidate, config_from_data
from specdeploy.decide import draft_rule
from specdeploy.measure import draft_flow
from specdeploy.report import summary as report
from tests.unit.conftest import VALID
from tests.unit.replays import approx_tree, load, rank_p_less, recording

NAME = "trained_choose_draft"
RECORD = "trained_choose_draft_record"
TRAINED = "specdeploy-sandbox/pycode-draft"


def recorded_host(path) -> str:
    (host,) = [d.name for d in (path / "raw").iterdir() if d.is_dir()]
    return host


@pytest.fixture(scope="module")
def live():
    path = recording(NAME)
    host = recorded_host(path)
    raw = path / "raw" / host
    runs = [load(f) for f in sorted(raw.glob("[0-9][0-9]-*.json"))]
    return SimpleNamespace(path=path, host=host, raw=raw, runs=runs,
                           cond=load(raw / "conditions.json"),
                           choice=load(raw / draft_flow.DRAFT_CHOICE))  # fmt: skip


def plan_of(live, out_dir) -> draft_flow.DraftPlan:
    """The DraftPlan the live run made: its candidates' checks as conditions.json keeps them."""
    cond = live.cond
    rows = cond["draft_candidates"]
    cfg = config_from_data({**VALID, "decision_alpha": cond["decision_alpha"],
                            "draft_candidates": [c["candidate"] for c in rows]})  # fmt: skip
    checks = tuple(
        CandidateCheck(i, DraftCandidate.model_validate(c["candidate"]),
                       refusals=[Problem(live.host, c["name"], why, "") for why in c["refused"]])
        for i, c in enumerate(rows)
    )  # fmt: skip
    return draft_flow.DraftPlan(cfg, checks, tuple(cond["ks"]), cond["warmup_runs"],
                                cond["draft_max_runs"], out_dir)  # fmt: skip


def test_the_flow_asks_for_the_recorded_runs_and_records_the_recorded_choice(
    live, tmp_path, monkeypatch
):
    monkeypatch.setattr(draft_flow, "logger", SimpleNamespace(info=lambda _: None))
    monkeypatch.setattr(draft_flow, "host", SimpleNamespace(print_prefix=f"{live.host}: "))
    plan = plan_of(live, tmp_path)
    asked = []
    for arm, warm in plan:
        i = len(asked)
        assert i < len(live.runs), f"the flow asked for a run the live run did not make: {arm}"
        run = live.runs[i]
        assert (arm.label, warm) == (run["specdeploy"]["arm"], run["specdeploy"]["warmup"])
        asked.append(arm.label)
        (tmp_path / f"{i:02d}-{arm.label}.json").write_text(json.dumps(run))
    assert len(asked) == len(live.runs)  # and stopped where the live run stopped
    assert not any("-d2-" in label for label in asked)  # the other vocabulary: never measured
    replayed = load(tmp_path / draft_flow.DRAFT_CHOICE)
    assert replayed["pairs"] == live.choice["pairs"]
    assert replayed["decision"] == approx_tree(live.choice["decision"])
    evidence = [{key: c[key] for key in draft_rule.EVIDENCE} for c in live.choice["candidates"]]
    assert [{key: c[key] for key in draft_rule.EVIDENCE}
            for c in replayed["candidates"]] == approx_tree(evidence)  # fmt: skip


def test_the_report_and_the_rules_replay_the_recorded_decision(live, tmp_path):
    shutil.copytree(live.path / "raw", tmp_path / "raw")
    s = report.write(tmp_path, "choose_draft")
    h = s["hosts"][live.host]
    assert h["decision"] == approx_tree(live.choice["decision"])
    assert h["decision"] == approx_tree(load(live.path / "summary.json")["hosts"][live.host]
                                        ["decision"])  # fmt: skip
    again = draft_rule.replay(live.choice)
    assert again["pairs"] == live.choice["pairs"]
    assert again["decision"] == approx_tree(live.choice["decision"])


def test_the_trained_draft_is_recommended_and_shown_faster_from_the_raw_runs(live):
    rec = live.choice["decision"]["recommended"]
    assert rec["candidate"] == 0 and rec["name"].startswith(TRAINED)
    by_arm = {}
    for r in live.runs:
        by_arm.setdefault(r["specdeploy"]["arm"], []).append(r["median_tpot_ms"])
    p = rank_p_less(by_arm[f"d0-k{rec['k']}"], by_arm["baseline"])
    assert p <= live.cond["decision_alpha"] / len(live.choice["pairs"])


def test_on_the_recorded_acceptance_the_evidence_not_the_name_ranks_the_candidates(live):
    """The recorded pin runs of the trained and the poor draft with their acceptance (and TPOT)
    swapped, as another request set could give them: the ranking swaps with the evidence."""
    ks = live.cond["ks"]
    pins = [r for r in live.runs if r["specdeploy"]["arm"].startswith("p-")]
    assert draft_rule.best_pairs(draft_rule.curves(pins, ks))[0][0] == 0
    by_arm = {r["specdeploy"]["arm"]: r for r in pins}
    trained, poor = by_arm[f"p-d0-k{max(ks)}"], by_arm[f"p-d1-k{max(ks)}"]

    def as_other(run, other):
        spec = {**run["specdeploy"]}
        return {**other, "specdeploy": spec}  # the other's figures under this one's label

    swapped = [as_other(trained, poor) if r is trained else as_other(poor, trained) if r is poor
               else r for r in pins]  # fmt: skip
    assert draft_rule.best_pairs(draft_rule.curves(swapped, ks))[0][0] == 1


def test_the_host_record_keeps_the_choice_and_it_replays_from_there(live):
    record = load(recording(RECORD) / "record.json")
    choice = record["draft_choice"]
    assert choice["followed"] is True and choice["measured_on"] == live.host
    assert choice["decision"] == approx_tree(live.choice["decision"])
    k = choice["decision"]["recommended"]["k"]
    assert record["speculative_config"]["num_speculative_tokens"] == k
    again = draft_rule.replay(choice)
    assert again["pairs"] == choice["pairs"]
    assert again["decision"] == approx_tree(choice["decision"])
