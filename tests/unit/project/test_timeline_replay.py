"""The rolling restart's health-timeline verdict (tests/timeline.py) replayed on a live run's raw
samples: tests/integration/test_rollout.py::
test_plain_pyinfra_run_restarts_host_by_host_and_stops_at_the_first_failure records each host's
`<epoch.ns> <code>` lines as its sampler wrote them during a k change rolled over two hosts, the
hosts' MainPIDs, and which host the failing run rolled back (data/replays/rolling_timeline/).

The verdict the live test passed ("never every host down, each host down at some point, up before
and after") must pass here on the same text; the same samples with one host's down window moved
onto the other's must fail it, so the verdict is what carries the claim; and each host's down time
is recomputed here, written out, from the raw lines."""

from __future__ import annotations

import itertools

import pytest

from tests.timeline import Timeline
from tests.unit.replays import approx_tree, load, recording


def recorded_run() -> tuple[dict, dict[str, str]]:
    """(run.json, {host: its raw sampled text}) of the recording, hosts in run.json's order."""
    path = recording("rolling_timeline")
    run = load(path / "run.json")
    return run, {h: (path / "timeline" / f"{h}.txt").read_text() for h in run["hosts"]}


def down_window(text: str) -> tuple[float, float]:
    """(first down sample, the first up sample after the last down one): the host's restart."""
    lines = [(float(f[0]), f[1]) for f in (ln.split() for ln in text.splitlines())]
    down = [i for i, (_, code) in enumerate(lines) if code != "200"]
    return lines[down[0]][0], lines[down[-1] + 1][0]


def shifted(text: str, seconds: float) -> str:
    """The same lines `seconds` later: the sampler's text, as if the host had restarted then."""
    lines = (ln.split() for ln in text.splitlines())
    return "".join(f"{float(t) + seconds:.9f} {' '.join(rest)}\n" for t, *rest in lines)


def test_the_live_verdict_passes_on_the_live_samples():
    run, raw = recorded_run()
    timeline = Timeline(raw)
    timeline.assert_one_down_at_a_time()
    assert timeline.all_down() == []
    assert list(timeline.samples) == run["hosts"] and len(run["hosts"]) == 2
    restarted = run["k_change_main_pids"]  # every host sampled down was really restarted
    assert all(restarted["before"][h] != restarted["after"][h] for h in run["hosts"])
    failure = run["failure"]
    assert {failure["rolled_back"], failure["not_restarted"]} == set(run["hosts"])


def test_one_host_down_while_the_other_is_fails_the_verdict():
    """The other host's samples moved so that its down window is centred on the first host's:
    the same codes, the same spacing, now both down at once."""
    run, raw = recorded_run()
    first, second = run["hosts"]
    (a0, a1), (b0, b1) = down_window(raw[first]), down_window(raw[second])
    overlapping = {**raw, second: shifted(raw[second], (a0 + a1) / 2 - (b0 + b1) / 2)}
    moved = Timeline(overlapping)
    assert moved.all_down(), "moving the windows together must put both hosts down at once"
    with pytest.raises(AssertionError, match="all hosts down at"):
        moved.assert_one_down_at_a_time()


def test_a_host_never_seen_down_fails_the_verdict():
    run, raw = recorded_run()
    host = run["hosts"][1]
    always_up = "".join(f"{ln.split()[0]} 200\n" for ln in raw[host].splitlines())
    with pytest.raises(AssertionError, match="was never seen down"):
        Timeline({**raw, host: always_up}).assert_one_down_at_a_time()


def test_down_seconds_is_the_time_from_each_down_sample_to_the_next():
    run, raw = recorded_run()
    timeline = Timeline(raw)
    for host, text in raw.items():
        lines = [ln.split()[:2] for ln in text.splitlines()]  # `<start> <code> [<seconds>]`
        down = 0.0
        for (t, code), (t_next, _) in itertools.pairwise(lines):
            if code != "200":
                down += float(t_next) - float(t)
        assert down > 0
        assert timeline.down_seconds(host) == pytest.approx(down)
        a0, a1 = down_window(text)
        assert down <= a1 - a0 + 1e-9  # never more than its restart's window
    live = {h: timeline.down_seconds(h) for h in run["hosts"]}
    assert live == approx_tree(run["down_seconds"])
