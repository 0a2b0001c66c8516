"""docs/reference/releases.md is the release matrix generated from the packaged tables: the
committed page equals the generator's output (regenerate: python -m specdeploy.docs.reference)."""

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
