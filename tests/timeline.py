"""The health timeline's verdict, apart from how its samples are taken: the live suite samples each
host's /health over SSH (tests/integration/conftest.py, HealthTimeline), the fast tier replays the
raw samples a live run recorded (tests/unit/project/test_timeline_replay.py). Both judge with this
code."""

from __future__ import annotations

import itertools


def parse_samples(text: str) -> list[tuple[float, bool]]:
    """The sampler's `<epoch.ns> <code> [<seconds taken>]` lines as (seconds, up); up means HTTP
    200 (the request's own time is kept in the raw text, for a reader of a slow host)."""
    return [(float(f[0]), f[1] == "200") for f in (ln.split() for ln in text.splitlines())]


class Timeline:
    """Each host's health samples on one clock (the sandbox hosts share the kernel's), merged to
    judge a rolling restart. `raw` keeps each host's text as it was read, so a live run can record
    it and a replay judge exactly what the live test judged."""

    def __init__(self, raw: dict[str, str] | None = None):
        self.raw: dict[str, str] = {}
        self.samples: dict[str, list[tuple[float, bool]]] = {}
        for host, text in (raw or {}).items():
            self.add(host, text)

    def add(self, host: str, text: str) -> None:
        self.raw[host] = text
        self.samples[host] = parse_samples(text)

    def all_down(self) -> list[float]:
        """Sampled instants at which every host's latest sample said down."""
        events = sorted((t, h, up) for h, samples in self.samples.items() for t, up in samples)
        latest: dict[str, bool] = {}
        found = []
        for t, name, up in events:
            latest[name] = up
            if len(latest) == len(self.samples) and not any(latest.values()):
                found.append(t)
        return found

    def down_seconds(self, host: str) -> float:
        """Sampled time the host was down (from each down sample to the next sample)."""
        samples = self.samples[host]
        return sum(b[0] - a[0] for a, b in itertools.pairwise(samples) if not a[1])

    def assert_one_down_at_a_time(self) -> None:
        """Up before and after, each host down at some point (really restarted or stopped), never
        all at once."""
        for host, samples in self.samples.items():
            assert len(samples) > 10 and samples[0][1] and samples[-1][1], (host, samples[:3])
            assert not all(up for _, up in samples), f"{host} was never seen down"
        both = self.all_down()
        assert both == [], f"all hosts down at {both[:5]} (of {len(both)} sampled instants)"
