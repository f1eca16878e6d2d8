#!/usr/bin/env bash
# Each hypothesis of README.md judged once on a GPU, its verdict as one JSON line under OUT:
#   bash benchmarks/gpu_hypotheses/run.sh OUT [CASE ...]      (CASE: h3c h3 h1a h1b h2 h4 h5 h1c; default all but h1c)
# Run from the repository root with the package importable (pip install -e . or PYTHONPATH=src).
set -u
out="${1:?usage: run.sh OUT [CASE ...]}"
shift
cases=("$@")
[ ${#cases[@]} -eq 0 ] && cases=(h3c h3 h1a h1b h2 h4 h5)
here=benchmarks/gpu_hypotheses
refs=tests/corpus/refs
declare -A task=([h1a]=$refs/gpu_matmul.py [h1b]=$refs/gpu_matmul.py [h1c]=$refs/gpu_matmul.py
                 [h2]=$refs/big_relu_add.py [h3]=$here/l2_reuse_task.py [h3c]=$here/l2_reuse_task.py
                 [h4]=$refs/transpose_copy.py [h5]=$refs/many_small_ops.py)
declare -A file=([h1a]=../../tests/corpus/gpu/deferred_behind_copy [h1b]=h1b_semaphore_blocked [h1c]=h1c_defer_when_first
                 [h2]=h2_find_reference_buffer [h3]=h3_l2_persist [h3c]=h3_control_identical
                 [h4]=h4_handle_alias_input_view [h5]=../../tests/corpus/gpu/batch_window_views_gpu)
mkdir -p "$out"
for name in "${cases[@]}"; do
  if [ -z "${file[$name]:-}" ]; then
    echo "$name: no such case (h3c h3 h1a h1b h2 h4 h5 h1c)" | tee -a "$out/summary.txt"
    continue
  fi
  start=$(date +%s)
  timeout -k 20 "${CASE_S:-240}" "${PYTHON:-python3}" -m cuda_l1 eval "${task[$name]}" "$here/${file[$name]}.py" \
    --device cuda --json > "$out/$name.json" 2> "$out/$name.err"
  rc=$?
  "${PYTHON:-python3}" - "$out/$name.json" "$name" "$rc" "$(( $(date +%s) - start ))" <<'PY' | tee -a "$out/summary.txt"
import json, sys
path, name, rc, took = sys.argv[1:]
try:
    v = json.load(open(path))
except Exception as exc:  # noqa: BLE001 - a crashed run is a line too
    print(f"{name}: rc={rc} in {took} s, no verdict ({type(exc).__name__})")
    raise SystemExit
t = v.get("timing") or {}
print(f"{name}: rc={rc} in {took} s: {v['status']} score={v.get('speedup')} raw={v.get('raw_speedup')} "
      f"idle_wait_ms={t.get('last_idle_wait_ms')} reasons={v.get('reasons', [])[:2]} "
      f"failed={[c['name'] for c in v.get('checks', []) if c.get('passed') is False]}")
PY
done
