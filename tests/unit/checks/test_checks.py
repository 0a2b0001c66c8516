"""Every validation rule: which field is named, what is said, and what to do."""

import pytest

from specdeploy.checks.host_data import ConfigError, check_config, check_host


def problems(data, host="gpu-1"):
    return {p.field: p for p in check_host(host, data)}


def only(data, field):
    found = problems(data)
    assert field in found, f"{field} not reported; got {list(found)}"
    return found[field]


def test_valid_data_has_no_problem(valid_data):
    assert check_host("gpu-1", valid_data) == []
    assert check_config("gpu-1", valid_data).speculative_config["num_speculative_tokens"] == 5


def test_problem_text_names_host_field_what_and_todo(valid_data):
    del valid_data["speculative_config"]["method"]
    (problem,) = check_host("gpu-7", valid_data)
    assert str(problem).startswith(
        "gpu-7: speculative_config.method: missing — set method explicitly"
    )


def test_unknown_method_suggests_the_close_one(valid_data):
    valid_data["speculative_config"]["method"] = "draft_modle"
    p = only(valid_data, "speculative_config.method")
    assert "'draft_modle' is not a method of vLLM 0.32.0" in p.what
    assert p.todo == "did you mean 'draft_model'?"


def test_unknown_method_without_close_match_lists_methods(valid_data):
    valid_data["speculative_config"]["method"] = "zzz"
    assert "ngram" in only(valid_data, "speculative_config.method").todo


@pytest.mark.parametrize("tokens", [None, 0, -2, 1.5, "5", True])
def test_num_speculative_tokens_missing_or_below_one(valid_data, tokens):
    if tokens is None:
        del valid_data["speculative_config"]["num_speculative_tokens"]
    else:
        valid_data["speculative_config"]["num_speculative_tokens"] = tokens
    p = only(valid_data, "speculative_config.num_speculative_tokens")
    assert p.what == ("missing" if tokens is None else f"{tokens!r} is not an integer >= 1")


def test_typo_key_checked_against_pinned_version(valid_data):
    valid_data["speculative_config"]["num_speculative_token"] = 3
    p = only(valid_data, "speculative_config.num_speculative_token")
    assert p.what == "unknown key for vLLM 0.32.0"
    assert p.todo == "did you mean 'num_speculative_tokens'?"


@pytest.mark.parametrize(
    "key, value, field, meant, section",
    [
        ("workload", {"promt_len": 512}, "workload.promt_len", "prompt_len", "workload"),
        ("workload", {"load_levels": [{"concurency": 4}]}, "workload.load_levels[0].concurency",
         "concurrency", "workload.load_levels"),
        ("speculation_gate", {"on_fial": "fail"}, "speculation_gate.on_fial", "on_fail",
         "speculation_gate"),
        ("instances", [{"gpu": [0], "port": 8001}], "instances[0].gpu", "gpus", "instances"),
    ],
)  # fmt: skip
def test_a_typo_in_a_nested_key_gets_did_you_mean(valid_data, key, value, field, meant, section):
    p = only({**valid_data, key: value}, field)
    assert p.what.startswith(f"not a key of {field.rsplit('.', 1)[0]}"), p.what
    assert p.todo == f"did you mean {meant!r}?"
    assert p.reference.endswith(f"#{section}")  # where the keys it can be are listed


def test_a_nested_key_nothing_is_close_to_lists_the_keys(valid_data):
    p = only({**valid_data, "workload": {"colour": "blue"}}, "workload.colour")
    assert p.todo.startswith("use one of: prompt_len, output_len, request_rate, ")


def test_key_vllm_rejects_inside_json(valid_data):
    valid_data["speculative_config"]["tensor_parallel_size"] = 2
    p = only(valid_data, "speculative_config.tensor_parallel_size")
    assert "vLLM refuses this key inside the JSON" in p.what
    assert "draft_tensor_parallel_size" in p.todo


def test_derived_key_rejected(valid_data):
    valid_data["speculative_config"]["target_model_config"] = {}
    assert "refuses" in only(valid_data, "speculative_config.target_model_config").what


def test_both_memory_mechanisms_refused_and_explained(valid_data):
    valid_data["kv_cache_memory_bytes"] = 4 << 30
    p = only(valid_data, "gpu_memory_utilization/kv_cache_memory_bytes")
    assert "kv_cache_memory_bytes win" in p.what and "ignores gpu_memory_utilization" in p.what
    assert p.todo.startswith("keep exactly one")


@pytest.mark.parametrize("value", [0, -0.1, 1.01, 2])
def test_utilisation_outside_range(valid_data, value):
    valid_data["gpu_memory_utilization"] = value
    assert only(valid_data, "gpu_memory_utilization").what == f"{float(value)} is outside (0, 1]"


def test_utilisation_one_is_allowed(valid_data):
    valid_data["gpu_memory_utilization"] = 1
    assert check_host("h", valid_data) == []


def test_max_model_len_below_prompt_plus_output(valid_data):
    valid_data["max_model_len"] = 500
    p = only(valid_data, "max_model_len")
    assert p.what == "500 is smaller than workload prompt_len + output_len = 512"
    assert "max_model_len >= 512" in p.todo


@pytest.mark.parametrize(
    "field,value",
    [
        ("request_rate", 0),
        ("request_rate", -1.0),
        ("request_rate", float("inf")),
        ("max_concurrency", 0),
        ("num_prompts", -5),
        ("prompt_len", 0),
        ("output_len", 0),
    ],
)
def test_non_positive_workload_numbers(valid_data, field, value):
    valid_data["workload"][field] = value
    p = only(valid_data, f"workload.{field}")
    assert repr(value) in p.what
    assert p.todo


@pytest.mark.parametrize("version", [">=0.30", "0.32", "~=0.32.0", "latest", "0.32.*", 32])
def test_version_must_be_exact_pin(valid_data, version):
    valid_data["vllm_version"] = version
    p = only(valid_data, "vllm_version")
    assert p.what == f"{version!r} is not an exact version pin"


def test_version_required(valid_data):
    del valid_data["vllm_version"]
    assert only(valid_data, "vllm_version").what == "missing"


def test_heterogeneous_vocab_needs_recent_vllm(valid_data):
    # 0.24.1 predates use_heterogeneous_vocab and has no release table: refused by name first.
    valid_data["vllm_version"] = "0.24.1"
    valid_data["speculative_config"]["use_heterogeneous_vocab"] = True
    assert "vLLM 0.24.1 has no release table" in only(valid_data, "vllm_version").what


def test_heterogeneous_vocab_needs_draft_model_method(valid_data):
    valid_data["speculative_config"].update(method="ngram", use_heterogeneous_vocab=True)
    p = only(valid_data, "speculative_config.use_heterogeneous_vocab")
    assert p.what == "only works with method \"draft_model\", not 'ngram'"


def test_heterogeneous_vocab_needs_greedy_drafting(valid_data):
    valid_data["speculative_config"].update(
        use_heterogeneous_vocab=True, draft_sample_method="probabilistic"
    )
    p = only(valid_data, "speculative_config.use_heterogeneous_vocab")
    assert "only supports greedy drafting" in p.what


def test_heterogeneous_vocab_allowed_when_recorded(valid_data):
    valid_data["speculative_config"]["use_heterogeneous_vocab"] = True
    assert check_host("h", valid_data) == []


@pytest.mark.parametrize(
    "args,flag,json_hint",
    [
        (
            ["--speculative-model", "Qwen/Qwen3-0.6B"],
            "--speculative-model",
            '{"model": "Qwen/Qwen3-0.6B"}',
        ),
        (
            ["--num-speculative-tokens=4"],
            "--num-speculative-tokens",
            '{"num_speculative_tokens": 4}',
        ),
        (["--spec-tokens", "3"], "--spec-tokens", '{"num_speculative_tokens": 3}'),
        (["--spec-method", "ngram"], "--spec-method", '{"method": "ngram"}'),
        (
            ["--speculative-draft-tensor-parallel-size", "1"],
            "--speculative-draft-tensor-parallel-size",
            '{"draft_tensor_parallel_size": 1}',
        ),
    ],
)
def test_deprecated_flags_in_extra_args_show_json_form(valid_data, args, flag, json_hint):
    valid_data["vllm_extra_args"] = ["--dtype", "bfloat16"] + args
    p = only(valid_data, "vllm_extra_args[2]")
    assert p.what.startswith(flag)
    assert json_hint in p.todo


@pytest.mark.parametrize(
    "flag,field",
    [
        ("--gpu-memory-utilization", "gpu_memory_utilization"),
        ("--max-model-len", "max_model_len"),
        ("--speculative-config", "speculative_config"),
        ("--port", "vllm_port"),
        ("--api-key", "vllm_api_key"),
    ],
)
def test_managed_flags_in_extra_args(valid_data, flag, field):
    valid_data["vllm_extra_args"] = [flag, "1"]
    p = only(valid_data, "vllm_extra_args[0]")
    assert p.what == f"{flag} is managed by specdeploy"
    assert p.todo == f"set host data {field} instead"


def test_draft_must_not_be_the_target(valid_data):
    valid_data["speculative_config"]["model"] = valid_data["target_model"]
    assert only(valid_data, "speculative_config.model").what == "is the target model itself"


def test_check_config_raises_with_every_problem(valid_data):
    valid_data["gpu_memory_utilization"] = 3
    valid_data["speculative_config"]["num_speculative_tokens"] = 0
    with pytest.raises(ConfigError) as error:
        check_config("gpu-1", valid_data)
    assert len(error.value.problems) == 2
    assert "gpu-1: gpu_memory_utilization" in str(error.value)


def test_moving_refs_are_named_by_check_not_refused(valid_data):
    from specdeploy.checks.host_data import moving_ref_notes

    assert check_host("gpu-1", valid_data) == []
    warned = {w.field: w for w in moving_ref_notes("gpu-1", valid_data)}
    assert "moving ref" in warned["target_revision"].what
    assert "speculative_config.revision" in warned  # the draft's revision defaults to "main"
    valid_data["target_revision"] = "0" * 40
    valid_data["speculative_config"]["revision"] = "1" * 40
    assert moving_ref_notes("gpu-1", valid_data) == []


def test_names_that_reach_shell_and_units_are_validated(valid_data):
    bad = {
        "state_dir": "/var/lib/spec deploy",
        "install_dir": "opt/relative",
        "service_user": "vllm;rm",
        "service_name": "a b",
        "vllm_env": {"BAD NAME": "1"},
        "vllm_host": "127.0.0.1; curl x",
    }
    for field, value in bad.items():
        found = problems({**valid_data, field: value})
        assert field in found, (field, found)
        assert found[field].todo != "fix the value in group_data or host data"  # a specific hint


def test_secret_values_are_never_printed(valid_data):
    found = problems({**valid_data, "vllm_api_key": 'sk-"quoted"'})
    assert "vllm_api_key" in found and "sk-" not in str(found["vllm_api_key"])


# --- top-level keys ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "meant"),
    [
        ("gpu_memory_utilisation", "gpu_memory_utilization"),
        ("max_num_seq", "max_num_seqs"),
        ("max_model_length", "max_model_len"),
        ("speculative_configs", "speculative_config"),
    ],
)
def test_misspelt_schema_key_refused_with_did_you_mean(valid_data, key, meant):
    p = only({**valid_data, key: 1}, key)
    assert p.what == "not a specdeploy key (the deploy would ignore it)"
    assert p.todo == f"did you mean {meant!r}?"


def test_vllm_flag_written_as_host_data_is_refused(valid_data):
    found = problems({**valid_data, "tensor_parallel_size": 2, "dtyp": "float32", "model": "x"})
    tp = found["tensor_parallel_size"]
    assert (
        tp.what == "is vLLM's --tensor-parallel-size written as host data, which the deploy ignores"
    )
    assert tp.todo == "pass it to vLLM in vllm_extra_args: ['--tensor-parallel-size', VALUE]"
    assert found["dtyp"].what.startswith("looks like vLLM's --dtype")
    assert found["dtyp"].todo.startswith("did you mean vLLM's --dtype?")
    assert found["model"].todo == "set host data target_model instead"  # a managed flag


def test_keys_that_match_nothing_stay_allowed(valid_data):
    from specdeploy.checks.host_data import unknown_keys

    data = {**valid_data, "_sudo": True, "ssh_user": "deploy", "ssh_port": 22, "team": "infra"}
    data |= {"_sudo_password": "x", "owner_email": "a@b.c"}
    assert check_host("gpu-1", data) == []
    assert [p.field for p in unknown_keys("gpu-1", data)] == ["team", "owner_email"]


# Numbers of host data that may be negative, and why; every other size, count, duration, rate or
# share must be refused below its floor (pydantic's Field(ge=/gt=), or a check's own rule).
MAY_BE_NEGATIVE = {"workload.seed": "a random seed: any integer"}


def numeric_keys():
    """(key, host data setting it to -1) for every int or float key, nested objects' too."""
    from specdeploy.config import schema
    from specdeploy.config.problems import nested_model
    from specdeploy.docs.reference import field_type

    for name in schema.FIELDS:
        field = schema.ServeConfig.model_fields[name]
        model = nested_model(field)
        if model is not None and field_type(field).startswith("object"):  # workload, gate
            for sub, sub_field in model.model_fields.items():
                if field_type(sub_field).split(" ")[0] in ("int", "float"):
                    yield f"{name}.{sub}", {name: {sub: -1}}
        elif field_type(field).split(" ")[0] in ("int", "float"):
            yield name, {name: -1}


def test_every_number_is_refused_below_its_floor(valid_data):
    keys = dict(numeric_keys())
    assert {"min_free_disk_gb", "health_timeout_s", "workload.prompt_len",
            "speculation_gate.band", "gpu_memory_utilization"} <= set(keys)  # fmt: skip
    accepted = []
    for key, data in keys.items():
        if key in MAY_BE_NEGATIVE:
            continue
        merged = {**valid_data, **data}
        found = [p for p in check_host("gpu-1", merged) if p.field.startswith(key)]
        if not found:
            accepted.append(key)
    assert accepted == [], f"negative values accepted: {accepted}"


def test_a_negative_size_names_host_field_and_floor(valid_data):
    p = only({**valid_data, "min_free_disk_gb": -5}, "min_free_disk_gb")
    assert str(p).startswith("gpu-1: min_free_disk_gb: Input should be greater than or equal to 0")
    assert "0 or more" in p.todo
    assert p.reference.endswith("#min_free_disk_gb")


@pytest.mark.parametrize("bind", ["0.0.0.0", "::", "10.0.0.5", "gpu-1.internal"])
def test_a_server_open_beyond_loopback_without_a_key_is_a_warning(valid_data, bind):
    from specdeploy.checks.host_data import check_warnings

    def about_the_bind(data):  # k = 5 on 0.32.0 has its own warning (test_release_rules.py)
        return [w for w in check_warnings("gpu-1", data) if w.field == "vllm_host"]

    (w,) = about_the_bind({**valid_data, "vllm_host": bind})
    assert w.host == "gpu-1"
    assert w.what.startswith(f"{bind!r} is not a loopback address and vllm_api_key is unset")
    assert "set vllm_api_key" in w.todo and "bind 127.0.0.1 behind a proxy" in w.todo
    assert w.reference.endswith("#vllm_host")
    assert about_the_bind({**valid_data, "vllm_host": bind, "vllm_api_key": "k"}) == []


@pytest.mark.parametrize("bind", ["127.0.0.1", "127.0.0.2", "::1", "localhost"])
def test_a_loopback_server_needs_no_key(valid_data, bind):
    from specdeploy.checks.host_data import check_warnings

    found = check_warnings("gpu-1", {**valid_data, "vllm_host": bind})
    assert [w for w in found if w.field == "vllm_host"] == []
