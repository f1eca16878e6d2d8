#!/bin/bash
# A/B of a process's start, before and after the two-stage fork server, on one host, interleaved.
#   bash ab.sh OLD_CHECKOUT NEW_CHECKOUT OUT
# OLD/NEW: checkouts of the two commits (git worktree add DIR COMMIT). Writes OUT/eval-*.json,
# OUT/throughput-*.json and prints one line per run.
set -euo pipefail
old=$1 new=$2 out=$3
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
    echo "eval $side $i wall_s=$(echo "$end - $start" | bc) $(python3 -c "import json,sys; v=json.load(open(sys.argv[1])); print(v['status'], v['sandbox'].get('started'), v['sandbox'].get('preloaded'))" "$out/eval-$side-$i.json")"
  done
done
for i in 1 2 3; do
  for side in old new; do
    tree=${!side}
    (cd "$tree" && PYTHONPATH=$tree/src python3 benchmarks/throughput.py --device cpu --limit 1 \
      --out "$out/throughput-$side-$i.json" > "$out/throughput-$side-$i.log" 2>&1)
    # The first verdict's line: "t= T s TASK STRATEGY STATUS E s {phases}"; T - E is when its evaluation began.
    python3 - "$out/throughput-$side-$i.json" "$out/throughput-$side-$i.log" $side $i <<'PY'
import json, re, sys
d = json.load(open(sys.argv[1]))
line = next(l for l in open(sys.argv[2]) if l.startswith("t="))
t, e = map(float, re.match(r"t=\s*([\d.]+)s\s+\S+\s+\S+\s+\S+\s+([\d.]+)s", line).groups())
print("throughput", sys.argv[3], sys.argv[4], d["worker_start_s"], "first_verdict_s", t, "its_evaluation_s", e,
      "began_at_s", round(t - e, 2))
PY
  done
done
