"""Download one model snapshot into the host's Hugging Face cache (runs in the vLLM venv).

argv: HF_HOME REPO_ID REVISION [MARGIN_BYTES]. Honours HF_ENDPOINT and HF_TOKEN_PATH (the token's
own root-only file) from the environment.

Only what vLLM loads is fetched (`wanted`): safetensors weights and their index, the config,
generation config and tokenizer files; `*.bin` only when the repo has no safetensors; never
`original/`, GGUF or `*.pth` (a repo shipping those beside its safetensors would otherwise be
downloaded two or three times over). The selected files are sized from the Hub's file metadata
first, and the download is refused, with the numbers, when the cache's disk cannot hold them plus
the margin.
huggingface_hub resumes interrupted files (.incomplete blobs) and never touches other revisions,
so a failed run leaves any working snapshot as it was. A marker file is written last: only a
snapshot that has it counts as complete."""

import fnmatch
import os
import shutil
import sys

# What vLLM reads from a checkpoint repo (weights, config, tokenizer). Patterns match whole paths.
WEIGHTS = ("*.safetensors", "*.safetensors.index.json")
FALLBACK_WEIGHTS = ("*.bin", "*.bin.index.json")  # only when there are no safetensors
SUPPORT = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "chat_template.jinja",
    "chat_template.json",
    "preprocessor_config.json",
)
NEVER = ("original/*", "*.gguf", "*.pth", "*.pt", "*.onnx", "*.msgpack", "*.h5")


def wanted(paths):
    """The repo files vLLM loads, from the list of every file in the repo (pure: unit-tested)."""
    keep = [p for p in paths if not any(fnmatch.fnmatch(p, n) for n in NEVER)]
    top = [p for p in keep if "/" not in p]  # weights in subfolders are other formats' copies
    weights = [p for p in top if any(fnmatch.fnmatch(p, w) for w in WEIGHTS)]
    if not weights:
        weights = [p for p in top if any(fnmatch.fnmatch(p, w) for w in FALLBACK_WEIGHTS)]
    support = [p for p in top if os.path.basename(p) in SUPPORT]
    return sorted(set(weights) | set(support))


def disk_problem(needed, free, margin, where):
    """The refusal text when `free` bytes cannot hold `needed` plus `margin`, else None."""
    if free >= needed + margin:
        return None
    gib = 1 << 30
    return (
        f"{where}: the download needs {needed / gib:.2f} GiB (+ {margin / gib:.2f} GiB margin) "
        f"but only {free / gib:.2f} GiB is free: free space or grow the disk, then re-run"
    )


def main(argv):
    from huggingface_hub import HfApi, get_hf_file_metadata, hf_hub_url, snapshot_download

    hf_home, repo, revision = argv[1:4]
    margin = int(argv[4]) if len(argv) > 4 else 1 << 30
    cache = os.path.join(hf_home, "hub")
    info = HfApi().model_info(repo, revision=revision)
    files = wanted([s.rfilename for s in info.siblings or []])
    sizes = {
        f: get_hf_file_metadata(hf_hub_url(repo, f, revision=info.sha)).size or 0 for f in files
    }
    os.makedirs(cache, exist_ok=True)
    problem = disk_problem(
        sum(sizes.values()),
        shutil.disk_usage(cache).free,
        margin,
        f"{repo}@{revision} into {cache}",
    )
    if problem:
        sys.exit(problem)
    path = snapshot_download(repo_id=repo, revision=revision, cache_dir=cache, allow_patterns=files)
    # This cache serves one deployment, offline (HF_HUB_OFFLINE=1). Code paths in vLLM that load a
    # model without its revision (e.g. the draft tokenizer under use_heterogeneous_vocab) resolve
    # "main": point it at the pinned snapshot so they see the same files.
    refs = os.path.join(os.path.dirname(os.path.dirname(path)), "refs")
    os.makedirs(refs, exist_ok=True)
    with open(os.path.join(refs, "main"), "w") as ref:
        ref.write(os.path.basename(path))
    with open(os.path.join(path, ".specdeploy-complete"), "w") as marker:
        marker.write(revision + "\n")
    print(f"{path} ({len(files)} files, {sum(sizes.values())} bytes)")


if __name__ == "__main__":
    main(sys.argv)
