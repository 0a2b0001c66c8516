"""predict.py on synthetic runs whose truth is known: L(k) from per-position rates, the step-model
fits (full, no baseline, linear fallback, none), the noise band carried through the fit, and reading
`vllm bench serve` JSONs with and without specdeploy's block."""

import math

import pytest

from specdeploy.decide.predict import (
    NotABenchRun,
    Run,
    acceptance_length,
    best_k,
    fit_step_model,
    format_table,
    pooled_rates,
    predict,
    run_from_bench,
)

RATES = [0.8, 0.6, 0.45, 0.3, 0.2, 0.1, 0.05]
S0, S1, S2 = 10.0, 4.0, 6.0  # baseline step, first draft token, each further one (ms)


def true_step(k):
    return S0 + (S1 if k >= 1 else 0) + S2 * max(k - 1, 0)


def true_tpot(k):
    return true_step(k) / acceptance_length(RATES, k)


def bench(k, tpot=None, *, drafts=100, arm=None, warmup=False, rates=None, extra=None):
    """A `vllm bench serve` result as deploys/tune.py saves it (k = 0: baseline)."""
    result = {"median_tpot_ms": true_tpot(k) if tpot is None else tpot}
    if k:
        rates = RATES[:k] if rates is None else rates
        result.update(
            spec_decode_per_position_acceptance_rates=rates,
            spec_decode_acceptance_length=1 + sum(rates),
            spec_decode_num_drafts=drafts,
        )
    result["specdeploy"] = {
        "arm": arm or (f"k{k}" if k else "baseline"),
        "warmup": warmup,
        "speculative": bool(k),
        "prefix_caching": False,
        "speculative_config": {"num_speculative_tokens": k} if k else None,
        **(extra or {}),
    }
    return result


def runs(*ks, **kw):
    return [run_from_bench(bench(k, **kw)) for k in ks]


def row(prediction, k):
    return next(r for r in prediction["rows"] if r["k"] == k)


def test_acceptance_length_is_one_plus_the_rate_prefix_sum():
    assert acceptance_length(RATES, 0) == 1.0
    assert acceptance_length(RATES, 3) == pytest.approx(1 + 0.8 + 0.6 + 0.45)
    assert acceptance_length(RATES, 7) == pytest.approx(1 + sum(RATES))
    with pytest.raises(ValueError):
        acceptance_length(RATES, 8)


def test_L_of_every_k_comes_from_the_k_max_run_exactly():
    p = predict(runs(0, 7))
    for k in range(1, 8):
        assert row(p, k)["acceptance_length"] == 1 + math.fsum(RATES[:k])
    assert row(p, 7)["acceptance_length_source"] == "measured"
    assert row(p, 3)["acceptance_length_source"] == "per-position rates"
    assert row(p, 0)["acceptance_length"] == 1.0


def test_full_model_from_baseline_and_two_k_reproduces_every_other_k():
    p = predict(runs(0, 1, 7))
    assert p["kind"] == "full"
    for k in range(8):
        assert row(p, k)["tpot_ms"] == pytest.approx(true_tpot(k))
    assert [row(p, k)["tpot_source"] for k in range(8)] == [
        "measured",
        "measured",
        "predicted",
        "predicted",
        "predicted",
        "predicted",
        "predicted",
        "measured",
    ]
    assert "s0=10.000 ms, s1=4.000 ms, s2=6.000 ms" in p["model"]
    assert "exact fit" in p["model"]
    assert best_k(p["rows"]) == min(range(1, 8), key=true_tpot)


def test_full_model_is_not_the_textbook_linear_one():
    # k=1 and k=3 pin s1 and s2 apart: a linear per-token cost would mispredict k=7.
    p = predict(runs(0, 1, 3), ks=range(8))
    linear = predict(runs(0, 3), ks=range(8))
    assert linear["kind"] == "linear" and "ASSUMES" in linear["model"]
    assert row(p, 1)["tpot_ms"] == pytest.approx(true_tpot(1))
    assert row(linear, 1)["tpot_ms"] != pytest.approx(true_tpot(1))  # d = (step(3) - s0) / 3


def test_linear_fallback_with_one_speculative_k():
    p = predict(runs(0, 4))
    d = (true_step(4) - S0) / 4
    assert row(p, 2)["tpot_ms"] == pytest.approx((S0 + 2 * d) / acceptance_length(RATES, 2))
    assert row(p, 4)["tpot_ms"] == pytest.approx(true_tpot(4))


def test_without_baseline_k_ge_1_is_predicted_and_the_baseline_is_not():
    p = predict(runs(2, 6))
    assert p["kind"] == "no-baseline"
    assert row(p, 0)["tpot_ms"] is None and row(p, 0)["tpot_source"] is None
    for k in (1, 3, 4, 5):
        assert row(p, k)["tpot_ms"] == pytest.approx(true_tpot(k))


def test_too_few_points_predict_nothing_but_keep_the_measurements():
    p = predict(runs(5))
    assert p["kind"] == "none"
    assert row(p, 5)["tpot_source"] == "measured"
    assert all(row(p, k)["tpot_ms"] is None for k in range(5))
    assert row(p, 3)["acceptance_length"] == pytest.approx(acceptance_length(RATES, 3))
    only_baseline = predict(runs(0))
    assert [r["k"] for r in only_baseline["rows"]] == [0]


def test_k_beyond_the_measured_positions_has_no_prediction():
    p = predict(runs(0, 1, 3), ks=[5])
    assert row(p, 5)["acceptance_length"] is None and row(p, 5)["tpot_ms"] is None


def test_measured_spread_is_carried_through_the_fit_weights():
    # Two runs per k: run-level MAD. Exact full fit: predicted step(k) = w . steps.
    rs = []
    for k, delta in ((0, 0.2), (1, 0.1), (5, 0.4)):
        t = true_tpot(k)
        rs += runs(k, tpot=t - delta) + runs(k, tpot=t + delta)
    p = predict(rs)
    # median of two = truth; MAD of two = delta; step spread = delta * L
    s = {0: 0.2, 1: 0.1 * acceptance_length(RATES, 1), 5: 0.4 * acceptance_length(RATES, 5)}
    # step(3) = s0 + s1 + 2 s2 with s2 = (step5 - step1)/4 -> weights 0, 1/2, 1/2 over (k0, k1, k5)
    half = 0.5 * s[1] + 0.5 * s[5]
    r3 = row(p, 3)
    length = acceptance_length(RATES, 3)
    spread_l = 0.0  # all runs report the same rates
    assert r3["tpot_ms_low"] == pytest.approx((true_step(3) - half) / (length + spread_l))
    assert r3["tpot_ms_high"] == pytest.approx((true_step(3) + half) / (length - spread_l))
    assert row(p, 5)["tpot_ms_low"] == pytest.approx(true_tpot(5) - 0.4)
    assert row(p, 5)["spread_from"] == "runs"


def test_overdetermined_fit_reports_residuals():
    rs = runs(0, 1, 3, 7)
    rs.append(run_from_bench(bench(5, tpot=true_tpot(5) * 1.2)))
    model = fit_step_model({r.k: (r.tpot_ms * (r.acceptance_length or 1), 0.0) for r in rs})
    assert model.kind == "full" and model.residual_rms > 0
    value, half = model.step(4)
    assert half == pytest.approx(model.residual_rms)


def test_pooled_rates_weight_runs_by_drafts():
    a = Run(k=2, tpot_ms=1.0, acceptance_length=1.9, per_position=(0.5, 0.4), drafts=100)
    b = Run(k=1, tpot_ms=1.0, acceptance_length=1.8, per_position=(0.8,), drafts=300)
    assert pooled_rates([a, b]) == pytest.approx([(50 + 240) / 400, 0.4])


def test_reading_bench_jsons():
    assert run_from_bench(bench(3, warmup=True)) is None
    assert run_from_bench(bench(0, arm="apc-on")) is None
    r = run_from_bench(bench(3), source="x.json")
    assert (r.k, r.per_position, r.source) == (3, tuple(RATES[:3]), "x.json")
    # plain vLLM JSON, no specdeploy block: k from the number of positions; baseline has no metrics
    plain = {k: v for k, v in bench(4).items() if k != "specdeploy"}
    assert run_from_bench(plain).k == 4
    assert run_from_bench({"median_tpot_ms": 5.0}).k == 0
    with pytest.raises(NotABenchRun):
        run_from_bench({"median_tpot_ms": 5.0, "spec_decode_acceptance_length": 2.0})
    with pytest.raises(NotABenchRun):
        run_from_bench({"median_tpot_ms": 0.0})


def test_single_run_spread_comes_from_its_requests():
    result = bench(2)
    result.update(latencies=[1.0, 1.1, 1.2], ttfts=[0.1, 0.1, 0.1], output_lens=[11, 11, 11])
    p = predict([run_from_bench(result)])
    r = row(p, 2)
    assert r["spread_from"] == "requests"
    assert r["tpot_ms_high"] - r["tpot_ms"] == pytest.approx(10.0)  # MAD of 90/100/110 ms


def test_table_marks_measured_and_predicted():
    text = format_table(predict(runs(0, 1, 7)))
    assert "s2=6.000 ms" in text
    lines = [line.split() for line in text.splitlines() if line[:3].strip().isdigit()]
    assert [line[0] for line in lines] == [str(k) for k in range(8)]
    assert lines[3][-2] == "p" and lines[7][-2] == "m"


def test_cli_predict_k_table_and_json(tmp_path, capsys):
    import json

    from specdeploy.cli import main

    for i, k in enumerate((0, 1, 7)):
        (tmp_path / f"0{i}-k{k}.json").write_text(json.dumps(bench(k)))
    (tmp_path / "09-warm.json").write_text(json.dumps(bench(3, warmup=True)))
    (tmp_path / "conditions.json").write_text("{}")
    (tmp_path / "notes.json").write_text("[]")  # not a bench result: skipped with a message
    assert main(["predict-k", str(tmp_path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["k"] for r in out] == list(range(8))
    assert out[4]["tpot_ms"] == pytest.approx(true_tpot(4))
    assert out[4]["acceptance_length"] == pytest.approx(acceptance_length(RATES, 4))
    assert out[4]["tpot_source"] == "predicted" and out[7]["tpot_source"] == "measured"
    assert main(["predict-k", str(tmp_path / "02-k7.json")]) == 0
    text = capsys.readouterr().out
    assert "step model" in text and "fewer points" in text
    assert main(["predict-k", str(tmp_path / "notes.json")]) == 1
