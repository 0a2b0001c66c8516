"""How well does the predictor reproduce a measured tune sweep? (issue 13)

    python benchmarks/predict_k/check_sweep.py reports/<tune run> [--pin 1,4,7]

For every host of a `tune_method = "sweep"` run: the runs of the pinned k (default: what the predict
flow pins, tune_flow.pin_ks) go into specdeploy.decide.predict, every other k is predicted, and the
prediction is compared with the sweep's own median TPOT of that k. A sweep measures no baseline, so
the step model is the 'no-baseline' one (intercept and per-extra-token slope over k ≥ 1). Also
printed: the predicted best k and whether it lies inside the sweep's noise band of the best k.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from specdeploy.decide.choose import choose_k
from specdeploy.decide.predict import best_k, predict, run_from_bench
from specdeploy.decide.tune_rule import pin_ks

REPO = Path(__file__).resolve().parents[2]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("run_dir")
    p.add_argument("--pin", help="k to predict from, e.g. 1,4,7 (default: tune_flow.pin_ks)")
    args = p.parse_args()
    for host_dir in sorted((Path(args.run_dir) / "raw").glob("*")):
        results = [json.loads(f.read_text()) for f in sorted(host_dir.glob("[0-9][0-9]-*.json"))]
        runs = [r for r in (run_from_bench(x, x["specdeploy"]["arm"]) for x in results) if r]
        by_k: dict[int, list[float]] = {}
        for r in runs:
            by_k.setdefault(r.k, []).append(r.tpot_ms)
        ks = sorted(by_k)
        pinned = [int(k) for k in args.pin.split(",")] if args.pin else pin_ks(ks)
        prediction = predict([r for r in runs if r.k in pinned], ks=ks)
        print(f"## {host_dir.name}: predicted from k={pinned} ({prediction['kind']} step model)")
        print(prediction["model"])
        print("| k | measured median ms (runs) | MAD | predicted ms | band | error |")
        print("|---|---|---|---|---|---|")
        errors = []
        for row in prediction["rows"]:
            k, values = row["k"], by_k[row["k"]]
            m = statistics.median(values)
            mad = statistics.median([abs(v - m) for v in values])
            if k in pinned or row["tpot_ms"] is None:
                pred, band, err = "pinned" if k in pinned else "–", "", ""
            else:
                e = row["tpot_ms"] / m - 1
                errors.append(abs(e))
                pred = f"{row['tpot_ms']:.3f}"
                band = f"{row['tpot_ms_low']:.3f}–{row['tpot_ms_high']:.3f}"
                err = f"{e:+.1%}"
            print(f"| {k} | {m:.3f} ({len(values)}) | {mad:.3f} | {pred} | {band} | {err} |")
        choice = choose_k(by_k)
        best = best_k(prediction["rows"])
        inside = choice["per_k"][best]["within_noise_of_best"] if best is not None else None
        if errors:
            print(
                f"\nmedian abs error {statistics.median(errors):.1%}, max {max(errors):.1%} "
                f"over {len(errors)} predicted k"
            )
        print(
            f"predicted best k = {best}; the sweep's best k = {choice['best_k']} (recommended "
            f"{choice['recommended_k']}); k={best} is "
            f"{'inside' if inside else 'outside'} the sweep's noise band of the best\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
