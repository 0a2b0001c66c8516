"""The manual builds and reads as a browser shows it (issue 40): `mkdocs build --strict` (a broken
link, anchor or missing page fails), then real headless Chromium renders the built start page and
the host-data reference, and the text it shows is asserted. A missing mkdocs or Chromium skips
here and fails under CI (`CI=true`), which installs both (`make deps`; tests/tools.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

from specdeploy.config import schema
from tests.tools import need_module, need_tool
from tests.unit import REPO

CHROMIUM = ("chromium", "chromium-browser", "google-chrome")
DOCS_EXTRA = "the docs extra: pip install -e '.[docs]'; `make deps` installs it"


def need_mkdocs() -> None:
    need_module("mkdocs", DOCS_EXTRA)
    need_module("material", DOCS_EXTRA)  # mkdocs-material, the theme


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    need_mkdocs()
    out = tmp_path_factory.mktemp("site")
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return out


def test_the_site_builds_strictly_with_every_page_of_the_nav(site):
    for page in (
        "start/sandbox",
        "start/first-host",
        "guides/rollout",
        "guides/measure",
        "guides/load",
        "reference/host-data",
        "reference/cli",
        "reference/releases",
        "develop/tests",
        "develop/architecture",
    ):
        assert (site / page / "index.html").is_file(), page
    # the architecture page is CONTRIBUTING.md itself, included (one home for it)
    architecture = (site / "develop/architecture/index.html").read_text()
    assert "The layering rule" in architecture


def test_a_broken_link_fails_the_strict_build(tmp_path):
    """The build really is strict: the same site with one link to a missing anchor is refused."""
    need_mkdocs()
    docs = tmp_path / "docs"
    shutil.copytree(REPO / "docs", docs)
    page = docs / "start" / "sandbox.md"
    page.write_text(page.read_text() + "\n[x](../reference/host-data.md#no_such_key)\n")
    config = (REPO / "mkdocs.yml").read_text().replace("docs_dir: docs", f"docs_dir: {docs}")
    (tmp_path / "mkdocs.yml").write_text(config)
    shutil.copy(REPO / "CONTRIBUTING.md", tmp_path / "CONTRIBUTING.md")  # the snippet's source
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        timeout=300,
    )
    assert result.returncode != 0
    assert "no_such_key" in result.stdout + result.stderr


class _Text(HTMLParser):
    """The text a reader sees: no scripts, styles or hidden templates; and every element's id."""

    def __init__(self):
        super().__init__()
        self.parts: list[str] = []
        self.ids: set[str] = set()
        self._skip = 0

    def handle_starttag(self, tag, attrs):
        self.ids |= {value for name, value in attrs if name == "id" and value}
        if tag in ("script", "style", "template"):
            self._skip += 1

    def handle_endtag(self, tag):
        if tag in ("script", "style", "template") and self._skip:
            self._skip -= 1

    def handle_data(self, data):
        if not self._skip:
            self.parts.append(data)

    @property
    def text(self) -> str:
        return " ".join("".join(self.parts).split())


def rendered(site: Path, page: str) -> _Text:
    """The page's DOM after Chromium loaded it and ran its scripts (--dump-dom)."""
    browser = need_tool(*CHROMIUM)
    result = subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
         "--dump-dom", (site / page / "index.html").as_uri()],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0 and "<html" in result.stdout, result.stderr[-2000:]
    parsed = _Text()
    parsed.feed(result.stdout)
    return parsed


def test_chromium_shows_the_start_page_with_its_commands(site):
    page = rendered(site, "start/sandbox")
    assert "Try it on the sandbox" in page.text
    for command in (
        "make demo",
        "specdeploy check inventories/sandbox.py",
        "pyinfra -y inventories/sandbox.py deploys/serve.py",
        "pytest tests/host --inventory inventories/sandbox.py",
        "specdeploy-sandbox down",
    ):
        assert command in page.text, command
    # the navigation Material's scripts render leads on to the rest of the manual
    assert "Your first real host" in page.text and "Host data" in page.text


def test_chromium_shows_every_host_data_key_with_its_description(site):
    page = rendered(site, "reference/host-data")
    workload = schema.Workload.model_fields
    for key, field in [
        ("workload.temperature", workload["temperature"]),
        ("workload.top_p", workload["top_p"]),
        ("vllm_version", schema.ServeConfig.model_fields["vllm_version"]),
        ("speculation_gate.on_fail", schema.SpeculationGate.model_fields["on_fail"]),
    ]:
        assert key in page.ids, f"no section a check message can link: #{key}"
        shown = " ".join(field.description.replace("`", "").split())  # code spans lose the ticks
        assert shown in page.text, key
    for key in schema.FIELDS:
        assert key in page.ids, key
