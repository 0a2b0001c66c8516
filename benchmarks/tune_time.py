"""deploys/tune.py on the sandbox: the predict flow vs the exhaustive sweep, wall times and k.

    SPECDEPLOY_STATE_DIR=/run/specdeploy/sandbox-mine specdeploy-sandbox up --hosts 1
    pyinfra -y inventories/sandbox.py deploys/serve.py
    python benchmarks/tune_time.py [--k 1-7] [--repeats 3] [--warmup-runs 1] [--[no-]share-server]
                                   [--only predict|sweep] [--limit HOST]

Runs the real pyinfra deploy twice against inventories/sandbox.py (tune_method sweep, then predict,
each its own run id), then prints both wall times, where they went (server starts, benchmarks), each
recommended k, and the issue-13 check: is the k the predict flow recommends inside the noise band of
the best k the sweep found (judged on the sweep's own runs), in at most a third of the sweep's time?
The sandbox shares the control node's CPUs: the load average is printed with every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def tune(method: str, args, stamp: str) -> dict:
    run = f"tune-time-{method}-{stamp}"
    env = {
        **os.environ,
        "SPECDEPLOY_RUN": run,
        "SPECDEPLOY_TUNE_METHOD": method,
        "SPECDEPLOY_TUNE_K": args.k,
        "SPECDEPLOY_TUNE_REPEATS": str(args.repeats),
        "SPECDEPLOY_TUNE_WARMUP_RUNS": str(args.warmup_runs),
    }
    if args.share_server is not None:  # else the host data's tune_share_server (default off)
        env["SPECDEPLOY_TUNE_SHARE_SERVER"] = "1" if args.share_server else "0"
    cmd = ["pyinfra", "-y", str(REPO / "inventories/sandbox.py")]
    cmd += (["--limit", args.limit] if args.limit else []) + ["deploys/tune.py"]
    load = os.getloadavg()[0]
    started = time.monotonic()
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=env)
    wall = time.monotonic() - started
    if r.returncode:
        print(r.stdout[-4000:], r.stderr[-4000:], file=sys.stderr)
        raise SystemExit(f"tune ({method}) FAILED after {wall:.0f} s")
    run_dir = Path(os.environ.get("SPECDEPLOY_REPORTS", REPO / "reports")) / run
    summary = json.loads((run_dir / "summary.json").read_text())
    return {
        "method": method,
        "wall": wall,
        "load": (load, os.getloadavg()[0]),
        "dir": run_dir,
        "summary": summary,
    }


def describe(t: dict) -> None:
    print(
        f"{t['method']}: {t['wall']:.0f} s wall (load average {t['load'][0]:.1f} -> "
        f"{t['load'][1]:.1f}, {os.cpu_count()} CPUs); report {t['dir']}/summary.md"
    )
    for name, h in t["summary"]["hosts"].items():
        samples = h["runs"]
        raw = [
            json.loads(f.read_text())["specdeploy"]
            for f in sorted((t["dir"] / "raw" / name).glob("[0-9][0-9]-*.json"))
        ]
        starts = [s["seconds_to_healthy"] for s in raw if s.get("seconds_to_healthy") is not None]
        benches = [s["bench_seconds"] for s in raw]
        c = h["choice"]
        print(
            f"  {name}: {len(samples)} samples, {len(starts)} server starts (median "
            f"{statistics.median(starts):.0f} s), benchmark median "
            f"{statistics.median(benches):.0f} s; best k {c['best_k']}, "
            f"recommended k {c['recommended_k']}"
        )
        for k, v in sorted(c["per_k"].items(), key=lambda kv: int(kv[0])):
            print(f"    k={k}: TPOT median {v['median']:.3f} ms, MAD {v['mad']:.3f} (n={v['n']})")
        flow = h.get("predict_flow")
        if flow:
            for row in flow["rows"]:
                if row["measured_runs"] and row["predicted_tpot_ms"] is not None:
                    print(
                        f"    k={row['k']}: predicted {row['predicted_tpot_ms']:.3f} ms, measured "
                        f"{row['measured_tpot_ms']:.3f} ms ({row['error']:+.1%})"
                    )


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--k", default="1-7", help="tune_k (default 1-7)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--warmup-runs", type=int, default=1)
    p.add_argument(
        "--share-server",
        action=argparse.BooleanOptionalAction,
        help="override tune_share_server for predict (default: the host data's, on)",
    )
    p.add_argument("--only", choices=["predict", "sweep"])
    p.add_argument("--limit", help="only this host")
    args = p.parse_args()
    stamp = time.strftime("%Y%m%dT%H%M%S")
    results = {}
    for method in ("sweep", "predict"):
        if args.only in (None, method):
            results[method] = tune(method, args, stamp)
            describe(results[method])
    if len(results) < 2:
        return 0
    sweep, pred = results["sweep"], results["predict"]
    ratio = pred["wall"] / sweep["wall"]
    print(
        f"\npredict / sweep wall time: {pred['wall']:.0f} / {sweep['wall']:.0f} s = {ratio:.2f} "
        f"(target <= 1/3: {'met' if ratio <= 1 / 3 else 'NOT met'})"
    )
    for name, h in pred["summary"]["hosts"].items():
        rec = h["choice"]["recommended_k"]
        sw = sweep["summary"]["hosts"][name]["choice"]
        inside = sw["per_k"][str(rec)]["within_noise_of_best"]
        print(
            f"{name}: predict recommends k={rec}; the sweep's best is k={sw['best_k']} "
            f"(recommended {sw['recommended_k']}); k={rec} on the sweep's runs is "
            f"{'inside' if inside else 'OUTSIDE'} the noise band of the best "
            f"(ratio {sw['per_k'][str(rec)]['ratio_to_best']:.3f})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
