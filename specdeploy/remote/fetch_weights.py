"""Download one model snapshot into the host's Hugging Face cache (runs in the vLLM venv).

argv: HF_HOME REPO_ID REVISION. Honours HF_ENDPOINT and HF_TOKEN from the environment.
huggingface_hub resumes interrupted files (.incomplete blobs) and never touches other revisions, so a
failed run leaves any working snapshot as it was. A marker file is written last: only a snapshot that
has it counts as complete."""
import os
import sys

from huggingface_hub import snapshot_download

hf_home, repo, revision = sys.argv[1:4]
path = snapshot_download(repo_id=repo, revision=revision, cache_dir=os.path.join(hf_home, "hub"),
                         token=os.environ.get("HF_TOKEN") or None)
with open(os.path.join(path, ".specdeploy-complete"), "w") as marker:
    marker.write(revision + "\n")
print(path)
