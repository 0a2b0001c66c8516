"""Print JSON facts about a model snapshot in a Hugging Face cache (standard library only).

argv: HF_HOME REPO_ID REVISION. Prints null when the snapshot is not (completely) there."""

import json
import os
import struct
import sys

DTYPE_BYTES = {
    "F64": 8,
    "F32": 4,
    "BF16": 2,
    "F16": 2,
    "I64": 8,
    "I32": 4,
    "I16": 2,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
}


def snapshot_dir(hf_home, repo, revision):
    base = os.path.join(hf_home, "hub", "models--" + repo.replace("/", "--"))
    ref = os.path.join(base, "refs", revision)
    sha = open(ref).read().strip() if os.path.isfile(ref) else revision
    path = os.path.join(base, "snapshots", sha)
    return (path, sha) if os.path.isdir(path) else (None, None)


def safetensors_bytes(path):
    with open(path, "rb") as handle:
        (size,) = struct.unpack("<Q", handle.read(8))
        header = json.loads(handle.read(size))
    total, dtypes = 0, set()
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, end = info["data_offsets"]
        total += end - start
        dtypes.add(info["dtype"])
    return total, dtypes


def main(hf_home, repo, revision):
    path, sha = snapshot_dir(hf_home, repo, revision)
    if path is None:
        return None
    files = sorted(os.listdir(path))
    if any(
        not os.path.exists(os.path.join(path, f)) for f in files
    ):  # dangling link: partial download
        return None
    manifest = os.path.join(path, ".specdeploy-complete")
    if not os.path.exists(manifest) or "config.json" not in files:
        return None
    config = json.load(open(os.path.join(path, "config.json")))
    text = config.get("text_config", config)
    weight_bytes, dtypes = 0, set()
    for name in files:
        if name.endswith(".safetensors"):
            size, kinds = safetensors_bytes(os.path.join(path, name))
            weight_bytes += size
            dtypes |= kinds
    tokenizer_vocab = None
    if "tokenizer.json" in files:
        tokenizer = json.load(open(os.path.join(path, "tokenizer.json")))
        vocab = tokenizer.get("model", {}).get("vocab", {})
        added = {t["id"] for t in tokenizer.get("added_tokens", [])}
        tokenizer_vocab = len(
            set(vocab.values() if isinstance(vocab, dict) else range(len(vocab))) | added
        )
    heads = text.get("num_attention_heads")
    return {
        "repo": repo,
        "revision": revision,
        "sha": sha,
        "path": path,
        "architectures": config.get("architectures"),
        "vocab_size": text.get("vocab_size"),
        "tokenizer_vocab_size": tokenizer_vocab,
        "max_position_embeddings": text.get("max_position_embeddings"),
        "num_hidden_layers": text.get("num_hidden_layers"),
        "num_key_value_heads": text.get("num_key_value_heads", heads),
        "head_dim": text.get("head_dim") or (text["hidden_size"] // heads if heads else None),
        "hidden_size": text.get("hidden_size"),
        "intermediate_size": text.get("intermediate_size"),
        "torch_dtype": text.get("torch_dtype") or text.get("dtype") or config.get("torch_dtype"),
        "weight_bytes": weight_bytes,
        "weight_dtypes": sorted(dtypes),
    }


if __name__ == "__main__":
    print(json.dumps(main(*sys.argv[1:4])))
