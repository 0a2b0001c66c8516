"""Replay of the live wing's recording (tests/integration/test_live_verdict.py): the windows
recomputed from the recorded /metrics snapshots give the decisions the live judge made, and the
autopilot replayed on them takes the same steps; phase 1 (the trained set) pays, phase 2
(random-token prompts) loses."""

from __future__ import annotations

import pytest

from specdeploy.decide import live_rule
from tests.unit.replays import REPLAYS, approx_tree, load

RECORDED = REPLAYS / "live_verdict"
# Until the live wing has recorded it; then drop this mark, as every other replay fails without
# its recording.
pytestmark = pytest.mark.skipif(
    not (RECORDED / "provenance.json").is_file(),
    reason="no live_verdict recording yet: SPECDEPLOY_RECORD_REPLAYS=1 make test-live WING=live",
)


def test_the_recorded_windows_give_the_recorded_decisions_and_steps():
    state = load(RECORDED / "live-verdict.json")
    phases = load(RECORDED / "phases.json")
    s = state["settings"]
    windows = live_rule.windows_from_snapshots(state["snapshots"], min_requests=s["min_requests"])
    result = live_rule.live_decisions(
        windows, windows_per_decision=s["windows_per_decision"], alpha=s["alpha"]
    )
    texts = [d["text"] for d in result["decisions"]]
    assert texts == approx_tree([step["text"] for step in state["steps"]])
    replayed = live_rule.autopilot_replay(
        result["decisions"], mode=s["autopilot"], after=s["after"]
    )
    assert [r["action"] for r in replayed] == [step["action"] for step in state["steps"]]
    verdicts = [d["verdict"] for d in result["decisions"]]
    assert verdicts[phases["phase1_steps"] - 1] == live_rule.PAYS
    assert verdicts[-s["after"] :] == [live_rule.LOSES] * s["after"]
