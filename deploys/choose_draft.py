# pyinfra INVENTORY deploys/choose_draft.py — which draft, at which k, on the workload's request
# set: each entry of host data `draft_candidates` that cannot run (vocabulary, memory with its
# weights and KV, the release's methods) is refused by name before anything is downloaded; the
# rest are downloaded at pinned revisions, run once at the largest tune_k, predicted over tune_k,
# and the best two proven against the baseline at decision_alpha (else: speculation off). It
# prints the host-data change; it never edits host data. Measured as deploys/compare.py measures.
# Output: reports/<run>/summary.md, summary.json, draft_tpot.png, raw/<host>/draft_choice.json.
from specdeploy.flows.measure import measurement_deploy

measurement_deploy("choose_draft")
