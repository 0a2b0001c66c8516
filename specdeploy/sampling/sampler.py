"""Sampling on a host: the one way the speculation gate (steps/gate.py) and every measurement
(measure/harness.py: compare, tune, the load tune and proof) run a benchmark on a server of their
own, at execution time (inside `python.call`). The plans (which unit, in which order, on which
workload) are theirs; how one sample runs is written here once, and runs.run_samples runs a plan.

A sample, in this order:
1. the deploy lock's lease is renewed for what the host runs until the next renewal (`renew_lease`,
   handed in by the caller: steps/lock.LeaseRenewal, whose LockLost, for a lease taken over
   meanwhile, stops the sample before anything more changes), and where a
   measurement stopped production, its watchdog with it (host/watchdog.py: the deployed unit comes
   back by itself if the control node goes quiet);
2. its benchmark starts ahead of its server (host/bench.PendingBench: vLLM's CLI imports overlap
   the server's start);
3. a fresh server for its unit (host/server.start_fresh: every server on the port stopped, the
   unit written unless it is installed already, started, healthy) and one discarded warm-up
   completion; unless it runs on the server the previous sample started (`same_server`: a load
   level above the first, tune's shared visits), which the renewal before that one covered;
4. the caller runs the benchmark (`bench.run`) with its own file name and what the run records.

No fresh server starts without a renewal first, also the one the gate ends on (Sampler.start)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Protocol

from pyinfra import host, logger

from specdeploy.config.schema import ServeConfig, Workload
from specdeploy.host import watchdog
from specdeploy.host.bench import PendingBench, bench_time_limit
from specdeploy.host.server import (
    enable_only,
    remove_measure_unit,
    start_fresh,
    switch_enabled,
    wait_healthy,
    warm_up,
)
from specdeploy.render.units import RenderedUnit


class RenewsLease(Protocol):
    """The deploy lock's renewal (steps/lock.LeaseRenewal): every lock this process holds on the
    host lasts at least `seconds` more, or LockLost when it was taken over meanwhile."""

    def __call__(self, seconds: int) -> None: ...


@dataclass(frozen=True)
class Sample:
    """One benchmark of a plan: the unit its server runs, its raw file's name, its workload, what
    the raw file records of it (`meta`), and how it runs: `renew_s`, the lease (and a measurement's
    watchdog) for its visit, None only on the visit's server (`same_server`); `install`: the unit
    written for it (false: a production unit the deploy installed); `extra`: bench flags; `says`:
    logged once its server is up; `timed`: its server's seconds to healthy and the whole sample's
    seconds recorded too (compare and tune report them)."""

    unit: RenderedUnit
    name: str
    workload: Workload
    meta: dict
    renew_s: int | None
    install: bool = True
    same_server: bool = False
    extra: tuple[str, ...] = field(default=())
    says: str | None = None
    timed: bool = False


@dataclass(frozen=True)
class Sampled:
    """A sample while its benchmark waits to run: `bench.run(local=..., meta=...)` runs it."""

    bench: PendingBench
    checked: dict  # the fresh server's health check (server.wait_healthy); {} on the same server
    started: float  # time.monotonic() when the benchmark was started, after the renewal


@dataclass
class Sampler:
    """One server's benchmarks and restarts, for one caller (the verify step: smoke and gate; or a
    measurement): the host data its server and benchmarks run with (host/ reads it), the tokenizer
    the benchmarks count with, the deploy lock's renewal (`renew_lease`), and for a measurement
    that stopped production the deployed unit its watchdog restores (`restores`; `readmit`: a
    whole box's drained instance, watchdog.watchdog_script). Built once by the step and handed
    down: what runs below it receives it, not the host data."""

    cfg: ServeConfig
    tokenizer: str
    renew_lease: RenewsLease
    restores: str | None = None
    readmit: tuple[str, str] | None = None
    timer: str | None = field(default=None, init=False)  # the watchdog timer armed last

    def renew(self, seconds: int) -> None:
        """The deploy lock, and the watchdog where production is stopped, hold `seconds` more:
        what the host runs until the next renewal."""
        self.renew_lease(seconds)  # the deploy lock outlasts the sample
        if self.restores is None:
            return
        # armed before the first sample stops production, renewed before every other one
        first = self.timer is None
        self.timer = watchdog.arm_watchdog(self.cfg, self.restores, seconds, self.readmit)
        if first:
            logger.info(
                f"{host.print_prefix}watchdog {self.timer}: {self.restores} comes back by itself "
                f"if the control node is silent for {seconds} s (renewed before every sample)"
            )

    @contextmanager
    def sample(self, sample: Sample) -> Iterator[Sampled]:
        """One sample (see the module): renewed for `sample.renew_s` (None only on the same
        server, whose visit's renewal covered it), its benchmark started, a fresh server unless
        `same_server` (its unit written unless `install` is false: a production unit the deploy
        installed), warmed up; the caller runs the benchmark inside the block (left unrun, it is
        ended)."""
        if sample.renew_s is not None:
            self.renew(sample.renew_s)
        elif not sample.same_server:
            raise ValueError(
                f"{sample.name}: a fresh server starts only after the lease is renewed"
            )
        started = time.monotonic()
        with PendingBench(
            self.cfg,
            tokenizer=self.tokenizer,
            name=sample.name,
            workload=sample.workload,
            extra=sample.extra,
        ) as bench:  # the benchmark's imports run while this server starts
            checked: dict = {}
            if not sample.same_server:
                checked = self._start(sample.unit, sample.install)
                warm_up(self.cfg, sample.workload)
            yield Sampled(bench, checked, started)

    def start(self, unit: RenderedUnit, *, install: bool = True) -> dict:
        """A fresh server with no benchmark (the unit the gate ends on), the lease renewed first
        for its start. Returns its health check."""
        self.renew(self.cfg.health_timeout_s)
        return self._start(unit, install)

    @property
    def instance_name(self) -> str | None:
        """A whole box's instance this server is (its files are named after it), else None."""
        return self.cfg.instance_name

    def bench(self, name: str) -> PendingBench:
        """A benchmark of the host's workload on the server that is starting (the smoke run)."""
        return PendingBench(self.cfg, tokenizer=self.tokenizer, name=name)

    def healthy(self, unit: str, *, speculative: bool) -> dict:
        """The running server of `unit` checked (server.wait_healthy)."""
        return wait_healthy(self.cfg, unit, speculative=speculative)

    def switch_enabled(self, *, disable: str, enable: str) -> None:
        """The unit the host boots with switched (server.switch_enabled)."""
        switch_enabled(self.cfg, disable=disable, enable=enable)

    def enable_only(self, role: str) -> None:
        """Only the unit of `role` enabled (server.enable_only)."""
        enable_only(self.cfg, role)

    def visit_seconds(self, workloads: list[Workload]) -> int:
        """What one visit may take: its server's start, then each benchmark on it at its time
        limit (the gate's renewal before a visit)."""
        return self.cfg.health_timeout_s + sum(bench_time_limit(self.cfg, w) for w in workloads)

    def end_measure_unit(self) -> None:
        """The measurement instance stopped and removed (the gate's fixed k never outlives it)."""
        remove_measure_unit(self.cfg)

    def _start(self, unit: RenderedUnit, install: bool) -> dict:
        # a speculative unit's health check also asks for the spec-decode counters
        speculative = unit.role == "speculative"
        return start_fresh(self.cfg, unit, speculative=speculative, install=install)
