"""The report of deploys/choose_draft.py, rebuilt from the raw files only (the decision replayed by
decide/draft_rule.draft_choice over them): per candidate its refusal or its acceptance by position,
predicted and measured TPOT, the KV cache it leaves (sequences of max_model_len) and its download
size; the decision with alpha; the host-data change and how to apply it; draft_tpot.png. The
choice is kept by its fingerprint (keep_choices) for the serve deploy that applies it, whose record
keeps it (steps/draft_choice.py)."""

from __future__ import annotations

from pathlib import Path

from specdeploy.config.schema import DraftCandidate, ServeConfig
from specdeploy.decide import draft_rule
from specdeploy.decide.stats import DEFAULT_ALPHA
from specdeploy.report.charts import SMALLEST_PT, _plt, _save
from specdeploy.report.load_summary import keep_entry, proof_fingerprint, proof_key


def host_choice(name: str, h: dict) -> dict:
    """One host's draft_choice from its conditions and runs, the host-data line to set and the
    speculative_config it sets (None: speculation off)."""
    cond = h["conditions"]  # conditions.json: the plan's keys (ks, ...) beside the rest
    candidates = cond.get("draft_candidates") or []
    choice = draft_rule.draft_choice(
        candidates, h["runs"], ks=cond["ks"],
        max_runs=cond["draft_max_runs"],
        alpha=cond.get("decision_alpha", DEFAULT_ALPHA), levels=cond.get("draft_levels"),
    )  # fmt: skip
    rec = choice["decision"]["recommended"]
    configs = [
        DraftCandidate.model_validate(c["candidate"]).speculative_config(
            cond.get("speculative_config") or {}, rec["k"] if rec else 1
        )
        for c in candidates
    ]
    return {**choice, "host_data_change": draft_rule.host_data_change(name, choice["decision"],
                                                                        configs),
            "speculative_config": configs[rec["candidate"]] if rec else None,
            "choice_fingerprint": cond.get("choice_fingerprint"),
            "finished_at": cond.get("finished_at")}  # fmt: skip


def draft_report(hosts: dict[str, dict], run_dir: Path, head: dict) -> dict:
    s = {**head, "hosts": {name: host_choice(name, h) for name, h in hosts.items()}}
    s["charts"] = draft_chart(s, run_dir)
    return s


# --- the choice kept for the deploys, and what a deploy's record says of it -----------------------

CHOICES = "draft_choices"  # under the reports root: one kept choice per fingerprint
APPLY = (
    "apply: set it in host data, then roll it out the ordinary way (specdeploy rollout INVENTORY "
    "deploys/serve.py); each host's deployment record then keeps this choice (draft_choice)"
)
# what makes the deployed speculative_config the recommended one
FOLLOWED_KEYS = ("method", "model", "revision", "num_speculative_tokens", "quantization")


def choice_fingerprint(cfg: ServeConfig, hardware: dict) -> dict:
    """What a draft choice depends on, and so what a deploy must match to record it: the schedule
    proof's fingerprint (release, target, workload with its load levels, request set, hardware)
    without the draft and the speculative config, which are what it chooses."""
    out = proof_fingerprint(cfg, hardware)
    return {key: v for key, v in out.items() if key not in ("draft", "speculative_config")}


def keep_choices(run_dir: Path, summary: dict) -> list[Path]:
    """After the report (flows/measure.py): each host's choice kept as <reports root>/draft_choices/
    <key>.json with the fingerprint its conditions carry (a later choice of the same fingerprint
    replaces it), for the serve deploy's record (steps/draft_choice.py)."""
    kept = []
    for name, h in (summary.get("hosts") or {}).items():
        fingerprint = h.get("choice_fingerprint")
        if not fingerprint:
            continue
        entry = {"key": proof_key(fingerprint), "fingerprint": fingerprint,
                 "run": summary.get("run"), "measured_on": name,
                 **{key: h[key] for key in ("finished_at", "alpha", "candidates", "pairs",
                                            "decision", "speculative_config")},
                 **({"levels": h["levels"]} if "levels" in h else {})}  # fmt: skip
        path = Path(run_dir).parent / CHOICES / f"{entry['key']}.json"
        if keep_entry(path, entry):
            kept.append(path)
    return kept


def follows(choice: dict, speculative_config: dict | None) -> bool:
    """Does a server with `speculative_config` (None: the baseline) serve what `choice` (a kept
    one) recommends: its draft at its k, or speculation off."""
    want = choice.get("speculative_config")
    if want is None or speculative_config is None:
        return want is None and speculative_config is None
    return all(want.get(key) == speculative_config.get(key) for key in FOLLOWED_KEYS)


def _size(n: int | None) -> str:
    if not n:
        return "-"
    return f"{n / (1 << 30):.2f} GiB" if n >= (1 << 30) / 10 else f"{n / (1 << 20):.1f} MiB"


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def _kv(c: dict) -> str:
    if c.get("kv_tokens_taken") is None:
        return "-"
    return f"{c['kv_tokens_taken']} ({c.get('max_sequences')})"


def draft_markdown(s: dict) -> str:
    lines = [f"# Which draft: {s['run']}", ""]
    for name, h in s["hosts"].items():
        d = h["decision"]
        lines += [f"## {name}", "", f"**{d['verdict']}** (alpha {d['alpha']:g}; {d['rule']})", "",
                  "| candidate | refused | acceptance by position | predicted best k | predicted "
                  "TPOT ms | proven k | measured TPOT ms | KV tokens it takes (sequences left) | "
                  "download |",
                  "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
        for c in h["candidates"]:
            rates = ", ".join(f"{a:.2f}" for a in c.get("per_position_acceptance") or []) or "-"
            refused = "; ".join(c.get("refused") or []) or "no"
            lines.append(
                f"| {c['name']} | {refused} | {rates} | {c.get('best_k') or '-'} | "
                f"{_ms(c.get('predicted_tpot_ms'))} | {c.get('proven_k') or '-'} | "
                f"{_ms(c.get('measured_tpot_ms'))} | {_kv(c)} | "
                f"{_size(c.get('download_bytes'))} |"
            )
        lines += [""] if d.get("levels") else []
        for c, verdict in (d.get("levels") or {}).items():
            lines.append(f"- at concurrency {c}: {verdict}")
        if d.get("levels"):
            lines += ["", "The table shows the lowest load level; summary.json has every level.",
                      ""]  # fmt: skip
        base = (d.get("baseline") or {}).get("median")
        lines += ["", f"Baseline median TPOT: {_ms(base)} ms. Host data: `{h['host_data_change']}`",
                  ""]  # fmt: skip
        if d["recommended"] is not None:
            lines += [f"To {APPLY}.", ""]
    lines += [f"![TPOT by k per candidate]({c})" for c in s.get("charts", [])]
    return "\n".join(lines)


def _legend_name(c: dict) -> str:
    """A candidate as the chart's legend names it: its place and the repo's last part (two drafts
    of one organisation differ there, never in the first 28 characters of repo@sha)."""
    repo = c["name"].split("@")[0].rsplit("/", 1)[-1]
    return f"d{c.get('index', '?')} {repo[:24]}"


def draft_chart(s: dict, run_dir: Path) -> list[str]:
    """draft_tpot.png: per host, each measured candidate's predicted TPOT over k (line), its
    proven median (filled marker), the baseline's median (dashed); beside it acceptance by
    position per candidate."""
    hosts = [(n, h) for n, h in s["hosts"].items() if any(c.get("rows") for c in h["candidates"])]
    if not hosts:
        return []
    plt = _plt()
    fig, axes = plt.subplots(len(hosts), 2, figsize=(8, 3.6 * len(hosts)), squeeze=False)
    for (name, h), (tpot_ax, acc_ax) in zip(hosts, axes, strict=True):
        for ci, c in enumerate(x for x in h["candidates"] if x.get("rows")):
            color = f"C{ci}"
            rows = [r for r in c["rows"] if r.get("tpot_ms") is not None]
            label = f"{_legend_name(c)} predicted"
            tpot_ax.plot([r["k"] for r in rows], [r["tpot_ms"] for r in rows], marker=".",
                         linestyle="--", color=color, label=label)  # fmt: skip
            if c.get("measured_tpot_ms") is not None:
                tpot_ax.plot([c["proven_k"]], [c["measured_tpot_ms"]], "o", markersize=9,
                             color=color, label=f"{_legend_name(c)} proven median")  # fmt: skip
            rates = c.get("per_position_acceptance") or []
            acc_ax.plot(range(1, len(rates) + 1), rates, marker="o", color=color,
                        label=_legend_name(c))  # fmt: skip
        base = (h["decision"].get("baseline") or {}).get("median")
        if base is not None:
            tpot_ax.axhline(base, color="gray", linestyle=":", label="baseline median")
        tpot_ax.set_xlabel("num_speculative_tokens (k)", fontsize=9)
        tpot_ax.set_ylabel("TPOT (ms)", fontsize=9)
        tpot_ax.set_title(f"{name}: TPOT by k per candidate", fontsize=9)
        acc_ax.set_xlabel("draft position", fontsize=9)
        acc_ax.set_ylabel("share accepted", fontsize=9)
        acc_ax.set_ylim(0, 1)
        acc_ax.xaxis.get_major_locator().set_params(integer=True)  # positions 1, 2, ...
        acc_ax.set_title("acceptance by position (pin run at the largest k)", fontsize=9)
        for ax in (tpot_ax, acc_ax):
            ax.tick_params(labelsize=SMALLEST_PT + 1)
            ax.legend(fontsize=SMALLEST_PT)
            ax.grid(alpha=0.3)
    return [_save(fig, run_dir, "draft_tpot.png")]
