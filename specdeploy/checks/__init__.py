"""What is refused before any host is touched, and the pure rules over facts: GPUs, preflight,
memory, vLLM releases."""
