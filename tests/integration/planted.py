"""What the rollout and fault-matrix wings plant on the sandbox: an inventory with per-host data
overrides, and a draft that passes every check but cannot load."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HUB = "/var/lib/specdeploy/hf/hub"
BROKEN_DRAFT = "specdeploy-sandbox/tiny-llama-draft-broken"


def write_inventory(tmp_path: Path, overrides: dict[str, dict], name: str = "inventory") -> Path:
    """The sandbox inventory with per-host data overrides (keeps the canary group)."""
    path = tmp_path / f"{name}.py"
    path.write_text(
        "import runpy\n"
        f"_base = runpy.run_path({str(REPO / 'inventories/sandbox.py')!r})\n"
        f"_over = {overrides!r}\n"
        "sandbox = [(n, {**d, **_over.get(n, {})}) for n, d in _base['sandbox']]\n"
        "canary = _base['canary']\n"
    )
    return path


def plant_broken_draft(ssh, host: str) -> None:
    """A draft repo in the host's cache that passes every check and preflight (config, vocabulary,
    context and memory are read from headers) but whose weights are truncated: vLLM fails only
    when it loads them, at health-check time."""
    ssh(
        host,
        f"set -e; src={HUB}/models--specdeploy-sandbox--tiny-llama-draft; "
        f"dst={HUB}/models--{BROKEN_DRAFT.replace('/', '--')}; rm -rf $dst; cp -rL $src $dst; "
        "for f in $dst/snapshots/*/*.safetensors; "
        "do truncate -s $(( $(stat -c %s $f) / 2 )) $f; done; chown -R root:root $dst",
    )
