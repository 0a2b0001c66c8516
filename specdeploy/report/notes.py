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
