"""A deployed speculation schedule stands on the proof of exactly its fingerprint
(steps/schedule_proof.py), handed to the record by the step that found it: a proof made with
another release, draft or workload is no proof; an unproven schedule is refused unless host data
sets allow_unproven_schedule, and then recorded as unproven; status and the alerts say so. On main
each of these read as proven (or `schedule_proof: None`) and status called the host data's load
levels the proven range."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import pytest
import yaml
from pyinfra.context import ctx_host

from specdeploy.config.problems import HostRefused
from specdeploy.decide.load_rule import SCHEDULE_KEY, batch_outside_proven, proof_range
from specdeploy.host.facts.nvidia import Accelerators
from specdeploy.host.facts.system import CpuInfo, MemoryBytes
from specdeploy.render.units import render_unit
from specdeploy.report.load_summary import proof_fingerprint
from specdeploy.steps import record, schedule_proof
from tests.facts import fixture
from tests.unit.report.test_load_report import CANDIDATE, cfg_with, deployed, proof_run


class Host:
    """The host being planned: one H200 (its recorded facts), named as the proof's host."""

    name = "gpu-1"
    print_prefix = "[gpu-1] "

    def __init__(self):
        self.asked = []

    def get_fact(self, cls, **kwargs):
        self.asked.append(cls)
        case = {Accelerators: ("Accelerators", "h200_one"), MemoryBytes: ("MemoryBytes", "meminfo"),
                CpuInfo: ("CpuInfo", "xeon_4")}[cls]  # fmt: skip
        return cls().process(fixture(*case)["output"])


@pytest.fixture
def planning(tmp_path, monkeypatch):
    """Reports under tmp_path, this host in context; returns it."""
    monkeypatch.setenv("SPECDEPLOY_REPORTS", str(tmp_path))
    host = Host()
    with ctx_host.use(host):
        yield host


def here(cfg) -> dict:
    """The fingerprint of `cfg` on this host, as a proof run on it would carry it."""
    return proof_fingerprint(cfg, schedule_proof.host_hardware(cfg))


def test_a_proof_of_exactly_this_fingerprint_is_found_and_recorded_as_proven(planning, tmp_path):
    measured = schedule_proof.measured_fingerprint(
        cfg_with(), [list(e) for e in CANDIDATE], candidate=True
    )  # what flows/measure.py puts in a candidate's proof conditions
    assert measured == here(deployed())
    deployed_schedule = deployed().speculative_config[SCHEDULE_KEY]  # a proof of the deployed one
    assert schedule_proof.measured_fingerprint(deployed(), deployed_schedule, False) == measured
    assert schedule_proof.measured_fingerprint(cfg_with(), None, False) is None  # no schedule
    proof_run(tmp_path, cfg_with(), measured)
    evidence = schedule_proof.schedule_evidence(deployed(), "speculative")
    assert evidence["proven"] is True and evidence["run"] == "proof-run"
    assert evidence["allowed_unproven"] is False and proof_range(evidence) == (1, 4)
    written = build(deployed(), evidence)
    assert written.schedule_proof["proven"] is True
    assert written.schedule_proof["key"] == evidence["key"]


@pytest.mark.parametrize(
    "deploy",
    [
        {"vllm_version": "0.33.0"},  # another release
        {"target_revision": "c" * 40},  # the target at another commit
        {"speculative_config": {**cfg_with().speculative_config, "revision": "b" * 40}},  # draft
        {"workload": {**cfg_with().workload.model_dump(), "load_levels": [1, 2, 8]}},
    ],
)
def test_a_proof_made_with_anything_else_is_no_proof_and_the_deploy_is_refused(
    planning, tmp_path, deploy
):
    """The proof of the same schedule on the same host, made with another release, draft,
    target or workload: refused before anything changes, naming the field and the fix."""
    proof_run(tmp_path, cfg_with(), here(deployed()))
    with pytest.raises(HostRefused) as refused:
        schedule_proof.schedule_evidence(deployed(**deploy), "speculative")
    said = str(refused.value)
    assert said.startswith(f"gpu-1: speculative_config.{SCHEDULE_KEY}: the schedule is unproven")
    assert "deploys/compare.py" in said and "allow_unproven_schedule = true" in said


def test_an_unproven_schedule_allowed_is_recorded_as_unproven(planning):
    cfg = deployed(allow_unproven_schedule=True)
    evidence = schedule_proof.schedule_evidence(cfg, "speculative")
    assert evidence["proven"] is False and evidence["allowed_unproven"] is True
    assert "no proof of it" in evidence["why"]
    written = build(cfg, evidence).schedule_proof
    assert written["proven"] is False and written["allowed_unproven"] is True
    assert proof_range(written) is None  # no batch size proven


def test_no_schedule_no_evidence_and_no_fact_read(planning):
    assert schedule_proof.schedule_evidence(cfg_with(), "speculative") is None
    assert schedule_proof.schedule_evidence(deployed(), "baseline") is None
    assert planning.asked == []


def build(cfg, evidence):
    """steps/record.build_record for a verified deploy of `cfg` with `evidence`."""
    preflight = SimpleNamespace(vocab=None, memory=None)
    return record.build_record(
        cfg, render_unit(cfg), vllm_version="0.32.0", snapshots={}, preflight=preflight,
        health=None, smoke=None, started=time.time(), schedule_proof=evidence,
    )  # fmt: skip


def test_the_record_takes_the_evidence_it_is_handed_and_looks_nothing_up(
    planning, tmp_path, monkeypatch
):
    """A proof of this very schedule lies in the reports (newest, matching): build_record still
    records only what the step handed it; without a schedule, no schedule_proof key at all."""
    proof_run(tmp_path, cfg_with(), here(deployed()))
    monkeypatch.chdir(tmp_path)
    assert build(deployed(), None).schedule_proof is None
    assert "schedule_proof" not in json.loads(build(cfg_with(), None).to_json())


def test_status_says_proven_or_unproven_and_checks_the_batch_against_the_proof_alone(
    planning, tmp_path
):
    from specdeploy.observe.status import _record_summary

    proof_run(tmp_path, cfg_with(), here(deployed()))
    proven = build(deployed(), schedule_proof.schedule_evidence(deployed(), "speculative"))
    allowed_cfg = deployed(allow_unproven_schedule=True, vllm_version="0.33.0")
    allowed = build(allowed_cfg, schedule_proof.schedule_evidence(allowed_cfg, "speculative"))
    assert _record_summary(proven).schedule == (
        "schedule proven at batch sizes 1-4 (run proof-run on gpu-1)"
    )
    said = _record_summary(allowed).schedule
    assert said.startswith("schedule unproven (deployed under allow_unproven_schedule")
    # a record written before fingerprints: its proof matched on host and schedule alone
    old = build(deployed(), {"run": "r", "proven": True, "levels": {"1": {}, "4": {}}})
    assert "unproven (its proof was matched on the host and the schedule alone" in (
        _record_summary(old).schedule
    )
    assert _record_summary(build(cfg_with(), None)).schedule is None  # no schedule
    # the batch is checked against a proof's range only: none for the unproven ones
    assert batch_outside_proven(proof_range(proven.schedule_proof), 6.0).startswith(
        "running batch 6 is outside the schedule's proven range 1-4"
    )
    assert proof_range(allowed.schedule_proof) is None and proof_range(old.schedule_proof) is None


def test_render_writes_a_proven_range_only_from_a_kept_proof(planning, tmp_path):
    """`specdeploy render`: a scheduled host whose proof is kept gets its proof's top level; one
    without (here: another release) is recorded as unproven, with no range at all; a host without
    a schedule keeps max_num_seqs."""
    from specdeploy.observe.monitoring import write_prometheus

    proof_run(tmp_path, cfg_with(), here(deployed()))
    hosts = [
        ("gpu-1", [], {}, deployed(vllm_host="0.0.0.0")),
        ("gpu-2", [], {}, deployed(vllm_host="0.0.0.0", vllm_version="0.33.0")),
        ("plain", [], {}, cfg_with(vllm_host="0.0.0.0")),
    ]
    write_prometheus(tmp_path / "prom", hosts, reports=tmp_path, warn=print)
    groups = yaml.safe_load((tmp_path / "prom" / "baselines.yml").read_text())["groups"]
    rules = {(r["record"], r["labels"]["host"]): r["expr"] for r in groups[1]["rules"]}
    assert rules == {
        ("specdeploy:proven_batch_size_max", "gpu-1"): "vector(4)",
        (
            "specdeploy:proven_batch_size_max",
            "plain",
        ): f"vector({cfg_with().effective_max_num_seqs})",
        ("specdeploy:schedule_unproven", "gpu-1"): "vector(0)",
        ("specdeploy:schedule_unproven", "gpu-2"): "vector(1)",
        ("specdeploy:schedule_unproven", "plain"): "vector(0)",
    }


@pytest.mark.needs_tool("promtool")
def test_the_unproven_alert_fires_for_a_serving_unproven_schedule_alone(tmp_path):
    from tests.unit.observe.test_monitoring import fired, promtool_test

    def running(host, values):
        labels = f'job="specdeploy-vllm",instance="{host}:8000",host="{host}",engine="0"'
        return {"series": f"vllm:num_requests_running{{{labels}}}", "values": values}

    inputs = [
        running("unproven", "2x30"),
        running("idle", "0x30"),
        running("proven", "2x30"),
        {"series": 'specdeploy:schedule_unproven{host="unproven"}', "values": "1x30"},
        {"series": 'specdeploy:schedule_unproven{host="idle"}', "values": "1x30"},
        {"series": 'specdeploy:proven_batch_size_max{host="proven"}', "values": "4x30"},
        {"series": 'specdeploy:schedule_unproven{host="proven"}', "values": "0x30"},
    ]
    alert = "SpeculationScheduleUnproven"
    notes = {
        "summary": "unproven: serving with an unproven speculation schedule",
        "description": "Its num_speculative_tokens_per_batch_size schedule has no proof with this "
        "release, models, workload and request set on the control node (deployed under "
        "allow_unproven_schedule): no batch size is proven, and speculation can lose. Prove it "
        "with deploys/compare.py (compare_across_load).",
    }
    promtool_test(
        tmp_path,
        inputs,
        [
            fired(alert, "5m"),
            fired(alert, "20m", ({"host": "unproven", "severity": "warning"}, notes)),
        ],
    )
