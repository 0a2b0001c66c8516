"""Write real-size checkpoints into a Hugging Face cache, as specdeploy's weights step leaves them.

For each architecture (Qwen3-8B, Qwen3-32B targets, Qwen3-0.6B draft): the real config.json, a
small tokenizer (benchmarks/gpu_payoff/make_models.py), and safetensors shards with every tensor of
the real checkpoint at its real shape and dtype. The data region is a sparse hole (zeros that take
no disk), so the headers and file sizes are exactly what the `ModelSnapshot` fact reads on a real
host; vLLM is started with `--load-format dummy` and allocates the same tensors from config.json.

Usage: python3 -m benchmarks.gpu_truth.make_weights HF_HOME   (a device plan's setup; `tokenizers`)
"""

from __future__ import annotations

import json
import math
import os
import struct
import sys

from benchmarks.gpu_payoff.make_models import DRAFT, TARGET, train_tokenizer, write_model_files

REVISION_SHA = "0" * 39 + "1"
SHARD_BYTES = 5 * 10**9  # like the Hub's ~5 GB shards
# Qwen/Qwen3-32B config.json values
TARGET_32B = TARGET | {
    "hidden_size": 5120,
    "intermediate_size": 25600,
    "num_hidden_layers": 64,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "max_window_layers": 64,
}
MODELS = {
    "specdeploy/qwen3-8b-arch": TARGET,
    "specdeploy/qwen3-32b-arch": TARGET_32B,
    "specdeploy/qwen3-0.6b-arch": DRAFT,
}


def tensors(cfg: dict) -> list[tuple[str, list[int]]]:
    """Every tensor of a Qwen3ForCausalLM checkpoint, in the Hub's naming."""
    h, i, v, hd = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"], cfg["head_dim"]
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    out = [("model.embed_tokens.weight", [v, h])]
    for n in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{n}."
        out += [
            (p + "input_layernorm.weight", [h]),
            (p + "post_attention_layernorm.weight", [h]),
            (p + "self_attn.q_proj.weight", [q, h]),
            (p + "self_attn.k_proj.weight", [kv, h]),
            (p + "self_attn.v_proj.weight", [kv, h]),
            (p + "self_attn.o_proj.weight", [h, q]),
            (p + "self_attn.q_norm.weight", [hd]),
            (p + "self_attn.k_norm.weight", [hd]),
            (p + "mlp.gate_proj.weight", [i, h]),
            (p + "mlp.up_proj.weight", [i, h]),
            (p + "mlp.down_proj.weight", [h, i]),
        ]
    out.append(("model.norm.weight", [h]))
    if not cfg.get("tie_word_embeddings"):
        out.append(("lm_head.weight", [v, h]))
    return out


def write_shard(path: str, items: list[tuple[str, list[int]]]) -> int:
    header, offset = {}, 0
    for name, shape in items:
        size = 2 * math.prod(shape)
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    header["__metadata__"] = {"format": "pt"}
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        f.truncate(8 + len(raw) + offset)  # a sparse hole: real size, no disk
    return offset


def write_model(hf_home: str, repo: str, cfg: dict, tokenizer) -> int:
    base = os.path.join(hf_home, "hub", "models--" + repo.replace("/", "--"))
    snap = os.path.join(base, "snapshots", REVISION_SHA)
    os.makedirs(snap, exist_ok=True)
    os.makedirs(os.path.join(base, "refs"), exist_ok=True)
    with open(os.path.join(base, "refs", "main"), "w") as f:
        f.write(REVISION_SHA)
    write_model_files(snap, cfg, tokenizer)
    shards, current, size = [], [], 0
    for name, shape in tensors(cfg):
        nbytes = 2 * math.prod(shape)
        if current and size + nbytes > SHARD_BYTES:
            shards.append(current)
            current, size = [], 0
        current.append((name, shape))
        size += nbytes
    shards.append(current)
    total, weight_map = 0, {}
    for n, items in enumerate(shards, 1):
        fname = f"model-{n:05d}-of-{len(shards):05d}.safetensors"
        total += write_shard(os.path.join(snap, fname), items)
        weight_map |= {name: fname for name, _ in items}
    with open(os.path.join(snap, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f)
    open(os.path.join(snap, ".specdeploy-complete"), "w").close()  # what steps/weights.py leaves
    return total


def main() -> None:
    hf_home = sys.argv[1]
    tok = train_tokenizer()
    for repo, cfg in MODELS.items():
        total = write_model(hf_home, repo, cfg, tok)
        print(f"{repo}: {total} bytes of bf16 tensors ({total / 2**30:.2f} GiB)")


if __name__ == "__main__":
    main()
