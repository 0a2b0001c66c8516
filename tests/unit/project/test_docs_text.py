"""The manual's pages as text, without building the site (fast): every page of docs/, the README
and CONTRIBUTING.md (which develop/architecture.md includes).

- No list renders as run-on text: Python-Markdown (the manual's renderer) starts a list only after a
  blank line, so a list written straight under a paragraph line becomes part of that paragraph. The
  pages are rendered here by Python-Markdown with the extensions of mkdocs.yml, and no paragraph or
  list item may hold a line that starts like a list item.
- Every repository path a page names exists: in a code span (`specdeploy/render/argv.py`,
  `tests/facts/<FactClassName>/`, `memory.py`), in a link (relative to the page), or written out in
  prose (docs/reference/releases.md). What names a host's, a run's or the Hub's things instead is
  left alone, by rules written down below (`NOT_IN_THE_REPOSITORY`).
- No page speaks of how the project is built: the manual describes the product and its tests as
  they are, not the issues, rounds or sessions that made them (`BUILD_TALK`). docs/develop/ may
  describe the test tiers and what a run measured, but names no issue and no session either.
"""

from __future__ import annotations

import fnmatch
import re
import subprocess
from functools import cache
from html.parser import HTMLParser
from pathlib import Path

import pytest
import yaml

from tests.tools import need_module
from tests.unit import REPO

PAGES = sorted((REPO / "docs").rglob("*.md")) + [REPO / "README.md", REPO / "CONTRIBUTING.md"]


def page_id(page: Path) -> str:
    return page.relative_to(REPO).as_posix()


# --- lists that render as run-on text -------------------------------------------------------------


def render(text: str) -> str:
    """The page's HTML as mkdocs renders its Markdown: the extensions and settings of mkdocs.yml
    (snippets read from the repository root, as `mkdocs build` run there does)."""
    markdown = need_module("markdown", "mkdocs's renderer: pip install -e '.[docs]'")
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


# --- every path a page names exists ---------------------------------------------------------------

# Extensions that make a word without a slash a file of the repository: code and templates. A bare
# `summary.md`, `latency.png` or `rules.yml` is a file a run writes, named by what it holds.
BARE_FILES = (".py", ".j2", ".sh", ".toml")
# Extensions that make a word with a slash a path even in prose (outside code spans).
FILES = BARE_FILES + (".md", ".json", ".yml", ".yaml", ".png", ".txt", ".cfg", ".jsonl")
# First components of paths that are not the repository's: on a host (under a host-data key's
# directory, or a release's venv), written by `specdeploy monitoring` into a directory of the
# user's (`targets/`, `api-keys/`), or a Hub repository's (a model id, the folder a checkpoint
# ships). What a run writes inside the repository (`reports/`) is what .gitignore keeps out.
NOT_IN_THE_REPOSITORY = {
    "state_dir": "under the host's state_dir",
    "install_dir": "under the host's install_dir",
    "venvs": "a release's venv under install_dir",
    "targets": "the monitoring directory's scrape targets, written by `specdeploy monitoring`",
    "api-keys": "the monitoring directory's key files",
    "original": "a folder inside a Hub checkpoint",
    "Qwen": "a Hub model id",
    "specdeploy-sandbox": "a model id in the sandbox's Hub mirror",
}
PLACEHOLDER = re.compile(r"<[^<>/]+>")  # `<host>`, `<FactClassName>`: any one name
UPPER_PLACEHOLDER = re.compile(r"^[A-Z][A-Z_]*$")  # HOST/0, DIR/prometheus/, ORG--NAME: not ours
PROSE_PATH = re.compile(
    r"(?<![\w/.~$<-])((?:[\w.-]+/)+[\w.-]+(?:"
    + "|".join(re.escape(ext) for ext in FILES)
    + r"))(?![\w/])"
)


@cache
def repository() -> frozenset[str]:
    """Every file git tracks or would track (new files not yet added count), and their folders."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=REPO, capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    paths = {p for p in listed if (REPO / p).exists()}
    folders = {str(Path(p).parents[i]) for p in paths for i in range(len(Path(p).parents) - 1)}
    return frozenset(paths | folders)


def outside_code(text: str) -> str:
    """The page without its fenced blocks (commands and file contents, not names of paths)."""
    kept, fence = [], None
    for line in text.splitlines():
        marker = re.match(r"\s*(`{3,}|~{3,})", line)
        if marker and (fence is None or marker.group(1).startswith(fence)):
            fence = None if fence else marker.group(1)[:3]
            continue
        if fence is None:
            kept.append(line)
    return "\n".join(kept)


def named_paths(text: str) -> list[str]:
    """The words of a page that name a repository path: code spans that are one path, and paths
    written out in prose."""
    text = outside_code(text)
    named = []
    for span in re.findall(r"`([^`\n]+)`", text):
        if re.search(r"\s", span) or "://" in span or span[0] in "/$~\"'-":
            continue
        if "/" in span or span.endswith(BARE_FILES):  # a path, a folder (`steps/`), a module
            named.append(span)
    prose = re.sub(r"`[^`\n]+`|\]\([^)]*\)", " ", text)  # neither code spans nor link targets
    named += PROSE_PATH.findall(prose)
    return named


def linked_paths(text: str) -> list[str]:
    """The targets of a page's links and images that are not on the web or on the page itself."""
    targets = re.findall(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)", outside_code(text))
    return [t for t in targets if not re.match(r"[a-z][a-z0-9+.-]*:|#", t)]


def exists(name: str) -> bool:
    """Whether a path a page names is the repository's: the path itself, or the tail of one (a page
    may say `steps/gate.py` or `h200-0.26.0/` where its context says under which folder); a
    placeholder (`<name>`, `*`) stands for any one name; `module._name` names a module's attribute;
    a trailing `:line` or `#anchor` points inside the file."""
    name = re.sub(r"(:\d+(-\d+)?|#[^/]*)$", "", name).rstrip("/")
    name = re.sub(r"^\./", "", name)
    pattern = PLACEHOLDER.sub("*", name)
    paths = repository()
    if "*" in pattern:
        return any(fnmatch.fnmatchcase(p, pattern) or fnmatch.fnmatchcase(p, "*/" + pattern)
                   for p in paths) or ignored(name)  # fmt: skip
    if name in paths or any(p.endswith("/" + name) for p in paths):
        return True
    module = re.fullmatch(r"(.+?)\.(_?[a-z_]\w*)", name)
    if module and not name.endswith(FILES):
        source, attribute = module.group(1) + ".py", module.group(2)
        files = [p for p in paths if p == source or p.endswith("/" + source)]
        return any(
            re.search(rf"^\s*(def |class )?{attribute}\b", (REPO / p).read_text(), re.M)
            for p in files
        )
    return ignored(name)


def ignored(name: str) -> bool:
    """Whether git keeps the path out of the repository (.gitignore): a file a run or a script
    writes where the page says, such as `reports/<run>/` or a recording not committed."""
    plain = PLACEHOLDER.sub(lambda m: m.group(0)[1:-1], name)
    check = ["git", "check-ignore", "--no-index", plain, plain + "/"]  # a file or a folder
    return subprocess.run(check, cwd=REPO, capture_output=True).returncode == 0


def ours(name: str) -> bool:
    """Whether a named path is meant as the repository's at all (see NOT_IN_THE_REPOSITORY)."""
    parts = name.split("/")
    return parts[0] not in NOT_IN_THE_REPOSITORY and not any(
        UPPER_PLACEHOLDER.match(part) for part in parts
    )


def missing_paths(page: Path) -> list[str]:
    text = page.read_text()
    missing = [n for n in named_paths(text) if ours(n) and not exists(n)]
    # a link is the page's own (relative to it); the README's and CONTRIBUTING's to the root
    base = page.parent if page.is_relative_to(REPO / "docs") else REPO
    for target in linked_paths(text):
        target = target.split("#")[0]
        if target and not (base / target).resolve().exists():
            missing.append(f"link {target}")
    return missing


def test_named_paths_are_found_and_checked():
    """The check itself: paths in code spans, prose and links are found; what names a host's or
    the Hub's things is not taken for the repository's."""
    text = (
        "See `specdeploy/render/argv.py`, `memory_model.py`, `tests/facts/<FactClassName>/` and "
        "docs/releases.md; on the host `state_dir/hf`, `/etc/specdeploy`, `HOST/0`, "
        "`Qwen/Qwen3-8B`; run `pyinfra -y INVENTORY deploys/serve.py`; "
        "[matrix](../reference/releases.md), [web](https://pyinfra.com), [here](#the-gate).\n"
        "```sh\npython benchmarks/no_such_script.py\n```\n"
    )
    named = [n for n in named_paths(text) if ours(n)]
    assert named == [
        "specdeploy/render/argv.py",
        "memory_model.py",
        "tests/facts/<FactClassName>/",
        "docs/releases.md",
    ]
    assert [n for n in named if not exists(n)] == ["memory_model.py", "docs/releases.md"]
    assert linked_paths(text) == ["../reference/releases.md"]
    assert exists("config/revisions._resolved") and exists("benchmarks/README.md:16")
    assert not exists("config/revisions._no_such_name")
    assert exists("reports/<run>/summary.md")  # .gitignore: a run writes it there


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_every_path_a_page_names_exists(page):
    missing = missing_paths(page)
    assert not missing, f"{page_id(page)} names paths the repository does not have: {missing}"


# --- no page speaks of how the project is built ---------------------------------------------------

# What a reader of the manual cannot follow: the tracker's numbers and the work's own calendar. A
# measurement is dated by its commit or recording, never by "this round".
BUILD_TALK = {
    "an issue number": r"(?<![\w&/])#\d+\b|\b(?:issues?|PRs?|pull requests?|tickets?)\s+#?\d+",
    "the issue or brief behind a change": (
        r"\b(?:the|this|that) (?:issue|ticket|brief)\b|\b(?:issue|ticket|brief)'s\b"
    ),
    "a round or session of work": (
        r"\b(?:this|that|last|previous|earlier|another|next) (?:round|session)\b"
        r"|\bthe session(?:'s)?\b|\b(?:this|that) round's\b|\bthe round (?:before|after)\b"
    ),
    "a path on the machine the project is built on": r"(?<![\w.])/work/",
}


def build_talk(text: str) -> list[str]:
    """Each phrase with its line; a phrase may wrap (a space in a pattern is any whitespace)."""
    found = []
    for what, pattern in BUILD_TALK.items():
        for m in re.finditer(pattern.replace(" ", r"\s+"), text, re.IGNORECASE):
            line = text.count("\n", 0, m.start()) + 1
            found.append(f"line {line}: {' '.join(m.group(0).split())!r} ({what})")
    return found


def test_build_talk_is_found():
    """The check itself: the phrases found on the pages before they were reworded are caught; the
    manual's own words for measurement rounds, anchors and colours are not."""
    for said in (
        "# Fleet scale (issue 37)",
        "within the issue's 60 s bar",
        "(307 s in this round's first run",
        "**This round** (issues 38-40;",
        "both re-run on the final code (see the session's note)",
        "596 s the round\nbefore, same setup code",
        "one host; /work/six/run.sh of that session",
        "fixed in #47",
    ):
        assert build_talk(said), said
    for fine in (
        "The report lists every round's p, the look's level",
        "a round's three servers; the next batch",
        "[the gate](measure.md#the-gate), colour #1f77b4, an ssh session",
        "a known issue in vLLM's scheduler",
    ):
        assert not build_talk(fine), fine


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_no_page_speaks_of_how_the_project_is_built(page):
    found = build_talk(page.read_text())
    assert not found, f"{page_id(page)} speaks of how the project is built: {found}"
