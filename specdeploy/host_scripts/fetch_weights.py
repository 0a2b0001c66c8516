"""Download one model snapshot into the host's Hugging Face cache (runs in the vLLM venv).

argv: HF_HOME REPO_ID REVISION. Honours HF_ENDPOINT and HF_TOKEN_PATH (the token's own root-only
file) from the environment.
huggingface_hub resumes interrupted files (.incomplete blobs) and never touches other revisions,
so a failed run leaves any working snapshot as it was. A marker file is written last: only a
snapshot that has it counts as complete."""

import os
import sys

from huggingface_hub import snapshot_download

hf_home, repo, revision = sys.argv[1:4]
path = snapshot_download(
    repo_id=repo,
    revision=revision,
    cache_dir=os.path.join(hf_home, "hub"),
)
# This cache serves one deployment, offline (HF_HUB_OFFLINE=1). Code paths in vLLM that load a
# model without its revision (e.g. the draft tokenizer under use_heterogeneous_vocab) resolve
# "main": point it at the pinned snapshot so they see the same files.
refs = os.path.join(os.path.dirname(os.path.dirname(path)), "refs")
os.makedirs(refs, exist_ok=True)
with open(os.path.join(refs, "main"), "w") as ref:
    ref.write(os.path.basename(path))
with open(os.path.join(path, ".specdeploy-complete"), "w") as marker:
    marker.write(revision + "\n")
print(path)
