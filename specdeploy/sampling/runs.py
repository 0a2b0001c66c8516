"""The one loop every measurement runs: a plan's samples in order, each through the sampler (the
lease renewed, the benchmark started ahead, a fresh server or the visit's own, the warm-up), its raw
file written on the control node before the next sample is asked for (a sequential plan reads the
files written so far). The gate's plans (gate_plans.py), compare's, tune's and the load tune and
proof's (measure/harness.measure_plan) are all plans over it.

`visits` is the order across load levels (measure/load_flow.py and the gate across load): one
fresh server per visit, one run per level on it, lowest first, so each level's runs of an arm come
from distinct server starts."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import NamedTuple

from pyinfra import host, logger

from specdeploy.config.record import BenchResult
from specdeploy.decide.load_rule import rotating_rounds
from specdeploy.sampling.sampler import Sample, Sampler


class Ran(NamedTuple):
    """A sample that ran: its result and its fresh server's health check ({} on the same server)."""

    sample: Sample
    result: BenchResult
    checked: dict


def run_samples(sampler: Sampler, samples: Iterable[Sample], out_dir: Path) -> Iterator[Ran]:
    """Run `samples` in order (asked for one at a time: a plan may read what ran), each raw file
    written to `out_dir` before the next is asked for."""
    for s in samples:
        local = out_dir / f"{s.name}.json"
        with sampler.sample(s) as run:
            if s.says:
                logger.info(f"{host.print_prefix}{s.says}")
            meta = dict(s.meta)
            if s.timed:
                meta["seconds_to_healthy"] = run.checked.get("seconds_to_healthy")
            result = run.bench.run(local=local, meta=meta)
        if s.timed:
            result.run.sample_seconds = round(time.monotonic() - run.started, 1)
            local.write_text(result.to_json())
        yield Ran(s, result, run.checked)


class Visit(NamedTuple):
    """One run of a visit: the visit's index, its arm, the level's index (0: the visit's fresh
    server) and the level."""

    index: int
    arm: str
    at: int
    level: object


def visits(arms: Sequence[str], levels: Sequence, rounds: int) -> Iterator[Visit]:
    """`rounds` rounds over `arms`, the order rotating by one every round (no arm always first:
    load_rule.rotating_rounds); each visit one run per level, lowest first."""
    for i, arm in enumerate(rotating_rounds(list(arms), rounds)):
        for j, level in enumerate(levels):
            yield Visit(i, arm, j, level)
