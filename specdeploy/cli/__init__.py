"""The `specdeploy` command: parses, then runs the rooms below (commands.py), and `migrate`, which
turns a `vllm serve` command line into host data (migrate.py)."""

from specdeploy.cli.commands import build_parser, main

__all__ = ["build_parser", "main"]
