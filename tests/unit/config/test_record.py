"""The typed deployment record reads what earlier releases wrote, and writes the same bytes back."""

from __future__ import annotations

import json

import pytest

from specdeploy.config.record import DeploymentRecord, RecordError, bench_result, read_record
from specdeploy.decide.metrics import acceptance
from specdeploy.report.bench_summary import summarize
from tests.unit import DATA

# Written on a sandbox host by deploys/serve.py at commit a83c70e, before the record was typed.
OLD = DATA / "deployment-record-a83c70e.json"


def test_a_record_written_before_the_typed_model_reads_and_round_trips():
    text = OLD.read_text()
    record = read_record(text, where="fixture")
    assert isinstance(record, DeploymentRecord)
    assert record.schema_version == 1
    assert record.unit.name == "specdeploy-vllm.service" and len(record.unit.sha256) == 64
    assert (
        record.role == "speculative"
        and record.k == json.loads(text)["speculative_config"]["num_speculative_tokens"]
    )
    assert record.workload.dataset == "random" and record.workload.request_set is None
    assert record.to_json() == text  # same keys, same order, same values: nothing lost or added


def test_the_fact_form_and_no_record():
    data = json.loads(OLD.read_text())
    assert read_record(data).host == data["host"]
    assert read_record(None) is None and read_record("  \n") is None


def test_unreadable_records_name_where_they_came_from():
    with pytest.raises(RecordError, match="h1: /var/lib/x.json is not a deployment record"):
        read_record('{"host": "h1"}', where="h1: /var/lib/x.json")
    with pytest.raises(RecordError, match="h1: r"):
        read_record("{not json", where="h1: r")


def test_unknown_keys_of_a_newer_writer_are_kept():
    data = json.loads(OLD.read_text()) | {"future_key": {"x": 1}}
    assert json.loads(read_record(data).to_json())["future_key"] == {"x": 1}


def test_a_new_record_keeps_the_workload_sampling():
    data = json.loads(OLD.read_text())
    data["workload"] |= {"temperature": 0.7, "top_p": 0.9}
    record = read_record(json.dumps(data))
    assert record.workload.temperature == 0.7 and record.workload.top_p == 0.9
    assert json.loads(record.to_json())["workload"]["top_p"] == 0.9


# One `vllm bench serve` result as bench.PendingBench leaves it: vLLM's JSON (keys specdeploy
# does not read included) and specdeploy's part.
BENCH = {
    "date": "20261201-120000",
    "request_rate": "inf",
    "completed": 24,
    "failed": 0,
    "median_tpot_ms": 6.5,
    "median_itl_ms": 14.25,
    "median_ttft_ms": 30.0,
    "spec_decode_acceptance_rate": 53.6,
    "spec_decode_num_drafts": 400,
    "itls": [[5.0, 5.0]] * 24,
    "output_lens": [64] * 24,
    "specdeploy": {
        "host": "h1",
        "server_counters": acceptance(
            {"num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0},
            {"num_drafts": 400.0, "num_draft_tokens": 1200.0, "num_accepted_tokens": 643.0},
        ),
        "prefix_cache": {"queries": 0.0, "hits": 0.0, "hit_rate": None},
        "bench_seconds": 12.5,
        "command": ["vllm", "bench", "serve"],
        "finished_at": "2026-12-01T12:00:00Z",
    },
}


def test_a_bench_result_keeps_vllms_json_and_reads_typed():
    result = bench_result(json.loads(json.dumps(BENCH)))
    assert result.median_tpot_ms == 6.5 and result.run.host == "h1"
    assert result.counters.drafts == 400 and result.counters.accepted_tokens == 643
    assert result.figure("date") == "20261201-120000"  # a key of vLLM's that nothing types
    assert result.run.warmup is False and result.run.arm is None  # a smoke run: no arm
    assert json.loads(result.to_json()) == BENCH
    assert list(json.loads(result.to_json()))[-1] == "specdeploy"


def test_a_record_with_a_smoke_result_round_trips():
    result = bench_result(BENCH)
    # as steps/record.py builds it
    data = json.loads(OLD.read_text()) | {
        "smoke": summarize(result),
        "smoke_counters": result.run.server_counters,
    }
    record = DeploymentRecord.model_validate(data)
    text = record.to_json()
    again = read_record(text)
    assert again == record and again.to_json() == text
    assert again.smoke.median_tpot_ms == 6.5 and again.smoke.spec_decode_acceptance_rate == 53.6
    assert again.smoke_counters.drafts == 400
    assert json.loads(text)["smoke"] == summarize(result).model_dump()
    assert "p99_ttft_ms" not in json.loads(text)["smoke"]["not_enough_data"]  # 24 >= 20
