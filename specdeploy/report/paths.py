"""Where benchmark JSONs and reports land on the control node (the one home for these paths):
`reports/`, or $SPECDEPLOY_REPORTS; a host's smoke and gate runs under <root>/<host>/, a compare or
tune run under <root>/<run id>/ (raw/<host>/ for its samples)."""

from __future__ import annotations

import os
from pathlib import Path

from specdeploy.config.timestamps import utc_stamp


def reports_root() -> Path:
    return Path(os.environ.get("SPECDEPLOY_REPORTS", "reports"))


def host_reports_dir(host_name: str) -> Path:
    return reports_root() / host_name


_RUN_IDS: dict[str, str] = {}


def run_id(kind: str) -> str:
    """One id per pyinfra process and kind (every host of the run writes under it); SPECDEPLOY_RUN
    overrides it."""
    if kind not in _RUN_IDS:
        _RUN_IDS[kind] = os.environ.get("SPECDEPLOY_RUN") or f"{kind}-{utc_stamp()}"
    return _RUN_IDS[kind]


def run_dir(kind: str) -> Path:
    return reports_root() / run_id(kind)


def raw_dir(kind: str, host_name: str) -> Path:
    return run_dir(kind) / "raw" / host_name
