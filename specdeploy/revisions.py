"""One rollout, one set of weights: moving refs are resolved once, on the control node.

Host data may name a branch or tag (`target_revision = "main"`). Left to each host, hosts deployed an
hour apart could serve different weights while their records each look right. So every deploy
resolves a moving ref on the control node with huggingface_hub (once per pyinfra process, shared by
all hosts of the run) and renders, downloads and records the commit sha; `specdeploy rollout`
resolves them once before its first batch and hands the pins to every batch through
PINNED_REVISIONS_ENV. The record keeps both the ref that was asked for and the commit it meant.
"""

from __future__ import annotations

import json
import os
import re

from .config import ServeConfig

PINNED_REVISIONS_ENV = "SPECDEPLOY_PINNED_REVISIONS"
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_resolved: dict[str, str] = {}  # pin key -> commit sha, for this process


class RevisionError(RuntimeError):
    pass


def is_commit(revision: str) -> bool:
    return bool(_COMMIT.match(revision))


def pin_key(endpoint: str | None, repo: str, revision: str) -> str:
    return f"{endpoint or 'https://huggingface.co'}|{repo}|{revision}"


def moving_refs(cfg: ServeConfig) -> list[tuple[str, str, str]]:
    """(role, repo, revision) of every model whose revision is not a commit sha."""
    models = [("target", cfg.target_model, cfg.target_revision)]
    if cfg.draft_model and cfg.speculative_config.get("method") == "draft_model":
        models.append(("draft", cfg.draft_model, cfg.draft_revision))
    return [(role, repo, rev) for role, repo, rev in models if not is_commit(rev)]


def _resolve(cfg: ServeConfig, repo: str, revision: str) -> str:
    key = pin_key(cfg.hf_endpoint, repo, revision)
    if key not in _resolved:
        handed_down = json.loads(os.environ.get(PINNED_REVISIONS_ENV) or "{}")
        if key in handed_down:
            _resolved[key] = handed_down[key]
        else:
            from huggingface_hub import HfApi  # only when a moving ref has to be resolved

            api = HfApi(endpoint=cfg.hf_endpoint, token=cfg.hf_token or False)
            try:
                _resolved[key] = api.model_info(repo, revision=revision).sha
            except Exception as error:  # noqa: BLE001 - any hub failure means "cannot pin"
                raise RevisionError(
                    f"{repo}@{revision} is a moving ref and the control node could not resolve it "
                    f"({type(error).__name__}: {str(error).splitlines()[0][:200]}) — pin a commit "
                    "sha in host data, or make the hub reachable from the control node"
                ) from None
    return _resolved[key]


def pin(cfg: ServeConfig) -> tuple[ServeConfig, dict[str, dict]]:
    """`cfg` with every moving ref replaced by its commit sha, and {role: {requested, resolved}}."""
    pins = {
        role: {"requested": revision, "resolved": _resolve(cfg, repo, revision),
               "resolved_on": "control node"}  # fmt: skip
        for role, repo, revision in moving_refs(cfg)
    }
    return apply_pins(cfg, pins), pins


def apply_pins(cfg: ServeConfig, pins: dict[str, dict]) -> ServeConfig:
    """`cfg` with the recorded pins applied (also how host tests read a deployed host's record)."""
    update: dict = {}
    if "target" in pins:
        update["target_revision"] = pins["target"]["resolved"]
    if "draft" in pins:
        update["speculative_config"] = {**cfg.speculative_config, "revision": pins["draft"]["resolved"]}
    return cfg.model_copy(update=update) if update else cfg


def pins_for_hosts(configs: list[ServeConfig]) -> dict[str, str]:
    """Resolve every moving ref of a fleet once (the rollout controller): {pin key: sha}."""
    for cfg in configs:
        pin(cfg)
    return dict(_resolved)
