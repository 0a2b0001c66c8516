"""Which of host data's draft_candidates can run at all, each refused by name before any weights are
downloaded (deploys/choose_draft.py): the pinned release's method rules and keys first (ngram where
the release has it; use_heterogeneous_vocab only where the release keeps the key), then, from the
candidate's card (config and tokenizer read from the Hub, config/model_cards.py) and the host's
facts, the preflight every deploy runs: vocabulary, context length and memory with that draft's
weights and KV cache. Pure functions: the flow hands the cards and the facts in."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from specdeploy.checks import release as release_checks
from specdeploy.checks.gpus import Preflight
from specdeploy.checks.preflight import evaluate
from specdeploy.config.problems import Problem
from specdeploy.config.schema import DraftCandidate, ServeConfig
from specdeploy.host.facts.nvidia import AcceleratorInfo
from specdeploy.releases import capabilities
from specdeploy.render.argv import engine_flags


def candidate_config(cfg: ServeConfig, candidate: DraftCandidate, k: int) -> ServeConfig:
    """The host's config serving `candidate` at k: only speculative_config differs."""
    spec = candidate.speculative_config(cfg.speculative_config, k)
    return cfg.model_copy(update={"speculative_config": spec})


def candidate_field(index: int, candidate: DraftCandidate) -> str:
    return f"draft_candidates[{index}] ({candidate.name})"


@dataclass
class CandidateCheck:
    """One candidate after the checks: refused (with every reason) or measured; the memory figures
    of the preflight (kv_tokens, max_sequences) and the size of its download."""

    index: int
    candidate: DraftCandidate
    refusals: list[Problem] = field(default_factory=list)
    memory: dict = field(default_factory=dict)
    vocab: dict = field(default_factory=dict)
    download_bytes: int | None = None
    kv_tokens_without_draft: int | None = None  # the same server's KV cache with no draft model

    @property
    def name(self) -> str:
        return self.candidate.name

    @property
    def refused(self) -> bool:
        return bool(self.refusals)

    def as_json(self) -> dict:
        return {
            "name": self.name,
            "candidate": self.candidate.model_dump(),
            "refused": [f"{p.field}: {p.what} — {p.todo}" for p in self.refusals],
            "download_bytes": self.download_bytes,
            "kv_tokens": self.memory.get("kv_tokens"),
            "kv_tokens_taken": (self.kv_tokens_without_draft - self.memory["kv_tokens"])
            if self.kv_tokens_without_draft is not None and "kv_tokens" in self.memory
            else None,
            "max_sequences": self.memory.get("max_sequences"),
            "vocab": self.vocab,
        }


def release_refusals(
    host: str, cfg: ServeConfig, index: int, candidate: DraftCandidate,
    release: capabilities.Release, k: int,
) -> list[Problem]:  # fmt: skip
    """What the pinned release refuses of this candidate's speculative_config (its methods, keys
    and rules, as `specdeploy check` refuses them for the deployed one), named by the candidate."""
    cand = candidate_config(cfg, candidate, k)
    found = release_checks.check_speculative(host, cand, release, engine_flags(cand))
    where = candidate_field(index, candidate)
    return [Problem(host, f"{where}: {p.field}", p.what, p.todo) for p in found]


def model_refusals(
    host: str, cfg: ServeConfig, index: int, candidate: DraftCandidate, k: int, *,
    target: dict, card: dict | None, accelerators: AcceleratorInfo, ram: dict,
    cpu: dict | None = None,
) -> tuple[list[Problem], Preflight]:  # fmt: skip
    """The preflight (vocabulary, context, memory with this draft's weights and KV) over the
    target's snapshot and the candidate's card; ngram has no weights of its own (card None)."""
    cand = candidate_config(cfg, candidate, k)
    result = evaluate(cand, target, card, accelerators, ram, cpu)
    where = candidate_field(index, candidate)
    fix = "drop it from draft_candidates" + (
        ""
        if candidate.is_ngram
        else ", or pick a draft that fits (smaller, quantized, the target's tokenizer)"
    )
    return [Problem(host, where, p, fix) for p in result.problems], result


def check_candidates(
    host: str,
    cfg: ServeConfig,
    release: capabilities.Release,
    *,
    k: int,
    target: dict,
    card_of: Callable[[DraftCandidate], dict | None],
    accelerators: AcceleratorInfo,
    ram: dict,
    cpu: dict | None = None,
) -> list[CandidateCheck]:
    """Every candidate checked at k (the largest tune_k, the run that measures it): the release's
    rules first (no card is read for a candidate the release cannot run), then its card and the
    preflight. `card_of(candidate)`: its card, None where the Hub has none at that revision."""
    out = []
    # what the KV cache holds with no draft model: what each candidate's weights and KV take from
    alone = evaluate(candidate_config(cfg, DraftCandidate(repo="ngram"), k), target, None,
                     accelerators, ram, cpu).memory.get("kv_tokens")  # fmt: skip
    for index, candidate in enumerate(cfg.draft_candidates):
        check = CandidateCheck(index, candidate, kv_tokens_without_draft=alone)
        out.append(check)
        check.refusals = release_refusals(host, cfg, index, candidate, release, k)
        if check.refusals:
            continue
        card = None
        if not candidate.is_ngram:
            card = card_of(candidate)
            if card is None:
                check.refusals = [
                    Problem(host, candidate_field(index, candidate),
                            f"no config.json at {candidate.revision} on the Hub, or the Hub "
                            "could not be reached from the control node",
                            "check the repo id, the revision, hf_endpoint and hf_token")
                ]  # fmt: skip
                continue
            check.download_bytes = card.get("download_bytes")
        check.refusals, result = model_refusals(
            host, cfg, index, candidate, k, target=target, card=card,
            accelerators=accelerators, ram=ram, cpu=cpu,
        )  # fmt: skip
        check.memory, check.vocab = result.memory, result.vocab
    return out
