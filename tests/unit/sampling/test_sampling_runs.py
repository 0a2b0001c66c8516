"""sampling/runs.py, the one loop every measurement runs: it asks a plan for its next sample only
once the previous sample's raw file is written (the sequential compare and the predict flow read
them to decide what comes next), and `visits` is the order across load levels that the gate and
the load tune and proof share."""

from __future__ import annotations

from contextlib import contextmanager
from types import SimpleNamespace

import pytest

from specdeploy.config.record import BenchResult
from specdeploy.config.schema import Workload
from specdeploy.render.units import RenderedUnit
from specdeploy.sampling import runs
from specdeploy.sampling.sampler import Sample, Sampler

UNIT = RenderedUnit("baseline", "vllm-measure", ["vllm"], "[Unit]", "/etc/vllm-measure")


class FakeSampler:
    """Sampler.sample's shape: each benchmark writes its raw file where run_samples asks."""

    def __init__(self):
        self.ran: list[str] = []

    @contextmanager
    def sample(self, s: Sample):
        def run(*, local, meta):
            self.ran.append(s.name)
            local.write_text("{}")
            return BenchResult.model_validate({"completed": 1, "failed": 0})

        yield SimpleNamespace(bench=SimpleNamespace(run=run), checked={"unit": s.name}, started=0.0)


def test_the_next_sample_is_asked_for_only_once_the_last_file_is_written(tmp_path):
    asked = []

    def plan():
        for i in range(3):
            asked.append(sorted(p.name for p in tmp_path.glob("*.json")))
            yield Sample(UNIT, f"{i:02d}-baseline", Workload(), {"arm": "baseline"}, renew_s=60)

    sampler = FakeSampler()
    ran = list(runs.run_samples(sampler, plan(), tmp_path))
    assert asked == [[], ["00-baseline.json"], ["00-baseline.json", "01-baseline.json"]]
    assert [r.checked["unit"] for r in ran] == sampler.ran == ["00-baseline", "01-baseline",
                                                               "02-baseline"]  # fmt: skip


def test_visits_rotate_the_arms_and_run_every_level_lowest_first():
    got = list(runs.visits(["baseline", "k2", "k4"], [1, 4, 16], 2))
    firsts = [v.arm for v in got if v.at == 0]
    assert firsts == ["baseline", "k2", "k4", "k2", "k4", "baseline"]  # no arm always first
    assert [v.level for v in got[:3]] == [1, 4, 16] and {v.index for v in got[:3]} == {0}
    for arm in ("baseline", "k2", "k4"):  # each level of each arm once per round
        assert sorted(v.level for v in got if v.arm == arm) == [1, 1, 4, 4, 16, 16]


def test_a_fresh_server_without_a_renewal_is_refused_before_anything_runs():
    renewed = []
    sampler = Sampler(None, "tok", renewed.append)
    sample = Sample(UNIT, "00-baseline", Workload(), {}, renew_s=None)
    with pytest.raises(ValueError, match="only after the lease is renewed"):
        with sampler.sample(sample):
            pass
    assert renewed == []
