"""The control-node services (pip wheelhouse index + Olah HF mirror) on 127.0.0.1.

These tests start their own instance (own state dir, free ports), independent of
a running sandbox fleet, and use the real clients: pip in a fresh venv with pip
configuration switched off, ``huggingface_hub.snapshot_download`` and the ``hf``
CLI.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from specdeploy_sandbox import models, multiformat, services, wheelhouse

pytestmark = [pytest.mark.sandbox, pytest.mark.timeout(600)]

TARGET = models.TARGET


@pytest.fixture(scope="module")
def svc(tmp_path_factory):
    state = {"bridge_ip": "127.0.0.1", "state_dir": str(tmp_path_factory.mktemp("svc-state"))}
    keys = services.start(state, ports={"wheelhouse": 0, "hf_mirror": 0, "gateway": 0})
    state.update(keys)
    yield state
    services.stop(state)


def _clean_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "HF_", "HUGGINGFACE_"))}
    env["PIP_CONFIG_FILE"] = os.devnull  # no /etc/pip.conf find-links or extra indexes
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env.update(extra)
    return env


def _wheel_version(name: str) -> str:
    wh = wheelhouse.wheelhouse_dir()
    found = sorted(wh.glob(f"{name}-*.whl"))
    assert found, f"{name} wheel missing from {wh}"
    return found[-1].name.split("-")[1]


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    path = tmp_path_factory.mktemp("pipvenv") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
    return path


def _pip(venv: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "--no-cache-dir", *args],
        capture_output=True,
        text=True,
        env=_clean_env(),
        timeout=300,
    )


def test_gated_repo_needs_the_token(svc, tmp_path):
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError

    gated = svc["hf_gated"]
    with pytest.raises(HfHubHTTPError) as refused:
        snapshot_download(gated["repo"], endpoint=svc["hf_endpoint"], cache_dir=tmp_path / "a",
                          token=False)  # fmt: skip
    assert "401" in str(refused.value)
    path = snapshot_download(gated["repo"], endpoint=svc["hf_endpoint"], cache_dir=tmp_path / "b",
                             token=gated["token"])  # fmt: skip
    assert (Path(path) / "config.json").is_file()
    draft_main = svc["models"][models.DRAFT]["main"]
    assert Path(path).name == draft_main  # the same commits as the draft it copies


def test_debian_repository_serves_what_the_deploy_installs(svc):
    import urllib.request

    with urllib.request.urlopen(f"{svc['debian_repo_url']}/Packages", timeout=10) as response:
        index = response.read().decode()
    for package in ("python3-venv", "curl", "libnuma1"):
        assert f"Package: {package}\n" in index, package


def test_returned_keys(svc):
    for key in (
        "wheelhouse_url",
        "pip_install_args",
        "hf_endpoint",
        "models",
        "model_repos",
        "services",
    ):
        assert key in svc, key
    assert svc["wheelhouse_url"].startswith("http://127.0.0.1:")
    assert svc["pip_install_args"][:2] == ["--index-url", svc["wheelhouse_url"]]
    # both model sets: the tiny random one (plumbing) and the trained one (behaviour)
    assert set(svc["model_repos"]) == {
        "target",
        "draft",
        "draft-othervocab",
        "trained-target",
        "trained-draft",
        "trained-draft-poor",
    }
    assert len(svc["models"][TARGET]["revisions"]) >= 2
    assert svc["models"][models.DRAFT]["vocab_size"] == svc["models"][TARGET]["vocab_size"]
    assert (
        svc["models"][models.DRAFT_OTHERVOCAB]["vocab_size"] != svc["models"][TARGET]["vocab_size"]
    )
    # the draft with the other formats real repos ship (test_host_download fetches it on a host)
    assert svc["hf_multiformat"]["repo"] == multiformat.REPO and svc["hf_multiformat"]["main"]
    assert {"original/consolidated.00.pth", "model.safetensors"} <= set(
        svc["hf_multiformat"]["files"]
    )
    for rec in svc["services"].values():
        assert Path(f"/proc/{rec['pid']}").exists()


def test_pip_installs_from_wheelhouse_index(svc, venv):
    version = _wheel_version("packaging")
    r = _pip(venv, *svc["pip_install_args"], f"packaging=={version}")
    assert r.returncode == 0, r.stdout + r.stderr
    assert (
        svc["wheelhouse_url"].rsplit("/simple/", 1)[0] in r.stdout + r.stderr
    )  # fetched from our index
    out = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import packaging; print(packaging.__version__)"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == version


def test_pip_no_index_find_links(svc, venv):
    version = _wheel_version("idna")
    host = svc["services"]["wheelhouse"]["host"]
    r = _pip(
        venv,
        "--no-index",
        "--find-links",
        svc["wheelhouse_find_links"],
        "--trusted-host",
        host,
        f"idna=={version}",
    )
    assert r.returncode == 0, r.stdout + r.stderr
    out = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import idna; print(idna.__version__)"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == version


def test_pip_does_not_fall_back_to_pypi(svc, venv):
    # A real PyPI project the wheelhouse does not hold (it holds the product's own dependencies
    # for the clean room, six among them): the index must answer 404, never redirect to pypi.org.
    assert not list(wheelhouse.wheelhouse_dir().glob("cowsay-*"))
    r = _pip(venv, *svc["pip_install_args"], "cowsay")
    assert r.returncode != 0
    assert "No matching distribution found for cowsay" in r.stdout + r.stderr


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _git_show(repo: str, rev: str, path: str) -> bytes:
    return subprocess.run(
        ["git", "-C", repo, "show", f"{rev}:{path}"], capture_output=True, check=True
    ).stdout


def test_snapshot_download_pinned_revisions(svc, tmp_path, monkeypatch):
    for k in list(os.environ):
        if k.startswith(("HF_", "HUGGINGFACE_")):
            monkeypatch.delenv(k)
    from huggingface_hub import snapshot_download

    info = svc["models"][TARGET]
    old_sha, new_sha = info["revisions"]["v1"], info["main"]
    assert old_sha != new_sha
    cache = tmp_path / "hf-cache"

    old = Path(
        snapshot_download(TARGET, revision=old_sha, endpoint=svc["hf_endpoint"], cache_dir=cache)
    )
    new = Path(
        snapshot_download(TARGET, revision="main", endpoint=svc["hf_endpoint"], cache_dir=cache)
    )
    assert old.name == old_sha and new.name == new_sha
    assert "revision: v1" in (old / "README.md").read_text()
    assert "revision: v2" in (new / "README.md").read_text()
    assert json.loads((old / "config.json").read_text())["max_position_embeddings"] == 1024
    assert json.loads((new / "config.json").read_text())["max_position_embeddings"] == 2048

    # Byte-identical to the git objects of the pinned commit.
    repo = str(models.hub_dir() / "models" / TARGET)
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        assert _sha256(old / name) == hashlib.sha256(_git_show(repo, old_sha, name)).hexdigest(), (
            name
        )
    # A tag resolves to its commit as well.
    tagged = Path(
        snapshot_download(TARGET, revision="v1", endpoint=svc["hf_endpoint"], cache_dir=cache)
    )
    assert tagged.name == old_sha


def test_hf_cli_download(svc, tmp_path):
    hf = shutil.which("hf") or str(Path(sys.executable).parent / "hf")
    dest = tmp_path / "draft"
    sha = svc["models"][models.DRAFT_OTHERVOCAB]["main"]
    r = subprocess.run(
        [hf, "download", models.DRAFT_OTHERVOCAB, "--revision", sha, "--local-dir", str(dest)],
        capture_output=True,
        text=True,
        timeout=300,
        env=_clean_env(HF_ENDPOINT=svc["hf_endpoint"], HF_HOME=str(tmp_path / "hf-home")),
    )
    assert r.returncode == 0, r.stdout + r.stderr
    cfg = json.loads((dest / "config.json").read_text())
    tok = json.loads((dest / "tokenizer.json").read_text())
    assert (
        cfg["vocab_size"]
        == svc["models"][models.DRAFT_OTHERVOCAB]["vocab_size"]
        == len(tok["model"]["vocab"])
    )


def test_unknown_revision_is_an_error(svc, tmp_path):
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError

    with pytest.raises((HfHubHTTPError, ValueError, OSError)):
        snapshot_download(
            TARGET, revision="0" * 40, endpoint=svc["hf_endpoint"], cache_dir=tmp_path / "c"
        )


def test_start_is_idempotent(svc):
    pids = {n: r["pid"] for n, r in svc["services"].items()}
    again = services.start(svc, ensure_assets=False)
    assert {n: r["pid"] for n, r in again["services"].items()} == pids
    assert again["hf_endpoint"] == svc["hf_endpoint"]


def _listening(port: int) -> bool:
    """A socket in LISTEN state (0A) on `port`, from /proc/net/tcp{,6}."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            if int(local.rsplit(":", 1)[1], 16) == port and state == "0A":
                return True
    return False


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_stop_leaves_no_process(svc):
    recs = dict(svc["services"])
    assert all(_alive(r["pid"]) for r in recs.values())
    services.stop(svc)
    for name, rec in recs.items():
        assert not _alive(rec["pid"]), f"{name} pid {rec['pid']} still running"
        # Ask the kernel who listens, don't connect: a connect to a closed port in the ephemeral
        # range can pick that very port as its source and connect to itself (TCP simultaneous
        # open) — the earlier flake; and a bind test fails on connections still closing.
        assert not _listening(rec["port"]), f"{name} port {rec['port']} still open"
        # nothing else of ours runs with that config/log either
        leftovers = [
            p
            for p in Path("/proc").iterdir()
            if p.name.isdigit()
            and _alive(int(p.name))
            and rec["marker"] in services._cmdline(int(p.name))
        ]
        assert not leftovers, leftovers
    services.stop(svc)  # idempotent
    assert all(not s["alive"] for s in services.status(svc).values())
