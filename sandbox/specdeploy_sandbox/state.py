"""The sandbox state file (JSON), kept under `$SPECDEPLOY_STATE_DIR`.

Default location: `/run/sandbox/specdeploy_sandbox/state.json`. Writes are atomic
(temp file + rename) and serialized with an flock on `state.lock`.
"""

from __future__ import annotations

import fcntl
import json
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path

DEFAULT_STATE_DIR = "/run/specdeploy/sandbox"


def state_dir() -> Path:
    return Path(os.environ.get("SPECDEPLOY_STATE_DIR", DEFAULT_STATE_DIR))


def state_path() -> Path:
    return state_dir() / "state.json"


def load() -> dict | None:
    """Return the state dict, or None when there is no (readable) state file."""
    p = state_path()
    try:
        return json.loads(p.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return None


def save(state: dict) -> Path:
    p = state_path()
    p.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=".state.", suffix=".json")
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(state, fh, indent=2, sort_keys=True)
            fh.write("\n")
        os.chmod(tmp, 0o600)
        os.replace(tmp, p)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return p


def remove() -> None:
    try:
        state_path().unlink()
    except FileNotFoundError:
        pass


@contextmanager
def locked():
    """Exclusive lock so concurrent up/down calls on one state dir serialize."""
    d = state_dir()
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    with open(d / "state.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
