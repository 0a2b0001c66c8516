# Production GPU hosts (the `prod` group is named after inventories/prod.py).
# Memory mechanism, chosen deliberately: a fraction of each GPU for this one vLLM instance.
# The draft model's weights and KV cache live inside the same budget as the target's.
gpu_memory_utilization = 0.92
