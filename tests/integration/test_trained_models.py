"""The trained sandbox pair (pycode-target, pycode-draft, pycode-draft-poor) on the sandbox, with
the shipped request set: figures that mean something.

- the smoke summary has real TPOT and ITL (enough tokens and chunks) and an acceptance curve that
  falls with draft position, with the acceptance rate at k=3 between 30 % and 85 %;
- the request set is shipped root-owned and sha256-verified, and its sha256 and rows are recorded;
- deploys/compare.py, replaying that request set, finds speculation faster than the baseline with
  the good draft (TPOT ratio below 1 with its whole noise band);
- with the poor draft the speculation gate keeps the host on the baseline, for the reason recorded;
  without the gate (and with the good draft) the host serves speculatively again;
- deploys/tune.py's default flow (predict, then confirm) on the poor draft, k 2-4, recommends
  leaving speculation off from measured runs the rule can decide on.

The module's first deploy is the gated one (poor draft): the tune measures the poor draft while
the host is still deployed with it, and the good draft's deploy that follows is both the way back
from the baseline and the deploy the smoke and compare tests read, so the module pays for one
server start and smoke fewer than measuring the gate last would.

The compare, the gate and the tune record their raw files for the fast tier's replays
(tests/unit/measure/test_{compare,tune}_replay.py, tests/unit/steps/gate/test_gate_replay.py)
under `make test-live`; the tune's 9-15 fresh-server runs cost 7-11 minutes, more than any other
test, which is why the fast tier replays it and a short live tune runs in test_serve.py.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
from pathlib import Path

import pytest
from specdeploy_sandbox.request_set import PATH as SAMPLE

from specdeploy.config import datasets
from tests.unit.replays import assert_tune_leaves_speculation_off, rank_p_less

pytestmark = [pytest.mark.sandbox, pytest.mark.vllm]

REPO = Path(__file__).resolve().parents[2]
TIMEOUT = 2400
INVENTORY = REPO / "inventories/sandbox.py"
UNIT = "specdeploy-vllm.service"
UNIT_BASELINE = "specdeploy-vllm-baseline.service"


def trained_env() -> dict:
    """Read at call time: the fixtures set SPECDEPLOY_STATE_DIR after this module is imported."""
    return {**os.environ, "SPECDEPLOY_SANDBOX_MODELS": "trained"}


def pyinfra(inventory, *args, env=None):
    return subprocess.run(
        ["pyinfra", "-y", str(inventory), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        env={**trained_env(), **(env or {})},
    )


def tail(result, n=60):
    return "\n".join((result.stdout + result.stderr).splitlines()[-n:])


def measure(kind: str, host: str, inventory=INVENTORY, **settings) -> tuple[Path, str]:
    """deploys/<kind>.py (compare or tune) on one host with SPECDEPLOY_<KIND>_<NAME> settings;
    returns its report folder and what pyinfra printed."""
    run = f"test-trained-{kind}-{os.getpid()}"
    env = {f"SPECDEPLOY_{kind.upper()}_{name}": str(v) for name, v in settings.items()}
    result = pyinfra(
        inventory, f"deploys/{kind}.py", "--limit", host, env={**env, "SPECDEPLOY_RUN": run}
    )
    assert result.returncode == 0, tail(result)
    return REPO / "reports" / run, result.stdout + result.stderr


POOR = "specdeploy-sandbox/pycode-draft-poor"


POOR_PROMPTS = 4  # per run: the poor draft is ~10-25 % slower at every k, 4 requests show it
COMPARE_PROMPTS = 4  # per run: the good draft halves TPOT (~16 vs ~37 ms); 4 requests show it


def short_inventory(path: Path, host: str, num_prompts: int, **data) -> Path:
    """An inventory of `host` alone with the sandbox's workload cut to `num_prompts` requests per
    run (the measurements' runs are what the suite pays for), plus `data`."""
    path.write_text(
        "import runpy\n"
        f"_base = runpy.run_path({str(REPO / 'inventories/sandbox.py')!r})\n"
        f"_group = runpy.run_path({str(REPO / 'group_data/sandbox.py')!r})\n"
        f"_workload = {{**_group['workload'], 'num_prompts': {num_prompts}}}\n"
        f"sandbox = [(n, {{**d, 'workload': _workload, **{data!r}}})\n"
        f"           for n, d in _base['sandbox'] if n == {host!r}]\n"
    )
    return path


def poor_inventory(path: Path, host: str, revision: str, **data) -> Path:
    """`host` alone serving the poor draft (the trained pair's k and method; `revision`: the
    mirror's commit of it), POOR_PROMPTS requests per run, plus `data`."""
    path.write_text(
        "import runpy\n"
        f"_base = runpy.run_path({str(REPO / 'inventories/sandbox.py')!r})\n"
        f"_group = runpy.run_path({str(REPO / 'group_data/sandbox.py')!r})\n"
        f"_workload = {{**_group['workload'], 'num_prompts': {POOR_PROMPTS}}}\n"
        "_spec = {**_group['speculative_config'], "
        f"'model': {POOR!r}, 'revision': {revision!r}}}\n"
        "sandbox = [(n, {**d, 'workload': _workload, 'speculative_config': _spec, "
        f"**{data!r}}})\n"
        f"           for n, d in _base['sandbox'] if n == {host!r}]\n"
    )
    return path


@pytest.fixture(scope="module")
def host(sandbox_services, sandbox_fleet):
    return sandbox_fleet["hosts"][0]["name"]


# The margin an operator would ask of speculation here: 20 % faster. The poor draft's TPOT is about
# the baseline's (1.0-1.1x, run spreads of 10-20 % on this machine): at the default 0.95 the gate's
# own error rate (a false "keep", up to alpha = 5 % at the margin, ~1 % at 1.0x) would make this
# test flaky; at 0.8 it is below 0.3 % even at 1.0x with 20 % spreads.
MARGIN = 0.8
GATE = {"max_tpot_ratio": MARGIN, "on_fail": "baseline"}


@pytest.fixture(scope="module")
def gated(host, sandbox_services, tmp_path_factory):
    """The module's first deploy: the poor draft behind the speculation gate (POOR_PROMPTS requests
    per run). Returns its inventory."""
    revision = sandbox_services["models"][POOR]["main"]
    inventory = poor_inventory(
        tmp_path_factory.mktemp("gate") / "poor.py", host, revision, speculation_gate=GATE
    )
    result = pyinfra(inventory, "deploys/serve.py")
    assert result.returncode == 0, tail(result)
    return inventory


@pytest.fixture(scope="module")
def deployed(gated, host):
    """The trained pair with the good draft and the sandbox's whole workload, no gate: after the
    gated deploy, the way back to speculation."""
    result = pyinfra(INVENTORY, "deploys/serve.py", "--limit", host)
    assert result.returncode == 0, tail(result)
    return result


def record_of(sandbox_ssh, host):
    out = sandbox_ssh(host, "cat /var/lib/specdeploy/records/specdeploy-vllm.json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_gate_falls_back_to_baseline_with_the_poor_draft(gated, host, sandbox_ssh, record_replay):
    """The gate's default 3 + 3 fresh-server runs in alternating rounds, each run's median TPOT one
    value: the poor draft is not shown faster than MARGIN x the baseline (the decision's p-value,
    recomputed here from the raw JSONs, is above alpha; its point ratio is noise-sized and not
    asserted), so the host ends on the baseline unit with the evidence recorded; a re-run keeps
    that decision (no re-measurement, no restart). First in the module: the tune below measures
    the poor draft as deployed here, the tests after it deploy the good draft without the gate."""
    inventory = gated
    record = record_of(sandbox_ssh, host)
    g = record["gate"]
    assert record["role"] == "baseline" and record["unit"]["name"] == UNIT_BASELINE, g
    assert g["passed"] is False and g["action"] == "switch to baseline"
    assert g["runs"] == {"speculative": 3, "baseline": 3}
    assert g["run_order"]["order"] == ["baseline", "speculative", "speculative", "baseline"] + [
        "baseline",
        "speculative",
    ]
    # the decision's numbers, recomputed from the raw bench JSONs of its six runs
    medians = {
        a: [json.loads((REPO / p).read_text())["median_tpot_ms"] for p in g["files"][a]]
        for a in ("speculative", "baseline")
    }
    ratio = statistics.median(medians["speculative"]) / statistics.median(medians["baseline"])
    assert g["ratio"] == pytest.approx(ratio), medians
    p = rank_p_less([x / MARGIN for x in medians["speculative"]], medians["baseline"])
    assert g["p_value"] == pytest.approx(p) and p > g["alpha"] == 0.05, (p, medians)
    assert f"required <= {MARGIN}" in g["reason"] and "3 + 3 fresh-server runs" in g["reason"]
    assert g["fingerprint"]["max_tpot_ratio"] == MARGIN and g["decided_at"]
    active = sandbox_ssh(host, f"systemctl is-active {UNIT_BASELINE}")
    assert active.stdout.strip() == "active"
    enabled = sandbox_ssh(
        host, f"systemctl is-enabled {UNIT_BASELINE}; systemctl is-enabled {UNIT} || true"
    )
    assert enabled.stdout.split() == ["enabled", "disabled"]

    # a re-run keeps the decision: no re-measurement, no restart
    pid = sandbox_ssh(host, f"systemctl show -p MainPID --value {UNIT_BASELINE}").stdout
    again = pyinfra(inventory, "deploys/serve.py")
    assert again.returncode == 0, tail(again)
    assert "speculation gate" not in again.stdout + again.stderr
    assert sandbox_ssh(host, f"systemctl show -p MainPID --value {UNIT_BASELINE}").stdout == pid
    # tests/unit/steps/gate/test_gate_replay.py replays the decision from these: the six runs' bench
    # JSONs (gate/<host>/<file name>, names as g["files"] has them) and the record the gate wrote
    bench_files = {
        f"gate/{host}/{Path(path).name}": REPO / path
        for arm_files in g["files"].values()
        for path in arm_files
    }
    record_replay("trained_gate", {**bench_files, "record.json": record})


def test_tune_on_the_poor_draft_predicts_then_confirms_and_leaves_speculation_off(
    gated, host, sandbox_ssh, record_replay
):
    """deploys/tune.py's default flow (predict, then confirm; runs per arm from the rule) with
    tune_k 2-4, no warm-up, on the poor draft as the host is deployed with it (the gated
    inventory, before `deployed` brings the good draft back). The pin phase measures the
    baseline, k=2 and k=4 on fresh servers; L(3) comes from their pooled per-position acceptance.
    When every k is predicted slower than the baseline, only the predicted best k is confirmed
    against it, 3 + 3 runs in rotating rounds (the one-sided test can reach 1/20 = 0.05: the rule
    can decide); when one pin run lands under the baseline's by noise, the best and its neighbour
    are confirmed, 4 runs each. Which path, and which k (2 or 4), is read from the pin runs, not
    assumed. "Leave speculation off" because no confirmed k is shown faster: each p, recomputed
    here from the raw JSONs, is above alpha. 9-15 fresh-server runs: 7-11 minutes."""
    out, printed = measure("tune", host, gated, METHOD="predict", K="2-4", WARMUP_RUNS=0)
    raw_dir = out / "raw" / host
    raw = [json.loads(f.read_text()) for f in sorted(raw_dir.glob("[0-9][0-9]-*.json"))]
    arms = [r["specdeploy"]["arm"] for r in raw]
    assert arms[:3] == ["baseline", "k2", "k4"], arms  # the pin phase
    assert all(r["specdeploy"]["fresh_server"] and not r["specdeploy"]["warmup"] for r in raw)
    assert {r["specdeploy"]["speculative_config"]["model"] for r in raw[1:3]} == {POOR}
    assert {r["completed"] for r in raw} == {POOR_PROMPTS}

    # per-position acceptance pooled over the pin runs, weighted by their drafts
    acc, drafts = [0.0] * 4, [0.0] * 4
    for r in raw[1:3]:
        for i, a in enumerate(r["spec_decode_per_position_acceptance_rates"]):
            acc[i] += a * r["spec_decode_num_drafts"]
            drafts[i] += r["spec_decode_num_drafts"]
    rates = [a / d for a, d in zip(acc, drafts, strict=True)]
    prediction = json.loads((raw_dir / "prediction.json").read_text())
    assert prediction["pinned_k"] == [2, 4]
    assert prediction["per_position_acceptance"] == pytest.approx(rates)
    rows = {row["k"]: row for row in prediction["rows"]}
    # measured k keep their own run's L; k=3 gets L(3) = 1 + a_1 + a_2 + a_3 from the pooled rates
    for k, r in ((2, raw[1]), (4, raw[2])):
        assert rows[k]["acceptance_length"] == pytest.approx(r["spec_decode_acceptance_length"])
    assert rows[3]["acceptance_length_source"] == "per-position rates"
    assert rows[3]["acceptance_length"] == pytest.approx(1 + sum(rates[:3]))
    assert rows[0]["tpot_ms"] == pytest.approx(raw[0]["median_tpot_ms"])
    best = min((2, 3, 4), key=lambda k: rows[k]["tpot_ms"])  # the predicted best, from the pins
    assert best in (2, 4), rows  # L(3) sits between its neighbours': so does its TPOT
    assert prediction["predicted_best_k"] == best
    # One pin run each of a draft this poor lands either side of the baseline's (the machine's
    # noise is larger than the difference): which path the flow takes is read from the pins.
    md = (out / "summary.md").read_text()
    if min(rows[k]["tpot_ms"] for k in (2, 3, 4)) > rows[0]["tpot_ms"]:
        # predicted off: only the best k is confirmed, 3 + 3 runs, rounds rotating who goes first
        assert prediction["confirm_k"] == [best] and prediction["predicted_off"]
        assert prediction["runs_per_arm"] == 3
        assert arms[3:] == ["baseline", f"k{best}", f"k{best}", "baseline"], arms
        assert "Only the predicted best was confirmed" in md
    else:  # predicted faster: the best and its neighbour, the runs choose_k needs for two k
        assert best in prediction["confirm_k"] and 3 in prediction["confirm_k"], prediction
        assert prediction["runs_per_arm"] == 4 and not prediction.get("predicted_off")
    confirmed = prediction["confirm_k"]

    # the decision, from the measured runs' median TPOTs: no confirmed k is shown faster
    tpot = {
        label: [r["median_tpot_ms"] for r in raw if r["specdeploy"]["arm"] == label]
        for label in ("baseline", *(f"k{k}" for k in confirmed))
    }
    h = json.loads((out / "summary.json").read_text())["hosts"][host]
    assert_tune_leaves_speculation_off(h, tpot)
    assert "leave speculation off: no k is significantly faster than the baseline" in printed

    flow = {row["k"]: row for row in h["predict_flow"]["rows"]}
    assert flow[3]["predicted_tpot_ms"] == pytest.approx(rows[3]["tpot_ms"])
    for k in (0, 2, 3, 4):  # the pin runs count: the other pinned k keeps its one run
        assert flow[k]["measured_runs"] == arms.count(f"k{k}" if k else "baseline"), flow
    if 3 not in confirmed:
        assert flow[3]["role"] == "predicted only"
    assert "predicted, then confirmed" in md and "none: leave speculation off" in md
    # the unit the gated deploy left serving (the baseline) is back; the measurement unit is gone
    cond = json.loads((raw_dir / "conditions.json").read_text())
    assert cond["restored_unit"] == UNIT_BASELINE and cond["restored_role"] == "baseline", cond
    assert sandbox_ssh(host, f"systemctl is-active {UNIT_BASELINE}").stdout.strip() == "active"
    gone = sandbox_ssh(host, "test -e /etc/systemd/system/specdeploy-vllm-measure.service")
    assert gone.returncode == 1
    # tests/unit/measure/test_tune_replay.py replays the flow from these: the host's runs,
    # conditions and prediction (raw/<host>/) and the report's summary.json
    names = [*sorted(raw_dir.glob("[0-9][0-9]-*.json")), raw_dir / "conditions.json"]
    raw_files = {f"raw/{host}/{p.name}": p for p in [*names, raw_dir / "prediction.json"]}
    record_replay("trained_tune", {**raw_files, "summary.json": out / "summary.json"})


def test_without_the_gate_the_host_serves_speculatively_again(deployed, host, sandbox_ssh):
    """The good draft's deploy after the gated one: the speculative unit serves and is the only
    one enabled, and the record no longer carries a gate decision."""
    assert sandbox_ssh(host, f"systemctl is-active {UNIT}").stdout.strip() == "active"
    enabled = sandbox_ssh(
        host, f"systemctl is-enabled {UNIT}; systemctl is-enabled {UNIT_BASELINE} || true"
    )
    assert enabled.stdout.split() == ["enabled", "disabled"]
    record = record_of(sandbox_ssh, host)
    assert record["role"] == "speculative" and record["unit"]["name"] == UNIT
    assert not record.get("gate"), record.get("gate")
    assert record["speculative_config"]["model"] != POOR


def test_smoke_figures_are_real_and_acceptance_falls_with_position(deployed, host, sandbox_ssh):
    record = record_of(sandbox_ssh, host)
    smoke = record["smoke"]
    thin = {k for k in smoke["not_enough_data"] if k != "p99_ttft_ms"}  # 16 requests: no p99
    assert not thin, smoke["not_enough_data"]
    assert smoke["median_tpot_ms"] > 1 and smoke["median_itl_ms"] > 1
    curve = smoke["per_position_acceptance"]
    assert len(curve) == 3 and curve[0] > curve[1] > curve[2] > 0, curve
    assert 30 <= smoke["spec_decode_acceptance_rate"] <= 85, smoke
    assert "pos1" in deployed.stdout + deployed.stderr  # the curve is in the printed summary


def test_request_set_is_shipped_verified_and_recorded(deployed, host, sandbox_ssh):
    described = datasets.describe(str(SAMPLE), "custom")
    path = described["host_path"]
    out = sandbox_ssh(host, f"stat -c '%U:%G %a' {datasets.HOST_DIR} {path} && sha256sum {path}")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.split("\n")
    assert lines[:2] == ["root:root 700", "root:root 600"]  # production prompts: root's alone
    assert lines[2].split()[0] == described["sha256"]
    recorded = record_of(sandbox_ssh, host)["workload"]["request_set"]
    assert recorded["sha256"] == described["sha256"]
    assert recorded["rows"] == described["rows"]


KEYS = {
    "ttft": "median_ttft_ms",
    "tpot": "median_tpot_ms",
    "itl": "median_itl_ms",
    "e2el": "median_e2el_ms",
    "output_throughput": "output_throughput",
    "request_throughput": "request_throughput",
}


def mad(xs):
    m = statistics.median(xs)
    return statistics.median([abs(x - m) for x in xs])


@pytest.fixture(scope="module")
def compare_run(deployed, host, tmp_path_factory):
    """deploys/compare.py with its default run count (sequential: from 4 + 4, the fewest at which
    the permutation test can reach alpha = 0.05, up to 8 + 8), COMPARE_PROMPTS requests per run,
    no warm-up run and no APC profile (its plumbing is checked on the tiny pair, in
    test_whole_box.py's compare)."""
    inventory = short_inventory(tmp_path_factory.mktemp("compare") / "c.py", host, COMPARE_PROMPTS)
    return measure("compare", host, inventory, WARMUP_RUNS=0, APC_PROFILE=0)[0]


def test_compare_finds_speculation_faster_with_the_good_draft(
    compare_run, host, sandbox_ssh, record_replay
):
    """The sequential compare's first look, four fresh-server runs per arm in alternating rounds,
    replaying the shipped request set: every speculative run's TPOT below every baseline run's,
    so the exact permutation test gives its smallest p, 2 / C(8, 4) = 2/70, at or below the first
    look's level: "better", recomputed here from the raw JSONs, and no further round runs."""
    h = json.loads((compare_run / "summary.json").read_text())["hosts"][host]
    tpot = h["ratios"]["tpot"]
    seq = h["sequential"]
    assert seq["max_runs"] == 8 and [lk["runs"] for lk in seq["looks"]] == [4, 8], seq
    assert [st["runs_per_arm"] for st in seq["steps"]] == [4] and seq["decided"], seq
    assert seq["stopped_by"] == "a significant look" and seq["steps"][0]["action"] == "decide now"
    assert seq["steps"][0]["p_value"] == pytest.approx(2 / math.comb(8, 4))
    described = datasets.describe(str(SAMPLE), "custom")
    wanted = {json.loads(row)["output_tokens"] for row in SAMPLE.read_text().splitlines() if row}
    runs = raw_runs(compare_run, host)
    medians: dict[str, list[float]] = {"baseline": [], "speculative": []}
    for r in arm(runs, "baseline") + arm(runs, "speculative"):
        command = r["specdeploy"]["command"]
        # the shipped request set, at its checksum-verified path on the host
        assert command[command.index("--dataset-name") + 1] == "custom", command
        assert command[command.index("--dataset-path") + 1] == described["host_path"], command
        # per-request output lengths are the rows' own output_tokens (--custom-output-len -1)
        assert set(r["output_lens"]) <= wanted and len(set(r["output_lens"])) > 1, r["output_lens"]
        medians[r["specdeploy"]["arm"]].append(r["median_tpot_ms"])
    assert [len(v) for v in medians.values()] == [4, 4], medians
    assert max(medians["speculative"]) < min(medians["baseline"]), medians
    ratio = statistics.median(medians["speculative"]) / statistics.median(medians["baseline"])
    assert tpot["ratio"] == pytest.approx(ratio) and ratio < 1
    assert tpot["p_value"] == pytest.approx(2 / math.comb(8, 4)) and tpot["verdict"] == "better"
    assert tpot["p_value"] <= tpot["look_alpha"] == seq["looks"][0]["level"]
    assert tpot["low"] <= ratio <= tpot["high"] < 1, tpot
    # the deployed speculative unit serves again afterwards
    active = sandbox_ssh(host, "systemctl is-active specdeploy-vllm.service")
    assert active.stdout.strip() == "active"
    # tests/unit/measure/test_compare_replay.py replays the stop at 4 + 4 from these: every raw file
    # of the host (NN-<arm>.json, conditions.json) and the report's summary.json
    raw = compare_run / "raw" / host
    raw_files = {f"raw/{host}/{p.name}": p for p in sorted(raw.iterdir()) if p.is_file()}
    record_replay("trained_compare", {**raw_files, "summary.json": compare_run / "summary.json"})


def test_compare_report_numbers_equal_the_raw_bench_jsons(compare_run, host, sandbox_ssh):
    """Every number the report shows, recomputed from the raw `vllm bench serve` JSONs (with
    `statistics`, not specdeploy's own code); the arms differ only in --speculative-config."""
    summary = json.loads((compare_run / "summary.json").read_text())
    assert set(summary["hosts"]) == {host}
    h = summary["hosts"][host]
    runs = raw_runs(compare_run, host)
    # rounds alternate which arm goes first; APC off in every run
    assert [r["specdeploy"]["arm"] for r in runs] == [
        "baseline",
        "speculative",
        "speculative",
        "baseline",
        "baseline",
        "speculative",
        "speculative",
        "baseline",
    ]
    for r in runs:
        assert r["failed"] == 0 and r["specdeploy"]["fresh_server"]
        assert r["completed"] == COMPARE_PROMPTS
        argv = r["specdeploy"]["unit_argv"]
        assert "--no-enable-prefix-caching" in argv
        assert ("--speculative-config" in argv) == (r["specdeploy"]["arm"] == "speculative")
    base, spec = arm(runs, "baseline"), arm(runs, "speculative")
    sa = spec[0]["specdeploy"]["unit_argv"]
    i = sa.index("--speculative-config")
    assert sa[:i] + sa[i + 2 :] == base[0]["specdeploy"]["unit_argv"]
    strip = lambda c: [w for w in c if "baseline" not in w and "speculative" not in w]  # noqa: E731
    assert strip(spec[0]["specdeploy"]["command"]) == strip(base[0]["specdeploy"]["command"])
    for metric, key in KEYS.items():
        for label, runs_ in (("baseline", base), ("speculative", spec)):
            values = [r[key] for r in runs_]
            got = h["arms"][label][metric]
            assert got["values"] == values
            assert got["median"] == pytest.approx(statistics.median(values))
            assert got["mad"] == pytest.approx(mad(values))
        ms, mb = (
            statistics.median([r[key] for r in spec]),
            statistics.median([r[key] for r in base]),
        )
        assert h["ratios"][metric]["ratio"] == pytest.approx(ms / mb)
    # acceptance from /metrics (prometheus_client) equals what bench itself saw
    accepted = sum(r["spec_decode_accepted_tokens"] for r in spec)
    proposed = sum(r["spec_decode_draft_tokens"] for r in spec)
    drafts = sum(r["spec_decode_num_drafts"] for r in spec)
    assert (
        h["acceptance"]["accepted_tokens"] == accepted
        and h["acceptance"]["draft_tokens"] == proposed
    )
    assert h["acceptance"]["acceptance_rate"] == pytest.approx(accepted / proposed)
    assert h["acceptance"]["mean_acceptance_length"] == pytest.approx(1 + accepted / drafts)
    for r in spec:
        assert r["specdeploy"]["server_counters"]["acceptance_rate"] * 100 == pytest.approx(
            r["spec_decode_acceptance_rate"]
        )
    for r in base:
        assert "spec_decode_acceptance_rate" not in r
    assert "apc_profile" not in h or not h["apc_profile"]
    # one host: the fleet ratio is that host's own
    assert summary["fleet"]["ratios"]["tpot"]["ratio"] == pytest.approx(
        h["ratios"]["tpot"]["ratio"]
    )
    md = (compare_run / "summary.md").read_text()
    assert (
        "ITL ≠ TPOT" in md and "prefix caching was OFF" in md and "Identical generated text" in md
    )
    assert "permutation test" in md
    assert "Stopped by a significant look" in md and "| 4 | 0.0286 | 0.0286 | decide now |" in md
    for chart in ("latency.png", "ratios.png"):
        assert (compare_run / chart).stat().st_size > 5000
    # the measurement unit is gone and the deployed unit serves again
    gone = sandbox_ssh(host, "test -e /etc/systemd/system/specdeploy-vllm-measure.service")
    assert gone.returncode == 1
    cond = json.loads((compare_run / "raw" / host / "conditions.json").read_text())
    assert cond["restored_unit"] == "specdeploy-vllm.service"
    assert cond["run_order"]["mode"] == "alternate" and cond["decision_alpha"] == 0.05


def raw_runs(run_dir, host):
    return [
        json.loads(p.read_text())
        for p in sorted((run_dir / "raw" / host).glob("[0-9][0-9]-*.json"))
    ]


def arm(runs, label):
    return [r for r in runs if r["specdeploy"]["arm"] == label and not r["specdeploy"]["warmup"]]


# One verdict per class of identical hosts (issue 37). The good draft halves TPOT, so the canary
# passes. class_cv 0.03 sizes the canary at 3 runs per arm (power_runs: 0.96 power on a 10 %
# effect), 6 fresh starts; the default 0.05 would ask 6 per arm, 12 starts (~2x the sandbox time).
# band 0.5: the sandbox's smoke TPOT moves 10-20 % run to run on 2 shared cores; the outlier path
# has its operation fixture, this test is about the sharing.
CLASS_GATE = {"max_tpot_ratio": MARGIN, "on_fail": "baseline", "share": True, "class_cv": 0.03,
              "band": 0.5, "runs": 3}  # fmt: skip


def class_inventory(path: Path, hosts: list[str]) -> Path:
    """`hosts` on the trained pair (good draft), COMPARE_PROMPTS requests a run, the class gate."""
    path.write_text(
        "import runpy\n"
        f"_base = runpy.run_path({str(REPO / 'inventories/sandbox.py')!r})\n"
        f"_group = runpy.run_path({str(REPO / 'group_data/sandbox.py')!r})\n"
        f"_workload = {{**_group['workload'], 'num_prompts': {COMPARE_PROMPTS}}}\n"
        "sandbox = [(n, {**d, 'workload': _workload, "
        f"'speculation_gate': {CLASS_GATE!r}}})\n"
        f"           for n, d in _base['sandbox'] if n in {hosts!r}]\n"
    )
    return path


def test_a_class_of_three_identical_hosts_is_gated_once_and_the_others_share(
    deployed, sandbox_fleet, extra_host, sandbox_ssh, tmp_path, record_replay
):
    """Three hosts, one pyinfra run each (as `specdeploy rollout` runs its batches), one reports
    folder: the first is gated with the power-derived runs; the other two take its decision across
    processes (shared_from, the same class key), run their smoke but no gate run."""
    hosts = [h["name"] for h in sandbox_fleet["hosts"]][:2] + [extra_host.get()]
    try:
        inventory = class_inventory(tmp_path / "class.py", hosts)
        reports = tmp_path / "reports"
        for name in hosts:
            result = pyinfra(inventory, "deploys/serve.py", "--limit", name,
                             env={"SPECDEPLOY_REPORTS": str(reports)})  # fmt: skip
            assert result.returncode == 0, tail(result)
        records = {name: record_of(sandbox_ssh, name) for name in hosts}
    finally:
        extra_host.release()  # give the session its fleet back
    canary, *others = hosts
    gate = records[canary]["gate"]
    assert gate["passed"] is True and "shared_from" not in gate, gate
    assert gate["power"]["runs"] == 3 and gate["runs"] == {"speculative": 3, "baseline": 3}
    assert len(list((reports / canary).glob("gate-*.json"))) == 6
    classes = list((reports / "classes").glob("*.json"))
    assert [c.stem for c in classes] == [gate["class_key"]]
    for name in others:
        shared = records[name]["gate"]
        assert shared["shared_from"] == canary and shared["class_key"] == gate["class_key"]
        assert shared["passed"] is True and "outlier" not in shared
        # its own units' fingerprint (the sandbox's hosts serve on the same address and port, so
        # theirs are the canary's too), so a re-run settles on it
        unit = records[name]["unit"]["sha256"]
        assert shared["fingerprint"]["speculative_unit_sha256"] == unit
        assert not list((reports / name).glob("gate-*.json")), "a sharing host ran gate runs"
        assert list((reports / name).glob("smoke-*.json")), "a sharing host skipped its smoke"
    record_replay("class_gate", {
        "hosts.json": hosts,
        **{f"records/{n}.json": r for n, r in records.items()},
        **{f"bench/{f.name}": f for f in (reports / canary).glob("gate-*.json")},
        **{f"smoke/{n}.json": sorted((reports / n).glob("smoke-*.json"))[-1] for n in hosts},
        f"classes/{classes[0].name}": classes[0],
    })  # fmt: skip
