# Two commands on a fresh machine: `make demo` (the main job) and `make test`.
# Both bootstrap .venv/ at the repo root. torch comes first and pinned, so that pip
# takes the local CPU build rather than downloading a CUDA build.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
TORCH_SPEC ?= torch==2.13.0

.PHONY: demo test clean-venv

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[test]"
	touch $@

demo: $(VENV)/.installed
	$(PY) -m cutedsl_inductor demo

test: $(VENV)/.installed
	$(PY) -m pytest -q tests

clean-venv:
	rm -rf $(VENV)
