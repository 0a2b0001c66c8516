import json
import shlex

import pytest

from specdeploy.cli import main
from specdeploy.cli.migrate import MigrationError, migrate


def test_legacy_flags_become_one_json():
    m = migrate(
        shlex.split(
            "vllm serve Qwen/Qwen3-8B --speculative-model Qwen/Qwen3-0.6B "
            "--num-speculative-tokens 5 --dtype bfloat16"
        )
    )
    assert m.speculative_config == {
        "model": "Qwen/Qwen3-0.6B",
        "num_speculative_tokens": 5,
        "method": "draft_model",
    }
    assert m.command[:3] == ["vllm", "serve", "Qwen/Qwen3-8B"]
    i = m.command.index("--speculative-config")
    assert json.loads(m.command[i + 1]) == m.speculative_config
    assert not any(
        a.startswith("--speculative-model") or a.startswith("--num-spec") for a in m.command
    )
    assert m.host_data["vllm_extra_args"] == ["--dtype", "bfloat16"]


def test_ngram_model_becomes_ngram_method():
    m = migrate(
        shlex.split(
            "vllm serve m --speculative-model [ngram] --num-speculative-tokens=3 "
            "--ngram-prompt-lookup-max 4"
        )
    )
    assert m.speculative_config == {
        "num_speculative_tokens": 3,
        "prompt_lookup_max": 4,
        "method": "ngram",
    }


def test_managed_flags_become_host_data():
    m = migrate(
        shlex.split(
            "vllm serve m --speculative-model d --num-speculative-tokens 2 "
            "--gpu-memory-utilization 0.85 --max-model-len=4096 --port 9000"
        )
    )
    assert m.host_data["gpu_memory_utilization"] == 0.85
    assert m.host_data["max_model_len"] == 4096 and m.host_data["vllm_port"] == 9000


def test_mixing_styles_is_an_error():
    with pytest.raises(MigrationError, match="mixes --speculative-config with the old flags"):
        migrate(
            shlex.split(
                'vllm serve m --speculative-config \'{"method":"ngram"}\' '
                "--num-speculative-tokens 3"
            )
        )


def test_cli_migrate_prints_command_and_host_data(capsys):
    rc = main(
        [
            "migrate",
            "--",
            "vllm",
            "serve",
            "Qwen/Qwen3-8B",
            "--speculative-model",
            "Qwen/Qwen3-0.6B",
            "--num-speculative-tokens",
            "5",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0
    assert (
        "--speculative-config "
        '\'{"method":"draft_model","model":"Qwen/Qwen3-0.6B","num_speculative_tokens":5}\'' in out
    )
    assert "speculative_config = {" in out and "target_model = 'Qwen/Qwen3-8B'" in out


def test_cli_migrate_mixed_exits_2(capsys):
    rc = main(
        [
            "migrate",
            "--",
            "vllm",
            "serve",
            "m",
            "--speculative-config",
            "{}",
            "--speculative-model",
            "d",
        ]
    )
    assert rc == 2
    assert "keep one style" in capsys.readouterr().err
