"""Download one model snapshot into the host's Hugging Face cache (runs in the vLLM venv).

argv: HF_HOME REPO_ID REVISION [TIMEOUT_S MIN_MB_PER_S HOST MARGIN_BYTES]. Honours HF_ENDPOINT and
HF_TOKEN_PATH (the token's own root-only file) from the environment.

Only what vLLM loads is fetched (`wanted`): safetensors weights and their index, the config,
generation config and tokenizer files; `*.bin` only when the repo has no safetensors; never
`original/`, GGUF or `*.pth` (a repo shipping those beside its safetensors would otherwise be
downloaded two or three times over). The selected files are sized from the Hub's file metadata
first, and the download is refused, with the numbers, when the cache's disk cannot hold them plus
MARGIN_BYTES.

Time limit: TIMEOUT_S seconds ("auto": DEFAULT_S while the files are sized, then START_S + size /
MIN_MB_PER_S, or DEFAULT_S where the size cannot be read); past it the script says which download
on which host, and which key to raise, and exits 124.

huggingface_hub resumes interrupted files (.incomplete blobs) and never touches other revisions,
so a failed run leaves any working snapshot as it was. A marker file is written last: only a
snapshot that has it counts as complete.

Root runs this, so its own writes (refs/main, the marker) never go through a symbolic link: a
directory on the way that is a link is refused, and each file is written beside its name and
renamed over it (a link planted at the name is replaced, never followed). The tree is root's
(steps/weights.py); this guards one that an older deploy left to the service user."""

import fnmatch
import math
import os
import shutil
import sys
import threading

DEFAULT_S = 3600  # config.DOWNLOAD_DEFAULT_TIMEOUT_S
START_S = 600  # config.DOWNLOAD_START_S

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


def sized_files(repo, revision):
    """(the files to fetch, their total bytes) from the Hub's file metadata: one listing with
    sizes, or a HEAD per file where the listing has none (a mirror without file metadata)."""
    from huggingface_hub import HfApi, get_hf_file_metadata, hf_hub_url

    info = HfApi().model_info(repo, revision=revision, files_metadata=True)
    listed = {s.rfilename: s.size for s in info.siblings or []}
    files = wanted(list(listed))
    sizes = [listed[f] for f in files]
    if None in sizes:
        sizes = [get_hf_file_metadata(hf_hub_url(repo, f, revision=info.sha)).size for f in files]
    return files, sum(s or 0 for s in sizes)


def disk_problem(needed, free, margin, where):
    """The refusal text when `free` bytes cannot hold `needed` plus `margin`, else None."""
    if free >= needed + margin:
        return None
    return (
        f"{where}: the download needs {size_text(needed)} (+ {size_text(margin)} margin) "
        f"but only {size_text(free)} is free: free space or grow the disk, then re-run"
    )


def size_text(n):
    """GiB with two decimals; MiB below a tenth of a GiB, where GiB would read 0.00 (a draft)."""
    if n >= (1 << 30) / 10 or n == 0:
        return f"{n / (1 << 30):.2f} GiB"
    return f"{n / (1 << 20):.1f} MiB"


def time_limit(timeout, size_bytes, min_mb_per_s):
    """The download's limit in seconds: a fixed TIMEOUT_S, else scaled from the size."""
    if timeout != "auto":
        return int(timeout)
    if not size_bytes:
        return DEFAULT_S
    return START_S + math.ceil(size_bytes / (float(min_mb_per_s) * 1e6))


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


def refuse_links(directory, top):
    """Exit when `directory` or a directory between `top` (exclusive) and it is a symbolic link:
    root writes there, and a planted link would send the write anywhere."""
    rel = os.path.relpath(directory, top)
    if rel.startswith(os.pardir):
        sys.exit(f"{directory} is outside {top}: refusing to write there")
    current = top
    for part in [] if rel == os.curdir else rel.split(os.sep):
        current = os.path.join(current, part)
        if os.path.islink(current):
            sys.exit(
                f"{current} is a symbolic link (to {os.readlink(current)}): refusing to write "
                f"through it as root; remove it (the cache under {top} is root's), then re-run"
            )


def write_no_follow(directory, name, text, top):
    """Write `directory/name` without following any link: the directory is opened O_NOFOLLOW,
    the text goes to a new file (O_EXCL | O_NOFOLLOW) and is renamed over `name` (rename replaces a
    link itself, never its target)."""
    refuse_links(directory, top)
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    temp = f".{name}.specdeploy-tmp"
    try:
        try:
            os.unlink(temp, dir_fd=fd)
        except FileNotFoundError:
            pass
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
        with os.fdopen(os.open(temp, flags, 0o644, dir_fd=fd), "w") as handle:
            handle.write(text)
        os.replace(temp, name, src_dir_fd=fd, dst_dir_fd=fd)
    finally:
        os.close(fd)


def not_writable_by_others(directory):
    """huggingface_hub's lock files come out 0666 (filelock's mode): nothing in the root-owned
    cache may be writable by the service user, so they lose group/other write."""
    for parent, _, names in os.walk(directory):
        for name in names:
            path = os.path.join(parent, name)
            if not os.path.islink(path):
                os.chmod(path, os.stat(path).st_mode & ~0o022)


def main(hf_home, repo, revision, timeout="auto", min_mb_per_s="10", host="this host", margin="0"):
    from huggingface_hub import snapshot_download

    cache = os.path.join(hf_home, "hub")
    what = f"{host}: weights: download of {repo}@{revision}"
    auto = timeout == "auto"
    watchdog = arm(
        DEFAULT_S if auto else int(timeout), what + " (sizing it)", "set download_timeout_s"
    )
    try:
        files, size = sized_files(repo, revision)
    except Exception as error:  # no listing: download everything, under the fixed limit
        sys.stderr.write(f"{what}: could not size the files ({error}); fetching the snapshot\n")
        files, size = None, None
    if size is not None:
        os.makedirs(cache, exist_ok=True)
        problem = disk_problem(
            size, shutil.disk_usage(cache).free, int(margin), f"{what} into {cache}"
        )
        if problem:
            watchdog.cancel()
            sys.exit(problem)
    limit = time_limit(timeout, size, min_mb_per_s)
    if auto:
        shown = f"{size / 1e9:.1f} GB at {min_mb_per_s} MB/s" if size else "size unknown"
        what += f" (limit scaled from {shown})"
        advice = "lower download_min_mb_per_s or set download_timeout_s in the host's data"
    else:
        advice = "raise download_timeout_s in the host's data"
    watchdog = arm(limit, what, advice, watchdog)
    try:
        path = snapshot_download(
            repo_id=repo, revision=revision, cache_dir=cache, allow_patterns=files
        )
    except Exception as error:  # a repo or revision the endpoint does not serve, a refusal
        watchdog.cancel()
        first = (str(error).strip().splitlines() or [type(error).__name__])[0]
        sys.exit(
            f"{what} failed: {type(error).__name__}: {first} — check that {repo} has revision "
            f"{revision} on the endpoint (hf_endpoint, HF_ENDPOINT: "
            f"{os.environ.get('HF_ENDPOINT', 'huggingface.co')}) and that the token may read it"
        )
    watchdog.cancel()
    # This cache serves one deployment, offline (HF_HUB_OFFLINE=1). Code paths in vLLM that load a
    # model without its revision (e.g. the draft tokenizer under use_heterogeneous_vocab) resolve
    # "main": point it at the pinned snapshot so they see the same files.
    repo_dir = os.path.dirname(os.path.dirname(path))
    refs = os.path.join(repo_dir, "refs")
    refuse_links(repo_dir, cache)
    if not os.path.lexists(refs):
        os.mkdir(refs, 0o755)
    write_no_follow(refs, "main", os.path.basename(path), cache)
    write_no_follow(path, ".specdeploy-complete", revision + "\n", cache)
    not_writable_by_others(os.path.join(cache, ".locks"))
    print(f"{path} ({len(files) if files else 'all'} files, {size} bytes)")


if __name__ == "__main__":
    main(*sys.argv[1:8])
