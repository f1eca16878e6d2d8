#!/usr/bin/env bash
# The evaluator's GPU validation in one go, each step under its own time limit, every result under OUT:
#   bash benchmarks/gpu_validation.sh OUT [quick]
# 1. the GPU-marked evaluator tests (adversarial corpus on the GPU, faults, identical code),
# 2. verdicts on the GPU corpus with full timing (one JSON line each),
# 3. identical code over the built-in suite (raw within 2% / scored 1.00),
# 4. throughput of a mixed batch through the local pool.
# Run from the repository root with the package importable (pip install -e . or PYTHONPATH=src).
set -u
out="${1:?usage: gpu_validation.sh OUT [quick]}"
mode="${2:-full}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1
py="${PYTHON:-python3}"
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  "$py" -c "import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda)"
  date -u +%Y-%m-%dT%H:%M:%SZ
  git rev-parse HEAD 2>/dev/null
} > "$out/environment.txt" 2>&1

step() {  # step NAME SECONDS COMMAND...
  local name="$1" limit="$2"; shift 2
  local start=$(date +%s)
  timeout "$limit" "$@" > "$out/$name.log" 2>&1
  local rc=$?
  echo "$name: rc=$rc in $(( $(date +%s) - start )) s" | tee -a "$out/steps.txt"
}

quick=()
[ "$mode" = quick ] && quick=(--quick)
step gpu-tests 420 "$py" -m pytest -m gpu -q -p no:cacheprovider tests/test_adversarial_gpu.py tests/test_build.py
step gpu-corpus 420 "$py" benchmarks/corpus_verdicts.py --device cuda --kind gpu "${quick[@]}" --out "$out/gpu-corpus.jsonl"
step identical 480 "$py" benchmarks/identical_suite.py --device cuda --out "$out/identical-gpu.json"
step throughput 300 "$py" benchmarks/throughput.py --device cuda --limit 8 --out "$out/throughput.json"
tail -n 3 "$out"/*.log
