"""A sandbox repo laid out like a real Hub checkpoint that ships several formats of one model.

Real repos (meta-llama/*, many fine-tunes) carry `original/consolidated.00.pth` (Meta's format),
`pytorch_model-*.bin` shards and their index beside the safetensors that vLLM loads; a download
that fetched them all would take two or three times the model's size. This repo,
`specdeploy-sandbox/tiny-llama-draft-multiformat`, is a clone of the tiny draft (its commits, so
the same weights byte for byte) plus one commit that adds, from those same weights:

    original/consolidated.00.pth     Meta names (tok_embeddings, layers.N.attention.wq, ...),
                                     wq/wk in Meta's rotary layout (the inverse of HF's permute)
    original/params.json             Meta's model parameters
    pytorch_model-0000N-of-00002.bin two torch.save shards of the HF state dict
    pytorch_model.bin.index.json     their weight map

Nothing is trained: the files are written from the draft's model.safetensors under the model venv
(torch), committed with a fixed date, so the commit sha is the same on every machine with the same
torch; `ensure()` rebuilds only when the draft's commit, this recipe or the clone changed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = "specdeploy-sandbox/tiny-llama-draft-multiformat"
RECIPE_VERSION = 1


def hub(cache: Path) -> Path:
    """Root to hand to Olah as one of its mirrors-path (contains models/<org>/<name>)."""
    return cache / "models" / "multiformat-hub"


def _manifest_path(cache: Path) -> Path:
    return cache / "models" / "multiformat.json"


def load(cache: Path) -> dict | None:
    """The manifest of the repo built before, or None."""
    try:
        return json.loads(_manifest_path(cache).read_text())
    except (OSError, ValueError):
        return None


def ensure(cache: Path, python: str | None = None) -> dict:
    """The repo's manifest {"repo", "main", "files", "source"}, building the repo when missing or
    stale (a few seconds: one torch import and two git commands)."""
    from . import models

    source = models.hub_dir(cache) / "models" / models.DRAFT
    source_head = models._git(source, "rev-parse", "HEAD")
    clone = hub(cache) / "models" / REPO
    manifest = load(cache)
    try:
        current = manifest["source"] == source_head and manifest["recipe"] == RECIPE_VERSION
        if current and models._git(clone, "rev-parse", "HEAD") == manifest["main"]:
            return manifest
    except (TypeError, KeyError, subprocess.CalledProcessError):
        pass
    work = Path(tempfile.mkdtemp(prefix="multiformat-", dir=cache / "models"))
    try:
        repo = work / "repo"
        subprocess.run(["git", "clone", "-q", str(source), str(repo)], check=True)
        subprocess.run(["git", "-C", str(repo), "fetch", "-q", "--tags", "origin"], check=True)
        subprocess.run(
            [python or models._python(cache), str(Path(__file__).resolve()), "_write", str(repo)],
            check=True,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
        models._git(repo, "add", "-A")
        date = f"@{models._EPOCH + 3600 * 24} +0000"  # after every generated revision
        models._git(repo, "commit", "-q", "--no-gpg-sign", "-m", f"{REPO}: the other formats",
                    env={"GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date})  # fmt: skip
        manifest = {
            "repo": REPO,
            "main": models._git(repo, "rev-parse", "HEAD"),
            "files": models._git(repo, "ls-files").splitlines(),
            "source": source_head,
            "recipe": RECIPE_VERSION,
        }
        shutil.rmtree(clone, ignore_errors=True)
        clone.parent.mkdir(parents=True, exist_ok=True)
        repo.rename(clone)
        _manifest_path(cache).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        return manifest
    finally:
        shutil.rmtree(work, ignore_errors=True)


# ---------------------------------------------------------------------------
# Worker side: runs under the model venv (torch), never imported by the control code.


def _meta_layout(state: dict, config: dict) -> dict:
    """The HF Llama state dict under Meta's names, wq/wk back in Meta's rotary layout (HF's
    conversion script permutes them; this is its inverse)."""
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]

    def unpermute(w, n):
        rows, cols = w.shape
        return w.view(n, 2, rows // n // 2, cols).transpose(1, 2).reshape(rows, cols)

    out = {
        "tok_embeddings.weight": state["model.embed_tokens.weight"],
        "norm.weight": state["model.norm.weight"],
        "output.weight": state.get("lm_head.weight", state["model.embed_tokens.weight"]),
    }
    names = {
        "self_attn.o_proj": "attention.wo",
        "self_attn.v_proj": "attention.wv",
        "mlp.gate_proj": "feed_forward.w1",
        "mlp.down_proj": "feed_forward.w2",
        "mlp.up_proj": "feed_forward.w3",
        "input_layernorm": "attention_norm",
        "post_attention_layernorm": "ffn_norm",
    }
    for i in range(config["num_hidden_layers"]):
        hf, meta = f"model.layers.{i}.", f"layers.{i}."
        out[meta + "attention.wq.weight"] = unpermute(state[hf + "self_attn.q_proj.weight"], heads)
        out[meta + "attention.wk.weight"] = unpermute(
            state[hf + "self_attn.k_proj.weight"], kv_heads
        )
        for hf_name, meta_name in names.items():
            out[f"{meta}{meta_name}.weight"] = state[f"{hf}{hf_name}.weight"]
    return {k: v.contiguous().clone() for k, v in out.items()}


def _write(repo: Path) -> None:
    import safetensors.torch
    import torch

    torch.set_num_threads(1)
    state = safetensors.torch.load_file(str(repo / "model.safetensors"))
    config = json.loads((repo / "config.json").read_text())
    (repo / "original").mkdir()
    torch.save(_meta_layout(state, config), repo / "original" / "consolidated.00.pth")
    params = {
        "dim": config["hidden_size"],
        "n_layers": config["num_hidden_layers"],
        "n_heads": config["num_attention_heads"],
        "n_kv_heads": config["num_key_value_heads"],
        "vocab_size": config["vocab_size"],
        "norm_eps": config["rms_norm_eps"],
        # transformers 5 nests it under rope_parameters, 4.x keeps it at the top
        "rope_theta": config.get("rope_parameters", config).get("rope_theta", 10000.0),
    }
    (repo / "original" / "params.json").write_text(json.dumps(params, indent=2) + "\n")
    keys = sorted(state)
    shards = [keys[: len(keys) // 2], keys[len(keys) // 2 :]]
    weight_map = {}
    for n, shard in enumerate(shards, 1):
        name = f"pytorch_model-{n:05d}-of-{len(shards):05d}.bin"
        torch.save({k: state[k].contiguous().clone() for k in shard}, repo / name)
        weight_map.update({k: name for k in shard})
    total = sum(t.numel() * t.element_size() for t in state.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (repo / "pytorch_model.bin.index.json").write_text(json.dumps(index, indent=2) + "\n")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "_write":
        _write(Path(sys.argv[2]))
    else:
        sys.exit("usage: multiformat.py _write REPO_DIR")
