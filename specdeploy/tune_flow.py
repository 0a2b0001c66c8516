"""deploys/tune.py: choose num_speculative_tokens on every host, by prediction (default) or sweep.

tune_method = "predict" (issue 13), three phases on one host, all under compare.py's rules (one
measurement unit, prefix caching off, the same request set for every arm, a fresh server per sample,
discarded warm-up runs, the deployed unit restored at the end):

1. **pin**: warm-up run(s), then one counted run each of the baseline, the smallest and the
   largest k of tune_k, and its middle k when tune_k has PIN_MIDDLE_FROM values or more (a third
   speculative point gives the step model a residual, i.e. its own error). k=1 must be measured:
   the first draft token costs very differently from the later ones
   (benchmarks/predict_k/REPORT.md).
2. **predict**: predict.predict() over the pin runs gives TPOT for every k in tune_k; it is written
   to raw/<host>/prediction.json before anything else runs.
3. **confirm**: the predicted best k, its neighbours in tune_k and the baseline, in rounds whose
   order rotates, until each has tune_repeats counted runs (pin runs count: same rules, same
   request set).
   When the measured best is at an edge of that window and tune_k goes further, the next k is added
   (with more runs of the current best beside it), at most MAX_EXTENSIONS times.

The recommendation comes only from measured runs: tuning.choose_k over the confirmed k (smallest k
within the noise band of the best), and the best's TPOT ratio to the baseline with its band. The
prediction only decides what to measure. tune_method = "sweep" measures every k (compare.tune_plan).

The plan is a generator that reads the raw files the samples wrote, so compare.run_plan runs it like
any fixed plan and the report is rebuilt from the same files.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from .compare import Arm, k_arm
from .config import ServeConfig
from .predict import best_k, json_rows, predict, run_from_bench
from .stats import median
from .tuning import choose_k, compare_values, run_values

PIN_MIDDLE_FROM = 5
MAX_EXTENSIONS = 2
BASELINE = Arm("baseline", False)

Step = tuple[Arm, bool]  # (arm, is_warmup), as compare.run_plan takes them


# --- which k to measure ---------------------------------------------------------------------------


def pin_ks(ks: Sequence[int]) -> list[int]:
    """The speculative k measured before predicting: smallest, largest, and the middle one of long
    lists (a third point measures the step model's own error)."""
    s = sorted(set(ks))
    pinned = {s[0], s[-1]}
    if len(s) >= PIN_MIDDLE_FROM:
        pinned.add(s[len(s) // 2])
    return sorted(pinned)


def neighbours(ks: Sequence[int], k: int) -> list[int]:
    """k and the k next to it in tune_k."""
    s = sorted(set(ks))
    i = s.index(k)
    return s[max(i - 1, 0) : i + 2]


def rounds(arms: Sequence[Arm], need: Mapping[str, int], *, start: int = 0) -> list[Arm]:
    """Rounds over `arms`, each arm once per round while it still needs runs, the order rotating by
    one every round so that no arm always runs first."""
    left = {a.label: need.get(a.label, 0) for a in arms}
    out: list[Arm] = []
    r = start
    while any(v > 0 for v in left.values()):
        shift = r % len(arms)
        for a in list(arms[shift:]) + list(arms[:shift]):
            if left[a.label] > 0:
                out.append(a)
                left[a.label] -= 1
        r += 1
    return out


# --- reading what ran -----------------------------------------------------------------------------


def counted(results: Sequence[Mapping]) -> list[Mapping]:
    return [r for r in results if not (r.get("specdeploy") or {}).get("warmup")]


def runs_by_label(results: Sequence[Mapping]) -> dict[str, list[Mapping]]:
    out: dict[str, list[Mapping]] = {}
    for r in counted(results):
        out.setdefault(r["specdeploy"]["arm"], []).append(r)
    return out


def label_k(label: str) -> int:
    return 0 if label == "baseline" else int(label[1:])


def read_raw(out_dir: Path) -> Callable[[], list[dict]]:
    """The samples written so far (compare.sample writes NN-<arm>.json), in index order."""

    def read() -> list[dict]:
        return [json.loads(f.read_text()) for f in sorted(out_dir.glob("[0-9][0-9]-*.json"))]

    return read


# --- the plan -------------------------------------------------------------------------------------


def predict_plan(
    cfg: ServeConfig,
    *,
    ks: Sequence[int],
    repeats: int,
    warmup_runs: int,
    read: Callable[[], list[dict]],
    record: Callable[[dict], None] = lambda _: None,
) -> Iterator[Step]:
    """The adaptive plan (module docstring). `read()` returns the results so far; `record(obj)`
    keeps the prediction and the decisions (raw/<host>/prediction.json)."""
    ks = sorted(set(ks))
    pinned = pin_ks(ks)
    pin_arms = [BASELINE, *(k_arm(cfg, k) for k in pinned)]
    for i in range(warmup_runs):
        yield pin_arms[i % len(pin_arms)], True
    for arm in pin_arms:
        yield arm, False

    pin_results = counted(read())
    runs = [r for r in (run_from_bench(x) for x in pin_results) if r is not None]
    prediction = predict(runs, ks=[0, *ks])
    predicted_best = best_k([r for r in prediction["rows"] if r["k"] in ks])
    state = {
        "method": "predict",
        "tune_k": ks,
        "pinned_k": pinned,
        "pin_samples": len(pin_results),
        "step_model": prediction["kind"],
        "model": prediction["model"],
        "per_position_acceptance": prediction["rates"],
        "rows": json_rows(prediction),
        "predicted_best_k": predicted_best,
    }
    if predicted_best is None:  # nothing to predict from (e.g. no acceptance figures): measure all
        window = ks
        state["why_no_prediction"] = "no TPOT could be predicted; every k is measured"
    else:
        window = neighbours(ks, predicted_best)
    extensions = 0
    while True:
        state.update(confirm_k=window, extensions=extensions)
        record(state)
        arms = [BASELINE, *(k_arm(cfg, k) for k in window)]
        have = runs_by_label(read())
        need = {a.label: repeats - len(have.get(a.label, [])) for a in arms}
        for arm in rounds(arms, need):
            yield arm, False
        nxt = next_k(window, ks, _tpot_by_k(read()))
        if nxt is None or extensions >= MAX_EXTENSIONS:
            break
        # the measured best sits at an edge of the window: measure one k further, with the best
        extensions += 1
        best = min(window, key=lambda k: median(_tpot_by_k(read())[k]))
        extra_arms = [k_arm(cfg, nxt), k_arm(cfg, best)]
        for arm in rounds(extra_arms, {a.label: repeats for a in extra_arms}):
            yield arm, False
        window = sorted({*window, nxt})
    state.update(confirm_k=window, extensions=extensions)
    record(state)


def _tpot_by_k(results: Sequence[Mapping]) -> dict[int, list[float]]:
    return {label_k(label): run_values(rs, "tpot") for label, rs in runs_by_label(results).items()}


def next_k(window: Sequence[int], ks: Sequence[int], tpot_by_k: Mapping[int, Sequence[float]]):
    """The k beyond the window's edge when the measured best (lowest median TPOT) is at that edge
    and tune_k goes further; else None."""
    measured = [k for k in window if tpot_by_k.get(k)]
    if not measured:
        return None
    best = min(measured, key=lambda k: (median(tpot_by_k[k]), k))
    s = sorted(set(ks))
    if best == min(window) and s.index(best) > 0 and s[s.index(best) - 1] not in window:
        return s[s.index(best) - 1]
    if best == max(window) and s.index(best) < len(s) - 1 and s[s.index(best) + 1] not in window:
        return s[s.index(best) + 1]
    return None


# --- the decision and the report ------------------------------------------------------------------


def decide(results: Sequence[Mapping], confirm_k: Sequence[int]) -> dict:
    """choose_k over the confirmed k's measured runs, and the chosen k against the baseline."""
    tpot = _tpot_by_k(results)
    choice = choose_k({k: tpot.get(k, []) for k in confirm_k})
    rec = choice["recommended_k"]
    vs_base = compare_values(tpot.get(rec, []), tpot.get(0, []))
    return {**choice, "recommended_vs_baseline": vs_base}


def flow_summary(results: Sequence[Mapping], record: Mapping, conditions: Mapping) -> dict:
    """Predicted (after the pin phase) vs measured TPOT for every measured k, the decision, and
    where the time went."""
    tpot = _tpot_by_k(results)
    predicted = {r["k"]: r for r in record["rows"]}
    rows = []
    for k in sorted(set(tpot) | set(predicted)):
        p, values = predicted.get(k, {}), tpot.get(k, [])
        measured_median = median(values) if values else None
        pinned = k == 0 or k in record["pinned_k"]
        rows.append(
            {
                "k": k,
                "role": "pinned" if pinned else ("confirmed" if values else "predicted only"),
                "acceptance_length": p.get("acceptance_length"),
                "predicted_tpot_ms": None if pinned else p.get("tpot_ms"),
                "predicted_low": None if pinned else p.get("tpot_ms_low"),
                "predicted_high": None if pinned else p.get("tpot_ms_high"),
                "measured_runs": len(values),
                "measured_tpot_ms": measured_median,
                "error": (p["tpot_ms"] / measured_median - 1)
                if values and not pinned and p.get("tpot_ms")
                else None,
            }
        )
    samples = [r["specdeploy"] for r in results]
    seconds = [s.get("sample_seconds") or 0.0 for s in samples]
    pin_n = record["pin_samples"] + sum(1 for s in samples if s.get("warmup"))
    return {
        "decision": decide(results, record["confirm_k"]),
        "record": dict(record),
        "rows": rows,
        "time": {
            "seconds": conditions.get("seconds"),
            "samples": len(samples),
            "server_starts": sum(1 for s in samples if s.get("seconds_to_healthy") is not None),
            "pin_seconds": round(sum(seconds[:pin_n]), 1),
            "confirm_seconds": round(sum(seconds[pin_n:]), 1),
            "sweep_samples_for_comparison": len(record["tune_k"]) * (conditions.get("repeats") or 0)
            + (conditions.get("warmup_runs") or 0),
        },
    }


def _f(x, digits=2):
    return "–" if x is None else f"{x:.{digits}f}"


def flow_markdown(name: str, s: Mapping) -> list[str]:
    r, d, t = s["record"], s["decision"], s["time"]
    vs = d["recommended_vs_baseline"]
    lines = [
        f"### {name}: predicted, then confirmed (tune_method = predict)",
        "",
        f"Pinned: baseline + k = {r['pinned_k']} (one run each after the warm-up); step model: "
        f"{r['model']}. Predicted best k = {r['predicted_best_k']}; confirmed k = {r['confirm_k']} "
        f"with the baseline ({r['extensions']} window extension(s)). The recommendation uses "
        "measured runs only.",
        "",
        f"Recommended k = **{d['recommended_k']}** (best measured {d['best_k']}); its TPOT / "
        f"baseline = {_f(vs['ratio'], 3)} (band {_f(vs['low'], 3)} – {_f(vs['high'], 3)}, "
        f"{vs['verdict']}).",
        "",
        "| k | role | L(k) | predicted TPOT ms | band | measured TPOT ms (runs) | error |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in s["rows"]:
        error = "–" if row["error"] is None else f"{row['error']:+.1%}"
        lines.append(
            f"| {row['k']} | {row['role']} | {_f(row['acceptance_length'], 3)} | "
            f"{_f(row['predicted_tpot_ms'])} | {_f(row['predicted_low'])} – "
            f"{_f(row['predicted_high'])} | {_f(row['measured_tpot_ms'])} ({row['measured_runs']}) "
            f"| {error} |"
        )
    lines += [
        "",
        f"Time: {t['seconds']} s for {t['samples']} samples ({t['server_starts']} server starts): "
        f"pin phase {t['pin_seconds']} s, confirm phase {t['confirm_seconds']} s (sample time, "
        f"server start included). The exhaustive sweep of tune_k would take "
        f"{t['sweep_samples_for_comparison']} samples.",
        "",
    ]
    return lines


# --- compare.measurement_deploy("tune") with tune_method = predict --------------------------------


@dataclass(frozen=True)
class PredictPlan:
    """predict_plan as compare.run_plan iterates it: built when the measurement starts on the host
    (it reads that host's raw files and writes its prediction.json beside them)."""

    cfg: ServeConfig
    ks: tuple[int, ...]
    repeats: int
    warmup_runs: int

    def __iter__(self) -> Iterator[Step]:
        from pyinfra import host

        from .compare import run_dir

        out_dir = run_dir("tune") / "raw" / host.name

        def record(state: dict) -> None:
            (out_dir / "prediction.json").write_text(json.dumps(state, indent=1))

        return predict_plan(
            self.cfg,
            ks=self.ks,
            repeats=self.repeats,
            warmup_runs=self.warmup_runs,
            read=read_raw(out_dir),
            record=record,
        )


def predict_measurement(cfg: ServeConfig) -> tuple[PredictPlan, dict, str]:
    """compare.MEASUREMENTS["tune"] for tune_method = predict: (plan, conditions, op name)."""
    from .compare import conditions, setting

    ks = setting(cfg, "tune_k")
    repeats = setting(cfg, "tune_repeats")
    warmup_runs = setting(cfg, "tune_warmup_runs")
    pinned = pin_ks(ks)
    order = (
        f"warm-up, then baseline {' '.join(f'k{k}' for k in pinned)} (pin), then the predicted "
        "best k, its neighbours and the baseline in rotating rounds (confirm); the exact order is "
        "the sample index"
    )
    cond = conditions(
        cfg, ks=ks, repeats=repeats, warmup_runs=warmup_runs, tune_method="predict", order=order
    )
    plan = PredictPlan(cfg, tuple(ks), repeats, warmup_runs)
    return plan, cond, f"Predict k over {ks} from k={pinned}, confirm ({repeats} runs each)"
