"""specdeploy's host download script against the session fleet's real HF mirror (Olah): only what
vLLM loads is fetched, sized first, and a disk too small is refused before the download."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from specdeploy_sandbox import models

pytestmark = [pytest.mark.sandbox, pytest.mark.timeout(600)]

TARGET = models.TARGET


def _clean_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "HF_", "HUGGINGFACE_"))}
    env.update(extra)
    return env


def test_the_host_download_fetches_only_what_vllm_loads_and_sizes_it_first(
    sandbox_services, tmp_path
):
    """specdeploy's host script against the real mirror: README.md and .gitattributes are left out,
    every file vLLM reads is fetched; a disk that cannot hold the files plus the margin is refused,
    with the numbers, before anything is downloaded."""
    from specdeploy.host_scripts import source

    sha = sandbox_services["models"][TARGET]["main"]
    env = _clean_env(HF_ENDPOINT=sandbox_services["hf_endpoint"], HF_HUB_DISABLE_TELEMETRY="1")
    script = source("fetch_weights")
    run = lambda home, margin: subprocess.run(  # noqa: E731
        [sys.executable, "-c", script, str(home), TARGET, sha, "auto", "10", "h1", str(margin)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    ok = run(tmp_path / "hf", 0)
    assert ok.returncode == 0, ok.stderr
    snapshot = tmp_path / "hf" / "hub" / f"models--{TARGET.replace('/', '--')}" / "snapshots" / sha
    fetched = sorted(p.name for p in snapshot.iterdir())
    assert (
        "model.safetensors" in fetched and "config.json" in fetched and "tokenizer.json" in fetched
    )
    assert "README.md" not in fetched and ".gitattributes" not in fetched
    assert (snapshot / ".specdeploy-complete").read_text().strip() == sha
    refused = run(tmp_path / "small", 1 << 50)  # a margin no disk has
    assert refused.returncode != 0
    assert "the download needs" in refused.stderr and "GiB is free" in refused.stderr
    assert not (tmp_path / "small" / "hub" / f"models--{TARGET.replace('/', '--')}").exists()
