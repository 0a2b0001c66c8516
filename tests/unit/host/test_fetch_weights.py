"""host/scripts/fetch_weights.py: only what vLLM loads is fetched, and a disk that cannot hold it
is refused before the download, with the numbers."""

from __future__ import annotations

import runpy
from pathlib import Path

import specdeploy.host.scripts as host_scripts

SCRIPT = runpy.run_path(str(Path(host_scripts.__file__).parent / "fetch_weights.py"))
wanted, disk_problem = SCRIPT["wanted"], SCRIPT["disk_problem"]

# The file list of a Llama release repo as the Hub shows it: safetensors shards, the original
# consolidated checkpoint, and pickled weights beside them.
LLAMA = [
    ".gitattributes",
    "LICENSE",
    "README.md",
    "config.json",
    "generation_config.json",
    "model-00001-of-00002.safetensors",
    "model-00002-of-00002.safetensors",
    "model.safetensors.index.json",
    "original/consolidated.00.pth",
    "original/params.json",
    "original/tokenizer.model",
    "pytorch_model-00001-of-00002.bin",
    "pytorch_model.bin.index.json",
    "special_tokens_map.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "model-q4.gguf",
]


def test_a_repo_with_original_bin_and_gguf_copies_fetches_only_the_safetensors():
    assert wanted(LLAMA) == [
        "config.json",
        "generation_config.json",
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
        "model.safetensors.index.json",
        "special_tokens_map.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ]


def test_pickled_weights_only_when_there_are_no_safetensors():
    legacy = ["config.json", "pytorch_model.bin", "tokenizer.model", "original/x.pth"]
    assert wanted(legacy) == ["config.json", "pytorch_model.bin", "tokenizer.model"]


def test_the_sandbox_repo_layout_keeps_every_file_vllm_reads():
    sandbox = [".gitattributes", "README.md", "chat_template.jinja", "config.json"]
    sandbox += ["generation_config.json", "model.safetensors", "tokenizer.json"]
    sandbox += ["tokenizer_config.json"]
    assert wanted(sandbox) == sorted(set(sandbox) - {".gitattributes", "README.md"})


def test_a_disk_too_small_is_refused_with_the_numbers():
    gib = 1 << 30
    assert disk_problem(16 * gib, 20 * gib, 2 * gib, "m@r into /c") is None
    text = disk_problem(16 * gib, 17 * gib, 2 * gib, "m@r into /c")
    assert text == (
        "m@r into /c: the download needs 16.00 GiB (+ 2.00 GiB margin) but only 17.00 GiB is "
        "free: free space or grow the disk, then re-run"
    )


def test_a_draft_sized_refusal_reads_in_mib_not_as_zero_gib():
    text = disk_problem(2_958_000, 1 << 20, 0, "d@r into /c")
    assert "needs 2.8 MiB (+ 0.00 GiB margin) but only 1.0 MiB is free" in text


def test_the_sandbox_multiformat_repo_downloads_as_the_plain_draft():
    """specdeploy_sandbox.multiformat's file list (the integration test downloads it on a host)."""
    repo = [".gitattributes", "README.md", "chat_template.jinja", "config.json"]
    repo += ["generation_config.json", "model.safetensors", "original/consolidated.00.pth"]
    repo += ["original/params.json", "pytorch_model-00001-of-00002.bin"]
    repo += ["pytorch_model-00002-of-00002.bin", "pytorch_model.bin.index.json"]
    repo += ["tokenizer.json", "tokenizer_config.json"]
    assert wanted(repo) == [
        "chat_template.jinja",
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
