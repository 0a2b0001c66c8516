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
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from specdeploy.config.record import BenchResult, bench_result
from specdeploy.config.schema import ServeConfig
from specdeploy.decide.choose import min_runs_for_choose_k
from specdeploy.decide.predict import best_k, json_rows, predict, run_from_bench
from specdeploy.decide.stats import median
from specdeploy.decide.tune_rule import (
    SHARED_SERVER_NOTE,
    counted,
    measured_tpot_by_k,
    neighbours,
    next_k,
    pin_ks,
    predicted_off,
    prefix_cache_evidence,
    runs_by_label,
    shown_faster,
)
from specdeploy.measure.arms import Arm, SharedStep
from specdeploy.measure.conditions import TuneConditions

MAX_EXTENSIONS = 2

ArmFor = Callable[[int], Arm]  # k -> the arm measuring it; 0 -> the baseline arm


# --- which k to measure ---------------------------------------------------------------------------


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


def read_raw(out_dir: Path) -> Callable[[], list[BenchResult]]:
    """The samples written so far (compare.sample writes NN-<arm>.json), in index order."""

    def read() -> list[BenchResult]:
        files = sorted(out_dir.glob("[0-9][0-9]-*.json"))
        return [bench_result(json.loads(f.read_text())) for f in files]

    return read


# --- the plan -------------------------------------------------------------------------------------


@dataclass
class PredictionRecord:
    """raw/<host>/prediction.json: the prediction after the pin phase and what the flow decided to
    confirm, written again at every decision (decide.tune_rule.flow_summary reads it for the
    report). `as_json()` is the file's object, key for key as it has always been."""

    share_server: bool
    tune_k: list[int]
    pinned_k: list[int]
    pin_samples: int
    step_model: str  # predict()'s "kind"
    model: str  # the fitted step model in words
    per_position_acceptance: list[float]
    rows: list[dict[str, Any]]  # predict.json_rows: the predicted TPOT per k
    predicted_best_k: int | None
    why_no_prediction: str | None = None  # nothing to predict from: every k is measured
    predicted_off: str | None = None  # no k predicted faster than the baseline: why
    confirm_k: list[int] = field(default_factory=list)
    extensions: int = 0
    runs_per_arm: int | None = None
    prefix_cache: dict[str, Any] | None = None  # tune_rule.prefix_cache_evidence, at the end

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "method": "predict",
            "share_server": self.share_server,
            "tune_k": self.tune_k,
            "pinned_k": self.pinned_k,
            "pin_samples": self.pin_samples,
            "step_model": self.step_model,
            "model": self.model,
            "per_position_acceptance": self.per_position_acceptance,
            "rows": self.rows,
            "predicted_best_k": self.predicted_best_k,
        }
        if self.why_no_prediction is not None:
            out["why_no_prediction"] = self.why_no_prediction
        if self.predicted_off is not None:
            out["predicted_off"] = self.predicted_off
        out |= {
            "confirm_k": self.confirm_k,
            "extensions": self.extensions,
            "runs_per_arm": self.runs_per_arm,
        }
        if self.prefix_cache is not None:
            out["prefix_cache"] = self.prefix_cache
        return out


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
) -> Iterator[SharedStep]:
    """The adaptive plan (module docstring). `read()` returns the results so far; `record(obj)`
    keeps the prediction and the decisions (raw/<host>/prediction.json: a PredictionRecord's
    JSON, a new object at every decision). share_server: the runs of
    one arm in a phase share one fresh server (SHARED_SERVER_NOTE). repeats None: the fewest runs
    per arm at which choose_k can decide over the confirm window (choose.min_runs_for_choose_k)."""
    ks = sorted(set(ks))
    pinned = pin_ks(ks)
    baseline = arm_for(0)
    pin_arms = [baseline, *(arm_for(k) for k in pinned)]
    if share_server:  # the warm-up runs share the first baseline server
        yield from _guarded(
            [
                SharedStep(_seeded(cfg, baseline, WARMUP_SEED_OFFSET + i), True, i > 0)
                for i in range(warmup_runs)
            ]
            + [SharedStep(_seeded(cfg, baseline, 0), False, warmup_runs > 0)],
            read,
        )
        yield from (SharedStep(_seeded(cfg, arm, 0), False, False) for arm in pin_arms[1:])
    else:
        for i in range(warmup_runs):
            yield SharedStep(pin_arms[i % len(pin_arms)], True, False)
        for arm in pin_arms:
            yield SharedStep(arm, False, False)

    pin_results = counted(read())
    runs = [r for r in (run_from_bench(x) for x in pin_results) if r is not None]
    prediction = predict(runs, ks=[0, *ks])
    predicted_best = best_k([r for r in prediction["rows"] if r["k"] in ks])
    state = PredictionRecord(
        share_server=share_server,
        tune_k=ks,
        pinned_k=pinned,
        pin_samples=len(pin_results),
        step_model=prediction["kind"],
        model=prediction["model"],
        per_position_acceptance=prediction["rates"],
        rows=json_rows(prediction),
        predicted_best_k=predicted_best,
    )
    if predicted_best is None:  # nothing to predict from (e.g. no acceptance figures): measure all
        window = ks
        state.why_no_prediction = "no TPOT could be predicted; every k is measured"
    else:
        window = neighbours(ks, predicted_best)
        off = predicted_off(prediction["rows"], predicted_best)
        if off:
            window, state.predicted_off = [predicted_best], off
    extensions = 0
    while True:
        each = repeats or min_runs_for_choose_k(len(window), alpha=cfg.decision_alpha)
        state.confirm_k, state.extensions, state.runs_per_arm = window, extensions, each
        record(state.as_json())
        arms = [baseline, *(arm_for(k) for k in window)]
        have = {label: len(rs) for label, rs in runs_by_label(read()).items()}
        need = {a.label: each - have.get(a.label, 0) for a in arms}
        yield from _guarded(_runs(cfg, arms, need, have, share_server), read)
        tpot = measured_tpot_by_k(read())
        nxt = next_k(window, ks, tpot)
        if nxt is None or extensions >= MAX_EXTENSIONS:
            break
        if off and not shown_faster(tpot[predicted_best], tpot[0], cfg.decision_alpha):
            # as predicted, not even the best k is shown faster than the baseline, so its slower
            # neighbours are not measured: a median below the baseline's by noise is no reason
            break
        # the measured best sits at an edge of the window: measure one k further, with the best
        extensions += 1
        best = min(window, key=lambda k: median(measured_tpot_by_k(read())[k]))
        extra_arms = [arm_for(nxt), arm_for(best)]
        have = {label: len(rs) for label, rs in runs_by_label(read()).items()}
        need = {a.label: each for a in extra_arms}
        yield from _guarded(_runs(cfg, extra_arms, need, have, share_server), read)
        window = sorted({*window, nxt})
    state.confirm_k, state.extensions = window, extensions
    state.prefix_cache = prefix_cache_evidence(read())
    record(state.as_json())


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
) -> list[SharedStep]:
    """The counted runs `need` asks for: fresh servers in rotating rounds, or (share_server) one
    visit per arm, its first run on a fresh server and the rest on the same one."""
    if not share_server:
        return [SharedStep(a, False, False) for a in rounds(arms, need)]
    return [
        SharedStep(_seeded(cfg, a, have.get(a.label, 0) + j), False, j > 0)
        for a in arms
        for j in range(max(need.get(a.label, 0), 0))
    ]


def _guarded(
    steps: Iterable[SharedStep], read: Callable[[], list[BenchResult]]
) -> Iterator[SharedStep]:
    """Yield the steps; after every run on a reused server, its prefix-cache counters must show
    no hit."""
    for step in steps:
        yield step
        if step.same_server:
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


# --- the decision and the report ------------------------------------------------------------------


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

    def __iter__(self) -> Iterator[SharedStep]:
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

    def conditions(self) -> TuneConditions:
        """What conditions.json says about this plan (plans.conditions adds the rest)."""
        confirm = "one visit each" if self.share_server else "in rotating rounds"
        return TuneConditions(
            ks=list(self.ks),
            repeats=self.repeats,
            warmup_runs=self.warmup_runs,
            tune_method="predict",
            order=f"warm-up, then baseline {' '.join(f'k{k}' for k in pin_ks(self.ks))} (pin), "
            f"then the predicted best k, its neighbours and the baseline {confirm} (confirm); the "
            "exact order is the sample index",
        )

    @property
    def restart_between_samples(self) -> bool | str:
        """True: a fresh server for every sample; share_server: how a visit's runs share one."""
        return "per arm visit: " + SHARED_SERVER_NOTE if self.share_server else True

    def describe(self) -> str:
        return (
            f"Predict k over {list(self.ks)} from k={pin_ks(self.ks)}, confirm "
            f"({self.repeats or 'the fewest choose_k needs for the confirmed k'} runs each, "
            f"shared servers {self.share_server})"
        )
