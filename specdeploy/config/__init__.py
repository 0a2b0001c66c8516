"""Host data and what the host keeps: the one schema, the deployment record, the request set,
pinned revisions."""
