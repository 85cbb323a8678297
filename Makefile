# Two commands on a fresh machine: `make demo` (the main job) and `make test`.
# Both bootstrap .venv/ at the repo root. torch comes first and pinned, so that pip
# takes the local CPU build rather than downloading a CUDA build.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
TORCH_SPEC ?= torch==2.13.0

.PHONY: demo test redis-server clean-venv

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[test]"
	touch $@

demo: $(VENV)/.installed
	$(PY) -m cutedsl_inductor demo

test: $(VENV)/.installed redis-server
	$(PY) -m pytest -q tests

# The remote-cache tests start Debian's redis-server on a free localhost port; installed
# here when missing and the user is root (CI), else those tests skip and say why.
redis-server:
	@command -v redis-server >/dev/null || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	      --no-install-recommends redis-server >/dev/null; \
	  else \
	    echo "redis-server is missing and this user cannot install it: the remote-cache tests skip"; \
	  fi; }

clean-venv:
	rm -rf $(VENV)
