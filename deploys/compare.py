# pyinfra INVENTORY deploys/compare.py — baseline vs speculative A/B on every host, then a report.
# One server at a time on the same accelerator, identical flags but --speculative-config, prefix
# caching off, a fresh server per sample, arms alternating A B A B; the host ends on its deployed
# unit.
# Settings (host data, or SPECDEPLOY_<NAME> in the environment): compare_repeats (unset:
# sequential, from 4 runs per arm adding rounds while the rule cannot decide, up to
# compare_max_repeats, 8), compare_warmup_runs (1), compare_apc_profile (true), compare_apc_repeats
# (1).
# Output: reports/<run>/summary.md, summary.json, *.png, raw/<host>/*.json (SPECDEPLOY_RUN names
# the run).
from specdeploy.flows.measure import measurement_deploy

measurement_deploy("compare")
