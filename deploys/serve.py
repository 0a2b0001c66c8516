# pyinfra INVENTORY deploys/serve.py — roll out the speculative vLLM server on every host. Steps
# (see specdeploy/flows/serve.py): check -> install -> weights -> preflight -> unit -> health ->
# smoke -> record.
from specdeploy.flows.serve import serve

serve()
