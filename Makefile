# Two commands set everything up: `make demo` and `make test` (a fresh Debian needs only python3, venv, pip,
# make and git). Both create .venv in the repo root and install kvaudit into it.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
KIMI := fixtures/journal_logs/kimi-k25-sglang-0.5.9-tp8-eagle3.log

.PHONY: demo test bench install clean golden

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

# The main job on the bundled example: the Kimi-K2.5 startup an operator asked about ("11.18 GB free: wasted?").
demo: $(STAMP)
	$(BIN)/kvaudit explain $(KIMI) --model-config fixtures/configs/kimi-k2.5.json

test: $(STAMP)
	$(BIN)/python -m pytest -q

# Regenerate golden report files after a reviewed change of the output.
golden: $(STAMP)
	$(BIN)/python -m pytest -q tests/report --update-golden

bench: $(STAMP)
	$(BIN)/python bench/run.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache bench/out
