"""Each host's outcome, noted for `specdeploy rollout`: the controller runs one pyinfra per batch
and reads, from the directory it names in ROLLOUT_REPORT_ENV (its own 0700 `mkdtemp`), one JSON
note per host of the batch: done (the deploy's last operation ran), failed with its cause (rolled
back, refused while planning, an operation that failed), or held back by a failed host before it.
No directory named, no note: a plain pyinfra run writes nothing."""

from __future__ import annotations

import json
import os
from pathlib import Path

ROLLOUT_REPORT_ENV = "SPECDEPLOY_ROLLOUT_REPORT"

# What a failed host serves now, as its note says it ("after"): every failure names it.
STILL_SERVING = "still serving what it served before this run"

# Where a serve stands on each host of this pyinfra process, for a failure no step accounts for
# (an operation that failed: steps/lock.ReleaseOnFailure notes it): "planned", until the host's
# turn swaps its unit and env file (steps/rollback.roll_servers), then "turn". A serve changes
# what a host serves in its turn alone, so a failure before it changed nothing served; other
# deploys (compare, tune) are not tracked, and their failures say nothing they cannot know.
_SERVE_STAGE: dict[str, str] = {}


def serve_planned(host: str) -> None:
    """Planning time: this host's serve is planned; nothing it serves changes before its turn."""
    _SERVE_STAGE.setdefault(host, "planned")


def turn_began(host: str) -> None:
    """Execution time: this host's turn began (swap, restart, health): what it serves may change."""
    _SERVE_STAGE[host] = "turn"


def after_failed_operation(host: str) -> str | None:
    """What the host serves after an operation of its deploy failed, where that is known: a serve
    before the host's turn changed nothing it serves; one in its turn may have; None for any other
    deploy."""
    stage = _SERVE_STAGE.get(host)
    if stage == "planned":
        return (
            f"not rolled back (nothing it serves changed: the failure came before its turn to swap "
            f"its unit and env file): {STILL_SERVING}"
        )
    if stage == "turn":
        return (
            "not rolled back: an operation failed in its turn, after its unit and env file may "
            "have been swapped; what it serves now is not known here — `specdeploy status` shows it"
        )
    return None


def note(entry: dict, *, first_only: bool = False) -> None:
    """Write `entry` as the note of `entry["host"]`, mode 0600, never through a link: created with
    O_EXCL and renamed into place, so a reader never sees half of one. `first_only`: keep a note
    already written (a failure hook after the step's own, truer account)."""
    directory = os.environ.get(ROLLOUT_REPORT_ENV)
    if not directory or not Path(directory).is_dir():
        return
    final = Path(directory) / f"{entry['host']}.json"
    if first_only and final.exists():
        return
    partial = final.with_name(f".{final.name}.{os.getpid()}")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump(entry, out, indent=2)
    if first_only:
        try:
            os.link(partial, final)  # fails on an existing note: the first account stays
        except FileExistsError:
            pass
        os.unlink(partial)
    else:
        os.replace(partial, final)


def read_notes(directory: str | Path) -> dict[str, dict]:
    """The notes of one batch, by host name."""
    return {
        path.stem: json.loads(path.read_text()) for path in sorted(Path(directory).glob("*.json"))
    }
