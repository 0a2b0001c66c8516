"""The deployment record (`state_dir/records/deployment.json`): every decision a deploy made on a
host, and what its smoke benchmark saw. One typed model, written by steps/record.py and read by the
serve path (re-run decisions, the gate), measurements (which unit to restore), and `status`.

Schema 1 is the layout every record written so far has: a record written by an older release still
reads (unknown keys are kept, missing optional parts are None). A change of meaning bumps SCHEMA.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

SCHEMA = 1


class _Part(BaseModel):
    model_config = ConfigDict(extra="allow")


class ModelRef(_Part):
    model: str | None = None
    revision: str | None = None
    resolved_sha: str | None = None


class RecordedWorkload(_Part):
    prompt_len: int
    output_len: int
    dataset: str
    dataset_path: str | None = None
    num_prompts: int
    seed: int
    request_rate: int | float  # as the host data gave it (inf: all at once)
    max_concurrency: int
    temperature: float | None = None  # None: a record written before sampling was recorded
    top_p: float | None = None
    request_set: dict[str, Any] | None = None  # sha256, rows, host path (datasets.describe)


class Limits(_Part):
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    memory: dict[str, int | float]  # the one memory mechanism: {flag name: value}


class VllmInstall(_Part):
    package: str
    version: str | None
    venv: str
    pruned_venvs: list[str] = Field(default_factory=list)


class UnitRef(_Part):
    name: str
    sha256: str
    argv: list[str]


class DeploymentRecord(_Part):
    schema_version: int = Field(SCHEMA, alias="schema")
    host: str
    role: str = "speculative"  # the unit the host serves with: "speculative" or "baseline"
    target: ModelRef
    draft: ModelRef
    speculative_config: dict[str, Any] | None = None
    vocab: dict[str, Any] | None = None
    memory: dict[str, Any] | None = None  # the preflight's memory figures
    workload: RecordedWorkload
    limits: Limits
    vllm: VllmInstall
    revisions: dict[str, Any] = Field(default_factory=dict)  # moving refs pinned for the rollout
    unit: UnitRef
    health: dict[str, Any] | None = None
    smoke: dict[str, Any] | None = None  # bench.summarize() of the smoke run
    smoke_counters: dict[str, Any] | None = None
    gate: dict[str, Any] | None = None
    timings: dict[str, Any] | None = None
    started_at: str
    finished_at: str
    seconds: float

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    def to_json(self) -> str:
        """The file's text: stable key order, so two records diff cleanly."""
        # exclude_unset: a record read from an older writer is written back with its own keys
        data = self.model_dump(mode="json", by_alias=True, exclude_unset=True)
        return json.dumps(data, indent=2, sort_keys=True) + "\n"

    @property
    def k(self) -> int | None:
        return (self.speculative_config or {}).get("num_speculative_tokens")


class RecordError(ValueError):
    pass


def read_record(
    source: str | dict | None, *, where: str = "deployment record"
) -> DeploymentRecord | None:
    """The record from its file text or parsed JSON (the JsonFile fact); None when there is none.
    A record that does not validate is an error naming where it came from, never "no record"."""
    if source is None or (isinstance(source, str) and not source.strip()):
        return None
    try:
        data = json.loads(source) if isinstance(source, str) else source
        return DeploymentRecord.model_validate(data)
    except ValueError as error:
        raise RecordError(
            f"{where} is not a deployment record specdeploy can read: {error}"
        ) from error
