# Two commands set everything up: `make demo` and `make test` (a fresh Debian needs only python3, venv, pip,
# make and git). Both create .venv in the repo root and install kvaudit into it; `make test` also installs,
# as root, the system packages the integration tests use (scripts/system-deps.sh).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TEST_STAMP := $(VENV)/.test-installed
KIMI_HOST := fixtures/hosts/kimi-k25-tp8

.PHONY: demo test bench install clean golden explain-demo screenshot corpus

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e .
	$(BIN)/python -m compileall -q kvaudit  # byte-compiled once: every start reads the .pyc
	touch $(STAMP)

$(TEST_STAMP): $(STAMP) scripts/system-deps.sh pyproject.toml
	sh scripts/system-deps.sh
	$(BIN)/python -m pip install --quiet -e '.[test]'
	$(BIN)/python -m pip install --quiet -e '.[journal]' || echo "NOTE: systemd-python did not build; its tests will be skipped"
	$(BIN)/python -m pip install --quiet --only-binary :all: 'ripgrep>=14' || echo "NOTE: no ripgrep wheel for this machine; grep selects the lines (the ripgrep tests are skipped)"
	touch $(TEST_STAMP)

install: $(STAMP)

# The main job on the bundled example host: the Kimi-K2.5 server an operator asked about
# ("11.18 GB free on every GPU: wasted?"), captured from its host and audited as if live.
demo: $(STAMP)
	$(BIN)/kvaudit check $(KIMI_HOST)

# The same startup from its log alone.
explain-demo: $(STAMP)
	$(BIN)/kvaudit explain fixtures/journal_logs/kimi-k25-sglang-0.5.9-tp8-eagle3.log --model-config fixtures/configs/kimi-k2.5.json

test: $(TEST_STAMP)
	$(BIN)/ruff check kvaudit tests scripts bench
	$(BIN)/lint-imports --no-cache
	$(BIN)/mypy
	$(BIN)/python -m pytest -q

# Regenerate golden report files after a reviewed change of the output.
golden: $(TEST_STAMP)
	$(BIN)/python -m pytest -q tests/report --update-golden

# docs/fleet-report.png, made by headless Chromium from a demo fleet's HTML report (never by hand).
screenshot: $(STAMP)
	sh scripts/screenshot.sh

# One line per real log of fixtures/corpus (engine, version, exit, status, verdict, findings, headline), to read.
corpus: $(STAMP)
	$(BIN)/python scripts/corpus.py

bench: $(TEST_STAMP)
	$(BIN)/python bench/run.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache bench/out
