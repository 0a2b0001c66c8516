"""Deploy steps, in the order `deploys/serve.py` runs them:
install -> weights -> preflight -> unit -> health -> smoke -> record.
Each step is a pyinfra @deploy that reads facts first and only schedules work that changes something."""
