"""Preflight verdicts for the H200 rows, next to vLLM's: results.json and the tables in REPORT.md.

The preflight runs here, with specdeploy's own code, on the facts the device recorded for each row:
the `Accelerators` fact command's output (read with the row's memory hog in place) and the
`ModelSnapshot` fact script's output over the generated checkpoints.

Usage: python -m benchmarks.gpu_truth.analyze DEVICE_DIR [DEVICE_DIR2] [--out OUT_DIR]
(DEVICE_DIR: summary.json and model_facts.json of the first session; DEVICE_DIR2: `swing_run.py`'s
output of the second: its TP=2 starts join `repeated_runs`, its swing experiment becomes `swing`;
writes OUT_DIR/results.json, prints the tables)
       python -m benchmarks.gpu_truth.analyze --predict PLAN.json    (verdicts on an idle H200 x2)
"""

from __future__ import annotations

import json
import os
import statistics
import sys

from specdeploy.checks.preflight import evaluate
from specdeploy.config.schema import config_from_data
from specdeploy.decide.stats import mad, median, ratio_with_band
from specdeploy.host.facts.nvidia import parse_accelerators

RAM = {"total": 256 << 30, "available": 250 << 30}  # unused for GPU hosts
IDLE_H200_X2 = [
    "@@query",
    "0, NVIDIA H200, 143771, 0, 580.159.04, 9.0, Disabled",
    "1, NVIDIA H200, 143771, 0, 580.159.04, 9.0, Disabled",
    "@@rc 0",
    "@@header",
    "| NVIDIA-SMI 580.159.04   Driver Version: 580.159.04   CUDA Version: 13.0     |",
]


def preflight(row: dict, facts: dict, fact_output: list[str]) -> dict:
    cfg = config_from_data(row["data"])
    target = facts[row["target_repo"]]
    draft = facts[row["draft_repo"]] if row.get("draft_repo") else None
    result = evaluate(cfg, target, draft, parse_accelerators(fact_output), RAM)
    return {
        "preflight": "refused" if result.problems else "fits",
        "preflight_kv_tokens": result.memory.get("kv_tokens"),
        "preflight_problems": result.problems,
        "preflight_warnings": result.warnings,
        "preflight_memory": result.memory,
    }


def truth_rows(summary: list[dict], facts: dict) -> list[dict]:
    rows = []
    for rec in summary:
        if "skipped" in rec or rec.get("vllm") not in ("started", "refused"):
            continue
        pre = preflight(rec, facts, rec["accelerator_fact_output"])
        vkv = int(rec["vllm_kv_tokens"]) if rec.get("vllm_kv_tokens") else None
        pkv = pre["preflight_kv_tokens"]
        both = rec["vllm"] == "started" and pre["preflight"] == "fits"
        rows.append(
            {
                "id": rec["id"],
                "tp": rec["tp"],
                "target": rec["target_repo"],
                "draft": rec.get("draft_repo"),
                "mechanism": pre["preflight_memory"].get("mechanism"),
                "mechanism_value": pre["preflight_memory"].get("mechanism_value"),
                "eager": "--enforce-eager" in rec["data"]["vllm_extra_args"],
                "memory_in_use_gib": rec["hog_gib"],
                "note": rec.get("note") or rec.get("arm"),
                "preflight": pre["preflight"],
                "vllm": rec["vllm"],
                "agree": (pre["preflight"] == "fits") == (rec["vllm"] == "started"),
                "preflight_kv_tokens": pkv if pre["preflight"] == "fits" else None,
                "vllm_kv_tokens": vkv,
                "kv_tokens_error": round(pkv / vkv - 1, 4) if both and vkv else None,
                "preflight_overhead_gib": round(
                    pre["preflight_memory"].get("overhead_per_gpu_bytes", 0) / 2**30, 2
                ),
                "vllm_available_kv_gib": float(rec["available_kv_gib"])
                if rec.get("available_kv_gib")
                else None,
                "vllm_weights_gib": float(rec["weights_gib"]) if rec.get("weights_gib") else None,
                "preflight_says": pre["preflight_problems"] + pre["preflight_warnings"],
                "vllm_says": rec.get("error_lines", [])[-3:] if rec["vllm"] != "started" else [],
                "ready_s": rec.get("ready_s"),
            }
        )
    return rows


def payoff(*sessions: list[dict]) -> dict:
    """Per arm: every sample (fresh server), the first start of each arm in each session (machine)
    marked discarded, medians + MAD of the kept samples' median TPOT, and the ratio to the same-TP
    baseline with its noise band."""
    arms: dict[str, list[tuple[int, bool, dict]]] = {}
    for session, summary in enumerate(sessions, 1):
        seen: set[str] = set()
        for rec in summary:
            if rec.get("arm") and rec.get("bench"):
                arms.setdefault(rec["arm"], []).append((session, rec["arm"] not in seen, rec))
                seen.add(rec["arm"])
    out = {}
    for arm, recs in arms.items():
        samples = []
        for session, first, rec in recs:
            for conc, b in rec["bench"].items():
                if "median_tpot_ms" not in b:
                    continue
                tpots = b["per_request_tpot_ms"]
                half = len(tpots) // 2
                samples.append(
                    {
                        "id": rec["id"],
                        "session": session,
                        "c": int(conc),
                        "discarded": first,
                        "median_tpot_ms": round(b["median_tpot_ms"], 3),
                        "first_half_tpot_ms": round(statistics.median(tpots[:half]), 3)
                        if half
                        else None,
                        "second_half_tpot_ms": round(statistics.median(tpots[half:]), 3)
                        if half
                        else None,
                        "acceptance_length": b.get("spec_decode_acceptance_length"),
                        "gpu_busy_pct": b.get("gpu_busy_pct_median"),
                        "ready_s": rec.get("ready_s"),
                        "engine_cpu": _engine_cpu(b.get("cpu", {})),
                        "per_request_tpot_ms": [round(t, 2) for t in tpots],
                    }
                )
        out[arm] = {"samples": samples}
        for conc in sorted({s["c"] for s in samples}):
            kept = [s["median_tpot_ms"] for s in samples if s["c"] == conc and not s["discarded"]]
            if not kept:  # one start only (first = discarded by the method): a lead, no band
                first = [s["median_tpot_ms"] for s in samples if s["c"] == conc][0]
                out[arm][f"c{conc}"] = {"n": 0, "single_start_tpot_ms": first}
            else:
                out[arm][f"c{conc}"] = {
                    "n": len(kept),
                    "median_tpot_ms": round(median(kept), 3),
                    "mad_ms": round(mad(kept), 3),
                    "range_ms": [min(kept), max(kept)],
                }
    for arm, entry in out.items():
        base = out.get(arm.split("_")[0] + "_base")
        if base is None or arm.endswith("_base"):
            continue
        for key in [k for k in entry if k.startswith("c")]:
            spec_kept = [
                s["median_tpot_ms"]
                for s in entry["samples"]
                if f"c{s['c']}" == key and not s["discarded"]
            ]
            base_kept = [
                s["median_tpot_ms"]
                for s in base["samples"]
                if f"c{s['c']}" == key and not s["discarded"]
            ]
            if not spec_kept and not base_kept:
                single = entry[key].get("single_start_tpot_ms")
                base_single = base.get(key, {}).get("single_start_tpot_ms")
                if single and base_single:
                    entry[key]["single_start_ratio_vs_base"] = round(single / base_single, 3)
            if spec_kept and base_kept:
                r = ratio_with_band(spec_kept, base_kept)
                entry[key]["tpot_ratio_vs_base"] = {
                    k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()
                }
    return out


def _engine_cpu(cpu: dict) -> dict | None:
    """The busiest thread of the engine-core process: its CPU share and the CPUs it was seen on."""
    for entry in cpu.values():
        if "EngineCore" in entry.get("cmd", "") or any(
            "EngineCor" in t["name"] for t in entry["busy_threads"]
        ):
            top = entry["busy_threads"][0] if entry["busy_threads"] else None
            return {
                "top_thread": top,
                "invol_ctxt": entry["invol_ctxt"],
                "allowed": entry["allowed"],
            }
    return None


def main() -> None:
    if sys.argv[1] == "--predict":
        plan = json.load(open(sys.argv[2]))
        facts = json.load(open(sys.argv[3])) if len(sys.argv) > 3 else None
        for row in plan:
            fact_lines = list(IDLE_H200_X2)
            if row["hog_gib"]:
                used = str(row["hog_gib"] * 1024 + 512)
                fact_lines[1] = fact_lines[1].replace(", 0, 580", f", {used}, 580")
                fact_lines[2] = fact_lines[2].replace(", 0, 580", f", {used}, 580")
            pre = preflight(row, facts, fact_lines)
            m = pre["preflight_memory"]
            print(
                f"{row['id']:<22} {pre['preflight']:<8} kv_tokens={m.get('kv_tokens')} "
                f"overhead={m.get('overhead_per_gpu_bytes', 0) / 2**30:.2f} GiB "
                f"{(pre['preflight_problems'] + pre['preflight_warnings'])[:1]}"
            )
        return
    args = sys.argv[1:]
    out_dir = os.path.dirname(__file__)
    if "--out" in args:
        out_dir = args.pop(args.index("--out") + 1)
        args.remove("--out")
    src, second = args[0], args[1:]
    summary = json.load(open(os.path.join(src, "summary.json")))
    facts = json.load(open(os.path.join(src, "model_facts.json")))
    rows = truth_rows(summary, facts)
    sessions = [summary] + [json.load(open(os.path.join(d, "summary.json"))) for d in second]
    result = {"rows": rows, "repeated_runs": payoff(*sessions), "model_facts": facts}
    if second:
        from benchmarks.gpu_truth.swing import analyze as swing

        result["swing"] = swing(second[0])
    with open(os.path.join(out_dir, "results.json"), "w") as f:
        json.dump(result, f, indent=1)
    for r in rows:
        print(
            f"{r['id']:<22} tp={r['tp']} preflight={r['preflight']:<7} vllm={r['vllm']:<8} "
            f"kv {r['preflight_kv_tokens']} vs {r['vllm_kv_tokens']} err={r['kv_tokens_error']}"
        )
    print(
        json.dumps(
            {
                a: {k: v for k, v in e.items() if k != "samples"}
                for a, e in result["repeated_runs"].items()
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
