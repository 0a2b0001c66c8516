# pyinfra INVENTORY deploys/serve.py — roll out the speculative vLLM server on every host.
# Steps (see specdeploy/serve.py): check -> install -> weights -> preflight -> unit -> health ->
# smoke -> record.
from specdeploy.serve import serve

serve()
