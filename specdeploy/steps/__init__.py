"""Deploy steps, numbered as in the README ("What deploys/serve.py does on each host"):
1 check (specdeploy/checks.py) -> 2 install -> 3 weights -> 4 preflight (specdeploy/preflight.py)
-> 5 unit -> 6 health -> 7 smoke -> 8 record; `lock` brackets them, `rollback` guards 6-8.

Steps that change a host are pyinfra `@deploy`s or `@operation`s that read facts first and only
schedule work that changes something (install, weights, secrets, unit, lock). Steps 6-8 and the
rollback run at execution time inside `python.call`, through `specdeploy.on_host`."""
