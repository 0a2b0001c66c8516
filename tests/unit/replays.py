"""What every replay of a live decision shares (tests/unit/*/test_*_replay.py): where the recordings
live and how a replayed figure is compared with the recorded one.

A recording is tests/unit/data/replays/<name>/, written by a live test through the
`record_replay` fixture under `make test-live` (SPECDEPLOY_RECORD_REPLAYS=1), with its
provenance.json (commit, date, machine). Decisions, arms and their order compare exactly; fitted
figures within FIGURE_REL: numpy/BLAS builds differ in the last digits (40.114257079552125 vs
40.11425707955212 for the same fit), and a replay must pass on any machine that installs the
package, not only on the one that recorded it."""

from __future__ import annotations

import itertools
import json
import statistics
from pathlib import Path

import pytest

REPLAYS = Path(__file__).parent / "data" / "replays"
FIGURE_REL = 1e-9  # far below any figure a decision turns on, far above float noise


def approx_tree(value, rel: float = FIGURE_REL):
    """`value` with every float replaced by pytest.approx(rel): `replayed == approx_tree(live)`
    compares strings, ints, bools, keys and list order exactly and floats within `rel`."""
    if isinstance(value, float):
        return pytest.approx(value, rel=rel, abs=1e-12)
    if isinstance(value, dict):
        return {k: approx_tree(v, rel) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [approx_tree(v, rel) for v in value]
    return value


def recording(name: str) -> Path:
    """The recording's folder; fails (never skips) when it is missing: the fast tier needs it."""
    path = REPLAYS / name
    assert (path / "provenance.json").is_file(), (
        f"{path}: no recording; `make test-live` records it (SPECDEPLOY_RECORD_REPLAYS=1)"
    )
    return path


def load(path: Path):
    return json.loads(path.read_text())


def rank_p_less(a: list[float], b: list[float]) -> float:
    """The exact one-sided permutation p-value that `a` is lower than `b` (rank sums, no ties),
    counted over every split here: the replays' check on a decision, independent of
    specdeploy's stats."""
    pooled = sorted(a + b)
    rank = {v: i + 1 for i, v in enumerate(pooled)}
    observed = sum(rank[v] for v in a)
    sums = [sum(c) for c in itertools.combinations(range(1, len(pooled) + 1), len(a))]
    return sum(1 for x in sums if x <= observed) / len(sums)


def assert_tune_leaves_speculation_off(host_summary: dict, tpot: dict[str, list[float]]) -> None:
    """A tune summary's host entry says "leave speculation off" for the reason the runs give: no
    confirmed k (`tpot`'s k arms, each run's median TPOT) is shown faster than the baseline, each
    k's p and ratio recomputed here. The live tune test and its replay both hold a run to this."""
    choice = host_summary["choice"]
    for label in (arm for arm in tpot if arm != "baseline"):
        p = rank_p_less(tpot[label], tpot["baseline"])
        assert p > choice["alpha"] == 0.05, tpot
        per_k = choice["per_k"][label.removeprefix("k")]
        assert per_k["p_faster_than_baseline"] == pytest.approx(p)
        ratio = statistics.median(tpot[label]) / statistics.median(tpot["baseline"])
        assert per_k["ratio_to_baseline"] == pytest.approx(ratio)
    assert choice["speculation"] == "off" and choice["recommended_k"] is None, choice["verdict"]
    assert choice["reachable"]["vs_baseline"] is True and "too few" not in choice["verdict"]
    assert host_summary["host_data_change"] is None


def recorded_bench(runs: dict, asked: list, who):
    """A stand-in for bench.PendingBench whose run returns the live run's JSON for that (index,
    arm) of `runs`, noting (who(its config), index, arm) in `asked`; a run the live run did not
    make fails the replay."""
    from specdeploy.config.record import BenchResult

    class RecordedBench:
        def __init__(self, c, *, tokenizer, name, **kw):
            self.c, self.name = c, name

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            pass

        def run(self, *, local, meta: dict) -> BenchResult:
            key = (meta["index"], meta["arm"])
            asked.append((who(self.c), *key))
            assert key in runs, f"the gate asked for a run the live run did not make: {key}"
            return BenchResult.model_validate(runs[key])

    return RecordedBench


def sampler_of(cfg):
    """The server's benchmarks and restarts as the verify step hands them to the gate
    (steps/verify.py): the host data, the tokenizer "tok", the deploy lock's renewal."""
    from specdeploy.sampling.sampler import Sampler
    from specdeploy.steps import lock

    return Sampler(cfg, "tok", lock.renewal(cfg))
