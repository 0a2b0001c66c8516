"""What each vLLM release changes for draft_model: draft TP refused or ignored, pointless flags
warned."""

import pytest

from specdeploy import capabilities
from specdeploy.checks import check_host, check_warnings


def spec(valid_data, **more):
    return {**valid_data, "speculative_config": {**valid_data["speculative_config"], **more}}


def fields(problems):
    return {p.field: p for p in problems}


def test_runtime_per_release():
    old = capabilities.draft_model_runtime("0.26.0")
    assert (old.async_scheduling_default, old.model_runner, old.draft_tp) == (False, "v1", "equal")
    assert old.exact
    mid = capabilities.draft_model_runtime("0.28.1")  # a patch release borrows its minor's table
    assert (mid.release, mid.exact, mid.async_scheduling_default) == ("0.28.0", False, True)
    with pytest.raises(capabilities.UnknownRelease, match="0.29.0 has no table"):
        capabilities.draft_model_runtime("0.29.0")
    new = capabilities.draft_model_runtime("0.32.0")
    assert (new.model_runner, new.draft_tp) == ("v2", "ignored")
    fallback = capabilities.draft_model_runtime("0.32.0", heterogeneous_vocab=True)
    assert (fallback.model_runner, fallback.draft_tp) == ("v1", "equal")


def test_cuda_build_per_release():
    assert capabilities.cuda_build("0.26.0") == "13.0"
    assert capabilities.cuda_build("0.33.0") == "13.0"  # its own table
    assert capabilities.cuda_build("0.99.0") is None  # no table: check refuses the pin
    assert capabilities.cuda_build("0.20.0") is None
    assert capabilities.driver_problem("0.32.0", "580.159.04", "13.0") is None
    assert "needs driver >= 580.65.06" in capabilities.driver_problem("0.32.0", "575.57.08", "12.9")


def test_draft_tp_other_than_target_refused_on_the_v1_runner(valid_data):
    data = spec(valid_data, draft_tensor_parallel_size=1)
    data |= {"vllm_version": "0.26.0", "vllm_extra_args": ["--tensor-parallel-size", "2"]}
    p = fields(check_host("gpu-1", data))["speculative_config.draft_tensor_parallel_size"]
    assert "differs from the target's tensor parallel size 2" in p.what and "raises" in p.what
    assert p.todo.startswith("remove it")
    data["speculative_config"]["draft_tensor_parallel_size"] = 2
    assert check_host("gpu-1", data) == []


def test_draft_tp_ignored_on_the_v2_runner_is_a_warning(valid_data):
    data = spec(valid_data, draft_tensor_parallel_size=1)
    data["vllm_extra_args"] = ["--tensor-parallel-size", "2"]
    assert check_host("gpu-1", data) == []  # 0.32.0: not refused
    w = fields(check_warnings("gpu-1", data))["speculative_config.draft_tensor_parallel_size"]
    assert "is ignored by vLLM 0.32.0" in w.what and "tensor parallel size 2, not 1" in w.what


def test_async_scheduling_flag_pointless_where_it_is_the_default(valid_data):
    data = {**valid_data, "vllm_extra_args": ["--async-scheduling"]}
    (w,) = check_warnings("gpu-1", data)
    assert w.what == "--async-scheduling is already the default for draft_model in vLLM 0.32.0"
    assert check_warnings("gpu-1", {**data, "vllm_version": "0.26.0"}) == []


def test_no_async_scheduling_pointless_on_026(valid_data):
    data = {**valid_data, "vllm_version": "0.26.0", "vllm_extra_args": ["--no-async-scheduling"]}
    (w,) = check_warnings("gpu-1", data)
    assert "already runs draft_model without async scheduling" in w.what


def test_draft_enforce_eager_pointless_on_v2(valid_data):
    (w,) = check_warnings("gpu-1", spec(valid_data, enforce_eager=True))
    assert w.field == "speculative_config.enforce_eager" and "without CUDA graphs" in w.what


def test_no_warnings_for_the_documented_example(valid_data):
    assert check_warnings("gpu-1", valid_data) == []
