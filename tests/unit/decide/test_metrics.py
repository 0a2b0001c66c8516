from specdeploy.decide.metrics import acceptance, spec_decode_counters

METRICS = """# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="tiny"} 31.0
# HELP vllm:spec_decode_num_drafts_created Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_created gauge
vllm:spec_decode_num_drafts_created{engine="0",model_name="tiny"} 1.7e9
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="tiny"} 93.0
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="tiny"} 62.0
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="tiny",position="0"} 30.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="tiny",position="1"} 20.0
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="tiny"} 0.0
"""


def test_counters_parsed_by_prometheus_client():
    counters = spec_decode_counters(METRICS)
    assert counters == {
        "num_drafts": 31.0,
        "num_draft_tokens": 93.0,
        "num_accepted_tokens": 62.0,
        "num_accepted_tokens_per_pos[0]": 30.0,
        "num_accepted_tokens_per_pos[1]": 20.0,
    }


def test_acceptance_between_snapshots():
    before = {"num_drafts": 10, "num_draft_tokens": 30, "num_accepted_tokens": 15}
    after = {"num_drafts": 30, "num_draft_tokens": 90, "num_accepted_tokens": 55}
    result = acceptance(before, after)
    assert result["acceptance_rate"] == 40 / 60
    assert result["mean_acceptance_length"] == 1 + 40 / 20


def test_no_drafts_means_no_rates():
    assert acceptance({}, {})["acceptance_rate"] is None
