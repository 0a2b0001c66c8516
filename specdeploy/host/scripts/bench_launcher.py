"""`vllm bench serve` started ahead of its server: vLLM's CLI modules are imported at once (seconds
of CPU, spent while the server starts), the benchmark runs when the go file appears, through
vLLM's own CLI entry point with its own arguments. argv: GO_FILE, then vLLM's CLI arguments."""

import importlib
import os
import sys
import time

go = sys.argv[1]
sys.argv = [sys.argv[0], *sys.argv[2:]]  # the command line vLLM's CLI parses: bench serve ...
# what vllm.entrypoints.cli.main.main() imports first (in 0.26 to 0.33), and the benchmark itself
for module in (
    "vllm.entrypoints.cli.benchmark.main",
    "vllm.entrypoints.cli.collect_env",
    "vllm.entrypoints.cli.launch",
    "vllm.entrypoints.cli.openai",
    "vllm.entrypoints.cli.run_batch",
    "vllm.entrypoints.cli.serve",
    "vllm.entrypoints.cli.benchmark.serve",
):
    importlib.import_module(module)
from vllm.entrypoints.cli.main import main  # noqa: E402

while not os.path.exists(go):
    time.sleep(0.05)
main()
