"""Which draft, at which k (deploys/choose_draft.py): the schema of draft_candidates, each refusal
by name before any download, and the pure decision replayed on per-position acceptance, where a
different request set's evidence changes the recommendation."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from pydantic import ValidationError

from specdeploy.checks.draft_candidates import CandidateCheck, check_candidates
from specdeploy.checks.model_cards import card_from_listing
from specdeploy.config.problems import ConfigError, Problem
from specdeploy.config.schema import config_from_data
from specdeploy.decide import draft_rule as rule
from specdeploy.decide.load_rule import split_label
from specdeploy.measure import draft_flow
from specdeploy.measure.plans import draft_conditions
from specdeploy.releases.capabilities import release_of
from specdeploy.report import summary as report
from tests.unit.checks.test_preflight import DRAFT, H200, RAM, TARGET, gpus, model

from .draft_fixtures import ACCEPTANCE, bench, pin_runs, proving_runs, true_tpot

KS = [1, 2, 3, 4, 5]
NAMES = ["trained", "bigger", "poor", "ngram"]
GIB = 1 << 30


# --- the schema -----------------------------------------------------------------------------------


def test_candidates_in_host_data(valid_data):
    cfg = config_from_data({**valid_data, "draft_candidates": [
        {"repo": "Qwen/Qwen3-0.6B", "revision": "a" * 40},
        {"repo": "Qwen/Qwen3-1.7B", "quantization": "fp8"},
        {"repo": "ngram"},
    ]})  # fmt: skip
    names = [c.name for c in cfg.draft_candidates]
    assert names == [f"Qwen/Qwen3-0.6B@{'a' * 40}", "Qwen/Qwen3-1.7B@main (fp8)", "ngram"]
    spec = cfg.draft_candidates[1].speculative_config(cfg.speculative_config, 3)
    assert spec == {"method": "draft_model", "model": "Qwen/Qwen3-1.7B", "revision": "main",
                    "num_speculative_tokens": 3, "quantization": "fp8"}  # fmt: skip
    assert cfg.draft_candidates[2].speculative_config(cfg.speculative_config, 4) == {
        "method": "ngram", "num_speculative_tokens": 4}  # fmt: skip


@pytest.mark.parametrize(
    "bad", [{"repo": "Qwen/Qwen3-0.6B", "revisoin": "main"}, {"revision": "main"}, {"repo": ""}]
)
def test_a_wrong_candidate_is_refused_by_the_schema(valid_data, bad):
    with pytest.raises(ValidationError):
        config_from_data({**valid_data, "draft_candidates": [bad]})


# --- refusals, each by name, before any download --------------------------------------------------

OTHER_VOCAB = model("org/other-vocab-draft", vocab=32000, tokenizer=32000, layers=16,
                    weights=GIB, hidden=1024, intermediate=3072)  # fmt: skip
HUGE = model("org/huge-draft", layers=64, weights=120 * GIB, hidden=5120, intermediate=25600)


def checked(valid_data, candidates, version="0.32.0", accelerators=H200):
    data = {**valid_data, "vllm_version": version, "draft_candidates": candidates}
    cfg = config_from_data(data)
    cards = {"Qwen/Qwen3-0.6B": {**DRAFT, "download_bytes": int(1.2 * GIB)},
             "org/other-vocab-draft": OTHER_VOCAB, "org/huge-draft": HUGE}  # fmt: skip
    asked = []

    def card_of(candidate):
        asked.append(candidate.repo)
        return cards.get(candidate.repo)

    found = check_candidates("h1", cfg, release_of(version), k=5, target=TARGET, card_of=card_of,
                             accelerators=accelerators, ram=RAM)  # fmt: skip
    return {c.name.split("@")[0]: c for c in found}, asked


def test_each_refusal_names_its_candidate(valid_data):
    found, asked = checked(valid_data, [
        {"repo": "Qwen/Qwen3-0.6B"}, {"repo": "org/other-vocab-draft"}, {"repo": "org/huge-draft"},
        {"repo": "org/missing"}, {"repo": "ngram"},
    ])  # fmt: skip
    assert not found["Qwen/Qwen3-0.6B"].refused and not found["ngram"].refused
    assert found["Qwen/Qwen3-0.6B"].download_bytes == int(1.2 * GIB)
    assert found["Qwen/Qwen3-0.6B"].memory["kv_tokens"] > 0  # the KV it leaves, for the report
    taken = found["Qwen/Qwen3-0.6B"].as_json()["kv_tokens_taken"]
    assert taken > 0 and found["ngram"].as_json()["kv_tokens_taken"] == 0  # no weights, no KV
    vocab = found["org/other-vocab-draft"].refusals
    assert vocab and "draft_candidates[1] (org/other-vocab-draft@main)" == vocab[0].field
    assert "vocab_size 32000" in vocab[0].what
    huge = " ".join(p.what for p in found["org/huge-draft"].refusals)
    assert found["org/huge-draft"].refusals[0].field.startswith("draft_candidates[2]")
    assert "KV" in huge or "memory" in huge
    assert "no config.json" in found["org/missing"].refusals[0].what
    # ngram has no weights: no card is asked for it
    assert "ngram" not in asked


def test_a_candidate_the_release_cannot_run_is_refused_before_its_card_is_read(valid_data):
    # use_heterogeneous_vocab: a key of 0.25-0.33; 0.34.0 dropped it
    cand = {"repo": "org/other-vocab-draft", "use_heterogeneous_vocab": True}
    found, asked = checked(valid_data, [cand], version="0.34.0")
    refusal = found["org/other-vocab-draft"].refusals
    assert refusal and refusal[0].field.startswith("draft_candidates[0] (org/other-vocab-draft")
    assert "use_heterogeneous_vocab" in refusal[0].field
    assert asked == []  # refused before anything is read of it, let alone downloaded
    # on a release that keeps the key it is measured, its vocabulary mapped
    found, asked = checked(valid_data, [cand], version="0.32.0")
    assert not found["org/other-vocab-draft"].refused
    assert found["org/other-vocab-draft"].vocab["shared"] is False


def test_memory_refusal_depends_on_the_gpu(valid_data):
    small = gpus(total=20 * GIB)
    found, _ = checked(valid_data, [{"repo": "Qwen/Qwen3-0.6B"}], accelerators=small)
    assert found["Qwen/Qwen3-0.6B"].refused  # 8B + 0.6B at bf16 in 20 GiB
    found, _ = checked(valid_data, [{"repo": "Qwen/Qwen3-0.6B"}])
    assert not found["Qwen/Qwen3-0.6B"].refused


# --- the decision, replayed -----------------------------------------------------------------------


def replay(request_set: str, rounds: int = 4) -> dict:
    """The flow's decisions over fixed runs: pin, curves, the two pairs, the proving rounds."""
    pins = pin_runs(NAMES, request_set)
    pairs = rule.best_pairs(rule.curves(pins, KS))
    arms = {rule.arm_label(i, k): (NAMES[i], k) for i, k in pairs}
    runs = pins + proving_runs(arms, request_set, rounds, len(pins))
    candidates = [{"name": n, "refused": []} for n in NAMES]
    return rule.draft_choice(candidates, runs, ks=KS, max_runs=8, alpha=0.05)


def test_acceptance_by_position_gives_each_candidate_its_curve():
    evidence = rule.curves(pin_runs(NAMES, "chat"), KS)
    assert evidence[0]["per_position_acceptance"] == pytest.approx([0.70, 0.52, 0.40, 0.30, 0.22])
    # the poor draft is predicted slower than the baseline at every k but the first
    poor = {r["k"]: r["tpot_ms"] for r in evidence[2]["rows"]}
    assert all(poor[k] > poor[0] for k in (2, 3, 4, 5))
    # the predicted best k of each candidate is as good as its true best, within 6 % (a flat
    # curve's minimum may sit at another k: one speculative run gives the linear step model,
    # which spreads the cost of turning speculation on over every k and so leans to small k)
    for i, name in enumerate(NAMES):
        truth = min(true_tpot(name, "chat", k) for k in KS)
        assert true_tpot(name, "chat", evidence[i]["best_k"]) <= truth * 1.06, name


def test_the_choice_follows_the_traffic_not_the_name():
    code, chat = replay("code"), replay("chat")
    assert code["decision"]["recommended"]["name"] == "ngram"  # repetitive: prompt lookup wins
    assert chat["decision"]["recommended"]["name"] == "trained"
    assert [NAMES[i] for i, _ in code["pairs"]] == ["ngram", "trained"]
    assert [NAMES[i] for i, _ in chat["pairs"]] == ["trained", "bigger"]
    # the poor draft is measured (pinned) but never proven
    poor = chat["candidates"][2]
    assert poor["per_position_acceptance"][0] < 0.1 and poor["proven_k"] is None


def test_off_when_no_pair_beats_the_baseline():
    pins = pin_runs(["poor"], "chat")
    pairs = rule.best_pairs(rule.curves(pins, KS))
    arms = {rule.arm_label(i, k): ("poor", k) for i, k in pairs}
    runs = pins + proving_runs(arms, "chat", 8, len(pins))
    out = rule.draft_choice([{"name": "poor", "refused": []}], runs, ks=KS, max_runs=8,
                            alpha=0.05)  # fmt: skip
    assert out["decision"]["recommended"] is None
    assert out["decision"]["verdict"].startswith(rule.OFF)


def test_the_proof_stops_at_a_look_and_is_exact():
    # 3 rounds: not yet a look at alpha / 2 (the first one-sided look is at 4 + 4)
    tpot = {"baseline": [20.0, 20.1, 19.9], "d0-k4": [10.0, 10.2, 9.9]}
    assert rule.next_step(tpot, ["d0-k4"], max_runs=8, alpha=0.05)["action"] == "add a round"
    tpot = {a: v + [v[0]] for a, v in tpot.items()}
    step = rule.next_step(tpot, ["d0-k4"], max_runs=8, alpha=0.05)
    assert step["action"] == "decide now"
    assert step["tests"]["d0-k4"]["p_faster"] == pytest.approx(1 / 70)
    # the same runs with two pairs: each at alpha / 2, 1/70 still passes the first look
    tpot["d1-k2"] = [20.0, 20.0, 20.1, 19.9]
    step = rule.next_step(tpot, ["d0-k4", "d1-k2"], max_runs=8, alpha=0.05)
    assert step["action"] == "decide now"


def test_undecided_until_the_budget_then_off():
    same = {"baseline": [20.0, 20.2, 19.8, 20.1], "d0-k3": [20.1, 19.9, 20.0, 20.2]}
    assert rule.next_step(same, ["d0-k3"], max_runs=8, alpha=0.05)["action"] == "add a round"


# --- the flow over a played host, and its report rebuilt from the raw files -----------------------


class PlayedHost:
    """Plays the harness: each step of the plan becomes NN-<label>.json in out_dir, its TPOT from
    the fixtures' model on `request_set`."""

    def __init__(self, out_dir, names, request_set):
        self.out_dir, self.names, self.request_set = out_dir, names, request_set
        self.index = 0

    def run(self, plan):
        for arm, warm in plan:
            k = arm.speculative_config["num_speculative_tokens"] if arm.speculative else 0
            parsed = rule.parse_label(arm.label)
            name = self.names[parsed[1]] if parsed else ""
            rates = ACCEPTANCE[self.request_set][name] if parsed else None
            tpot = true_tpot(name, self.request_set, k) * (1 + 0.01 * ((self.index % 3) - 1))
            result = bench(arm.label, self.index, tpot, k, rates)
            result["specdeploy"] |= {"warmup": warm, "speculative_config": arm.speculative_config}
            path = self.out_dir / f"{self.index:02d}-{arm.label}.json"
            path.write_text(json.dumps(result))
            self.index += 1


def test_the_flow_refuses_by_name_proves_two_pairs_and_the_report_replays_it(
    valid_data, tmp_path, monkeypatch
):
    monkeypatch.setattr(draft_flow, "logger", SimpleNamespace(info=lambda _: None))
    monkeypatch.setattr(draft_flow, "host", SimpleNamespace(print_prefix="h1: "))
    cfg = config_from_data({**valid_data, "draft_candidates": [
        {"repo": "org/trained"}, {"repo": "org/poor"}, {"repo": "org/other-vocab"}]})  # fmt: skip
    other = Problem("h1", "draft_candidates[2] (org/other-vocab@main)", "vocab_size 3072", "drop")
    checks = (
        CandidateCheck(0, cfg.draft_candidates[0], download_bytes=5 << 20),
        CandidateCheck(1, cfg.draft_candidates[1], download_bytes=3 << 20),
        CandidateCheck(2, cfg.draft_candidates[2], refusals=[other]),
    )
    out = tmp_path / "raw" / "h1"
    out.mkdir(parents=True)
    plan = draft_flow.DraftPlan(cfg, checks, tuple(KS), 1, 8, out)
    PlayedHost(out, ["trained", "poor", "other"], "chat").run(plan)
    labels = [p.name.split("-", 1)[1][:-5] for p in sorted(out.glob("[0-9][0-9]-*.json"))]
    assert labels[:4] == ["p-baseline", "p-baseline", "p-d0-k5", "p-d1-k5"]  # warm-up, pins
    assert "p-d2-k5" not in labels  # the refused candidate never ran
    assert set(labels[4:]) == {"baseline", "d0-k4", "d1-k1"} and len(labels[4:]) == 12
    recorded = json.loads((out / draft_flow.DRAFT_CHOICE).read_text())
    assert recorded["decision"]["recommended"] == {"candidate": 0, "name": "org/trained@main",
                                                   "k": 4}  # fmt: skip
    cond = {**draft_conditions(cfg, plan), "finished_at": "x"}  # as measure_plan writes it
    (out / "conditions.json").write_text(json.dumps(cond))
    s = report.write(tmp_path, "choose_draft")
    h = s["hosts"]["h1"]
    assert h["decision"] == recorded["decision"]  # the report replays the flow's decision
    assert "num_speculative_tokens': 4" in h["host_data_change"]
    assert "'model': 'org/trained'" in h["host_data_change"]
    md = (tmp_path / "summary.md").read_text()
    assert "draft_candidates[2] (org/other-vocab@main): vocab_size 3072" in md
    assert "5.0 MiB" in md and s["charts"] == ["draft_tpot.png"]
    assert (tmp_path / "draft_tpot.png").stat().st_size > 10_000


def test_a_card_is_read_by_the_snapshot_parser_and_sized_by_what_the_download_fetches(tmp_path):
    sha = "b" * 40
    snap = tmp_path / "hub" / "models--org--d" / "snapshots" / sha
    snap.mkdir(parents=True)
    config = {"vocab_size": 1024, "num_hidden_layers": 1, "num_attention_heads": 2,
              "num_key_value_heads": 1, "hidden_size": 64}  # fmt: skip
    (snap / "config.json").write_text(json.dumps(config))
    (snap / "tokenizer.json").write_text(json.dumps({"model": {"vocab": {"a": 0, "b": 1}}}))
    (snap / ".specdeploy-complete").write_text("")
    files = {"config.json": 300, "tokenizer.json": 50, "model.safetensors": 4000,
             "original/consolidated.pth": 9000, "README.md": 10}  # fmt: skip
    card = card_from_listing("org/d", {"home": str(tmp_path), "sha": sha, "files": files})
    assert card["vocab_size"] == 1024 and card["tokenizer_vocab_size"] == 2
    assert card["head_dim"] == 32 and card["weight_bytes"] == 4000
    assert card["download_bytes"] == 4350  # never original/ or the README


# --- at the workload's load levels ----------------------------------------------------------------

LEVELS = [1, 16]


def tpot_at(name: str, request_set: str, k: int, c: int, slope: float) -> float:
    """The fixtures' TPOT at concurrency c: every step slower under load, and each draft token
    `slope` of a step more per further sequence (a busy batch leaves speculation less room)."""
    load = 1 + 0.05 * (c - 1)
    return true_tpot(name, request_set, k) * load * (1 + slope * (c - 1) * k if k else 1)


class PlayedLevels(PlayedHost):
    """PlayedHost at load levels: each step's label names its level (`<arm>@c<concurrency>`)."""

    def __init__(self, out_dir, names, request_set, slope):
        super().__init__(out_dir, names, request_set)
        self.slope, self.steps = slope, []

    def run(self, plan):
        for arm, warm, same_server in plan:
            self.steps.append((arm.label, warm, same_server))
            k = arm.speculative_config["num_speculative_tokens"] if arm.speculative else 0
            label, c = split_label(arm.label)
            parsed = rule.parse_label(label)
            name = self.names[parsed[1]] if parsed else ""
            rates = ACCEPTANCE[self.request_set][name] if parsed else None
            tpot = tpot_at(name, self.request_set, k, c, self.slope)
            tpot *= 1 + 0.01 * ((self.index % 3) - 1)
            result = bench(arm.label, self.index, tpot, k, rates)
            result["specdeploy"] |= {"warmup": warm, "speculative_config": arm.speculative_config}
            (self.out_dir / f"{self.index:02d}-{arm.label}.json").write_text(json.dumps(result))
            self.index += 1


def chosen_at_levels(valid_data, tmp_path, monkeypatch, slope):
    monkeypatch.setattr(draft_flow, "logger", SimpleNamespace(info=lambda _: None))
    monkeypatch.setattr(draft_flow, "host", SimpleNamespace(print_prefix="h1: "))
    workload = {**valid_data["workload"], "load_levels": LEVELS}
    cfg = config_from_data({**valid_data, "workload": workload, "max_num_seqs": 16,
                            "draft_candidates": [{"repo": "org/trained"}, {"repo": "org/poor"},
                                                 {"repo": "org/other-vocab"}]})  # fmt: skip
    other = Problem("h1", "draft_candidates[2] (org/other-vocab@main)", "vocab_size 3072", "drop")
    c = cfg.draft_candidates
    checks = (CandidateCheck(0, c[0]), CandidateCheck(1, c[1]),
              CandidateCheck(2, c[2], refusals=[other]))  # fmt: skip
    out = tmp_path / "raw" / "h1"
    out.mkdir(parents=True)
    plan = draft_flow.DraftPlan(cfg, checks, tuple(KS), 1, 8, out)
    played = PlayedLevels(out, ["trained", "poor", "other"], "chat", slope)
    played.run(plan)
    (out / "conditions.json").write_text(json.dumps({**draft_conditions(cfg, plan),
                                                     "finished_at": "x"}))  # fmt: skip
    recorded = json.loads((out / draft_flow.DRAFT_CHOICE).read_text())
    return played, recorded, report.write(tmp_path, "choose_draft")["hosts"]["h1"]


def test_at_load_levels_each_level_is_pinned_and_proven_and_has_its_verdict(
    valid_data, tmp_path, monkeypatch
):
    """Under load the draft stops paying at concurrency 16: the trained draft wins at 1, nothing
    at 16, so the choice is "off", with each level's verdict (without levels, the same runs at
    concurrency 1 recommend the trained draft)."""
    played, recorded, h = chosen_at_levels(valid_data, tmp_path, monkeypatch, slope=0.05)
    steps = played.steps
    # the load proof's visits: one fresh server per arm, its higher level on the same server
    assert steps[:5] == [("p-baseline@c1", True, False), ("p-baseline@c1", False, False),
                         ("p-baseline@c16", False, True), ("p-d0-k5@c1", False, False),
                         ("p-d0-k5@c16", False, True)]  # fmt: skip
    assert not any("d2-" in label for label, *_ in steps)  # refused: never measured
    proving = [label for label, warm, _ in steps[7:]]
    assert {split_label(x)[1] for x in proving} == set(LEVELS)
    levels = recorded["levels"]
    assert levels["1"]["decision"]["recommended"]["name"] == "org/trained@main"
    assert levels["16"]["decision"]["recommended"] is None
    assert levels["1"]["decision"]["alpha"] == pytest.approx(0.025)  # alpha / levels
    d = recorded["decision"]
    assert d["recommended"] is None and d["verdict"].startswith(rule.OFF)
    assert "c1: org/trained@main at k" in d["verdict"] and "c16: off" in d["verdict"]
    # each candidate's evidence at each level
    assert set(recorded["candidates"][0]["levels"]) == {"1", "16"}
    # the report replays it from the raw files, and the record replays through the rules
    assert h["decision"] == d and h["levels"] == levels
    again = rule.replay(recorded)
    assert again["decision"] == d and again["levels"] == levels
    md = (tmp_path / "summary.md").read_text()
    assert "at concurrency 16: off" in md


def test_at_load_levels_a_draft_that_pays_at_every_level_is_recommended(
    valid_data, tmp_path, monkeypatch
):
    _, recorded, h = chosen_at_levels(valid_data, tmp_path, monkeypatch, slope=0.0)
    rec = recorded["decision"]["recommended"]
    assert rec["name"] == "org/trained@main"
    assert all(lv["decision"]["recommended"]["name"] == rec["name"]
               for lv in recorded["levels"].values())  # fmt: skip
    assert f"'num_speculative_tokens': {rec['k']}" in h["host_data_change"]


def test_a_budget_that_can_never_decide_is_refused_before_anything_runs(valid_data, monkeypatch):
    monkeypatch.setattr(draft_flow, "host", SimpleNamespace(name="h1"))
    two = [{"repo": "org/a"}, {"repo": "org/b"}]
    cfg = config_from_data({**valid_data, "draft_candidates": two})
    draft_flow.reachable(cfg, 4)  # 1/70 <= 0.05 / 2 at 4 + 4
    workload = {**valid_data["workload"], "load_levels": [1, 4, 16]}
    cfg = config_from_data({**valid_data, "workload": workload, "max_num_seqs": 16,
                            "draft_candidates": two})  # fmt: skip
    with pytest.raises(ConfigError) as refused:  # 0.05 / 3 / 2 needs 5 + 5
        draft_flow.reachable(cfg, 4)
    problem = refused.value.problems[0]
    assert problem.host == "h1" and problem.field == "compare_max_repeats"
    assert "over 3 load levels" in problem.what
    draft_flow.reachable(cfg, 5)


def test_the_chart_tells_two_drafts_of_one_organisation_apart(tmp_path, monkeypatch):
    """The sandbox's trained and poor drafts share their first 28 characters of repo@sha: the
    legend names each by its place and its repo's last part."""
    from specdeploy.report import draft_summary

    drawn = []
    monkeypatch.setattr(
        draft_summary, "_save", lambda fig, run_dir, name: drawn.append(fig) or name
    )
    rows = [{"k": k, "tpot_ms": 20.0 - k} for k in range(5)]
    candidates = [{"index": i, "name": f"specdeploy-sandbox/pycode-draft{tail}@{'a' * 40}",
                   "rows": rows, "per_position_acceptance": [0.5, 0.3]}
                  for i, tail in enumerate(["", "-poor"])]  # fmt: skip
    s = {"hosts": {"h1": {"candidates": candidates, "decision": {"baseline": {"median": 20.0}}}}}
    assert draft_summary.draft_chart(s, tmp_path) == ["draft_tpot.png"]
    (fig,) = drawn
    tpot_ax, acc_ax = fig.axes
    names = [t.get_text() for t in acc_ax.get_legend().get_texts()]
    assert names == ["d0 pycode-draft", "d1 pycode-draft-poor"]
    assert [t.get_text() for t in tpot_ax.get_legend().get_texts()] == [
        "d0 pycode-draft predicted",
        "d1 pycode-draft-poor predicted",
        "baseline median",
    ]
