"""One rollout, one set of weights: moving refs are resolved once, on the control node.

Host data may name a branch or tag (`target_revision = "main"`). Left to each host, hosts deployed
an hour apart could serve different weights while their records each look right. So every deploy
resolves a moving ref on the control node with huggingface_hub (once per pyinfra process, shared by
all hosts of the run) and renders, downloads and records the commit sha; `specdeploy rollout`
resolves them once before its first batch and hands the pins to every batch through
PINNED_REVISIONS_ENV. The record keeps both the ref that was asked for and the commit it meant.

After the rollout the record's pins are the truth: `specdeploy status`, compare, tune and the host
tests read what a host serves with `as_deployed` (the record's commit for each moving ref the host
data still asks for), never by resolving the ref again — upstream may have moved since.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

from specdeploy.config.record import DeploymentRecord
from specdeploy.config.schema import ServeConfig

PINNED_REVISIONS_ENV = "SPECDEPLOY_PINNED_REVISIONS"
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_resolved: dict[str, str] = {}  # pin key -> commit sha, for this process


class RevisionError(RuntimeError):
    pass


def is_commit(revision: str) -> bool:
    return bool(_COMMIT.match(revision))


def snapshot_dir(cfg: ServeConfig, repo: str, revision: str) -> str | None:
    """Where huggingface_hub keeps `repo` at commit `revision` in the host's cache (the download
    step puts it there); None for a moving ref, whose commit is known only once resolved."""
    if not is_commit(revision):
        return None
    return f"{cfg.hf_home}/hub/models--{repo.replace('/', '--')}/snapshots/{revision}"


def pin_key(endpoint: str | None, repo: str, revision: str) -> str:
    return f"{endpoint or 'https://huggingface.co'}|{repo}|{revision}"


def moving_refs(cfg: ServeConfig) -> list[tuple[str, str, str]]:
    """(role, repo, revision) of every model whose revision is not a commit sha."""
    return [(role, repo, rev) for role, repo, rev in cfg.hub_models if not is_commit(rev)]


def _resolve(cfg: ServeConfig, repo: str, revision: str) -> str:
    key = pin_key(cfg.hf_endpoint, repo, revision)
    if key not in _resolved:
        handed_down = json.loads(os.environ.get(PINNED_REVISIONS_ENV) or "{}")
        if key in handed_down:
            _resolved[key] = handed_down[key]
        else:
            _resolved[key] = _ask_hub(cfg, repo, revision)
    return _resolved[key]


_ASK_HUB = """
import sys
from huggingface_hub import HfApi
endpoint, repo, revision = sys.argv[1:4]
print(HfApi(endpoint=endpoint or None).model_info(repo, revision=revision).sha)
"""


def _ask_hub(cfg: ServeConfig, repo: str, revision: str) -> str:
    """huggingface_hub in a child process: inside pyinfra (gevent-patched `select`) it cannot be
    imported. The token travels in the child's environment, never its argv."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    if cfg.hf_token:
        env["HF_TOKEN"] = cfg.hf_token
    env["HF_HUB_DISABLE_TELEMETRY"] = "1"
    done = subprocess.run(
        [sys.executable, "-c", _ASK_HUB, cfg.hf_endpoint or "", repo, revision],
        capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip
    sha = done.stdout.strip()
    if done.returncode != 0 or not is_commit(sha):
        why = (done.stderr.strip().splitlines() or ["no answer"])[-1][:200]
        raise RevisionError(
            f"{repo}@{revision} is a moving ref and the control node could not resolve it ({why})"
            " — pin a commit sha in host data, or make the hub reachable from the control node"
        )
    return sha


def pin(cfg: ServeConfig) -> tuple[ServeConfig, dict[str, dict]]:
    """`cfg` with every moving ref replaced by its commit sha, and {role: {requested, resolved}}."""
    pins = {
        role: {
            "requested": revision,
            "resolved": _resolve(cfg, repo, revision),
            "resolved_on": "control node",
        }
        for role, repo, revision in moving_refs(cfg)
    }
    return apply_pins(cfg, pins), pins


def apply_pins(cfg: ServeConfig, pins: dict[str, dict]) -> ServeConfig:
    """`cfg` with the recorded pins applied (also how host tests read a deployed host's record)."""
    update: dict = {}
    if "target" in pins:
        update["target_revision"] = pins["target"]["resolved"]
    if "draft" in pins:
        update["speculative_config"] = {
            **cfg.speculative_config,
            "revision": pins["draft"]["resolved"],
        }
    return cfg.model_copy(update=update) if update else cfg


def pins_for_hosts(configs: list[ServeConfig]) -> dict[str, str]:
    """Resolve every moving ref of a fleet once (the rollout controller): {pin key: sha}."""
    for cfg in configs:
        pin(cfg)
    return dict(_resolved)


def recorded_pins(cfg: ServeConfig, record: DeploymentRecord | None) -> dict[str, dict]:
    """The record's pins that still answer the host data: same repo, same moving ref requested. A
    ref the host data changed since the deploy (another branch, another repo) is not answered."""
    if record is None:
        return {}
    refs = {"target": record.target, "draft": record.draft}
    pins = {}
    for role, repo, revision in moving_refs(cfg):
        pin = (record.revisions or {}).get(role) or {}
        if (
            pin.get("requested") == revision
            and is_commit(str(pin.get("resolved") or ""))
            and refs[role].model == repo
        ):
            pins[role] = pin
    return pins


def as_deployed(cfg: ServeConfig, record: DeploymentRecord | None) -> ServeConfig:
    """`cfg` as the host was deployed with it: every moving ref the record pinned, at its commit.
    Moving refs the record does not answer stay as they are (status shows them as drift)."""
    return apply_pins(cfg, recorded_pins(cfg, record))
