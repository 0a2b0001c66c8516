"""The gate's planning-time decisions: a fall-back stands until what it depends on changes."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specdeploy.config.record import GateDecision, read_record
from specdeploy.config.schema import config_from_data
from specdeploy.decide.gate_rule import gate_needs_recheck
from specdeploy.render.units import render_unit
from specdeploy.steps import gate
from tests.unit import DATA

OLD = DATA / "deployment-record-a83c70e.json"


def cfg_with_gate(valid_data, **gate_settings):
    return config_from_data(
        {**valid_data, "speculation_gate": {"max_tpot_ratio": 0.95, **gate_settings}}
    )


def fell_back(cfg, *, decided_at="2026-12-01T10:00:00Z"):
    """A record whose gate switched the host to the baseline for `cfg`."""
    spec, base = render_unit(cfg, "speculative"), render_unit(cfg, "baseline")
    data = json.loads(OLD.read_text())
    data["role"] = "baseline"
    data["unit"] = {"name": base.name, "sha256": base.sha256, "argv": base.argv}
    data["gate"] = {
        "passed": False,
        "on_fail": "baseline",
        "fingerprint": gate.fingerprint(cfg, spec, base),
        "decided_at": decided_at,
    }
    return read_record(data)


def test_a_fall_back_stands_on_a_re_run(valid_data):
    cfg = cfg_with_gate(valid_data)
    previous = fell_back(cfg)
    settled = gate.gate_settled_unit(cfg, render_unit(cfg, "speculative"), previous)
    assert settled.role == "baseline" and not gate.gate_pending(cfg, previous)


def test_a_changed_workload_or_gate_setting_measures_again(valid_data):
    cfg = cfg_with_gate(valid_data)
    previous = fell_back(cfg)
    for changed in (
        config_from_data(
            {**valid_data, "workload": {**valid_data["workload"], "max_concurrency": 8}}
        ).model_copy(update={"speculation_gate": cfg.speculation_gate}),
        cfg_with_gate(valid_data, max_tpot_ratio=0.9),
        cfg_with_gate(valid_data, runs=4),
        cfg.model_copy(update={"decision_alpha": 0.01}),
    ):
        spec = render_unit(changed, "speculative")
        assert gate.gate_settled_unit(changed, spec, previous).role == "speculative"
        assert gate.gate_pending(changed, previous)


def test_an_old_fall_back_is_re_examined_after_recheck_days(valid_data):
    cfg = cfg_with_gate(valid_data, recheck_days=7)
    spec = render_unit(cfg, "speculative")
    assert gate.gate_settled_unit(
        cfg, spec, fell_back(cfg, decided_at="2026-01-01T00:00:00Z")
    ).role == ("speculative")
    assert gate.gate_settled_unit(
        cfg, spec, fell_back(cfg, decided_at="2099-01-01T00:00:00Z")
    ).role == ("baseline")


def test_a_record_from_before_fingerprints_measures_again(valid_data):
    cfg = cfg_with_gate(valid_data)
    previous = fell_back(cfg)
    previous.gate = GateDecision.model_validate(
        {k: v for k, v in previous.gate.items() if k != "fingerprint"}
    )
    assert gate.gate_settled_unit(cfg, render_unit(cfg, "speculative"), previous).role == (
        "speculative"
    )


# --- the recheck boundary: a fall-back exactly recheck_days old re-measures --------------------

DECIDED = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)


def _frozen_clock(monkeypatch, now: datetime) -> None:
    """steps/gate.py's clock reads `now` (planning time and the class decisions alike)."""

    class Clock(datetime):
        @classmethod
        def now(cls, tz=None):
            return now

    monkeypatch.setattr(gate, "datetime", Clock)


@settings(max_examples=300, deadline=None)
@given(days=st.floats(min_value=0.0001, max_value=400, allow_nan=False))
def test_a_fall_back_exactly_recheck_days_old_re_measures_one_microsecond_younger_does_not(days):
    """The rule itself, at any recheck_days: exactly that old re-measures (days as a float
    quotient missed it, e.g. 0.007 days), a microsecond younger stands."""
    fell = {"passed": False, "fingerprint": {"f": 1}, "decided_at": DECIDED.isoformat()}
    at = DECIDED + timedelta(days=days)
    assert gate_needs_recheck(fell, {"f": 1}, now=at, recheck_days=days)["recheck"]
    younger = at - timedelta(microseconds=1)
    assert not gate_needs_recheck(fell, {"f": 1}, now=younger, recheck_days=days)["recheck"]


@pytest.mark.parametrize("days", [7, 0.5, 0.007])
def test_the_step_and_the_class_re_measure_a_fall_back_exactly_recheck_days_old(
    valid_data, tmp_path, monkeypatch, days
):
    """Through steps/gate.py: the host's settled fall-back (gate_settled_unit, gate_pending) and a
    class's kept fall-back (FleetClasses.find) at the boundary, and a second before it."""
    monkeypatch.setenv("SPECDEPLOY_REPORTS", str(tmp_path))
    cfg = cfg_with_gate(valid_data, recheck_days=days, on_fail="baseline")
    spec = render_unit(cfg, "speculative")
    previous = fell_back(cfg, decided_at=DECIDED.isoformat())
    gate.FleetClasses().keep("k", GateDecision.model_validate(previous.gate.as_json()), "canary")
    boundary = DECIDED + timedelta(days=days)
    for now, expired in ((boundary - timedelta(seconds=1), False), (boundary, True)):
        _frozen_clock(monkeypatch, now)
        settled = gate.gate_settled_unit(cfg, spec, previous)
        assert settled.role == ("speculative" if expired else "baseline"), now
        assert gate.gate_pending(cfg, previous) is expired
        assert (gate.FleetClasses().find("k", days) is None) is expired
