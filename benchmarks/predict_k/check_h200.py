"""How well does specdeploy.decide.predict's step model predict the H200 payoff runs? (issue 13)

    python benchmarks/predict_k/check_h200.py [benchmarks/gpu_payoff/results.json] [--markdown]

Data: benchmarks/gpu_payoff/results.json (vLLM 0.26.0, Qwen3-8B/0.6B architectures, one H200, one
run per arm, `--async-scheduling` arms only: the sync and draft-eager arms are other servers). Those
runs set acceptance synthetically (`synthetic_acceptance_length`), so there are no per-position
rates: every arm has its own fixed L, and the prediction for an arm uses that arm's measured
acceptance length, TPOT = step(k) / L. What is checked is the step-time model, the part that
replaces measuring:

* "1 k": fit from the baseline and ONE speculative arm (the 'linear' fallback: every draft token
  assumed to cost the same), predict every other arm;
* "2 k": fit from the baseline and two arms with different k (the 'full' model
  s0 + s1·[k≥1] + s2·(k−1), what the tune flow pins), predict every other arm.

* "k=1 + k_max": the subset of "2 k" that pins the model the way the tune flow does (the smallest
  and the largest k), predicting the k in between.

Spread per arm: 0.526 × (P90 − P50) of TPOT, as benchmarks/gpu_payoff/analyze.py estimates it (the
runs saved no per-request samples). "in band": the measured TPOT ± its spread overlaps the predicted
band.
"""

from __future__ import annotations

import itertools
import json
import statistics
import sys
from pathlib import Path

from specdeploy.decide.predict import fit_step_model

REPO = Path(__file__).resolve().parents[2]

SPREAD_FROM_P90 = 0.526  # MAD ≈ 0.526 × (P90 − P50) for normal data


def arms(results: dict, concurrency: str) -> dict[str, dict]:
    """{arm: {k, L, tpot, spread, step}} for the baseline and the async speculative arms."""
    out = {}
    for rec in results["records"]:
        meta, bench = rec.get("meta", {}), (rec.get("bench") or {}).get(concurrency)
        if not bench or bench.get("median_tpot_ms") is None:
            continue
        if rec["arm"] == "base":
            k, length = 0, 1.0
        elif (
            meta.get("kind") == "spec"
            and meta.get("sched") == "async"
            and "eager" not in rec["arm"]
        ):
            k, length = meta["k"], bench["spec_decode_acceptance_length"] or meta["L"]
        else:
            continue
        tpot = bench["median_tpot_ms"]
        p90 = bench.get("p90_tpot_ms")
        spread = max(SPREAD_FROM_P90 * (p90 - tpot), 0.0) if p90 is not None else 0.0
        out[rec["arm"]] = {
            "k": k,
            "L": length,
            "tpot": tpot,
            "spread": spread,
            "step": tpot * length,
        }
    return out


def check(data: dict[str, dict], anchors: tuple[str, ...]) -> list[dict]:
    """Fit from the baseline + anchors, predict every other speculative arm."""
    points = {0: (data["base"]["step"], data["base"]["spread"])}
    for a in anchors:
        points[data[a]["k"]] = (data[a]["step"], data[a]["spread"] * data[a]["L"])
    model = fit_step_model(points)
    rows = []
    for name, arm in data.items():
        if name == "base" or name in anchors:
            continue
        step, half = model.step(arm["k"])
        pred = step / arm["L"]
        low, high = (step - half) / arm["L"], (step + half) / arm["L"]
        rows.append(
            {
                "from": "base + " + " + ".join(anchors),
                "model": model.kind,
                "arm": name,
                "k": arm["k"],
                "L": arm["L"],
                "measured": arm["tpot"],
                "predicted": pred,
                "error": pred / arm["tpot"] - 1,
                "low": low,
                "high": high,
                "inside": low - arm["spread"] <= arm["tpot"] <= high + arm["spread"],
            }
        )
    return rows


HEADER = (
    "| from | model | predicted arm | k | L | measured ms | predicted ms | band | error | in band |"
)


def table(rows: list[dict]) -> None:
    print(HEADER)
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['from']} | {r['model']} | {r['arm']} | {r['k']} | {r['L']:.2f} | "
            f"{r['measured']:.2f} | {r['predicted']:.2f} | {r['low']:.2f}–{r['high']:.2f} "
            f"| {r['error']:+.1%} | {'yes' if r['inside'] else 'no'} |"
        )


def totals(rows: list[dict]) -> tuple[int, float, float, int]:
    errors = [abs(r["error"]) for r in rows]
    return len(rows), statistics.median(errors), max(errors), sum(r["inside"] for r in rows)


def main() -> int:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    path = Path(args[0]) if args else REPO / "benchmarks/gpu_payoff/results.json"
    results = json.loads(path.read_text())
    print(f"{path} ({results.get('device')})\n")
    summary = []
    for conc in ("1", "8"):
        data = arms(results, conc)
        spec = [a for a in data if a != "base"]
        print(f"## concurrency {conc}: measured arms")
        for name, a in data.items():
            print(
                f"  {name:<10} k={a['k']} L={a['L']:.3f} TPOT {a['tpot']:.3f} ms "
                f"(spread {a['spread']:.3f}) step {a['step']:.2f} ms"
            )
        for n_anchor in (1, 2):
            rows = []
            for anchors in itertools.combinations(spec, n_anchor):
                if len({data[a]["k"] for a in anchors}) < n_anchor:
                    continue  # two arms at the same k do not pin the per-token slope
                rows += check(data, anchors)
            print(f"\n### concurrency {conc}: from the baseline + {n_anchor} k")
            table(rows)
            summary.append((conc, f"baseline + {n_anchor} k", *totals(rows)))
        k_max = max(data[a]["k"] for a in spec)
        rows = [
            r
            for lo in spec
            for hi in spec
            if data[lo]["k"] == 1 and data[hi]["k"] == k_max
            for r in check(data, (lo, hi))
            if 1 < r["k"] < k_max
        ]
        print(f"\n### concurrency {conc}: baseline + k=1 + k={k_max}, predicting the k between")
        table(rows)
        summary.append((conc, f"baseline + k=1 + k={k_max} (tune flow)", *totals(rows)))
        print()
    print("## summary: |TPOT error| of predicted arms")
    print(
        "| concurrency | fitted from | predictions | median abs error | max abs error | in band |"
    )
    print("|---|---|---|---|---|---|")
    for conc, how, count, med, worst, inside in summary:
        print(f"| {conc} | {how} | {count} | {med:.1%} | {worst:.1%} | {inside}/{count} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
