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
   request set); tune_repeats unset: the fewest at which choose_k can decide over the confirmed k
   (4 for 2-3 k at alpha 0.05, 5 for 4-5 k after extensions). When no k is predicted faster than
   the baseline's pin run, only the predicted best is confirmed (3 + 3 runs at alpha 0.05 can
   show it faster, so "leave speculation off" then comes from the measured runs, not from too
   few of them); its neighbours are measured only when the confirm runs show it faster than the
   baseline after all (the rank test at decision_alpha, not a lower median).
   When the measured best is at an edge of that window and tune_k goes further, the next k is added
   (with more runs of the current best beside it), at most MAX_EXTENSIONS times.

The recommendation comes only from measured runs: decisions.choose_k over the confirmed k
(smallest k within the noise band of the best), and the best's TPOT ratio to the baseline with its
band. The prediction only decides what to measure. tune_method = "sweep" measures every k
(compare.tune_plan).

The plan is a generator that reads the raw files the samples wrote, so compare.measure_plan runs it
like any fixed plan and the report is rebuilt from the same files.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from ..config import ServeConfig
from ..record import BenchResult, bench_result
from .arms import Arm
from .choose import choose_k, min_runs_for_choose_k
from .decisions import run_values
from .predict import best_k, json_rows, predict, run_from_bench
from .stats import DEFAULT_ALPHA, median, rank_test

PIN_MIDDLE_FROM = 5
MAX_EXTENSIONS = 2

ArmFor = Callable[[int], Arm]  # k -> the arm measuring it; 0 -> the baseline arm
Step = tuple[Arm, bool, bool]  # (arm, is_warmup, same_server), as harness.measure_plan takes them


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


def counted(results: Sequence[BenchResult | Mapping]) -> list[BenchResult]:
    return [r for r in map(bench_result, results) if not (r.run and r.run.warmup)]


def runs_by_label(results: Sequence[BenchResult | Mapping]) -> dict[str, list[BenchResult]]:
    out: dict[str, list[BenchResult]] = {}
    for r in counted(results):
        out.setdefault(r.run.arm, []).append(r)
    return out


def label_k(label: str) -> int:
    return 0 if label == "baseline" else int(label[1:])


def read_raw(out_dir: Path) -> Callable[[], list[BenchResult]]:
    """The samples written so far (compare.sample writes NN-<arm>.json), in index order."""

    def read() -> list[BenchResult]:
        files = sorted(out_dir.glob("[0-9][0-9]-*.json"))
        return [bench_result(json.loads(f.read_text())) for f in files]

    return read


# --- the plan -------------------------------------------------------------------------------------


def predict_plan(
    cfg: ServeConfig,
    *,
    ks: Sequence[int],
    repeats: int | None,
    warmup_runs: int,
    read: Callable[[], list[BenchResult]],
    arm_for: ArmFor,
    record: Callable[[dict], None] = lambda _: None,
    share_server: bool = False,
) -> Iterator[Step]:
    """The adaptive plan (module docstring). `read()` returns the results so far; `record(obj)`
    keeps the prediction and the decisions (raw/<host>/prediction.json). share_server: the runs of
    one arm in a phase share one fresh server (SHARED_SERVER_NOTE). repeats None: the fewest runs
    per arm at which choose_k can decide over the confirm window (choose.min_runs_for_choose_k)."""
    ks = sorted(set(ks))
    pinned = pin_ks(ks)
    baseline = arm_for(0)
    pin_arms = [baseline, *(arm_for(k) for k in pinned)]
    if share_server:  # the warm-up runs share the first baseline server
        yield from _guarded(
            [
                (_seeded(cfg, baseline, WARMUP_SEED_OFFSET + i), True, i > 0)
                for i in range(warmup_runs)
            ]
            + [(_seeded(cfg, baseline, 0), False, warmup_runs > 0)],
            read,
        )
        yield from ((_seeded(cfg, arm, 0), False, False) for arm in pin_arms[1:])
    else:
        for i in range(warmup_runs):
            yield pin_arms[i % len(pin_arms)], True, False
        for arm in pin_arms:
            yield arm, False, False

    pin_results = counted(read())
    runs = [r for r in (run_from_bench(x) for x in pin_results) if r is not None]
    prediction = predict(runs, ks=[0, *ks])
    predicted_best = best_k([r for r in prediction["rows"] if r["k"] in ks])
    state = {
        "method": "predict",
        "share_server": share_server,
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
        off = predicted_off(prediction["rows"], predicted_best)
        if off:
            window, state["predicted_off"] = [predicted_best], off
    extensions = 0
    while True:
        each = repeats or min_runs_for_choose_k(len(window), alpha=cfg.decision_alpha)
        state.update(confirm_k=window, extensions=extensions, runs_per_arm=each)
        record(state)
        arms = [baseline, *(arm_for(k) for k in window)]
        have = {label: len(rs) for label, rs in runs_by_label(read()).items()}
        need = {a.label: each - have.get(a.label, 0) for a in arms}
        yield from _guarded(_runs(cfg, arms, need, have, share_server), read)
        tpot = _tpot_by_k(read())
        nxt = next_k(window, ks, tpot)
        if nxt is None or extensions >= MAX_EXTENSIONS:
            break
        if off and not _shown_faster(tpot[predicted_best], tpot[0], cfg.decision_alpha):
            # as predicted, not even the best k is shown faster than the baseline, so its slower
            # neighbours are not measured: a median below the baseline's by noise is no reason
            break
        # the measured best sits at an edge of the window: measure one k further, with the best
        extensions += 1
        best = min(window, key=lambda k: median(_tpot_by_k(read())[k]))
        extra_arms = [arm_for(nxt), arm_for(best)]
        have = {label: len(rs) for label, rs in runs_by_label(read()).items()}
        need = {a.label: each for a in extra_arms}
        yield from _guarded(_runs(cfg, extra_arms, need, have, share_server), read)
        window = sorted({*window, nxt})
    state.update(confirm_k=window, extensions=extensions, prefix_cache=_prefix_cache(read()))
    record(state)


def _shown_faster(spec: Sequence[float], base: Sequence[float], alpha: float) -> bool:
    """The one-sided rank test says `spec`'s TPOTs are lower than `base`'s at `alpha`."""
    return bool(spec and base) and rank_test(spec, base, alternative="less")["p_value"] <= alpha


def predicted_off(rows: Sequence[Mapping], best: int) -> str | None:
    """Why only the predicted best k is confirmed: no k is predicted faster than the baseline's pin
    run (its neighbours are predicted slower still). None when the best k is predicted faster."""
    by_k = {r["k"]: r for r in rows}
    base, top = (by_k.get(0) or {}).get("tpot_ms"), by_k[best]["tpot_ms"]
    if base is None or top is None or top < base:
        return None
    return (
        f"no k is predicted faster than the baseline (best k = {best}: {top:.2f} ms; baseline "
        f"pin run {base:.2f} ms): only k = {best} is confirmed against the baseline, with the "
        "fewest runs at which choose_k can decide over one k"
    )


SHARED_SERVER_NOTE = (
    "share_server: the counted runs of one arm in one phase run back to back on one freshly "
    "started server (arms still alternate, each visit on a fresh server), each with its own "
    "request seed (seed + the arm's run number, the same for every arm); prefix caching is off "
    "in every measurement instance, and every run on a reused server must show zero prefix-cache "
    "hits on the server's own counters, else the tune stops. Runs of one visit share that "
    "server's start, so their spread does not include start-to-start variation."
)
WARMUP_SEED_OFFSET = 1000  # warm-up runs use request sets no counted run uses


class PrefixCacheReuse(RuntimeError):
    pass


def _seeded(cfg: ServeConfig, arm: Arm, j: int) -> Arm:
    return replace(arm, workload=cfg.workload.model_copy(update={"seed": cfg.workload.seed + j}))


def _runs(
    cfg: ServeConfig,
    arms: Sequence[Arm],
    need: Mapping[str, int],
    have: Mapping[str, int],
    share_server: bool,
) -> list[Step]:
    """The counted runs `need` asks for: fresh servers in rotating rounds, or (share_server) one
    visit per arm, its first run on a fresh server and the rest on the same one."""
    if not share_server:
        return [(a, False, False) for a in rounds(arms, need)]
    return [
        (_seeded(cfg, a, have.get(a.label, 0) + j), False, j > 0)
        for a in arms
        for j in range(max(need.get(a.label, 0), 0))
    ]


def _guarded(steps: Iterable[Step], read: Callable[[], list[BenchResult]]) -> Iterator[Step]:
    """Yield the steps; after every run on a reused server, its prefix-cache counters must show
    no hit."""
    for step in steps:
        yield step
        if step[2]:
            check_no_prefix_reuse(read()[-1])


def check_no_prefix_reuse(result: BenchResult | Mapping) -> None:
    run = bench_result(result).run
    pc = run.prefix_cache if run else {}
    if pc.get("hits"):
        raise PrefixCacheReuse(
            f"run {run.index} ({run.arm}) on a "
            f"reused server hit the prefix cache ({pc}): runs on one server are not independent "
            "here; set tune_share_server = false"
        )


def _prefix_cache(results: Sequence[Mapping]) -> dict:
    """The evidence: prefix-cache queries and hits summed over runs on fresh / reused servers."""
    out = {}
    for r in map(bench_result, results):
        key = "fresh_server" if r.run is None or r.run.fresh_server else "reused_server"
        pc = r.run.prefix_cache if r.run else {}
        agg = out.setdefault(key, {"runs": 0, "queries": 0.0, "hits": 0.0})
        agg["runs"] += 1
        agg["queries"] += pc.get("queries") or 0.0
        agg["hits"] += pc.get("hits") or 0.0
    return out


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


def decide(results: Sequence[Mapping], confirm_k: Sequence[int], *, alpha: float) -> dict:
    """choose_k over the confirmed k's measured runs with the baseline's: the smallest k not slower
    than the best and faster than the baseline, or leave speculation off (choose.py)."""
    tpot = _tpot_by_k(results)
    return choose_k({k: tpot.get(k, []) for k in confirm_k}, baseline=tpot.get(0), alpha=alpha)


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
    samples = [bench_result(r).run for r in results]
    seconds = [s.sample_seconds or 0.0 for s in samples]
    pin_n = record["pin_samples"] + sum(1 for s in samples if s.warmup)
    return {
        "decision": decide(
            results, record["confirm_k"], alpha=conditions.get("decision_alpha", DEFAULT_ALPHA)
        ),
        "record": dict(record),
        "rows": rows,
        "time": {
            "seconds": conditions.get("seconds"),
            "samples": len(samples),
            "server_starts": sum(1 for s in samples if s.seconds_to_healthy is not None),
            "pin_seconds": round(sum(seconds[:pin_n]), 1),
            "confirm_seconds": round(sum(seconds[pin_n:]), 1),
            # the sweep measures every k and the baseline, with the runs choose_k needs for them
            "sweep_samples_for_comparison": (len(record["tune_k"]) + 1)
            * min_runs_for_choose_k(
                len(record["tune_k"]), alpha=conditions.get("decision_alpha", DEFAULT_ALPHA)
            )
            + (conditions.get("warmup_runs") or 0),
        },
    }


# --- compare.measurement_deploy("tune") with tune_method = predict --------------------------------


@dataclass(frozen=True)
class PredictPlan:
    """predict_plan as compare.measure_plan iterates it: the generator starts when the measurement
    starts on the host; it reads the raw files in out_dir and writes prediction.json beside them."""

    cfg: ServeConfig
    ks: tuple[int, ...]
    repeats: int | None  # None: sized by the flow to the k it confirms
    warmup_runs: int
    share_server: bool
    out_dir: Path
    arm_for: ArmFor

    def __iter__(self) -> Iterator[Step]:
        def record(state: dict) -> None:
            (self.out_dir / "prediction.json").write_text(json.dumps(state, indent=1))

        return predict_plan(
            self.cfg,
            ks=self.ks,
            repeats=self.repeats,
            warmup_runs=self.warmup_runs,
            read=read_raw(self.out_dir),
            arm_for=self.arm_for,
            record=record,
            share_server=self.share_server,
        )

    def conditions(self) -> dict:
        """What conditions.json says about this plan (compare.conditions adds the rest)."""
        confirm = "one visit each" if self.share_server else "in rotating rounds"
        out = {
            "tune_method": "predict",
            "order": f"warm-up, then baseline {' '.join(f'k{k}' for k in pin_ks(self.ks))} (pin), "
            f"then the predicted best k, its neighbours and the baseline {confirm} (confirm); the "
            "exact order is the sample index",
        }
        if self.share_server:
            out["restart_between_samples"] = "per arm visit: " + SHARED_SERVER_NOTE
        return out

    def describe(self) -> str:
        return (
            f"Predict k over {list(self.ks)} from k={pin_ks(self.ks)}, confirm "
            f"({self.repeats or 'the fewest choose_k needs for the confirmed k'} runs each, "
            f"shared servers {self.share_server})"
        )
