"""A pytest plugin: the wall time and the machine-wide CPU (busy core-seconds and steal, from
/proc/stat) of every test phase, appended as TSV to $CPU_ACCOUNT_OUT (default
/tmp/cpu_account.tsv): nodeid, phase, start epoch, wall s, busy core-s, steal s; one SESSION line.
Machine-wide on purpose: the sandbox hosts' servers and pip installs are the suite's work too.

    CPU_ACCOUNT_OUT=suite.tsv PYTHONPATH=benchmarks/suite_cpu PYTEST_ADDOPTS="-p cpu_account" \
        CI=true make test
    python benchmarks/suite_cpu/summarize.py suite.tsv

A module-scoped fixture's cost lands in the setup of the first test that uses it."""

from __future__ import annotations

import os
import time

import pytest

HZ = os.sysconf("SC_CLK_TCK")
OUT = os.environ.get("CPU_ACCOUNT_OUT", "/tmp/cpu_account.tsv")
# a test that runs pytest itself (the host suite) inherits PYTEST_ADDOPTS: it logs nothing
ACTIVE = os.environ.get("CPU_ACCOUNT_ACTIVE") is None
os.environ["CPU_ACCOUNT_ACTIVE"] = "1"


def _stat() -> tuple[int, int]:
    """(busy, steal) jiffies of all CPUs: user + nice + system + irq + softirq, and steal."""
    with open("/proc/stat") as f:
        fields = f.readline().split()[1:9]
    user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, fields)
    return user + nice + system + irq + softirq, steal


def _log(nodeid: str, phase: str, t0: float, busy0: int, steal0: int) -> None:
    if not ACTIVE:
        return
    busy, steal = _stat()
    with open(OUT, "a") as f:
        f.write(
            f"{nodeid}\t{phase}\t{t0:.1f}\t{time.time() - t0:.2f}\t"
            f"{(busy - busy0) / HZ:.2f}\t{(steal - steal0) / HZ:.2f}\n"
        )


def pytest_sessionstart(session):
    session.config._cpu_account_start = (time.time(), *_stat())


def pytest_sessionfinish(session):
    _log("SESSION", "all", *session.config._cpu_account_start)


def _phase(name: str):
    @pytest.hookimpl(hookwrapper=True)
    def hook(item):
        t0, (busy0, steal0) = time.time(), _stat()
        yield
        _log(item.nodeid, name, t0, busy0, steal0)

    return hook


pytest_runtest_setup = _phase("setup")
pytest_runtest_call = _phase("call")
pytest_runtest_teardown = _phase("teardown")
