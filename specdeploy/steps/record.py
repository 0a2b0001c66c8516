"""Step 8: the deployment record on the host: every decision, and what the smoke benchmark saw."""

from __future__ import annotations

import shlex
import time

from pyinfra import host

from specdeploy.config import datasets
from specdeploy.config.record import (
    SCHEMA,
    BenchResult,
    DeploymentRecord,
    GateDecision,
    ValidatedBy,
    read_service_record,
)
from specdeploy.config.schema import ServeConfig
from specdeploy.config.timestamps import utc_iso
from specdeploy.decide.load_rule import SCHEDULE_KEY
from specdeploy.host.on_host import read_text, sh, write_text
from specdeploy.render.units import RenderedUnit
from specdeploy.report.bench_summary import summarize
from specdeploy.report.draft_summary import follows


def build_record(
    cfg: ServeConfig,
    unit: RenderedUnit,
    *,
    vllm_version: str,
    snapshots: dict,
    preflight,
    health: dict | None,
    smoke: BenchResult | None,
    started: float,
    gate: GateDecision | None = None,
    timings: dict | None = None,
    revisions: dict | None = None,
    pruned_venvs: list[str] | None = None,
    validated_by: ValidatedBy | None = None,
    schedule_proof: dict | None = None,
    draft_choice: dict | None = None,
    live_fallback: dict | None = None,
) -> DeploymentRecord:
    """The record of a verified deploy; `unit` is the unit the host serves with (its role too).
    Every piece of evidence is handed in by the step that made it: `schedule_proof`, the proof of
    a deployed schedule or the allowance of an unproven one (steps/schedule_proof.py, while
    planning), `draft_choice`, the kept choice of draft for this host's fingerprint
    (steps/draft_choice.py, while planning), recorded with `followed` for the unit it ends on;
    nothing is looked up here."""
    w = cfg.workload
    served = cfg.speculative_config if unit.role == "speculative" else None  # None: baseline
    record = {
        # set, not defaulted: to_json writes only what was set; a reader tells releases apart by it
        "schema": SCHEMA,
        "host": host.name,
        "role": unit.role,
        "target": {
            "model": cfg.target_model,
            "revision": cfg.target_revision,
            "resolved_sha": (snapshots.get("target") or {}).get("sha"),
        },
        "draft": {
            "model": cfg.draft_model,
            "revision": cfg.draft_revision,
            "resolved_sha": (snapshots.get("draft") or {}).get("sha"),
        },
        "speculative_config": cfg.speculative_config,
        "vocab": preflight.vocab,
        "memory": preflight.memory,
        "workload": {
            "prompt_len": w.prompt_len,
            "output_len": w.output_len,
            "dataset": w.dataset,
            "dataset_path": w.dataset_path,
            "num_prompts": w.num_prompts,
            "seed": w.seed,
            "temperature": w.temperature,
            "top_p": w.top_p,
            "request_rate": w.request_rate,
            "max_concurrency": w.max_concurrency,
            "request_set": datasets.describe(w.dataset_path, w.dataset),  # sha256, rows
        },
        "limits": {
            "max_model_len": cfg.effective_max_model_len,
            "max_num_seqs": cfg.effective_max_num_seqs,
            "max_num_batched_tokens": cfg.effective_max_num_batched_tokens,
            "memory": dict([cfg.memory_mechanism]),
        },
        "vllm": {
            "package": cfg.vllm_package,
            "version": vllm_version,
            "venv": cfg.venv,
            "pruned_venvs": pruned_venvs or [],
        },  # fmt: skip
        # moving refs (branch/tag) the control node resolved once for the whole rollout
        "revisions": revisions or {},
        "unit": {"name": unit.name, "sha256": unit.sha256, "argv": unit.argv},
        "health": health,
        "smoke": summarize(smoke) if smoke else None,
        "smoke_counters": smoke.run.server_counters if smoke and smoke.run else None,
        "gate": gate,
        **({"validated_by": validated_by} if validated_by is not None else {}),
        # only with a schedule, so every other record stays as it was
        **({"schedule_proof": schedule_proof} if SCHEDULE_KEY in cfg.speculative_config else {}),
        # only where a draft choice is kept for this fingerprint: every other record stays as it was
        **(
            {"draft_choice": {**draft_choice, "followed": follows(draft_choice, served)}}
            if draft_choice is not None
            else {}
        ),
        # only in a live autopilot's fall-back: the verdict and windows it fell back on
        **({"live_fallback": live_fallback} if live_fallback is not None else {}),
        "timings": timings,
        "started_at": utc_iso(started),
        "finished_at": utc_iso(),
        "seconds": round(time.time() - started, 1),
    }
    return DeploymentRecord.model_validate(record)


def write_record(cfg: ServeConfig, unit: RenderedUnit, **decisions) -> DeploymentRecord:
    """Build the record (build_record's arguments) and write it atomically, root-owned and
    world-readable (the record holds no secret)."""
    record = build_record(cfg, unit, **decisions)
    write_text(cfg.record_path, record.to_json(), mode="644")
    # migrated: the host-wide record of an older release goes once this service has its own
    legacy = read_text(cfg.legacy_record_path, missing_ok=True)
    if legacy and read_service_record(
        None, legacy, service_name=cfg.service_name, where="", legacy_where=cfg.legacy_record_path
    ):
        sh(f"rm -f -- {shlex.quote(cfg.legacy_record_path)}")
    return record
