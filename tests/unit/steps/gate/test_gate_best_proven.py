"""The gate's opt-in `on_fail = "best_proven"`: a host whose deployed schedule is not proven serves
the configuration the gate's own runs proved faster than the baseline (the fixed k without the
schedule), recording why; the baseline only when nothing is; and a re-run settles on that
configuration instead of measuring again."""

from __future__ import annotations

import json

from specdeploy.config.record import read_record
from specdeploy.config.schema import config_from_data
from specdeploy.decide.gate_rule import best_proven, served_config
from specdeploy.decide.load_rule import SCHEDULE_KEY
from specdeploy.render.argv import flag_value
from specdeploy.render.units import render_unit
from specdeploy.steps import gate
from tests.unit import DATA

from .test_gate_across_load import SCHEDULED, decide

OLD = DATA / "deployment-record-a83c70e.json"
BEHIND_FIXED = {
    1: (40.0, 30.0, 20.0),
    4: (50.0, 40.0, 40.0),
}  # the fixed k proven, the schedule not


def test_the_fixed_k_proven_faster_is_served_instead_and_says_why():
    g = decide(BEHIND_FIXED, on_fail="best_proven")
    assert not g["passed"] and g["served_instead"]["k"] == 3
    assert g["action"] == "serve k = 3 without the schedule (best proven)"
    assert g["served_instead"]["why"] == g["across_load"]["instead"]
    # the same evidence under on_fail = baseline: the baseline, as before
    assert "served_instead" not in decide(BEHIND_FIXED)
    assert decide(BEHIND_FIXED)["action"] == "switch to baseline"


def test_nothing_proven_falls_back_to_the_baseline_and_says_so():
    g = decide({1: (5.18, 8.23, 6.50), 16: (5.51, 12.17, 7.27)}, on_fail="best_proven")
    assert g["action"] == "switch to baseline" and "served_instead" not in g
    assert g["reason"].endswith("nothing else was proven faster than the baseline")


def test_of_several_proven_the_one_faster_at_more_levels_and_never_an_unproven_one():
    alternatives = [
        {"what": "a", "k": 2, "proven": True, "faster_at": 1},
        {"what": "b", "k": 4, "proven": False, "faster_at": 3},
        {"what": "c", "k": 3, "proven": True, "faster_at": 2},
    ]
    assert best_proven(alternatives)["what"] == "c"
    assert best_proven([alternatives[1]]) is None
    spec = {"method": "draft_model", "model": "m", "num_speculative_tokens": 3,
            SCHEDULE_KEY: [[1, 4, 3]]}  # fmt: skip
    assert served_config(spec, {"served_instead": {"k": 2}}) == {
        "method": "draft_model", "model": "m", "num_speculative_tokens": 2}  # fmt: skip
    assert served_config(spec, {}) is None


def record_serving_instead(cfg, k: int):
    """A record whose gate (on_fail best_proven) served k without the schedule."""
    spec, base = render_unit(cfg, "speculative"), render_unit(cfg, "baseline")
    served = gate.best_proven_unit(
        cfg, spec, read_record({**json.loads(OLD.read_text()), "gate": {
            "passed": False, "on_fail": "best_proven",
            "served_instead": {"what": f"k = {k} without the schedule", "k": k}}}).gate,
    )  # fmt: skip
    data = json.loads(OLD.read_text())
    data["role"] = "speculative"
    data["unit"] = {"name": served.name, "sha256": served.sha256, "argv": served.argv}
    data["gate"] = {"passed": False, "on_fail": "best_proven",
                    "served_instead": {"what": f"k = {k} without the schedule", "k": k},
                    "fingerprint": gate.fingerprint(cfg, spec, base),
                    "decided_at": "2026-12-01T10:00:00Z"}  # fmt: skip
    return read_record(data), served


def test_a_re_run_settles_on_the_configuration_served_instead(valid_data):
    opt_in = {"across_load": True, "on_fail": "best_proven"}
    cfg = config_from_data({**valid_data, **SCHEDULED, "speculation_gate": opt_in})
    previous, served = record_serving_instead(cfg, 3)
    assert served.role == "speculative" and served.name == render_unit(cfg, "speculative").name
    spec = json.loads(flag_value(served.argv, "--speculative-config"))
    assert SCHEDULE_KEY not in spec and spec["num_speculative_tokens"] == 3
    settled = gate.gate_settled_unit(cfg, render_unit(cfg, "speculative"), previous)
    assert settled.sha256 == served.sha256  # no restart, no new measurement
    # what the decision depends on changed: the host data's own unit, measured again
    changed = cfg.model_copy(update={"decision_alpha": 0.01})
    assert gate.gate_settled_unit(changed, render_unit(changed, "speculative"), previous).sha256 \
        == render_unit(changed, "speculative").sha256  # fmt: skip


def test_best_proven_is_a_choice_of_on_fail(valid_data):
    cfg = config_from_data({**valid_data, "speculation_gate": {"on_fail": "best_proven"}})
    assert cfg.speculation_gate.on_fail == "best_proven"
