"""deploys/compare.py's sequential plan replayed on a live run: the trained sandbox pair with its
good draft, compare_max_repeats 8, no warm-up, no APC profile, 4 requests per run, measured on a
sandbox host by tests/integration/test_trained_models.py
(test_compare_finds_speculation_faster_with_the_good_draft records it as `trained_compare`:
raw/<host>/NN-<arm>.json, raw/<host>/conditions.json, summary.json, provenance.json).

The plan (plans.SequentialCompare, as harness.measure_plan iterates it) is fed each arm's next
recorded run, written where the plan reads it back (read_raw): it must ask for exactly the runs the
live run made, in their order (B S, S B, B S, S B), stop after the first look (4 + 4, "decide now",
p = 2/70) and reach the recorded verdict. The report rebuilt from the raw files must carry the
recorded decision. The live suite no longer has to run the compare to check its decision logic."""

from __future__ import annotations

import json
import math
import shutil
from collections import deque
from pathlib import Path
from types import SimpleNamespace

import pytest

from specdeploy.decide.decisions import DECIDE, next_step, run_values
from specdeploy.decide.tune_rule import runs_by_label
from specdeploy.measure import plans
from specdeploy.report import summary as report
from tests.unit.replays import approx_tree, load, rank_p_less, recording

NAME = "trained_compare"
B, S = "baseline", "speculative"


def recorded_host(path: Path) -> str:
    """The one host the recording measured (the live test limits the compare to it)."""
    (host,) = [d.name for d in (path / "raw").iterdir() if d.is_dir()]
    return host


@pytest.fixture(scope="module")
def replay(tmp_path_factory):
    """SequentialCompare built from the recorded conditions and driven by the recorded runs: each
    run it asks for gets that arm's next recorded run, written to the folder it reads. Returns
    (recording folder, host, recorded runs in index order, runs in the order asked, plan, log)."""
    path = recording(NAME)
    host = recorded_host(path)
    raw = path / "raw" / host
    cond = load(raw / "conditions.json")
    files = sorted(raw.glob("[0-9][0-9]-*.json"))
    runs = [load(f) for f in files]
    queues: dict[tuple[str, bool], deque] = {}
    for f, r in zip(files, runs, strict=True):
        queues.setdefault((r["specdeploy"]["arm"], r["specdeploy"]["warmup"]), deque()).append(f)
    out_dir = tmp_path_factory.mktemp("compare-replay")
    seq = cond["sequential"]
    plan = plans.SequentialCompare(
        seq["max_runs"], cond["warmup_runs"], cond["decision_alpha"], (), out_dir
    )
    asked, log = [], []
    with pytest.MonkeyPatch.context() as mp:  # the plan's log line names the pyinfra host
        mp.setattr(plans, "host", SimpleNamespace(name=host, print_prefix=""))
        mp.setattr(plans, "logger", SimpleNamespace(info=log.append))
        for arm, warm in plan:
            queue = queues.get((arm.label, warm))
            assert queue, f"the plan asked for a run the live run did not make: {arm.label}"
            f = queue.popleft()
            shutil.copyfile(f, out_dir / f.name)  # as harness.sample writes it before the next step
            asked.append(load(f))
    return path, host, runs, asked, plan, log


def test_the_plan_asks_for_exactly_the_live_runs_in_their_order(replay):
    _, _, runs, asked, _, _ = replay
    assert [r["specdeploy"]["index"] for r in asked] == list(range(len(runs)))
    assert [r["specdeploy"]["arm"] for r in asked] == [B, S, S, B, B, S, S, B]  # alternating


def test_it_stops_at_the_first_look_with_the_live_verdict(replay):
    path, host, _, asked, plan, log = replay
    cond = load(path / "raw" / host / "conditions.json")
    assert plan.conditions()["sequential"] == approx_tree(cond["sequential"])
    assert len(log) == 1 and log[0].startswith("sequential compare, 4 runs per arm: decide now")
    by_arm = runs_by_label(asked)
    spec, base = run_values(by_arm[S], "tpot"), run_values(by_arm[B], "tpot")
    step = next_step(spec, base, max_runs=plan.max_runs, alpha=plan.alpha)
    live = load(path / "summary.json")["hosts"][host]
    assert step["action"] == DECIDE and step["runs_per_arm"] == {S: 4, B: 4}
    assert step["result"] == approx_tree(live["ratios"]["tpot"])  # verdict exact, figures 1e-9
    assert step["result"]["verdict"] == "better"
    # every speculative run below every baseline run: two-sided p = 2 x one-sided = 2 / C(8, 4)
    assert max(spec) < min(base)
    p = 2 * rank_p_less(spec, base)
    assert step["result"]["p_value"] == pytest.approx(p) == 2 / math.comb(8, 4)
    assert p <= step["look"]["level"]


def test_the_report_rebuilt_from_the_raw_files_carries_the_live_decision(replay, tmp_path):
    path, host, _, _, _, _ = replay
    shutil.copytree(path / "raw", tmp_path / "raw")
    report.write(tmp_path, "compare")
    h = json.loads((tmp_path / "summary.json").read_text())["hosts"][host]
    live = load(path / "summary.json")["hosts"][host]
    for decided in ("sequential", "ratios", "arms"):
        assert h[decided] == approx_tree(live[decided]), decided
    seq = h["sequential"]
    assert [st["runs_per_arm"] for st in seq["steps"]] == [4] and seq["decided"]
    assert seq["stopped_by"] == "a significant look" and seq["steps"][0]["action"] == DECIDE
    assert h["ratios"]["tpot"]["verdict"] == "better" and h["ratios"]["tpot"]["ratio"] < 1
    md = (tmp_path / "summary.md").read_text()
    assert "Stopped by a significant look" in md and "| 4 | 0.0286 | 0.0286 | decide now |" in md
