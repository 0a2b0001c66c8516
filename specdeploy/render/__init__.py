"""Host data to text: the vLLM argv, the systemd units and env files, a whole box's instance
layout."""
