"""The tiny-model generator is deterministic, idempotent and self-healing.

Needs the generator interpreter (torch/transformers/tokenizers), by default
``$SPECDEPLOY_CACHE/venv-vllm/bin/python``; skipped when it is absent, failed under CI
(tests/tools.py).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from specdeploy_sandbox import models

PY = Path(models._python(models.cache_dir_default()))

pytestmark = [
    pytest.mark.needs_tool(str(PY), hint="the sandbox's model venv: control_venv.ensure_training"),
    pytest.mark.timeout(300),
]


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    cache = tmp_path_factory.mktemp("cache")
    return cache, models.ensure(cache, python=str(PY))


def test_layout_and_revisions(generated):
    cache, manifest = generated
    assert set(manifest["repos"]) == {models.TARGET, models.DRAFT, models.DRAFT_OTHERVOCAB}
    target = manifest["repos"][models.TARGET]
    assert list(target["revisions"]) == ["v1", "v2"] and target["main"] == target["revisions"]["v2"]
    repo = models.hub_dir(cache) / "models" / models.TARGET

    def show(rev, f):
        return subprocess.run(
            ["git", "-C", str(repo), "show", f"{rev}:{f}"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout

    assert json.loads(show("v1", "config.json"))["max_position_embeddings"] == 1024
    assert json.loads(show("v2", "config.json"))["max_position_embeddings"] == 2048
    assert "revision: v1" in show("v1", "README.md") and "revision: v2" in show("v2", "README.md")
    cfg = json.loads(show("v2", "config.json"))
    assert (
        cfg["num_hidden_layers"],
        cfg["hidden_size"],
        cfg["num_attention_heads"],
        cfg["num_key_value_heads"],
        cfg["intermediate_size"],
    ) == (4, 256, 4, 2, 512)
    assert cfg["dtype"] == "float32" and cfg["architectures"] == ["LlamaForCausalLM"]
    for repo_id, info in manifest["repos"].items():
        files = info["files"][list(info["revisions"])[-1]]
        assert {
            "model.safetensors",
            "config.json",
            "tokenizer.json",
            "tokenizer_config.json",
        } <= set(files)
        size = (models.hub_dir(cache) / "models" / repo_id / "model.safetensors").stat().st_size
        assert size < 20 * 2**20, (repo_id, size)
    draft_cfg = json.loads(
        (models.hub_dir(cache) / "models" / models.DRAFT / "config.json").read_text()
    )
    assert (draft_cfg["num_hidden_layers"], draft_cfg["hidden_size"]) == (1, 128)
    assert manifest["repos"][models.DRAFT]["vocab_size"] == target["vocab_size"]
    assert manifest["repos"][models.DRAFT_OTHERVOCAB]["vocab_size"] != target["vocab_size"]


def test_deterministic_across_runs(generated, tmp_path):
    _, first = generated
    second = models.ensure(tmp_path, python=str(PY))
    for repo_id in first["repos"]:
        assert second["repos"][repo_id]["revisions"] == first["repos"][repo_id]["revisions"], (
            repo_id
        )


def test_ensure_is_a_noop_when_current(generated):
    cache, manifest = generated
    before = models.manifest_path(cache).stat().st_mtime_ns
    assert (
        models.ensure(cache, python="/nonexistent/python") == manifest
    )  # would fail if it regenerated
    assert models.manifest_path(cache).stat().st_mtime_ns == before


def test_ensure_repairs_a_damaged_repo(generated):
    cache, manifest = generated
    repo = models.hub_dir(cache) / "models" / models.TARGET
    subprocess.run(["git", "-C", str(repo), "tag", "-d", "v1"], check=True, capture_output=True)
    repaired = models.ensure(cache, python=str(PY))
    assert (
        repaired["repos"][models.TARGET]["revisions"]
        == manifest["repos"][models.TARGET]["revisions"]
    )


def test_trained_set_recipe_runs_and_pads_without_changing_the_function(tmp_path, monkeypatch):
    """The trained set's whole recipe with 2 steps per model (the real one trains for minutes):
    three repos sharing one vocabulary, the target padded with zero-output layers (the build
    asserts bit-identical logits), model cards that say how each was made."""
    import copy

    spec = copy.deepcopy(models.TRAINED_SPEC)
    for rspec in spec["repos"].values():
        rspec["train"].update(steps=2, warmup_steps=1)
    monkeypatch.setitem(models.MODEL_SETS, "trained", spec)
    manifest = models.ensure(tmp_path, python=str(PY), model_set="trained")
    repos = manifest["repos"]
    assert {r["role"] for r in repos.values()} == {
        "trained-target",
        "trained-draft",
        "trained-draft-poor",
    }
    assert len({r["vocab_size"] for r in repos.values()}) == 1
    hub = models.hub_dir(tmp_path, "trained") / "models"
    target = spec["repos"][models.TRAINED_TARGET]
    config = json.loads((hub / models.TRAINED_TARGET / "config.json").read_text())
    assert config["num_hidden_layers"] == (
        target["arch"]["num_hidden_layers"] + target["identity_layers"]
    )
    card = (hub / models.TRAINED_TARGET / "README.md").read_text()
    assert "extra decoder layers" in card and "o_proj and MLP down_proj weights are zero" in card
    poor = (hub / models.TRAINED_DRAFT_POOR / "README.md").read_text()
    assert "common-licenses" in poor and "agreement with the target" in poor
    assert manifest["training"][models.TRAINED_DRAFT]["steps"] == 2
    assert models.hub_dir(tmp_path) != models.hub_dir(tmp_path, "trained")  # sets live apart
