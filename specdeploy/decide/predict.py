"""Predict TPOT for every num_speculative_tokens k from a few measured runs (issue 13).

Two measured quantities carry the whole sweep:

* **Acceptance.** Accepted draft tokens always form a prefix, so a speculative run at k_max reports
  per-position acceptance rates a_1 … a_kmax (`spec_decode_per_position_acceptance_rates` in
  `vllm bench serve`'s JSON: accepted at position i / drafts), and the expected tokens per engine
  step at any k ≤ k_max is L(k) = 1 + a_1 + … + a_k (L(0) = 1, the baseline). With greedy sampling
  the chance that position i is accepted does not depend on how many tokens are drafted after it.
* **Step time.** One engine step emits L(k) tokens per request, so step(k) = TPOT(k) · L(k) is
  measured at every k that ran (the baseline: step(0) = TPOT(0)). It is NOT assumed to be
  T_target + k·T_draft: on the H200 (benchmarks/gpu_payoff) the first draft token cost ~0.4 of a
  target step and every further one ~0.9. The model fitted here is

      step(k) = s0 + s1·[k ≥ 1] + s2·(k − 1)⁺

  s0 the baseline step, s1 what turning speculation on costs (the first draft token plus the fixed
  per-step overhead), s2 each further draft token. With fewer measured k it does less (STEP_MODELS).

predicted TPOT(k) = step(k) / L(k). The uncertainty is interval arithmetic in the style of
stats.band_from_spread: each measured step's spread (MAD over runs, or over requests for a single
run) is carried through the fit's weights, the fit's residual RMS is added when there are more
points than parameters, and L's spread over runs widens the TPOT interval. It is a noise band, not a
confidence interval, and it says nothing about the model form when the fit is exact.

Pure functions over result dicts: no host, no I/O (the CLI reads the files).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from specdeploy.config.record import BenchResult, BenchRun, bench_result
from specdeploy.decide.decisions import per_request_tpot_ms
from specdeploy.decide.stats import mad, median

STEP_MODELS = {
    "full": "step(k) = s0 + s1·[k≥1] + s2·(k−1): baseline and two or more speculative k measured",
    "no-baseline": "step(k) = c + s2·(k−1) for k ≥ 1: two or more speculative k, no baseline "
    "(the baseline TPOT cannot be predicted)",
    "linear": "step(k) = s0 + d·k, d from the one speculative k measured: ASSUMES every draft "
    "token costs the same (false on the H200 for k ≥ 2); measure a second k to pin the step model",
    "none": "fewer points than any model needs: only measured k have a TPOT",
}


# --- reading `vllm bench serve` results -----------------------------------------------------------


@dataclass(frozen=True)
class Run:
    """One benchmark run: its k (0 = baseline), median TPOT and acceptance."""

    k: int
    tpot_ms: float
    acceptance_length: float | None = None  # measured, 1 + accepted / drafts; None for the baseline
    per_position: tuple[float, ...] = ()  # a_1 … a_k (accepted at position i / drafts)
    drafts: float | None = None
    request_tpot_ms: tuple[
        float, ...
    ] = ()  # per-request TPOT (--save-detailed), for one-run spread
    source: str = ""


class NotABenchRun(ValueError):
    pass


def run_k(result: BenchResult | Mapping) -> int:
    """k of a result: from specdeploy's record of the arm when present, else vLLM's own fields."""
    result = bench_result(result)
    sd = result.run or BenchRun()
    if sd.speculative is False:
        return 0
    spec_cfg = sd.speculative_config or {}
    if spec_cfg.get("num_speculative_tokens"):
        return int(spec_cfg["num_speculative_tokens"])
    arm = str(sd.arm or "")
    if arm[:1] == "k" and arm[1:].isdigit():
        return int(arm[1:])
    if arm == "baseline":
        return 0
    rates = result.spec_decode_per_position_acceptance_rates
    if rates:
        return len(rates)
    if result.spec_decode_acceptance_length is None:
        return 0  # no speculative metrics at all: a baseline run
    raise NotABenchRun(
        "speculative run without per-position rates or a specdeploy arm record: k unknown"
    )


def run_from_bench(result: BenchResult | Mapping, source: str = "") -> Run | None:
    """A Run from one `vllm bench serve` JSON (with or without specdeploy's part, BenchRun).
    None for runs that must not be counted: warm-ups and the prefix-caching profile."""
    if not isinstance(result, (BenchResult, Mapping)):
        raise NotABenchRun("not a JSON object")
    try:
        result = bench_result(result)
    except ValueError as error:
        raise NotABenchRun(f"not a bench result: {error}") from None
    sd = result.run or BenchRun()
    if sd.warmup or sd.prefix_caching or str(sd.arm or "").startswith("apc-"):
        return None
    tpot = result.median_tpot_ms
    if not isinstance(tpot, (int, float)) or tpot <= 0:
        raise NotABenchRun(f"no positive median_tpot_ms ({tpot!r})")
    k = run_k(result)
    rates = tuple(float(a) for a in result.spec_decode_per_position_acceptance_rates or ())
    length = result.spec_decode_acceptance_length
    if k and length is None and rates:
        length = 1 + sum(rates)
    return Run(
        k=k,
        tpot_ms=float(tpot),
        acceptance_length=float(length) if k and length is not None else None,
        per_position=rates[:k] if k else (),
        drafts=result.spec_decode_num_drafts,
        request_tpot_ms=tuple(per_request_tpot_ms(result)),
        source=source,
    )


# --- acceptance -----------------------------------------------------------------------------------


def acceptance_length(rates: Sequence[float], k: int) -> float:
    """L(k) = 1 + a_1 + … + a_k: expected tokens per engine step at k, from per-position rates."""
    if k < 0 or k > len(rates):
        raise ValueError(f"k={k} outside the {len(rates)} measured positions")
    return 1.0 + math.fsum(rates[:k])


def pooled_rates(runs: Iterable[Run]) -> list[float]:
    """Per-position acceptance pooled over runs, each position over the runs that drafted it,
    weighted by their drafts (accepted at i / drafts, summed): the rate over all drafts seen."""
    acc: dict[int, float] = {}
    drafts: dict[int, float] = {}
    for r in runs:
        weight = r.drafts if r.drafts else 1.0
        for i, a in enumerate(r.per_position):
            acc[i] = acc.get(i, 0.0) + a * weight
            drafts[i] = drafts.get(i, 0.0) + weight
    return [acc[i] / drafts[i] for i in range(len(acc))]


# --- the step model -------------------------------------------------------------------------------


def features(k: int, kind: str) -> list[float]:
    if kind == "full":
        return [1.0, float(k >= 1), float(max(k - 1, 0))]
    if kind == "no-baseline":
        return [1.0, float(k - 1)]
    if kind == "linear":
        return [1.0, float(k)]
    raise ValueError(kind)


@dataclass(frozen=True)
class StepModel:
    """A fitted step(k) model: prediction = weights(k) · measured steps (a linear estimator)."""

    kind: str  # a key of STEP_MODELS
    ks: tuple[int, ...]  # the measured k the fit uses
    steps: tuple[float, ...]  # their step times (ms)
    spreads: tuple[float, ...]  # their step spreads (ms)
    params: tuple[float, ...] = ()
    residual_rms: float | None = None  # None: as many points as parameters (exact fit)
    _pinv: tuple[tuple[float, ...], ...] = field(default=(), repr=False)

    def covers(self, k: int) -> bool:
        if self.kind == "none":
            return False
        return k >= 1 or self.kind in ("full", "linear")

    def step(self, k: int) -> tuple[float, float]:
        """(predicted step ms, half-width ms) at k."""
        if not self.covers(k):
            raise ValueError(f"the {self.kind} step model cannot predict k={k}")
        x = np.array(features(k, self.kind))
        weights = x @ np.array(self._pinv)
        value = float(weights @ np.array(self.steps))
        half = float(np.abs(weights) @ np.array(self.spreads)) + (self.residual_rms or 0.0)
        return value, half

    def describe(self) -> str:
        if self.kind == "none":
            return STEP_MODELS["none"]
        names = {"full": ("s0", "s1", "s2"), "no-baseline": ("c", "s2"), "linear": ("s0", "d")}
        fitted = ", ".join(
            f"{n}={p:.3f} ms" for n, p in zip(names[self.kind], self.params, strict=True)
        )
        rms = (
            "exact fit (as many points as parameters): model error not estimated"
            if self.residual_rms is None
            else f"residual RMS {self.residual_rms:.3f} ms"
        )
        return f"{STEP_MODELS[self.kind]}; fitted on k={list(self.ks)}: {fitted}; {rms}"


def fit_step_model(points: Mapping[int, tuple[float, float]]) -> StepModel:
    """Fit step(k) from {k: (step ms, spread ms)} (k = 0 is the baseline). The model is the richest
    one the points determine: 'full' (baseline + ≥ 2 speculative k), 'no-baseline' (≥ 2 speculative
    k), 'linear' (baseline + 1 speculative k, an assumption), else 'none'."""
    ks = tuple(sorted(points))
    spec = [k for k in ks if k >= 1]
    if 0 in points and len(spec) >= 2:
        kind = "full"
    elif len(spec) >= 2:
        kind = "no-baseline"
        ks = tuple(spec)
    elif 0 in points and spec:
        kind = "linear"
    else:
        return StepModel(
            "none", ks, tuple(points[k][0] for k in ks), tuple(points[k][1] for k in ks)
        )
    steps = np.array([points[k][0] for k in ks])
    spreads = tuple(float(points[k][1]) for k in ks)
    design = np.array([features(k, kind) for k in ks])
    pinv = np.linalg.pinv(design)
    params = pinv @ steps
    residual_rms = None
    if len(ks) > design.shape[1]:
        residuals = steps - design @ params
        residual_rms = float(math.sqrt(float(residuals @ residuals) / (len(ks) - design.shape[1])))
    return StepModel(
        kind,
        ks,
        tuple(float(s) for s in steps),
        spreads,
        tuple(float(p) for p in params),
        residual_rms,
        tuple(tuple(float(v) for v in row) for row in pinv),
    )


# --- per-k measurements and predictions -----------------------------------------------------------


@dataclass(frozen=True)
class Measured:
    """The runs of one k, reduced the way decisions.py reduces them: one value per run."""

    k: int
    runs: int
    tpot_ms: float  # median over runs
    tpot_spread_ms: float  # MAD over runs; for one run, MAD over its requests; else 0
    spread_from: str  # "runs", "requests" or "none"
    acceptance_length: float  # pooled over runs (1 for the baseline)
    acceptance_spread: float  # MAD of the per-run lengths (0 with one run)

    @property
    def step_ms(self) -> float:
        return self.tpot_ms * self.acceptance_length


def measured_by_k(runs: Iterable[Run]) -> dict[int, Measured]:
    groups: dict[int, list[Run]] = {}
    for r in runs:
        groups.setdefault(r.k, []).append(r)
    out = {}
    for k, rs in sorted(groups.items()):
        tpots = [r.tpot_ms for r in rs]
        if len(rs) >= 2:
            spread, spread_from = mad(tpots), "runs"
        elif rs[0].request_tpot_ms:
            spread, spread_from = mad(rs[0].request_tpot_ms), "requests"
        else:
            spread, spread_from = 0.0, "none"
        lengths = [r.acceptance_length for r in rs if r.acceptance_length is not None]
        if k == 0:
            length, length_spread = 1.0, 0.0
        elif lengths:
            weighted = [(r.acceptance_length, r.drafts or 1.0) for r in rs if r.acceptance_length]
            length = sum(v * w for v, w in weighted) / sum(w for _, w in weighted)
            length_spread = mad(lengths) if len(lengths) >= 2 else 0.0
        else:
            continue  # a speculative run that reports no acceptance: its step time is unknown
        out[k] = Measured(k, len(rs), median(tpots), spread, spread_from, length, length_spread)
    return out


def _length_spread(runs: Sequence[Run], k: int) -> float:
    """MAD over runs of L(k) computed from each run's own per-position rates (0 with < 2 runs)."""
    per_run = [acceptance_length(r.per_position, k) for r in runs if len(r.per_position) >= k]
    return mad(per_run) if len(per_run) >= 2 else 0.0


def predict(runs: Sequence[Run], ks: Iterable[int] | None = None) -> dict:
    """Predicted (or measured) acceptance length, step time and TPOT for every k.

    ks: the k to report; default 0 … the largest measured k. Returns {"model": description,
    "kind", "rates": pooled per-position rates, "rows": [row per k]}; a row has k,
    acceptance_length (+ _source), step_ms, tpot_ms with tpot_ms_low/high, tpot_source
    ("measured" / "predicted" / None when it cannot be predicted), the model's own value at measured
    k (model_tpot_ms) and the number of runs."""
    runs = list(runs)
    by_k = measured_by_k(runs)
    rates = pooled_rates(r for r in runs if r.k >= 1)
    model = fit_step_model(
        {k: (m.step_ms, m.tpot_spread_ms * m.acceptance_length) for k, m in by_k.items()}
    )
    top = max([0, *(r.k for r in runs)])
    rows = []
    for k in sorted(set(ks) if ks is not None else range(top + 1)):
        rows.append(_row(k, by_k.get(k), rates, runs, model))
    return {"kind": model.kind, "model": model.describe(), "rates": rates, "rows": rows}


def _row(k: int, m: Measured | None, rates, runs, model: StepModel) -> dict:
    row = {"k": k, "runs": m.runs if m else 0}
    if m:
        length, length_spread, length_source = m.acceptance_length, m.acceptance_spread, "measured"
    elif k == 0:
        length, length_spread, length_source = 1.0, 0.0, "baseline"
    elif k <= len(rates):
        length = acceptance_length(rates, k)
        length_spread = _length_spread([r for r in runs if r.k >= 1], k)
        length_source = "per-position rates"
    else:
        length, length_spread, length_source = None, None, None
    row.update(acceptance_length=length, acceptance_length_source=length_source)
    model_tpot = model_step = half = None
    if length is not None and model.covers(k):
        model_step, half = model.step(k)
        model_tpot = model_step / length
    row["model_tpot_ms"] = model_tpot
    if m:
        row.update(
            step_ms=m.step_ms,
            tpot_ms=m.tpot_ms,
            tpot_ms_low=m.tpot_ms - m.tpot_spread_ms,
            tpot_ms_high=m.tpot_ms + m.tpot_spread_ms,
            tpot_source="measured",
            spread_from=m.spread_from,
        )
    elif model_tpot is not None:
        low_len = length - length_spread
        row.update(
            step_ms=model_step,
            tpot_ms=model_tpot,
            tpot_ms_low=max(model_step - half, 0.0) / (length + length_spread),
            tpot_ms_high=(model_step + half) / low_len if low_len > 0 else math.inf,
            tpot_source="predicted",
            spread_from=None,
        )
    else:
        row.update(
            step_ms=None,
            tpot_ms=None,
            tpot_ms_low=None,
            tpot_ms_high=None,
            tpot_source=None,
            spread_from=None,
        )
    return row


def best_k(rows: Sequence[Mapping], *, speculative_only: bool = True) -> int | None:
    """The k with the lowest TPOT (measured or predicted) among rows with one; ties: smaller k."""
    candidates = [
        r for r in rows if r["tpot_ms"] is not None and (r["k"] >= 1 or not speculative_only)
    ]
    if not candidates:
        return None
    return min(candidates, key=lambda r: (r["tpot_ms"], r["k"]))["k"]


def json_rows(prediction: Mapping) -> list[dict]:
    """predict()'s rows as strict JSON (an infinite band edge becomes null), each with the model."""

    def clean(v):
        return None if isinstance(v, float) and not math.isfinite(v) else v

    return [
        {**{key: clean(v) for key, v in r.items()}, "step_model": prediction["kind"]}
        for r in prediction["rows"]
    ]


def format_table(prediction: Mapping) -> str:
    """The people's view of predict()."""
    lines = [
        f"step model: {prediction['model']}",
        "per-position acceptance: "
        + (", ".join(f"a{i + 1}={a:.3f}" for i, a in enumerate(prediction["rates"])) or "none"),
        "",
        f"{'k':>3} {'L(k)':>7} {'':1} {'step ms':>8} {'TPOT ms':>8} {'band':>17} {'':1} runs",
    ]
    for r in prediction["rows"]:
        length = "-" if r["acceptance_length"] is None else f"{r['acceptance_length']:.3f}"
        mark_l = "m" if r["acceptance_length_source"] == "measured" else ""
        if r["tpot_ms"] is None:
            step = tpot = band = "-"
        else:
            step, tpot = f"{r['step_ms']:.3f}", f"{r['tpot_ms']:.3f}"
            high = r["tpot_ms_high"]
            band = f"{r['tpot_ms_low']:.3f}-{'inf' if math.isinf(high) else f'{high:.3f}'}"
        mark_t = {"measured": "m", "predicted": "p"}.get(r["tpot_source"], "")
        lines.append(
            f"{r['k']:>3} {length:>7} {mark_l:1} {step:>8} {tpot:>8} {band:>17} {mark_t:1} "
            f"{r['runs']}"
        )
    best = best_k(prediction["rows"])
    lines += [
        "",
        "m = measured, p = predicted (step model / L(k)); band: spread of the measured runs "
        "carried through the fit (a noise band, not a confidence interval); k=0 is the baseline.",
    ]
    if best is not None:
        lines.append(
            f"lowest TPOT at k={best}: confirm it against its neighbours and the baseline."
        )
    return "\n".join(lines)
