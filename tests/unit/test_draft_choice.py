"""Which draft, at which k (deploys/choose_draft.py): the schema of draft_candidates, each refusal
by name before any download, and the pure decision replayed on per-position acceptance, where a
different request set's evidence changes the recommendation."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from specdeploy.checks.draft_candidates import check_candidates
from specdeploy.config.schema import DraftCandidate, config_from_data
from specdeploy.decide import draft_rule as rule
from specdeploy.releases.capabilities import release_of

from .draft_fixtures import pin_runs, proving_runs, true_tpot
from .test_preflight import DRAFT, H200, RAM, TARGET, gpus, model

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


# --- the decision, replayed ------------------------------------------------------------------------


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
