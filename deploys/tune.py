# pyinfra INVENTORY deploys/tune.py — choose num_speculative_tokens on the recorded workload,
# recommend the smallest k whose TPOT is within the noise band of the best, and print the host-data
# change. It never edits group_data or host data. Same measurement rules as deploys/compare.py.
# tune_method "predict" (default, specdeploy/measure/tune_flow.py): baseline + the smallest, largest
# (and middle) k, predict every k, confirm the predicted best against its neighbours and the
# baseline; "sweep": measure every k. Settings (host data, or SPECDEPLOY_<NAME> in the environment):
# tune_method, tune_k ("1-7", or "1,2,4" / a list), tune_repeats (3), tune_warmup_runs (1).
# Output: reports/<run>/summary.md, summary.json, tune_tpot.png, raw/<host>/ (prediction.json).
from specdeploy.flows.measure import measurement_deploy

measurement_deploy("tune")
