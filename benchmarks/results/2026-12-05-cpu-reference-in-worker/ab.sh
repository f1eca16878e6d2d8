#!/bin/bash
# A/B on one host, interleaved: `cuda-l1 eval --no-timing` of identical code, and `cuda-l1 bench` of a
# KernelBench-layout folder (eager, quick timing), before and after the reference ran in the worker.
#   bash ab.sh OLD_CHECKOUT NEW_CHECKOUT SOURCE OUT   (SOURCE: builtin, say; the bench runs its level 1)
# OLD/NEW: checkouts of the two commits (git worktree add DIR COMMIT). Prints one line per run.
set -euo pipefail
old=$1 new=$2 source=$3 out=$4
mkdir -p "$out"
ref=$new/tests/corpus/refs/tiny_relu.py
sed 's/^class Model(/class ModelNew(/' "$ref" > "$out/identical.py"
for i in 1 2 3 4; do
  for side in old new; do
    tree=${!side}
    start=$(date +%s.%N)
    PYTHONPATH=$tree/src python3 -m cuda_l1 eval --device cpu --json --no-timing "$ref" "$out/identical.py" \
      > "$out/eval-$side-$i.json" 2>/dev/null
    end=$(date +%s.%N)
    echo "eval $side $i wall_s=$(echo "$end - $start" | bc) $(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['status'])" "$out/eval-$side-$i.json")"
  done
done
for i in 1 2 3; do
  for side in old new; do
    tree=${!side}
    rm -rf "$out/bench-$side-$i"
    start=$(date +%s.%N)
    PYTHONPATH=$tree/src python3 -m cuda_l1 bench "$source" --levels 1 --device cpu --strategies eager \
      --out "$out/bench-$side-$i" > "$out/bench-$side-$i.log" 2>&1
    end=$(date +%s.%N)
    first=$(grep -m1 -o '(0:[0-9:]* elapsed' "$out/bench-$side-$i.log" || true)
    echo "bench $side $i wall_s=$(echo "$end - $start" | bc) first_verdict $first"
  done
done
