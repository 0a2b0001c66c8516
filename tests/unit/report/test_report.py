"""report.py on fixed raw files: the numbers in summary.json/summary.md equal values computed by
hand from the raw bench JSONs, warm-ups are left out, and the charts are written."""

import json

import pytest

from specdeploy.config.schema import ServeConfig, parse_int_list
from specdeploy.measure.plans import compare_plan, tune_plan
from specdeploy.report import summary as report


def bench_json(tpot, *, ttft=20.0, itl=None, thr=100.0, counters=None, prefix=None):
    return {
        "median_tpot_ms": tpot,
        "median_ttft_ms": ttft,
        "median_itl_ms": itl if itl is not None else tpot,
        "median_e2el_ms": ttft + 31 * tpot,
        "output_throughput": thr,
        "request_throughput": thr / 32,
        "completed": 8,
        "failed": 0,
    }


def write_run(tmp_path, host, samples, cond):
    d = tmp_path / "raw" / host
    d.mkdir(parents=True)
    for i, (arm, warm, result, counters, prefix) in enumerate(samples):
        result = dict(result)
        result["specdeploy"] = {
            "arm": arm,
            "index": i,
            "warmup": warm,
            "server_counters": counters
            or {
                "drafts": 0,
                "draft_tokens": 0,
                "accepted_tokens": 0,
                "acceptance_rate": None,
                "mean_acceptance_length": None,
            },
            "prefix_cache": prefix or {},
        }
        (d / f"{i:02d}-{arm}.json").write_text(json.dumps(result))
    (d / "conditions.json").write_text(json.dumps({"finished_at": "x", "workload": {}, **cond}))


def counters(drafts, accepted, k=3):
    return {
        "drafts": drafts,
        "draft_tokens": drafts * k,
        "accepted_tokens": accepted,
        "acceptance_rate": accepted / (drafts * k),
        "mean_acceptance_length": 1 + accepted / drafts,
    }


@pytest.fixture
def compare_run(tmp_path):
    # h1: speculation slower (random draft); the warm-up run (99 ms) must not count.
    write_run(
        tmp_path,
        "h1",
        [
            ("speculative", True, bench_json(99.0), counters(10, 0), None),
            ("baseline", False, bench_json(2.0, thr=120), None, None),
            ("speculative", False, bench_json(11.0, thr=100), counters(100, 0), None),
            ("baseline", False, bench_json(2.2, thr=118), None, None),
            ("speculative", False, bench_json(11.5, thr=95), counters(100, 30), None),
            ("baseline", False, bench_json(1.9, thr=121), None, None),
            ("speculative", False, bench_json(10.8, thr=101), counters(100, 0), None),
            ("baseline", False, bench_json(2.1, thr=119), None, None),
            ("speculative", False, bench_json(11.2, thr=99), counters(100, 0), None),
            ("apc-off", False, bench_json(2.0, ttft=50.0), None, {"queries": 100, "hits": 0}),
            ("apc-on", False, bench_json(2.0, ttft=20.0), None, {"queries": 100, "hits": 75}),
        ],
        {"kind": "compare"},
    )
    # h2: speculation faster
    write_run(
        tmp_path,
        "h2",
        [
            ("baseline", False, bench_json(10.0), None, None),
            ("speculative", False, bench_json(5.0), counters(50, 120), None),
            ("baseline", False, bench_json(10.4), None, None),
            ("speculative", False, bench_json(5.2), counters(50, 110), None),
        ],
        {"kind": "compare"},
    )
    return tmp_path


def test_compare_report_numbers_match_raw(compare_run):
    s = report.write(compare_run)
    h1 = s["hosts"]["h1"]
    sp = h1["arms"]["speculative"]["tpot"]
    assert sp["n"] == 4 and sp["median"] == pytest.approx(11.1)
    assert sp["values"] == [11.0, 11.5, 10.8, 11.2]
    assert sp["mad"] == pytest.approx(0.2)  # |dev| = 0.1, 0.4, 0.3, 0.1
    assert h1["arms"]["baseline"]["tpot"]["median"] == pytest.approx(2.05)
    assert h1["arms"]["baseline"]["tpot"]["mad"] == pytest.approx(0.1)
    r = h1["ratios"]["tpot"]
    assert r["ratio"] == pytest.approx(11.1 / 2.05)
    # 4 + 4 runs, every speculative run slower than every baseline run: the exact permutation test's
    # most extreme split, p = 2 / C(8, 4) = 2/70 <= 0.05
    assert r["p_value"] == pytest.approx(2 / 70) and r["verdict"] == "worse"
    assert r["low"] <= r["ratio"] <= r["high"] and r["interval_method"]
    assert h1["ratios"]["output_throughput"]["verdict"] == "worse"
    assert h1["acceptance"]["acceptance_rate"] == pytest.approx(
        30 / 1200
    )  # warm-up counters excluded
    assert h1["acceptance"]["mean_acceptance_length"] == pytest.approx(1 + 30 / 400)
    # 2 + 2 runs cannot reach alpha (smallest p = 2 / C(4, 2) = 1/3), however large the effect
    h2 = s["hosts"]["h2"]["ratios"]["tpot"]
    assert h2["verdict"] == "too few runs to decide at alpha" and h2["ratio"] < 1
    assert h2["min_p_value"] == pytest.approx(1 / 3)
    # APC profile: separate, on over off, hit rate from the prefix-cache counters
    apc = h1["apc_profile"]
    assert apc["ratios_on_over_off"]["ttft"]["ratio"] == pytest.approx(20.0 / 50.0)
    assert apc["prefix_cache_hit_rate_on"] == pytest.approx(0.75)
    # fleet: the median of the per-host ratios (paired within each host), never pooled runs
    f = s["fleet"]
    ratios = [h1["ratios"]["tpot"]["ratio"], s["hosts"]["h2"]["ratios"]["tpot"]["ratio"]]
    assert f["ratios"]["tpot"]["ratio"] == pytest.approx(sum(ratios) / 2)
    assert f["ratios"]["tpot"]["low"] == pytest.approx(min(ratios))
    assert f["ratios"]["tpot"]["verdict"] == "too few hosts to decide at alpha"  # 2 hosts: p >= 0.5
    assert f["arms"]["speculative"]["tpot"]["values"] == [11.0, 11.5, 10.8, 11.2, 5.0, 5.2]
    assert f["acceptance"]["accepted_tokens"] == 30 + 230
    assert set(f["per_host_tpot_ratio"]) == {"h1", "h2"}
    # written files
    on_disk = json.loads((compare_run / "summary.json").read_text())
    assert on_disk["hosts"]["h1"]["ratios"]["tpot"]["ratio"] == pytest.approx(11.1 / 2.05)
    md = (compare_run / "summary.md").read_text()
    assert "ITL ≠ TPOT" in md and "prefix caching was OFF" in md
    assert "| worse |" in md and "| too few runs to decide at alpha |" in md
    for chart in ("latency.png", "ratios.png", "apc.png"):
        assert (compare_run / chart).stat().st_size > 5000
    assert "generated" in on_disk["notes"]["generated_text"]


def test_unfinished_host_is_left_out(compare_run):
    cond = compare_run / "raw" / "h2" / "conditions.json"
    cond.write_text(json.dumps({"kind": "compare"}))  # no finished_at
    assert list(report.compare_summary(compare_run)["hosts"]) == ["h1"]


def test_tune_report_recommends_and_prints_change(tmp_path):
    spec = {"method": "draft_model", "model": "d", "num_speculative_tokens": 3}
    samples = [("k1", True, bench_json(50.0), counters(10, 5, 1), None)]
    # 5 runs per arm: the fewest at which choose_k can decide over 4 k (Holm at 0.05 / 4)
    values = {
        0: [8.0, 8.2, 8.1, 7.9, 8.3],
        1: [6.0, 6.2, 6.1, 6.05, 6.15],
        2: [5.1, 5.3, 5.2, 5.0, 5.25],
        3: [5.0, 5.2, 5.1, 5.3, 5.15],
        4: [5.6, 5.7, 5.8, 5.65, 5.75],
    }
    for r in range(5):
        for k in (0, 1, 2, 3, 4):
            arm, c = ("baseline", None) if k == 0 else (f"k{k}", counters(10, 5, k))
            samples.append((arm, False, bench_json(values[k][r]), c, None))
    write_run(
        tmp_path, "h1", samples, {"kind": "tune", "ks": [1, 2, 3, 4], "speculative_config": spec}
    )
    s = report.write(tmp_path)
    h = s["hosts"]["h1"]
    # k=2 overlaps the best (k=3) run for run: not slower; k=1 and k=4 are; all beat the baseline
    assert h["choice"]["best_k"] == 3 and h["choice"]["recommended_k"] == 2
    assert h["choice"]["speculation"] == "on"
    assert h["choice"]["per_k"]["1"]["median"] == 6.1  # the warm-up (50 ms) is not counted
    assert h["choice"]["per_k"]["1"]["slower_than_best"] is True
    assert "'num_speculative_tokens': 2" in h["host_data_change"]
    assert (tmp_path / "tune_tpot.png").stat().st_size > 5000
    assert "recommended k = 2" in (tmp_path / "summary.md").read_text()


def test_tune_report_leaves_speculation_off_when_no_k_beats_the_baseline(tmp_path):
    spec = {"method": "draft_model", "model": "d", "num_speculative_tokens": 3}
    samples = []
    for r in range(5):
        samples.append(("baseline", False, bench_json(5.0 + r / 100), None, None))
        for k in (1, 2):
            samples.append((f"k{k}", False, bench_json(5.5 + k / 10 + r / 100), None, None))
    write_run(tmp_path, "h1", samples, {"kind": "tune", "ks": [1, 2], "speculative_config": spec})
    h = report.write(tmp_path)["hosts"]["h1"]
    assert h["choice"]["recommended_k"] is None and h["choice"]["speculation"] == "off"
    assert h["host_data_change"] is None


def test_plans_alternate_and_restart_every_sample():
    cfg = ServeConfig(
        vllm_version="0.32.0",
        target_model="t",
        speculative_config={"model": "d", "num_speculative_tokens": 3},
        max_model_len=1024,
    )
    plan = compare_plan(cfg, repeats=3, warmup_runs=1, apc_profile=True, apc_repeats=1)
    labels = [(a.label, w) for a, w in plan]
    assert labels == [  # rounds alternate which arm goes first: B S, S B, B S
        ("speculative", True),
        ("baseline", False),
        ("speculative", False),
        ("speculative", False),
        ("baseline", False),
        ("baseline", False),
        ("speculative", False),
        ("apc-off", False),
        ("apc-on", False),
    ]
    assert not any(a.prefix_caching for a, _ in plan if not a.label.startswith("apc"))
    tplan = tune_plan(cfg, ks=[1, 2, 3], repeats=2, warmup_runs=0)
    # the baseline is an arm of the sweep: is any k worth it at all?
    assert [a.label for a, _ in tplan] == [
        "baseline",
        "k1",
        "k2",
        "k3",
        "k1",
        "k2",
        "k3",
        "baseline",
    ]
    assert tplan[1][0].speculative_config["num_speculative_tokens"] == 1
    assert parse_int_list("1-3,5") == [1, 2, 3, 5] and parse_int_list([2, 4]) == [2, 4]


def test_measure_unit_differs_only_in_the_arm():
    from specdeploy.measure.arms import Arm, measure_unit

    cfg = ServeConfig(
        vllm_version="0.32.0",
        target_model="t",
        speculative_config={"model": "d", "num_speculative_tokens": 3},
        max_model_len=1024,
        kv_cache_memory_bytes=1 << 28,
    )
    spec, base = (
        measure_unit(cfg, Arm("speculative", True)),
        measure_unit(cfg, Arm("baseline", False)),
    )
    i = spec.argv.index("--speculative-config")
    assert spec.argv[:i] + spec.argv[i + 2 :] == base.argv
    assert "--no-enable-prefix-caching" in base.argv
    assert "Conflicts=specdeploy-vllm.service specdeploy-vllm-baseline.service" in spec.text
    assert "[Install]" not in spec.text and spec.name == "specdeploy-vllm-measure.service"
