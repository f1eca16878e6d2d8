# Identical code over the whole built-in suite, three pairs, alternately without and with the side
# stopped while the parent answers its rings: bash run.sh OUT (from anywhere inside the repository).
out="${1:?usage: run.sh OUT}"
mkdir -p "$out"
cd "$(git rev-parse --show-toplevel)" || exit 1
for pair in 1 2 3; do
  for mode in nostop stop; do
    echo "$(date -u +%H:%M:%S) $mode $pair"
    python3 benchmarks/results/2026-12-05-cpu-stopped-answer/interleaved_ab.py $mode --device cpu \
      --out "$out/full-$mode-$pair.json" > "$out/full-$mode-$pair.log" 2>&1
  done
done
echo "$(date -u +%H:%M:%S) done"
