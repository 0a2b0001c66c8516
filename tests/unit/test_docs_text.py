"""The manual's pages as text, without building the site (fast): every page of docs/, the README
and CONTRIBUTING.md (which develop/architecture.md includes).

- No list renders as run-on text: Python-Markdown (the manual's renderer) starts a list only after a
  blank line, so a list written straight under a paragraph line becomes part of that paragraph. The
  pages are rendered here by Python-Markdown with the extensions of mkdocs.yml, and no paragraph or
  list item may hold a line that starts like a list item.
"""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
PAGES = sorted((REPO / "docs").rglob("*.md")) + [REPO / "README.md", REPO / "CONTRIBUTING.md"]


def page_id(page: Path) -> str:
    return page.relative_to(REPO).as_posix()


# --- lists that render as run-on text -------------------------------------------------------------


def render(text: str) -> str:
    """The page's HTML as mkdocs renders its Markdown: the extensions and settings of mkdocs.yml
    (snippets read from the repository root, as `mkdocs build` run there does)."""
    markdown = pytest.importorskip("markdown")  # a dependency of mkdocs: the docs extra
    names, settings = [], {}
    for entry in yaml.safe_load((REPO / "mkdocs.yml").read_text())["markdown_extensions"]:
        if isinstance(entry, dict):
            ((name, config),) = entry.items()
            settings[name] = dict(config or {})
        else:
            name = entry
        names.append(name)
    if "pymdownx.snippets" in settings:
        settings["pymdownx.snippets"]["base_path"] = [str(REPO)]
    return markdown.markdown(text, extensions=names, extension_configs=settings)


# A bullet, or the first item of an ordered list ("1." / "1)"): a line of prose may well begin
# with "100." or "3)" after a line break, but a list written without its blank line has a first
# item, and a bullet list has nothing else.
LIST_ITEM = re.compile(r"^\s*(?:[-*+]|1[.)])\s+\S")


class _RunOn(HTMLParser):
    """Every line after the first of a <p> or <li> that starts like a list item: a list the
    renderer took for the paragraph's (or the item's) continuation."""

    def __init__(self):
        super().__init__()
        self.open: list[list[str]] = []
        self.found: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag in ("p", "li"):
            self.open.append([])

    def handle_endtag(self, tag):
        if tag in ("p", "li") and self.open:
            lines = "".join(self.open.pop()).split("\n")
            self.found += [line.strip() for line in lines[1:] if LIST_ITEM.match(line)]

    def handle_data(self, data):
        for text in self.open:
            text.append(data)


def run_on_lists(text: str) -> list[str]:
    parser = _RunOn()
    parser.feed(render(text))
    return parser.found


def test_a_list_straight_under_a_paragraph_is_found():
    """The check itself: the pattern is found, the same list after a blank line is not."""
    prose = "Disk, for the model:\n- under `state_dir/hf`, the files\n- under `install_dir`\n"
    assert run_on_lists(prose) == ["- under state_dir/hf, the files", "- under install_dir"]
    assert run_on_lists(prose.replace(":\n", ":\n\n")) == []
    assert run_on_lists("Steps:\n1. install\n2. deploy\n") == ["1. install"]
    assert run_on_lists("a line length of\n100. Docstrings say why.\n") == []
    assert run_on_lists("```sh\nmake test\n- not a list\n```\n") == []


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_no_list_renders_as_run_on_text(page):
    found = run_on_lists(page.read_text())
    assert not found, (
        f"{page_id(page)}: a list straight under a paragraph line renders as that paragraph's "
        f"text (Python-Markdown needs a blank line before a list): {found}"
    )
