"""Feed the H200 load proof's runs to the product's decision code, here on the control node.

The device's raw `vllm bench serve` results (device_run.py) become the bench results a
measurement keeps (config/record.BenchResult: vLLM's figures plus specdeploy's BenchRun, labelled
`<arm>@c<concurrency>` as measure/load_flow labels its runs), and go through what a load tune and
a proof across load report (report/load_summary.load_summary, which runs decide/load_rule):

- the tune (tune_method = "load"): the baseline and every fixed-k arm of the plan (`k<k>`: k = 1
  and k = 3 in h200-0.26.0, k = 1 alone in h200-0.26.0-5starts) at every level: the k per level
  (decide_levels), the schedule those call for, the single k or off (tune_recommendation); the
  tuned config is the largest fixed k's;
- the proof (compare_across_load of a candidate schedule, compare_schedule): the issue's schedule
  against the baseline and the fixed k the tune recommends (else the tuned config's k) at every
  level (prove_schedule).

The fixed arm of the proof is that k's own runs (same rounds, same fresh servers): with synthetic
acceptance the acceptance length must fit the k (vLLM refuses L > k + 1), so the k = 1 arm runs
L 1.8 where the k = 3 and schedule arms run L 2.5 (the earlier sweep's lengths).

Usage: python benchmarks/gpu_load/decide.py RECORDING_DIR
  reads RECORDING_DIR/rounds.json, plan.json and results/round<r>/<label>.json (device_run.py's
  results.tar.gz unpacked; without it, the kept results.json);
  writes RECORDING_DIR/results.json (every counted run, vLLM's scalar figures), inputs.json (what
  load_summary gets), summary.json and summary.md (what it answers)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from specdeploy.decide.load_rule import SCHEDULE_KEY, k_of, level_label, split_label
from specdeploy.decide.stats import DEFAULT_ALPHA
from specdeploy.releases.capabilities import speculative_keys
from specdeploy.report.load_summary import load_markdown, load_summary

HOST = "h200"
ALPHA = DEFAULT_ALPHA


def compact(raw: dict) -> dict:
    """vLLM's scalar figures of one run (the per-request arrays stay in the tarball)."""
    return {k: v for k, v in raw.items() if not isinstance(v, list | dict)}


def counted_runs(rec: Path) -> list[dict]:
    """Every measured run as a bench result, in the order it ran (from the device's raw files
    where they are unpacked, else from the kept results.json)."""
    if not (rec / "results").is_dir():
        return json.loads((rec / "results.json").read_text())
    plan = json.loads((rec / "plan.json").read_text())
    out = []
    for rnd in json.loads((rec / "rounds.json").read_text()):
        if rnd["mode"] == "warmup":
            continue
        for run in rnd["runs"]:
            if "error" in run:
                continue
            label = Path(run["file"]).stem
            arm, _ = split_label(label)
            raw = json.loads((rec / "results" / run["file"]).read_text())
            out.append(
                compact(raw)
                | {
                    "specdeploy": {
                        "arm": label,
                        "index": len(out),
                        "warmup": False,
                        "fresh_server": True,
                        "speculative": arm != "baseline",
                        "seconds_to_healthy": rnd["servers"][arm]["seconds_to_healthy"],
                        "unit_argv": plan[arm]["unit_argv"],
                        "speculative_config": plan[arm]["speculative_config"],
                        "host": HOST,
                    }
                }
            )
    return out


def relabel(run: dict, arm: str) -> dict:
    _, c = split_label(run["specdeploy"]["arm"])
    return run | {"specdeploy": run["specdeploy"] | {"arm": level_label(arm, c)}}


def inputs(runs: list[dict], plan: dict, levels: list[dict]) -> dict:
    """The two hosts load_summary is given: the tune's and the proof's (conditions as
    measure/load_flow's LoadTune and LoadProof write them, runs as the harness keeps them)."""
    ks = sorted(k for arm in plan if (k := k_of(arm)))
    deployed = plan[f"k{ks[-1]}"]["speculative_config"]
    schedule = plan["schedule"]["speculative_config"][SCHEDULE_KEY]
    common = {
        "decision_alpha": ALPHA,
        "load_levels": levels,
        "limits": {"max_num_seqs": 64},
        "schedule_supported": SCHEDULE_KEY in speculative_keys("0.26.0").keys,
        "data_parallel_size": 1,
    }
    tune = {
        "conditions": common
        | {"tune_method": "load", "ks": ks, "arms": ["baseline", *(f"k{k}" for k in ks)]}
        | {"speculative_config": deployed},
        "runs": [r for r in runs if k_of(split_label(r["specdeploy"]["arm"])[0]) is not None],
    }
    return {"tune": tune, "schedule": schedule, "deployed": deployed, "common": common}


def proof_host(tune_summary: dict, given: dict, runs: list[dict]) -> dict:
    """compare_schedule of the issue's schedule with the fixed k the tune printed
    (SPECDEPLOY_COMPARE_FIXED_K: its single k, else the config's num_speculative_tokens)."""
    fixed_k = (
        tune_summary["recommendation"]["fixed"]["k"] or given["deployed"]["num_speculative_tokens"]
    )
    by_arm = {"baseline": "baseline", "schedule": "schedule", f"k{fixed_k}": "fixed"}
    chosen = [
        relabel(r, by_arm[arm])
        for r in runs
        if (arm := split_label(r["specdeploy"]["arm"])[0]) in by_arm
    ]
    spec = given["deployed"] | {SCHEDULE_KEY: given["schedule"]}
    return {
        "conditions": given["common"]
        | {"across_load": True, "arms": ["baseline", "schedule", "fixed"], "fixed_k": fixed_k}
        | {"schedule": given["schedule"], "schedule_deployed": False, "speculative_config": spec},
        "runs": chosen,
    }


def decide(given: dict, runs: list[dict], run: str) -> dict:
    """summary.json of both: the tune first (its fixed k picks the proof's fixed arm)."""
    head = {"run": run, "kind": "tune", "hosts": {}}
    tune = load_summary({f"{HOST}-tune": given["tune"]}, head)
    proof_in = proof_host(tune["hosts"][f"{HOST}-tune"], given, runs)
    proof = load_summary({f"{HOST}-proof": proof_in}, head | {"kind": "compare", "hosts": {}})
    return {"tune": tune, "proof": proof, "proof_input": proof_in}


def main(rec: Path) -> None:
    plan = json.loads((rec / "plan.json").read_text())
    runs = counted_runs(rec)
    levels = [{"concurrency": int(c)} for c in plan["baseline"]["bench"]]
    given = inputs(runs, plan, levels)
    out = decide(given, runs, rec.name)
    (rec / "results.json").write_text(json.dumps(runs, indent=1) + "\n")
    (rec / "inputs.json").write_text(json.dumps(given | {"proof": out["proof_input"]}, indent=1))
    summary = {"tune": out["tune"], "proof": out["proof"]}
    (rec / "summary.json").write_text(json.dumps(summary, indent=1, default=str) + "\n")
    md = load_markdown(out["tune"]) + "\n" + load_markdown(out["proof"])
    (rec / "summary.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
