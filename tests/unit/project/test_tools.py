"""A green CI cannot hide a missing tool: tests/tools.py skips a test whose tool is missing on a
developer's machine and fails it under CI (`CI=true`, set by `.ci/run`), naming the package; and no
test skips on a missing tool any other way."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests import tools
from tests.unit import REPO

NO_SUCH_TOOL = "specdeploy-no-such-tool"


@pytest.mark.parametrize("ci", ["true", "1", "yes"])
def test_a_missing_tool_fails_under_ci_naming_its_package(monkeypatch, ci):
    monkeypatch.setenv("CI", ci)
    with pytest.raises(pytest.fail.Exception) as failed:
        tools.need_tool(NO_SUCH_TOOL)
    assert f"{NO_SUCH_TOOL} missing" in str(failed.value)
    assert f"apt-get install {NO_SUCH_TOOL}" in str(failed.value)
    monkeypatch.setattr(tools, "which", lambda name: None)  # promtool is here: pretend it is not
    with pytest.raises(pytest.fail.Exception, match="apt-get install prometheus"):
        tools.need_tool("promtool")


@pytest.mark.parametrize("ci", [None, "", "false", "0"])
def test_a_missing_tool_skips_outside_ci(monkeypatch, ci):
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    with pytest.raises(pytest.skip.Exception, match=f"{NO_SUCH_TOOL} missing"):
        tools.need_tool(NO_SUCH_TOOL)


def test_a_missing_python_package_fails_under_ci_and_skips_outside(monkeypatch):
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="no_such_module_xyz missing"):
        tools.need_module("no_such_module_xyz", "the docs extra")
    monkeypatch.delenv("CI")
    with pytest.raises(pytest.skip.Exception):
        tools.need_module("no_such_module_xyz", "the docs extra")
    assert tools.need_module("json", "").dumps([]) == "[]"


def test_a_present_tool_is_found_with_the_first_of_its_names(monkeypatch):
    monkeypatch.setenv("CI", "true")
    assert tools.need_tool(NO_SUCH_TOOL, "sh") == tools.which("sh")
    assert Path(tools.need_tool("sh")).name == "sh"


def test_the_marker_runs_the_helper_before_the_test(tmp_path):
    """`@pytest.mark.needs_tool` through tests/conftest.py (loaded as a plugin into a pytest run of
    its own): the test is skipped locally and fails under CI."""
    (tmp_path / "test_marked.py").write_text(
        f"import pytest\n\n\n@pytest.mark.needs_tool({NO_SUCH_TOOL!r})\ndef test_it():\n    pass\n"
    )

    def run(**env: str) -> subprocess.CompletedProcess:
        environ = {k: v for k, v in os.environ.items() if k not in ("CI", "PYTEST_ADDOPTS")}
        command = [sys.executable, "-m", "pytest", "-p", "tests.conftest", "-p", "no:cacheprovider",
                   "-rs", "test_marked.py"]  # fmt: skip
        return subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=120,
                              env=environ | {"PYTHONPATH": str(REPO)} | env)  # fmt: skip

    local = run()
    assert local.returncode == 0 and "1 skipped" in local.stdout, local.stdout + local.stderr
    assert f"{NO_SUCH_TOOL} missing" in local.stdout
    ci = run(CI="true")
    assert ci.returncode == 1 and "1 error" in ci.stdout, ci.stdout + ci.stderr
    assert f"{NO_SUCH_TOOL} missing" in ci.stdout and "CI installs every tool" in ci.stdout


def test_ci_runs_with_ci_set():
    """`.ci/run` sets CI (unless its caller did), so `./.ci/run` on a laptop fails as CI would."""
    run = (REPO / ".ci/run").read_text()
    assert re.search(r"^export CI=\$\{CI:-true\}$", run, re.M), run


def _skips_on_a_missing_tool(tree: ast.AST) -> list[int]:
    """Lines where a test decides to skip from a tool lookup of its own: a skipif that asks
    shutil.which, imports, or looks for a file, or says "not installed"; a skip under an `if` that
    asks shutil.which or in an `except ImportError`; an importorskip."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = ast.unparse(node.func)
            if name.endswith("importorskip"):
                found.append(node.lineno)
            if name.endswith("mark.skipif") and re.search(
                r"which|import|installed|exists\(", ast.unparse(node)
            ):
                found.append(node.lineno)
        if isinstance(node, ast.If) and re.search(r"which\(", ast.unparse(node.test)):
            body = "\n".join(ast.unparse(statement) for statement in node.body)
            if re.search(r"pytest\.skip|mark\.skip", body):
                found.append(node.lineno)
        if isinstance(node, ast.Try) and any(
            re.search(r"pytest\.skip", ast.unparse(handler)) for handler in node.handlers
        ):
            if any(isinstance(s, ast.Import | ast.ImportFrom) for s in node.body):
                found.append(node.lineno)
    return found


def test_no_test_skips_on_a_missing_tool_any_other_way():
    own = {Path(tools.__file__).resolve(), Path(__file__).resolve()}
    offenders = {
        path.relative_to(REPO).as_posix(): lines
        for path in sorted((REPO / "tests").rglob("*.py"))
        if path.resolve() not in own
        and (lines := _skips_on_a_missing_tool(ast.parse(path.read_text())))
    }
    assert not offenders, f"skip on a missing tool through tests/tools.py: {offenders}"


def test_the_guard_finds_the_old_ways():
    for old in (
        '@pytest.mark.skipif(shutil.which("socat") is None, reason="no socat")\ndef t(): pass',
        'pytestmark = pytest.mark.skipif(not shutil.which("haproxy"), reason="")',
        'if shutil.which("promtool") is None:\n    pytest.skip("no promtool")',
        'markdown = pytest.importorskip("markdown")',
        "try:\n    import mkdocs\nexcept ImportError:\n    pytest.skip('no mkdocs')",
        'pytestmark = pytest.mark.skipif(not (A and B), reason="haproxy is not installed")',
        'pytestmark = [pytest.mark.skipif(not PY.exists(), reason=f"python {PY} missing")]',
    ):
        assert _skips_on_a_missing_tool(ast.parse(old)), old
    assert not _skips_on_a_missing_tool(ast.parse('@pytest.mark.needs_tool("socat")\ndef t(): 0'))
    assert not _skips_on_a_missing_tool(
        ast.parse('@pytest.mark.skipif(os.geteuid() != 0, reason="root")\ndef t(): 0')
    )
