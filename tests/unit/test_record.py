"""The typed deployment record reads what earlier releases wrote, and writes the same bytes back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specdeploy.record import DeploymentRecord, RecordError, read_record

# Written on a sandbox host by deploys/serve.py at commit a83c70e, before the record was typed.
OLD = Path(__file__).parent / "data" / "deployment-record-a83c70e.json"


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
