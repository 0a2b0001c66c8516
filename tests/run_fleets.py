"""`make test`: the whole suite as two pytest processes side by side, each on a sandbox fleet of
its own (SPECDEPLOY_TEST_FLEET=a / b; which modules each runs: tests/integration/conftest.py,
FLEET_OF). Most of a sandbox test's time is spent waiting on one core (a server importing vLLM, a
host booting, SSH round trips), so two fleets on a 2-core machine take about half the time of one.

Each process's output is streamed with its fleet as prefix, `[a] ...`; its summary and slowest
tests are printed again, whole, at the end. Exits non-zero when either process does (pytest's 5,
no tests collected, included).

    python tests/run_fleets.py [pytest args ...]     # default: -v --durations=30 tests
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

FLEETS = ("a", "b")
SUMMARY_FROM = "slowest 30 durations"  # --durations output, then the short summary


def stream(fleet: str, proc: subprocess.Popen, lines: list[str]) -> None:
    for line in proc.stdout:
        lines.append(line)
        sys.stdout.write(f"[{fleet}] {line}")
        sys.stdout.flush()


def main(args: list[str]) -> int:
    args = args or ["-v", "--durations=30", "tests"]
    root = Path(__file__).resolve().parents[1]
    t0 = time.monotonic()
    runs = {}
    for fleet in FLEETS:
        env = {**os.environ, "SPECDEPLOY_TEST_FLEET": fleet, "PYTHONUNBUFFERED": "1"}
        # no cache plugin: two sessions would write one .pytest_cache at once
        cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args]
        proc = subprocess.Popen(
            cmd, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        lines: list[str] = []
        reader = threading.Thread(target=stream, args=(fleet, proc, lines), daemon=True)
        reader.start()
        runs[fleet] = (proc, reader, lines)
    codes = {}
    for fleet, (proc, reader, _) in runs.items():
        codes[fleet] = proc.wait()
        reader.join()
    for fleet, (_, _, lines) in runs.items():
        tail = max(len(lines) - 40, 0)
        start = next((i for i, ln in enumerate(lines) if SUMMARY_FROM in ln), tail)
        print(f"\n===== fleet {fleet}: pytest exit {codes[fleet]} =====")
        sys.stdout.writelines(lines[start:])
    print(f"\nboth fleets: exits {codes}, {time.monotonic() - t0:.0f} s wall")
    return 0 if all(c == 0 for c in codes.values()) else max(codes.values()) or 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
