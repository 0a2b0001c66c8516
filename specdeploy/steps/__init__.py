"""What a deploy does to one host, each step its own module: lock, install, weights, dataset,
secrets, preflight, unit, gate, smoke, record, balancer, and rollback (the rolling restart that
guards the restart, health, smoke, gate and record). How the gate's runs are measured is sampling/'s
(below, shared with measure/ above); the lease renewal it needs is handed to it from lock.py. The
order the steps run in is flows/serve.py's.

A step that changes a host is a pyinfra `@deploy` or `@operation` that reads facts first and
schedules only what changes something, saying `host.noop(...)` otherwise. What runs at execution
time (inside `python.call`) goes through `specdeploy.host.on_host` and `specdeploy.host.server`."""
