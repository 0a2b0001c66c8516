"""The speculation gate (steps/gate.py) replayed on a live run: the trained sandbox pair with its
poor draft behind `speculation_gate` {max_tpot_ratio 0.8, on_fail baseline} (3 + 3 runs, alpha
0.05), 4 requests per run, deployed on a sandbox host by tests/integration/test_trained_models.py
(test_gate_falls_back_to_baseline_with_the_poor_draft records it as `trained_gate`:
gate/<host>/gate-<stamp>-NN-<arm>.json, the six runs' bench JSONs; record.json, the deployment
record the deploy wrote; provenance.json).

The real speculation_gate() runs with the host-touching calls replaced (servers, warm-up, the unit
switch, the benchmark): each run it asks for gets the recorded bench JSON of that index. It must
ask for the live runs in their order (B S S B B S), reach the recorded decision (a fall-back to the
baseline) with the same numbers, and leave the host on the baseline unit. The recorded record then
settles a re-run: same fingerprint, no re-measurement; a changed margin, measure again."""

from __future__ import annotations

import dataclasses
import statistics
from datetime import datetime, timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest

from specdeploy.config.record import BenchResult, read_record
from specdeploy.config.schema import config_from_data
from specdeploy.decide.gate_rule import gate_needs_recheck
from specdeploy.render.units import render_unit
from specdeploy.sampling import gate_plans, sampler
from specdeploy.steps import gate
from tests.unit.conftest import VALID
from tests.unit.replays import approx_tree, load, rank_p_less, recording, sampler_of

NAME = "trained_gate"
B, S = "baseline", "speculative"
# the gate's evidence as gate_decision and speculation_gate record it; the units' hashes, the files'
# paths and decided_at are this replay's own (units rendered from VALID, files in tmp_path, now)
DECISION_KEYS = (
    "passed",
    "conclusive",
    "verdict",
    "action",
    "on_fail",
    "max_tpot_ratio",
    "alpha",
    "p_value",
    "p_value_slower",
    "min_p_value",
    "runs",
    "ratio",
    "low",
    "high",
    "confidence",
    "interval_method",
    "speculative",
    "baseline",
    "test",
    "reason",
    "fingerprint",
    "run_order",
    "method",
    "acceptance",
)


def recorded_host(path: Path) -> str:
    (host,) = [d.name for d in (path / "gate").iterdir() if d.is_dir()]
    return host


def gate_cfg(g: dict, **changes):
    """VALID host data with the recorded gate's settings (`changes` override them)."""
    settings = {
        "max_tpot_ratio": g["max_tpot_ratio"],
        "on_fail": g["on_fail"],
        "runs": g["runs"]["speculative"],
        **changes,
    }
    return config_from_data({**VALID, "decision_alpha": g["alpha"], "speculation_gate": settings})


@pytest.fixture(scope="module")
def replay(tmp_path_factory):
    """speculation_gate() on units rendered from VALID with the recorded settings and fingerprint,
    each run fed the recorded bench JSON of its index. Returns (record, host, recorded file names
    by index, what the gate returned, the host calls in order, the runs' meta in order)."""
    path = recording(NAME)
    host = recorded_host(path)
    record = load(path / "record.json")
    g = record["gate"]
    files = {}
    for f in (path / "gate" / host).glob("gate-*.json"):
        files[load(f)["specdeploy"]["index"]] = f
    names = [files[i].name for i in sorted(files)]
    stamp = names[0].removeprefix("gate-").rsplit("-", 2)[0]  # gate-<stamp>-00-baseline.json
    cfg = gate_cfg(g)
    units = dataclasses.replace(
        gate.gate_input(cfg, render_unit(cfg, "speculative")), fingerprint=g["fingerprint"]
    )
    calls, metas = [], []

    class RecordedBench:
        """bench.PendingBench's stand-in: run() returns the recorded result of the run's index."""

        def __init__(self, c, *, tokenizer, name, **kw):
            self.name = name

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            pass

        def run(self, *, local, meta):
            metas.append({**meta, "name": Path(local).name})
            calls.append(("bench", meta["arm"]))
            return BenchResult.model_validate(load(files[meta["index"]]))

    def start_fresh(c, unit, *, speculative, install=True):
        calls.append(("start", unit.name, speculative, install))
        return {"healthy": True, "unit": unit.name}

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gate, "host", SimpleNamespace(name=host, print_prefix=""))
        mp.setattr(
            gate, "logger", SimpleNamespace(info=lambda line: None, warning=lambda line: None)
        )
        mp.setattr(gate, "host_reports_dir", lambda name: tmp_path_factory.mktemp("gate") / name)
        mp.setattr(gate_plans, "utc_stamp", lambda: stamp)
        mp.setattr(sampler, "PendingBench", RecordedBench)
        mp.setattr(sampler, "start_fresh", start_fresh)
        mp.setattr(sampler, "warm_up", lambda c, workload: calls.append(("warm up",)))
        mp.setattr(sampler, "switch_enabled", lambda c, *, disable, enable: calls.append(
            ("switch", disable, enable)))  # fmt: skip
        returned = gate.speculation_gate(sampler_of(cfg), units)
    return record, host, names, returned, calls, metas


def test_the_gate_runs_the_live_runs_in_their_order(replay):
    record, _, names, _, _, metas = replay
    order = [B, S, S, B, B, S]
    assert [m["arm"] for m in metas] == record["gate"]["run_order"]["order"] == order
    assert [m["index"] for m in metas] == list(range(6)) and all(m["gate"] for m in metas)
    assert [m["name"] for m in metas] == names  # the live run's file names, in index order
    live = {arm: [Path(p).name for p in paths] for arm, paths in record["gate"]["files"].items()}
    assert live == {arm: [n for n in names if n.endswith(f"-{arm}.json")] for arm in (B, S)}


def test_the_decision_is_the_live_one(replay):
    record, _, names, (_, _, decision), _, _ = replay
    g = record["gate"]
    assert {k: decision[k] for k in DECISION_KEYS} == approx_tree({k: g[k] for k in DECISION_KEYS})
    assert decision["passed"] is False and decision["action"] == "switch to baseline"
    assert decision["runs"] == {S: 3, B: 3} and decision["alpha"] == 0.05
    assert [Path(p).name for arm in (B, S) for p in decision["files"][arm]] == [
        n for arm in (B, S) for n in names if n.endswith(f"-{arm}.json")
    ]
    # the numbers recomputed from the raw JSONs, without specdeploy's stats
    tpot = {arm: decision[arm]["values"] for arm in (S, B)}
    ratio = statistics.median(tpot[S]) / statistics.median(tpot[B])
    assert decision["ratio"] == pytest.approx(ratio)
    margin = g["max_tpot_ratio"]
    p = rank_p_less([x / margin for x in tpot[S]], tpot[B])
    assert decision["p_value"] == pytest.approx(p) and p > decision["alpha"]
    assert f"required <= {margin}" in decision["reason"]


def test_the_host_ends_on_the_baseline_unit(replay):
    record, _, _, (final, checked, _), calls, _ = replay
    spec_unit, base_unit = "specdeploy-vllm.service", "specdeploy-vllm-baseline.service"
    assert final.role == "baseline" and final.name == base_unit == record["unit"]["name"]
    assert record["role"] == "baseline"
    runs = []
    for arm in (B, S, S, B, B, S):  # the baseline unit is written for its runs; spec installed
        unit = base_unit if arm == B else spec_unit
        runs += [("start", unit, arm == S, arm == B), ("warm up",), ("bench", arm)]
    # the fall-back: enable the baseline, then serve it (the last run was speculative)
    after = [("switch", spec_unit, base_unit), ("start", base_unit, False, False)]
    assert calls == runs + after
    assert checked["unit"] == base_unit


def test_a_re_run_keeps_the_decision_until_the_margin_changes(replay, monkeypatch):
    record, _, _, _, _, _ = replay
    previous = read_record(record)
    g = previous.gate
    later = datetime.fromisoformat(g["decided_at"]) + timedelta(days=365)
    same = gate_needs_recheck(g, g["fingerprint"], now=later)
    assert same["recheck"] is False, same
    changed = gate_needs_recheck(g, {**g["fingerprint"], "max_tpot_ratio": 0.9}, now=later)
    assert changed["recheck"] is True and "max_tpot_ratio" in changed["why"]
    # deploys/serve.py's planning on this record: the units and workload as recorded (the
    # fingerprint's own hashes), the gate's settings from the config
    monkeypatch.setattr(gate, "fingerprint", lambda cfg, spec, base: {
        **g["fingerprint"],
        "max_tpot_ratio": cfg.speculation_gate.max_tpot_ratio,
        "on_fail": cfg.speculation_gate.on_fail,
        "alpha": cfg.decision_alpha,
    })  # fmt: skip
    for cfg, settled_role, pending in (
        (gate_cfg(g), "baseline", False),
        (gate_cfg(g, max_tpot_ratio=0.9), "speculative", True),
    ):
        spec = render_unit(cfg, "speculative")
        assert gate.gate_settled_unit(cfg, spec, previous).role == settled_role
        assert gate.gate_pending(cfg, previous) is pending
