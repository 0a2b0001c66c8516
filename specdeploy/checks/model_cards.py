"""A draft candidate's card, read on the control node before any weights are downloaded: its config
and tokenizer (two small files from the Hub) through the same parser as a downloaded snapshot
(host/scripts/model_facts.py), its weights' bytes and the download's size from the Hub's file
metadata over the files the download step would fetch (host/scripts/fetch_weights.py `wanted`).
The checks refuse a candidate on it (checks/draft_candidates.py) before its weights are fetched."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from functools import cache

from specdeploy.config.schema import ServeConfig
from specdeploy.host.scripts import fetch_weights, model_facts

# huggingface_hub in a child process, as config/revisions.py asks the Hub: inside pyinfra
# (gevent-patched `select`) it cannot be imported. The token travels in its environment.
_READ_CARD = """
import json, os, sys, tempfile
from huggingface_hub import HfApi, get_hf_file_metadata, hf_hub_download, hf_hub_url
endpoint, repo, revision = sys.argv[1:4]
info = HfApi(endpoint=endpoint or None).model_info(repo, revision=revision, files_metadata=True)
listed = {s.rfilename: s.size for s in info.siblings or []}
for name, size in listed.items():  # a mirror without file metadata: a HEAD per weights file
    if size is None and "/" not in name and name.endswith((".safetensors", ".bin")):
        url = hf_hub_url(repo, name, revision=info.sha, endpoint=endpoint or None)
        listed[name] = get_hf_file_metadata(url).size
home = tempfile.mkdtemp(prefix="specdeploy-card-")
for name in ("config.json", "tokenizer.json"):
    if name in listed:
        path = hf_hub_download(repo, name, revision=info.sha, endpoint=endpoint or None,
                               cache_dir=os.path.join(home, "hub"))
        open(os.path.join(os.path.dirname(path), ".specdeploy-complete"), "w").close()
print(json.dumps({"sha": info.sha, "home": home, "files": listed}))
"""


def card_from_listing(repo: str, listing: dict) -> dict | None:
    """The card from what the child found: model_facts' figures over the config and tokenizer, with
    weight_bytes and download_bytes from the listed sizes of the files the download fetches."""
    facts = model_facts.main(listing["home"], repo, listing["sha"])
    if facts is None:
        return None
    files = fetch_weights.wanted(list(listing["files"]))
    sizes = {f: listing["files"].get(f) or 0 for f in files}
    weights = sum(v for f, v in sizes.items() if f.endswith((".safetensors", ".bin")))
    return {**facts, "weight_bytes": weights, "download_bytes": sum(sizes.values()),
            "path": None}  # fmt: skip


@cache
def _card(endpoint: str, token: str, repo: str, revision: str) -> str | None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    if token:
        env["HF_TOKEN"] = token
    env["HF_HUB_DISABLE_TELEMETRY"] = "1"
    done = subprocess.run(
        [sys.executable, "-c", _READ_CARD, endpoint, repo, revision],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    if done.returncode != 0:
        return None
    listing = json.loads(done.stdout)
    try:
        return json.dumps(card_from_listing(repo, listing))
    finally:
        shutil.rmtree(listing["home"], ignore_errors=True)


def read_card(cfg: ServeConfig, repo: str, revision: str) -> dict | None:
    """The card of repo@revision from the host's hub (hf_endpoint, hf_token), once per process;
    None when the Hub has no such model or revision, or no config.json for it."""
    text = _card(cfg.hf_endpoint or "", cfg.hf_token or "", repo, revision)
    return json.loads(text) if text else None
