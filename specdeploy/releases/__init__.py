"""The vLLM releases specdeploy knows: one table per release (tables/, read from the release's own
wheels), the `Release` a pin is looked up to once (capabilities.py: its keys, rules, runtime,
flags and builds as attributes), the wheel probe behind `specdeploy releases add` (probe.py) and
the release matrix with its upgrade paths (matrix.py)."""
