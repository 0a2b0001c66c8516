"""Pure decision code, no host and no I/O: statistics, verdicts, the gate rule, choosing and
predicting k, vLLM's counters. The benchmarks import it as a library."""
