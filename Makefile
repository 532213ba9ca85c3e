# Two entry points: `make demo` (the main job) and `make test`. Each builds .venv on first use.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   ?= .venv
PY     := $(VENV)/bin/python
# The CPU build of torch: pip would otherwise pull a multi-GB CUDA build. Override TORCH_SPEC / PIP_EXTRA to taste,
# e.g. PIP_EXTRA="--extra-index-url https://download.pytorch.org/whl/cpu" off this machine.
TORCH_SPEC ?= torch==2.13.0
PIP_EXTRA  ?=

.PHONY: demo test venv bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(PIP_EXTRA) "$(TORCH_SPEC)"
	$(PY) -m pip install -q $(PIP_EXTRA) -e '.[test]'
	touch $@

venv: $(VENV)/.installed

demo: $(VENV)/.installed
	$(PY) -m bertkit demo --out runs/demo

test: $(VENV)/.installed
	$(PY) -m pytest -q

bench: $(VENV)/.installed
	for b in benchmarks/*.py; do $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) runs build src/*.egg-info
