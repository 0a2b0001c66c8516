"""Download one model snapshot into the host's Hugging Face cache (runs in the vLLM venv).

argv: HF_HOME REPO_ID REVISION [TIMEOUT_S MIN_MB_PER_S HOST]. Honours HF_ENDPOINT and HF_TOKEN_PATH
(the token's own root-only file) from the environment.
huggingface_hub resumes interrupted files (.incomplete blobs) and never touches other revisions,
so a failed run leaves any working snapshot as it was. A marker file is written last: only a
snapshot that has it counts as complete.

Time limit: TIMEOUT_S seconds ("auto": DEFAULT_S while the snapshot's size is read from the Hub's
file metadata, then START_S + size / MIN_MB_PER_S, or DEFAULT_S where the size cannot be read);
past it the script says which download on which host, and which key to raise, and exits 124."""

import math
import os
import sys
import threading

DEFAULT_S = 3600  # config.DOWNLOAD_DEFAULT_TIMEOUT_S
START_S = 600  # config.DOWNLOAD_START_S


def time_limit(timeout, size_bytes, min_mb_per_s):
    """The download's limit in seconds: a fixed TIMEOUT_S, else scaled from the size."""
    if timeout != "auto":
        return int(timeout)
    if not size_bytes:
        return DEFAULT_S
    return START_S + math.ceil(size_bytes / (float(min_mb_per_s) * 1e6))


def snapshot_bytes(repo, revision):
    """The snapshot's size from the Hub's file metadata (one request), or None."""
    try:
        from huggingface_hub import HfApi

        info = HfApi().model_info(repo, revision=revision, files_metadata=True)
        sizes = [s.size for s in info.siblings or []]
        return sum(sizes) if sizes and None not in sizes else None
    except Exception:  # a mirror without file metadata, a network error: the fixed limit
        return None


def arm(seconds, what, advice, previous=None):
    """A watchdog thread that ends the process at the limit (a thread, not SIGALRM: the main thread
    may sit in a native call of the downloader, where no signal handler runs)."""
    if previous is not None:
        previous.cancel()

    def expired():
        sys.stderr.write(f"{what} ran past {seconds} s (stopped); {advice}\n")
        sys.stderr.flush()
        os._exit(124)  # the downloader's worker threads would keep a normal exit waiting

    timer = threading.Timer(seconds, expired)
    timer.daemon = True
    timer.start()
    return timer


def main(hf_home, repo, revision, timeout="auto", min_mb_per_s="10", host="this host"):
    from huggingface_hub import snapshot_download

    what = f"{host}: weights: download of {repo}@{revision}"
    if timeout == "auto":
        sizing = "set download_timeout_s in the host's data"
        watchdog = arm(DEFAULT_S, what + " (sizing it)", sizing)
        size = snapshot_bytes(repo, revision)
        limit = time_limit(timeout, size, min_mb_per_s)
        shown = f"{size / 1e9:.1f} GB at {min_mb_per_s} MB/s" if size else "size unknown"
        what += f" (limit scaled from {shown})"
        advice = "lower download_min_mb_per_s or set download_timeout_s in the host's data"
    else:
        limit, watchdog = time_limit(timeout, None, min_mb_per_s), None
        advice = "raise download_timeout_s in the host's data"
    watchdog = arm(limit, what, advice, watchdog)
    path = snapshot_download(
        repo_id=repo,
        revision=revision,
        cache_dir=os.path.join(hf_home, "hub"),
    )
    watchdog.cancel()
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


if __name__ == "__main__":
    main(*sys.argv[1:7])
