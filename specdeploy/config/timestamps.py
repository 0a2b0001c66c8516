"""The two time formats specdeploy writes: ISO 8601 UTC in records and reports, a compact UTC stamp
in file and run names."""

from __future__ import annotations

import time


def utc_iso(seconds: float | None = None) -> str:
    """2026-11-30T09:26:08Z"""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


def utc_stamp(seconds: float | None = None) -> str:
    """20261130T092608 (UTC), for names."""
    return time.strftime("%Y%m%dT%H%M%S", time.gmtime(seconds))
