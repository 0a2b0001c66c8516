"""Per-position acceptance from /metrics and from bench JSON; the smoke summary's refusal to show
figures computed from too little data; the curve in compare/tune reports (acceptance.png)."""

import json

import pytest

from specdeploy.decide.metrics import (
    acceptance,
    per_position_acceptance,
    pooled_per_position_acceptance,
    spec_decode_counters,
)
from specdeploy.report import summary as report
from specdeploy.report.bench_summary import format_summary, not_enough_data, summarize

METRICS = """# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} %(drafts)s
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} %(tokens)s
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} %(accepted)s
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} %(p0)s
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} %(p1)s
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="2"} %(p2)s
"""


def snapshot(drafts, p0, p1, p2):
    return spec_decode_counters(
        METRICS
        % {
            "drafts": drafts,
            "tokens": 3 * drafts,
            "accepted": p0 + p1 + p2,
            "p0": p0,
            "p1": p1,
            "p2": p2,
        }
    )


def test_per_position_from_prometheus_counters():
    before, after = snapshot(10, 8, 5, 2), snapshot(110, 88, 55, 32)
    assert per_position_acceptance(before, after) == pytest.approx([0.8, 0.5, 0.3])
    result = acceptance(before, after)
    assert result["per_position"] == pytest.approx([0.8, 0.5, 0.3])
    # the positions sum to the accepted tokens per draft
    assert sum(result["per_position"]) == pytest.approx(result["mean_acceptance_length"] - 1)


def test_per_position_without_drafts_is_none():
    assert per_position_acceptance(snapshot(5, 1, 1, 1), snapshot(5, 1, 1, 1)) is None
    assert per_position_acceptance({}, {}) is None


def test_pooled_weights_runs_by_drafts():
    runs = [
        {"drafts": 100, "per_position": [0.8, 0.4]},
        {"drafts": 300, "per_position": [0.4, 0.0]},
        {"drafts": 0, "per_position": None},
    ]
    assert pooled_per_position_acceptance(runs) == pytest.approx([0.5, 0.1])
    assert pooled_per_position_acceptance([{"drafts": 0}]) is None


def bench_result(**overrides):
    result = {
        "completed": 24,
        "total_output_tokens": 24 * 96,
        "output_lens": [96] * 24,
        "itls": [[5.0] * 40] * 24,
        "median_ttft_ms": 40.0,
        "p99_ttft_ms": 90.0,
        "median_tpot_ms": 12.5,
        "median_itl_ms": 28.0,
        "median_e2el_ms": 1200.0,
        "spec_decode_acceptance_rate": 52.0,
        "spec_decode_acceptance_length": 2.56,
        "spec_decode_num_drafts": 600,
        "spec_decode_per_position_acceptance_rates": [0.74, 0.52, 0.3],
    }
    return result | overrides


def test_summary_shows_real_figures_and_the_curve():
    text = format_summary("h1", bench_result())
    assert "not enough data" not in text
    assert "12.50" in text and "28.00" in text and "52.0" in text
    assert "pos1 0.74  pos2 0.52  pos3 0.30" in text
    assert summarize(bench_result()).per_position_acceptance == [0.74, 0.52, 0.3]


def test_one_chunk_requests_show_no_tpot_or_itl():
    # the tiny random pair: every request arrived in one streamed chunk, TPOT/ITL 0.00
    result = bench_result(itls=[[]] * 8, completed=8, median_tpot_ms=0.0, median_itl_ms=0.0)
    thin = not_enough_data(result)
    assert "1 streamed chunks per request" in thin["median_tpot_ms"]
    assert "0 gaps between streamed chunks" in thin["median_itl_ms"]
    assert "8 requests" in thin["p99_ttft_ms"]
    text = format_summary("h1", result)
    assert "0.00" not in text
    assert text.count("not enough data") == 3


def test_few_drafts_or_tokens_are_refused():
    thin = not_enough_data(bench_result(spec_decode_num_drafts=5, output_lens=[4] * 24))
    assert thin["spec_decode_acceptance_rate"] == "5 drafts verified; needs >= 32"
    assert "spec_decode_per_position_acceptance_rates" in thin
    assert thin["median_tpot_ms"].startswith("4 output tokens per request")
    assert not_enough_data(bench_result(completed=0))["median_ttft_ms"] == "no request completed"


def test_baseline_has_no_acceptance_figures_but_no_complaint():
    result = bench_result()
    for key in list(result):
        if key.startswith("spec_decode"):
            del result[key]
    assert "spec_decode_acceptance_rate" not in not_enough_data(result)
    line = [ln for ln in format_summary("h", result).splitlines() if "by draft position" in ln]
    assert line[0].split()[-1] == "-"


def test_reports_carry_the_curve_and_chart(tmp_path):
    raw = tmp_path / "raw" / "h1"
    raw.mkdir(parents=True)
    for i, (arm, per_position) in enumerate(
        [("baseline", None), ("speculative", [0.8, 0.5, 0.2]), ("baseline", None)]
        + [("speculative", [0.6, 0.3, 0.2])]
    ):
        counters = {"drafts": 100, "draft_tokens": 300, "accepted_tokens": 100}
        counters["per_position"] = per_position
        result = {"median_tpot_ms": 10.0, "completed": 8, "specdeploy": {}}
        result["specdeploy"] = {
            "arm": arm,
            "index": i,
            "warmup": False,
            "server_counters": counters if per_position else {},
        }
        (raw / f"{i:02d}-{arm}.json").write_text(json.dumps(result))
    request_set = {
        "control_path": "/srv/reqs.jsonl",
        "dataset": "custom",
        "rows": 40,
        "distinct_prompts": 40,
        "sha256": "ab" * 32,
        "per_request_output_tokens": True,
    }
    (raw / "conditions.json").write_text(
        json.dumps(
            {"finished_at": "x", "workload": {}, "kind": "compare", "request_set": request_set}
        )
    )
    s = report.write(tmp_path)
    assert s["hosts"]["h1"]["acceptance"]["per_position"] == pytest.approx([0.7, 0.4, 0.2])
    md = (tmp_path / "summary.md").read_text()
    assert "pos1 0.70  pos2 0.40  pos3 0.20" in md
    assert f"sha256 `{'ab' * 32}`" in md and "40 rows" in md
    assert "acceptance.png" in s["charts"]
    assert (tmp_path / "acceptance.png").stat().st_size > 5000
