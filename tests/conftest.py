"""The tiers (tests/wings.py): each test of a wing's modules gets the markers `live` and its
wing; `make test` deselects `live`, `make test-live WING=box` selects `live and (box)`. At the end
of a run, the time each wing took (setup, call and teardown of its tests, so its module fixtures'
deploys too; the first test of a session also pays for the sandbox fleet coming up). A test marked
`needs_tool(...)` skips without its tool, and fails under CI (tests/tools.py)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest

from tests import tools, wings

FAST = "fast tier"
_seconds: dict[str, float] = defaultdict(float)
_tests: dict[str, set[str]] = defaultdict(set)


def pytest_configure(config):
    config.addinivalue_line("markers", "live: the live tier (make test-live): not run by CI")
    config.addinivalue_line(
        "markers",
        "needs_tool(*names): the test needs one of these tools; it skips without, and fails "
        "under CI (tests/tools.py)",
    )
    for name, wing in wings.WINGS.items():
        config.addinivalue_line("markers", f"{name}: live wing: {wing.proves}")


def _wing(item) -> str | None:
    try:
        path = Path(str(item.fspath)).resolve().relative_to(wings.REPO).as_posix()
    except ValueError:
        return None
    return wings.wing_of_test(path)


def pytest_collection_modifyitems(config, items):
    for item in items:
        wing = _wing(item)
        if wing:
            item.add_marker(pytest.mark.live)
            item.add_marker(getattr(pytest.mark, wing))


def pytest_runtest_setup(item):
    for mark in item.iter_markers("needs_tool"):
        tools.need_tool(*mark.args, **mark.kwargs)


def pytest_runtest_logreport(report):
    if report.when in ("setup", "call", "teardown"):
        rel = report.nodeid.split("::")[0]
        wing = wings.wing_of_test(rel) or FAST
        _seconds[wing] += report.duration
        _tests[wing].add(report.nodeid)


def pytest_terminal_summary(terminalreporter):
    if not _seconds:
        return
    terminalreporter.section("time per tier and wing")
    for wing, seconds in sorted(_seconds.items(), key=lambda kv: -kv[1]):
        terminalreporter.write_line(
            f"{wing:>10}: {seconds:7.0f} s ({seconds / 60:5.1f} min), {len(_tests[wing])} tests"
        )
