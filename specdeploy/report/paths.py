"""Where benchmark JSONs and reports land on the control node (the one home for these paths):
`reports/`, or $SPECDEPLOY_REPORTS; a host's smoke and gate runs under <root>/<host>/, a compare or
tune run under <root>/<run id>/ (raw/<host>/ for its samples).

The root is the owner's alone (0700): reports hold generated text of production prompts, and a
closed root keeps every file under it from other users whatever its own mode."""

from __future__ import annotations

import os
from pathlib import Path

from specdeploy.config.timestamps import utc_stamp


def reports_root() -> Path:
    return Path(os.environ.get("SPECDEPLOY_REPORTS", "reports"))


def private_reports_root() -> Path:
    """The reports root, created 0700, or closed to group and others where it was open."""
    root = reports_root()
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    if root.stat().st_mode & 0o077:
        os.chmod(root, 0o700)
    return root


def host_reports_dir(host_name: str) -> Path:
    return private_reports_root() / host_name


_RUN_IDS: dict[str, str] = {}


def run_id(kind: str) -> str:
    """One id per pyinfra process and kind (every host of the run writes under it); SPECDEPLOY_RUN
    overrides it."""
    if kind not in _RUN_IDS:
        _RUN_IDS[kind] = os.environ.get("SPECDEPLOY_RUN") or f"{kind}-{utc_stamp()}"
    return _RUN_IDS[kind]


def run_dir(kind: str) -> Path:
    return private_reports_root() / run_id(kind)


def raw_dir(kind: str, host_name: str) -> Path:
    return run_dir(kind) / "raw" / host_name
