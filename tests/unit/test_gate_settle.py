"""The gate's planning-time decisions: a fall-back stands until what it depends on changes."""

from __future__ import annotations

import json
from pathlib import Path

from specdeploy.config.record import GateDecision, read_record
from specdeploy.config.schema import config_from_data
from specdeploy.render.units import render_unit
from specdeploy.steps import gate

OLD = Path(__file__).parent / "data" / "deployment-record-a83c70e.json"


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
