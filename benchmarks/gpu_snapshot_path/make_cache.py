"""Write the plan's target and draft into a Hugging Face cache laid out as huggingface_hub leaves it
(`{hf_home}/hub/models--ORG--NAME/{blobs,refs/main,snapshots/SHA}`, the snapshot's files symlinks
into blobs/), with random bf16 weights (std 0.02, norms 1): small Qwen3-architecture checkpoints
that vLLM really loads from disk. The tokenizer is gpu_payoff's small trained BPE (the configs keep
Qwen3's 151936-token vocabulary, so target and draft match as draft_model requires).

Usage: python3 -m benchmarks.gpu_snapshot_path.make_cache PLAN.json   (the plan's device setup)
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time

from benchmarks.gpu_payoff.make_models import train_tokenizer, write_model_files
from benchmarks.gpu_truth.make_weights import tensors


def random_weights(cfg: dict, seed: int) -> dict:
    import torch

    gen = torch.Generator(device="cuda").manual_seed(seed)
    out = {}
    for name, shape in tensors(cfg):
        if name.endswith("norm.weight"):
            t = torch.ones(shape, dtype=torch.bfloat16, device="cuda")
        else:
            t = torch.randn(shape, generator=gen, device="cuda", dtype=torch.float32) * 0.02
            t = t.to(torch.bfloat16)
        out[name] = t.cpu()
    return out


def write_repo(hf_home: str, repo: str, sha: str, cfg: dict, tok, seed: int) -> dict:
    from safetensors.torch import save_file

    base = os.path.join(hf_home, "hub", "models--" + repo.replace("/", "--"))
    snap, blobs = os.path.join(base, "snapshots", sha), os.path.join(base, "blobs")
    staging = os.path.join(base, ".staging")
    for d in (snap, blobs, staging, os.path.join(base, "refs")):
        os.makedirs(d, exist_ok=True)
    with open(os.path.join(base, "refs", "main"), "w") as f:
        f.write(sha)
    write_model_files(staging, cfg, tok)
    weights = random_weights(cfg, seed)
    save_file(weights, os.path.join(staging, "model.safetensors"), metadata={"format": "pt"})
    files = {}
    for name in sorted(os.listdir(staging)):
        blob = hashlib.sha256(f"{repo}@{sha}/{name}".encode()).hexdigest()  # stands in for the etag
        os.replace(os.path.join(staging, name), os.path.join(blobs, blob))
        link = os.path.join(snap, name)
        if os.path.lexists(link):
            os.remove(link)
        os.symlink(os.path.join("..", "..", "blobs", blob), link)
        files[name] = os.path.getsize(os.path.join(blobs, blob))
    os.rmdir(staging)
    open(os.path.join(snap, ".specdeploy-complete"), "w").close()  # what steps/weights.py leaves
    params = sum(t.numel() for t in weights.values())
    return {"snapshot": snap, "files": files, "params": params}


def main() -> None:
    plan = json.load(open(sys.argv[1]))
    t0 = time.time()
    tok = train_tokenizer()
    out = {}
    for seed, (repo, model) in enumerate(plan["models"].items(), 1):
        out[repo] = write_repo(plan["hf_home"], repo, model["sha"], model["config"], tok, seed)
        print(f"{repo}: {out[repo]['params'] / 1e9:.3f} B params -> {out[repo]['snapshot']}")
    out["seconds"] = round(time.time() - t0, 1)
    with open(os.path.join(plan["hf_home"], "made.json"), "w") as f:
        json.dump(out, f, indent=1)
    print(f"cache written in {out['seconds']} s")


if __name__ == "__main__":
    main()
