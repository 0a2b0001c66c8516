"""Reading and driving one host: facts (one module per tool), commands with the host's sudo
settings, the server lifecycle, benchmarks, and the scripts that run there."""
