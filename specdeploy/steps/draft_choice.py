"""The draft choice a deploy's speculative_config stands on (deploys/choose_draft.py): while
planning, the choice the control node keeps for exactly this host's fingerprint
(report/draft_summary.choice_fingerprint: release, target, workload, request set, hardware) is
looked up by its key, never by a file's age, and travels in the server's plan to its record
(`draft_choice`, with `followed`: does the unit the server ends on serve what it recommends).
Applying a choice is the ordinary serve deploy with the recommended speculative_config in host
data; nothing here changes what is deployed."""

from __future__ import annotations

from pyinfra import host, logger

from specdeploy.config.schema import ServeConfig
from specdeploy.report.draft_summary import CHOICES, choice_fingerprint, follows
from specdeploy.report.load_summary import kept_proof
from specdeploy.report.paths import reports_root
from specdeploy.steps.schedule_proof import host_hardware


def choice_evidence(cfg: ServeConfig, role: str) -> dict | None:
    """Planning time: the kept choice for this server's fingerprint, else None (and None without
    any kept choice, so a deploy with none reads no more facts than before). Whether the server
    follows it is the record's to say, from the unit it ends on (steps/record.build_record)."""
    root = reports_root()
    if not any((root / CHOICES).glob("*.json")):
        return None
    choice = kept_proof(root, choice_fingerprint(cfg, host_hardware(cfg)), CHOICES)
    if choice is None:
        return None
    planned = follows(choice, cfg.speculative_config if role == "speculative" else None)
    verdict = choice["decision"]["verdict"]
    says = "serves it" if planned else "does not serve it"
    logger.info(f"{host.print_prefix}draft choice of run {choice['run']} on "
                f"{choice['measured_on']}: {verdict}; this server, as planned, {says}")  # fmt: skip
    return choice
