"""measure/harness.measure_plan on a fake host, its samples through sampling/ as the gate's:
before every sample the deploy lock's lease is renewed and the watchdog re-armed, the benchmark
starts ahead of its server, a fresh server starts (none for a visit's later level on the same
server); after the last sample the deployed unit comes back and no watchdog is left. The host's
answers are matched by command (tests/operations/harness.py's fakes for the clock and the control
node); what the host is asked is recorded in order."""

from __future__ import annotations

import itertools
import json
import types

import pytest
from pyinfra.context import ctx_host, ctx_state

from specdeploy.config.schema import config_from_data
from specdeploy.host.facts.cuda_boot import CudaBootInfo
from specdeploy.measure import arms, harness, load_flow
from tests.operations import harness as fake
from tests.unit.conftest import VALID
from tests.unit.handed import handed

LOCK = "/run/specdeploy/locks/specdeploy-vllm.deploy.lock"
METRICS = (
    "# TYPE vllm:spec_decode_num_drafts_total counter\nvllm:spec_decode_num_drafts_total 1.0\n"
)
ANSWERS = [  # (what the command has, what the host says), the first match
    ("echo RENEWED", "RENEWED"),
    ("/health", "healthy"),
    ("NRestarts", "0"),
    ("/v1/models", json.dumps({"data": [{"id": "Qwen/Qwen3-8B"}]})),
    (
        "/v1/completions",
        json.dumps({"choices": [{"text": " Paris"}], "usage": {"completion_tokens": 8}}),
    ),
    ("/metrics", METRICS),
    ("nohup setsid", "4321"),
    ("/go; ", "0"),
]
BENCH = json.dumps({"completed": 16, "failed": 0, "median_tpot_ms": 9.0})


def event(command: str) -> str | None:
    """R renewal, W watchdog armed, B benchmark started, S server started fresh, b benchmark run,
    D deployed unit started again."""
    for has, name in (("echo RENEWED", "R"), ("systemd-run ", "W"), ("nohup setsid", "B"),
                      ("/go; ", "b")):  # fmt: skip
        if has in command:
            return name
    if command.startswith("systemctl reset-failed ") and "; systemctl start " in command:
        return "S"
    if command == "systemctl start specdeploy-vllm.service":
        return "D"
    return None


@pytest.fixture
def measured(monkeypatch, tmp_path):
    """measure_plan(plan) on host h1 with this process holding its deploy lock: the events."""
    from specdeploy.host import on_host, watchdog
    from specdeploy.steps import lock

    fake.import_steps()
    calls: list[str] = []

    def sh_status(command, *, stdin=None, timeout=None):
        calls.append(str(command))
        out = next((answer for has, answer in ANSWERS if has in str(command)), "")
        return True, out + "\n", None

    for name, stand_in in (("sh_status", sh_status),
                           ("read_text", lambda path, *, missing_ok=False: BENCH),
                           ("write_text", lambda path, text, **kw: None)):  # fmt: skip
        fake._patch_everywhere(monkeypatch, getattr(on_host, name), stand_in)
    import time as time_module

    fake._patch_everywhere(monkeypatch, time_module, fake.FrozenTime())
    ns = itertools.count(1)
    monkeypatch.setattr(watchdog, "time", types.SimpleNamespace(time_ns=lambda: next(ns)))
    monkeypatch.setattr(lock, "control_host", lambda: "ctl")
    monkeypatch.setattr(lock, "_HELD", {"h1": {LOCK: "holder=me@ctl:1 since=x host=h1"}})
    monkeypatch.setattr(lock, "_LEASES", {})
    monkeypatch.setattr(lock, "_LOST", {})
    monkeypatch.setattr(
        harness, "deployed_unit", lambda c: ("specdeploy-vllm.service", "speculative")
    )
    snapshots = {"target": {"path": "/tok"}, "draft": {"path": "/draft"}}
    monkeypatch.setattr(harness.weights, "snapshots", lambda c: snapshots)
    state, host = fake.pyinfra_host()
    host.get_fact = lambda cls, *a, **kw: CudaBootInfo()

    def run(cfg, plan) -> str:
        calls.clear()
        with ctx_state.use(state), ctx_host.use(host):
            harness.measure_plan(cfg, plan, out_dir=tmp_path / "raw", conditions={"kind": "t"})
        return " ".join(e for e in map(event, calls) if e)

    return run


def test_every_sample_renews_the_lease_and_the_watchdog_before_its_fresh_server(measured):
    cfg = config_from_data(VALID)
    plan = [arms.Step(arms.BASELINE, True), arms.Step(arms.BASELINE, False),
            arms.Step(arms.SPECULATIVE, False)]  # fmt: skip
    assert measured(cfg, plan) == "R W B S b R W B S b R W B S b W D"  # W: the restore's own


def test_a_visits_later_level_runs_on_its_server_renewed_but_not_restarted(measured):
    levels = [{"concurrency": 1}, {"concurrency": 4}]
    cfg = config_from_data({**VALID, "workload": {**VALID.get("workload", {}),
                                                  "load_levels": levels}})  # fmt: skip
    plan = list(load_flow.LoadTune(cfg, (2,), repeats=1, warmup_runs=0, **handed(cfg)))
    assert [(s.arm.label, s.same_server) for s in plan] == [
        ("baseline@c1", False), ("baseline@c4", True), ("k2@c1", False), ("k2@c4", True)
    ]  # fmt: skip
    assert measured(cfg, plan) == "R W B S b R W B b R W B S b R W B b W D"
