"""The draft choice recorded on the host: deploys/choose_draft.py's report keeps each host's choice
by its fingerprint (report/draft_summary.keep_choices); the serve deploy that applies it (the
ordinary rolling path, host data set to the printed change) finds exactly that choice while planning
(steps/draft_choice.py) and its deployment record keeps it, saying whether the server follows it;
the recorded choice replays through decide/draft_rule. A deploy with no kept choice records nothing
new."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import pytest
from pyinfra.context import ctx_host

from specdeploy.checks.draft_candidates import CandidateCheck
from specdeploy.config.problems import Problem
from specdeploy.config.schema import config_from_data
from specdeploy.decide import draft_rule
from specdeploy.measure import draft_flow
from specdeploy.measure.plans import draft_conditions
from specdeploy.render.units import render_unit
from specdeploy.report import summary as report
from specdeploy.report.draft_summary import CHOICES, choice_fingerprint, follows, keep_choices
from specdeploy.steps import draft_choice, record, schedule_proof
from tests.unit.measure.test_draft_choice import KS, PlayedHost
from tests.unit.steps.test_schedule_proof import Host

TRAINED = "org/trained"


@pytest.fixture
def planning(tmp_path, monkeypatch):
    """Reports under tmp_path, the H200 host gpu-1 in context (as test_schedule_proof plans)."""
    monkeypatch.setenv("SPECDEPLOY_REPORTS", str(tmp_path))
    host = Host()
    with ctx_host.use(host):
        yield host


def checks_of(cfg) -> tuple[CandidateCheck, ...]:
    """The planning checks as the flow found them: the third candidate refused by name."""
    other = Problem("gpu-1", "draft_candidates[2] (org/other-vocab@main)", "vocab_size 3072",
                    "drop it")  # fmt: skip
    c = cfg.draft_candidates
    return (CandidateCheck(0, c[0], download_bytes=5 << 20),
            CandidateCheck(1, c[1], download_bytes=3 << 20),
            CandidateCheck(2, c[2], refusals=[other]))  # fmt: skip


def build(cfg, draft=None, role="speculative"):
    """steps/record.build_record for a verified deploy of `cfg` ending on its `role` unit, handed
    `draft` as its choice."""
    return record.build_record(
        cfg, render_unit(cfg, role), vllm_version="0.32.0", snapshots={},
        preflight=SimpleNamespace(vocab=None, memory=None), health=None, smoke=None,
        started=time.time(), draft_choice=draft,
    )  # fmt: skip


def chosen(valid_data, root, request_set="chat", run="draft-run", **data):
    """A choose_draft run of [trained, poor, other-vocab] on gpu-1 over `request_set` played as
    the flow plays it, its conditions carrying this host's choice fingerprint as flows/measure.py
    writes it, reported and kept as the flow keeps it. Returns (the measured config, summary)."""
    cfg = config_from_data({**valid_data, **data, "draft_candidates": [
        {"repo": TRAINED}, {"repo": "org/poor"}, {"repo": "org/other-vocab"}]})  # fmt: skip
    out = root / run / "raw" / "gpu-1"
    out.mkdir(parents=True)
    plan = draft_flow.DraftPlan(cfg, checks_of(cfg), tuple(KS), 0, 8, out)
    PlayedHost(out, ["trained", "poor", "other"], request_set).run(plan)
    fingerprint = choice_fingerprint(cfg, schedule_proof.host_hardware(cfg))
    cond = {**draft_conditions(cfg, plan), "choice_fingerprint": fingerprint,
            "finished_at": f"2026-12-04T00:00:0{len(run) % 10}+00:00"}  # fmt: skip
    (out / "conditions.json").write_text(json.dumps(cond))
    summary = report.write(root / run, "choose_draft")
    keep_choices(root / run, summary)
    return cfg, summary


def applied(cfg, summary):
    """The config after the printed host-data change: the winner's speculative_config."""
    return cfg.model_copy(update={"speculative_config": summary["hosts"]["gpu-1"]
                                  ["speculative_config"]})  # fmt: skip


def test_the_applied_choice_is_found_recorded_and_replays(planning, tmp_path, valid_data):
    cfg, summary = chosen(valid_data, tmp_path)
    h = summary["hosts"]["gpu-1"]
    assert h["decision"]["recommended"]["name"] == f"{TRAINED}@main"
    assert "specdeploy rollout" in (tmp_path / "draft-run" / "summary.md").read_text()
    deployed = applied(cfg, summary)
    evidence = draft_choice.choice_evidence(deployed, "speculative")
    assert evidence["run"] == "draft-run"
    written = build(deployed, evidence)
    on_disk = json.loads(written.to_json())["draft_choice"]
    assert on_disk["decision"] == h["decision"] and on_disk["followed"] is True
    # each refusal by name, each measured candidate's evidence, alpha: all in the host's record
    assert on_disk["candidates"][2]["refused"] and on_disk["alpha"] == 0.05
    assert on_disk["candidates"][0]["per_position_acceptance"]
    # replayable from the record alone: the rules give back its pairs and its decision
    again = draft_rule.replay(on_disk)
    assert again["pairs"] == on_disk["pairs"] and again["decision"] == on_disk["decision"]
    # the same host still on its old draft, or ending on the baseline (a gate's fall-back): the
    # choice is recorded, not followed
    old_draft = build(cfg, draft_choice.choice_evidence(cfg, "speculative"))
    assert old_draft.draft_choice["followed"] is False
    fell_back = build(deployed, evidence, role="baseline")
    assert fell_back.role == "baseline" and fell_back.draft_choice["followed"] is False


def test_a_replay_of_a_tampered_record_disagrees(planning, tmp_path, valid_data):
    """The replay reads the record's evidence, not its verdict: slower proving runs for the winner
    give "off", so a record whose decision its runs do not support is caught."""
    cfg, summary = chosen(valid_data, tmp_path)
    choice = draft_choice.choice_evidence(applied(cfg, summary), "speculative")
    label = draft_rule.arm_label(0, choice["decision"]["recommended"]["k"])
    slow = {**choice["decision"]["tpot"], label: [40.0] * len(choice["decision"]["tpot"][label])}
    tampered = {**choice, "decision": {**choice["decision"], "tpot": slow}}
    assert draft_rule.replay(tampered)["decision"]["recommended"] is None


@pytest.mark.parametrize("deploy", [{"vllm_version": "0.33.0"}, {"target_revision": "c" * 40}])
def test_a_choice_is_found_by_its_whole_fingerprint_only(planning, tmp_path, valid_data, deploy):
    cfg, summary = chosen(valid_data, tmp_path)
    other = config_from_data({**valid_data, **deploy})
    assert draft_choice.choice_evidence(applied(other, summary), "speculative") is None
    # another request set is another workload: its own choice, never this one
    workload = {**valid_data["workload"], "num_prompts": 7}
    other = config_from_data({**valid_data, "workload": workload})
    assert draft_choice.choice_evidence(applied(other, summary), "speculative") is None


def test_without_a_kept_choice_nothing_is_read_or_recorded(planning, tmp_path, valid_data):
    cfg = config_from_data(valid_data)
    assert draft_choice.choice_evidence(cfg, "speculative") is None
    assert planning.asked == []  # no facts read for it
    assert "draft_choice" not in json.loads(build(cfg).to_json())
    (tmp_path / CHOICES).mkdir()
    assert draft_choice.choice_evidence(cfg, "speculative") is None and planning.asked == []


def test_follows_compares_the_draft_and_k_not_the_rest():
    want = {"method": "draft_model", "model": "d", "revision": "a" * 40,
            "num_speculative_tokens": 3}  # fmt: skip
    choice = {"speculative_config": want}
    assert follows(choice, {**want, "disable_by_batch_size": 8})
    assert not follows(choice, {**want, "num_speculative_tokens": 4})
    assert not follows(choice, {**want, "revision": "b" * 40})
    assert not follows(choice, None)
    assert follows({"speculative_config": None}, None)  # "off", served as the baseline
    assert not follows({"speculative_config": None}, want)
