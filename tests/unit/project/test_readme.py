"""The README is the first five minutes (issue 40): at most 100 lines, the two commands in its
first 10, the operator's three, a host-data example `specdeploy check` accepts, and links that all
resolve (a file of the repository; a page's anchor where one is named)."""

from __future__ import annotations

import re
from pathlib import Path

from specdeploy.checks import host_data
from tests.unit import REPO

README = REPO / "README.md"
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def test_at_most_100_lines_with_make_demo_and_make_test_in_the_first_10():
    lines = README.read_text().splitlines()
    assert len(lines) <= 100, f"README.md has {len(lines)} lines: move the detail into docs/"
    head = "\n".join(lines[:10])
    assert "make demo" in head and "make test" in head


def test_the_operators_three_commands():
    text = README.read_text()
    for command in (
        "specdeploy check inventories/prod.py",
        "pyinfra inventories/prod.py deploys/serve.py",
        "pytest tests/host",
    ):
        assert command in text, command


def test_its_host_data_example_passes_check():
    block = README.read_text().split("```python\n", 1)[1].split("```", 1)[0]
    namespace: dict = {}
    exec(block, namespace)  # a group_data file is Python: read it the way pyinfra does
    data = {k: v for k, v in namespace.items() if not k.startswith("__")}
    assert {"vllm_version", "target_model", "speculative_config"} <= data.keys()
    assert host_data.check_host("example", data) == []


def anchors_of(page: Path) -> set[str]:
    """The anchors a Markdown page offers: explicit ids, and its headings as mkdocs' table of
    contents slugs them (GitHub slugs these the same way)."""
    text = page.read_text()
    ids = set(re.findall(r'id="([^"]+)"', text))
    for heading in re.findall(r"^#+ (.+)$", text, re.M):
        heading = re.sub(r"<[^>]+>", "", heading).strip()
        ids.add(re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", heading).strip().lower()))
    return ids


def test_every_link_resolves():
    links = LINK.findall(README.read_text())
    local = [link for link in links if not re.match(r"[a-z]+://", link)]
    assert len(local) >= 10, local  # the README points into the manual
    for link in local:
        path, _, anchor = link.partition("#")
        target = REPO / path
        assert target.exists(), f"README links {link}: no such file"
        if anchor:
            assert anchor in anchors_of(target), f"README links {link}: no such anchor"
    assert any(link.startswith("docs/start/") for link in local)
    assert "docs/reference/host-data.md" in local
