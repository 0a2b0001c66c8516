"""The unit tier, mirroring the package: tests/unit/<room>/ holds the tests of specdeploy/<room>/
(ROOMS in project/test_layout.py), a concept with several modules a folder of its own
(steps/gate/, flows/rollout/), project/ the tests of the repository itself (layout, tiers, manual,
tools, sandbox). Here: what several rooms share (conftest.py, replays.py) and the recorded data."""

from pathlib import Path

UNIT = Path(__file__).resolve().parent
DATA = UNIT / "data"  # recordings and fixtures the tests of every room read
REPO = UNIT.parents[1]
