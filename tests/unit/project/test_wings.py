"""tests/wings.py against the tree: no live proof without a tier, no code without a wing that
guards it, and the live tier never shrinks."""

from __future__ import annotations

import subprocess
import sys

from tests import wings

REPO = wings.REPO


def tracked(*roots: str) -> list[str]:
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", *roots],
        cwd=REPO, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return [p for p in out.split() if "__pycache__" not in p and (REPO / p).is_file()]


def test_every_live_module_is_in_the_fast_tier_or_in_exactly_one_wing():
    modules = sorted(
        p.relative_to(REPO).as_posix() for p in REPO.glob("tests/integration/test_*.py")
    )
    for module in modules:
        homes = [name for name, w in wings.WINGS.items() if module in w.tests]
        homes += ["fast"] if module in wings.FAST_LIVE else []
        assert len(homes) == 1, f"{module}: in {homes or 'no tier'}; add it to tests/wings.py"
    named = [*wings.FAST_LIVE, *(t for w in wings.WINGS.values() for t in w.tests)]
    assert sorted(named) == modules, "tests/wings.py names a module that does not exist"


def test_every_product_and_sandbox_file_is_guarded_by_a_wing():
    files = tracked("specdeploy", "deploys", "templates", "sandbox", "inventories", "group_data")
    assert len(files) > 50
    unguarded = [p for p in files if not wings.wings_of_file(p)]
    assert unguarded == [], "no live wing runs when these change; map them in tests/wings.py"


def test_a_file_runs_its_own_wing_and_what_all_stand_on_runs_every_wing():
    assert wings.wings_of_file("tests/integration/test_whole_box.py") == ["box"]
    assert wings.wings_of_file("specdeploy/observe/status_box.py") == ["box"]
    assert wings.wings_of_file("specdeploy/steps/gate.py") == list(wings.WINGS)  # a deploy step
    assert set(wings.wings_of_file("specdeploy/measure/harness.py")) == {"measure", "observe"}
    assert wings.wings_of_file("specdeploy/config/schema.py") == list(wings.WINGS)
    assert wings.wings_of_file("README.md") == [] and wings.wings_of_file("tests/unit/x.py") == []


def test_changed_wings_follow_the_changed_files_in_the_maps_order(monkeypatch):
    monkeypatch.setattr(
        wings,
        "changed_files",
        lambda base: ["specdeploy/observe/status.py", "specdeploy/observe/status_box.py"],
    )
    assert wings.changed_wings("main") == ["box", "observe"]
    monkeypatch.setattr(wings, "changed_files", lambda base: ["README.md"])
    assert wings.changed_wings("main") == []


def test_the_live_tier_never_shrinks_and_the_main_job_stays_in_the_fast_tier():
    """The live tier as `make test-live` collects it (a subprocess: pytest's own collection)."""
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
         "-m", "live", "tests"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    live = [line for line in out.stdout.splitlines() if "::" in line]
    assert len(live) >= wings.LIVE_TESTS_AT_LEAST, f"{len(live)} live tests: a proof was dropped"
    assert not [t for t in live if t.split("::")[0] in wings.FAST_LIVE]
    main_job = (REPO / "tests/integration/test_main_job.py").read_text()
    assert main_job.count("\ndef test_") >= 5


def test_a_wing_selects_only_its_own_tests():
    """`-m "live and (<wing>)"` selects a wing by its marker: a wing named like a marker the tests
    set themselves (pytest.mark.sandbox is on every test that needs the fleet) would select them
    all."""
    import re

    pyproject = (REPO / "pyproject.toml").read_text()
    own = set(re.findall(r'^\s*"(\w+): ', pyproject, flags=re.M))
    for module in (REPO / "tests").rglob("*.py"):
        own |= set(re.findall(r"pytest\.mark\.(\w+)", module.read_text()))
    assert "sandbox" in own  # the scan sees the markers
    assert sorted(set(wings.WINGS) & own) == [], "rename the wing: a test's own marker has its name"
