#!/usr/bin/env bash
# The evaluator's GPU validation, each step under its own time limit, every result under OUT:
#   bash benchmarks/gpu_validation.sh OUT [STEP ...]
# Steps (default: all, in this order):
#   smoke       two verdicts (identical matmul, side-stream hiding) with their logs; the steps after it
#               are skipped when identical code is not accepted, since nothing else could be judged
#   gpu-builds  the GPU-marked `load_inline` build tests (tests/test_build.py): on a fresh machine every build is
#               cold, and these took 164 s of an H100 call (2026-12-08), so they have a step of their own
#   gpu-tests   the other GPU-marked evaluator tests (the launch share, the oracle's memory, probe trials forked
#               from the fork server, the GPU corpus, faults, identical code), all but the CPU corpus's cases
#   gpu-tests-cpu-corpus  the GPU-marked tests of the CPU corpus's cases run on the GPU (test_cpu_corpus_on_gpu);
#               together the two took more than 470 s on an H100, so each has a step (and a call) of its own
#   gpu-corpus  verdicts on the GPU corpus with full timing (one JSON line each; GPU_CORPUS_NAMES: some, comma-separated)
#   cpu-corpus  the CPU corpus's cheats run on the GPU (quick timing; CPU_CORPUS_NAMES: some)
#   identical   identical code over the built-in suite (raw within 2% / scored 1.00)
#   throughput  a mixed batch through the local pool (THROUGHPUT_ARGS: more options, e.g. --input-memory-gib 32)
#   window-noise  where a memory-bound task's round noise comes from: identical code's every window
#               (identical_rounds.py) on NOISE_TASKS (default L1/07,L1/09,L1/11), with the default input
#               slots' budget, with NOISE_GIB (default 32) GiB for them, and with the CPUs kept out of deep
#               idle states (the kernel's PM QoS request, /dev/cpu_dma_latency, held at 0 us: does waking
#               a core make the jitter?), the last also without the pause after verification (--settle-ms 0),
#               and with the parent polling for each reply instead (--spin-reply-ms 100);
#               the host's idle states into cpu-idle.txt
#   sizes       every built-in reference timed at its CPU and GPU sizes (GPU_SIZES aim at >= 0.5 ms)
#   main-job    the README's main job, `cuda-l1 optimize builtin`, timed (set MAIN_JOB_ARGS to narrow it)
#   ablations   where identical code's bias comes from: a launch-bound and a memory-bound task, each
#               as is and with one difference between the sides removed (identical_rounds.py)
#   audit       `cuda-l1 audit` of AUDIT_SOLUTIONS (default .data/cuda-l1/h100.jsonl) into runs/audit, then
#               that run directory archived as OUT/audit-run.tgz even when the limit stopped it (reruns
#               resume from it: unpack it into runs/audit and carry it to the next run)
#   compile-time  the `load_inline` build: cold with the precompiled headers building, cold source with
#               them ready, cached (compile_time.py, no stock build)
#   preload     what importing torch.compile's modules in the fork server saves a compile candidate
#               (preload_effect.py on PRELOAD_TASK of .data/KernelBench, 3 verdicts with and without)
#   verify-cost what a full comparison of one large output costs (verify_cost.py; VERIFY_NUMEL float32
#               values, default 1610612736: the 6 GiB outputs of KernelBench's 4096 x 393216 tasks)
#   ring-cost   what a per-call doorbell would cost on the GPU (gpu_ring_cost.py, every mode: the child synchronising
#               and ringing after each call, the parent copying the next slot and reading a few output
#               positions from its own context), a launch-bound, a mid-size and a large tanh, and a matmul
#   hypotheses  the GPU-path hypotheses of benchmarks/gpu_hypotheses/README.md, a verdict each (HYPOTHESES: some of
#               h3c h3 h1a h1b h2 h4 h5 h1c; default all but h1c), under OUT/hypotheses
#   handle-sweep every byte of a legacy IPC handle edited and opened from another process: the premise of
#               allocations.py (benchmarks/gpu_hypotheses/handle_sweep.py), into OUT/handle-sweep.json
#   copy-jitter how much a 6 GiB copy and ReLU vary on the GPU alone, one process, host clock and events, with the
#               source fixed, drawn again or allocated anew (gpu_copy_jitter.py; COPY_GIB, default 6)
#   kb-tasks    `cuda-l1 bench` of a few KernelBench tasks (KB_TASKS, paths under KernelBench/, default
#               level 1's Swish and Softplus, whose 6 GiB inputs crowd an 80 GiB GPU) with KB_TASK_STRATEGIES
#               (default eager) into runs/kb-tasks, archived as OUT/kb-tasks-run.tgz (the verdicts' tracebacks)
#   kb-bench    `cuda-l1 bench` of KernelBench (.data/KernelBench/KernelBench) into runs/kb (KB_ARGS: levels,
#               strategies), archived the same way as OUT/kb-run.tgz
#   (audit, kb-bench: AUDIT_VERDICTS / KB_VERDICTS name a verdicts.jsonl of an earlier run, kept where the
#   run directory was not: its verdicts are taken instead of judged again, see `cuda-l1 bench --help`)
# MEMORY_SAMPLES=1 (optional): beside every step, the GPU's memory (in all and per process) and the five largest
# processes' resident memory, once a second, into OUT/memory-STEP.txt.gz: what a memory limit would have seen.
# HOLD_AWAKE=1 (optional): every step runs with the CPUs held out of deep idle states (as window-noise's third run),
# e.g. HOLD_AWAKE=1 IDENTICAL_ARGS='--settle-ms 0' ... identical throughput.
# DEADLINE_S (optional): seconds the whole script may take. Each step's limit is cut to what is left
# of it, less ARCHIVE_S (default 30) for the archives written after the audit and kb-bench steps, so a
# caller's own time limit never stops the script before a run store is archived.
# Run from the repository root with the package importable (pip install -e . or PYTHONPATH=src).
set -u
script_start=$(date +%s)
out="${1:?usage: gpu_validation.sh OUT [STEP ...]}"
shift
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(smoke gpu-builds gpu-tests gpu-tests-cpu-corpus gpu-corpus sizes identical throughput main-job)
mkdir -p "$out"
export PYTHONUNBUFFERED=1
py="${PYTHON:-python3}"
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  "$py" -c "import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda)"
  date -u +%Y-%m-%dT%H:%M:%SZ
  git rev-parse HEAD 2>/dev/null
  # which files ran (a copy's git metadata may name another commit): compare with the same line run locally
  # (LC_ALL=C: the order of the files, hence the sum, must not depend on the machine's locale)
  echo "src sha256 $(LC_ALL=C find src -name '*.py' -print0 | LC_ALL=C sort -z | xargs -0 cat | sha256sum | cut -c1-16)"
} > "$out/environment.txt" 2>&1

step() {  # step NAME SECONDS COMMAND...
  local name="$1" limit="$2"; shift 2
  local start=$(date +%s)
  if [ -n "${DEADLINE_S:-}" ]; then
    local left=$(( DEADLINE_S - (start - script_start) - ${ARCHIVE_S:-30} ))
    if [ "$left" -lt 10 ]; then
      echo "$name: skipped, ${left} s left of DEADLINE_S=${DEADLINE_S}" | tee -a "$out/steps.txt"
      return 124
    fi
    [ "$left" -lt "$limit" ] && limit=$left
  fi
  local sampler=""
  if [ -n "${MEMORY_SAMPLES:-}" ]; then
    memory_samples > "$out/memory-$name.txt" 2>&1 &
    sampler=$!
  fi
  timeout -s INT -k 20 "$limit" "$@" > "$out/$name.log" 2>&1
  local rc=$?
  if [ -n "$sampler" ]; then
    kill "$sampler" 2>/dev/null; wait "$sampler" 2>/dev/null
    gzip -f "$out/memory-$name.txt"
  fi
  echo "$name: rc=$rc in $(( $(date +%s) - start )) s" | tee -a "$out/steps.txt"
  return $rc
}

memory_samples() {  # once a second until killed: a time stamp, the GPU's memory, per process, the largest by RSS
  while true; do
    echo "t $(date +%s)"
    nvidia-smi --query-gpu=memory.used,memory.total --format=csv,noheader
    nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader
    ps -eo pid,rss,comm --sort=-rss | head -6
    sleep 1
  done
}

cpu_idle() {  # the host's CPU idle states and whether the PM QoS request can be held
  ls -l /dev/cpu_dma_latency
  cat /sys/devices/system/cpu/cpuidle/current_driver /sys/devices/system/cpu/cpuidle/current_governor*
  for st in /sys/devices/system/cpu/cpu2/cpuidle/state*; do
    [ -d "$st" ] || continue
    echo "$st $(cat "$st/name") latency_us=$(cat "$st/latency") usage=$(cat "$st/usage") disable=$(cat "$st/disable")"
  done
  cat /sys/devices/system/cpu/cpu0/cpufreq/scaling_governor
}

awake() {  # awake LOG: the CPUs held out of deep idle states (the PM QoS request at 0 us) by a process of
  # its own, whose pid goes into awake_pid: the request holds while its file stays open
  "$py" -c "import struct, time; fh = open('/dev/cpu_dma_latency', 'wb', buffering=0); fh.write(struct.pack('i', 0)); print('held', flush=True); time.sleep(86400)" \
    > "$1" 2>&1 &
  awake_pid=$!
  sleep 1
}

window_noise() {  # identical code's every window: default slots, NOISE_GIB GiB of slots, CPUs held out of deep idle
  local tasks="${NOISE_TASKS:-L1/07,L1/09,L1/11}" held
  "$py" benchmarks/identical_rounds.py --device cuda --tasks "$tasks" --repeats 1 --out "$out/noise-default.json"
  "$py" benchmarks/identical_rounds.py --device cuda --tasks "$tasks" --repeats 1 \
    --input-memory-gib "${NOISE_GIB:-32}" --out "$out/noise-${NOISE_GIB:-32}gib.json"
  awake "$out/noise-awake.log"
  held=$awake_pid
  "$py" benchmarks/identical_rounds.py --device cuda --tasks "$tasks" --repeats 1 --out "$out/noise-awake.json"
  # and without the pause after verification, which made up for the reference's process having just
  # worked (2026-12-02-h200-settle): is that a core's idle state too?
  "$py" benchmarks/identical_rounds.py --device cuda --tasks "$tasks" --repeats 1 --settle-ms 0 \
    --out "$out/noise-awake-settle0.json"
  kill "$held" 2>/dev/null || true
  # the parent alone kept awake for the replies: it polls for each one before sleeping on it
  "$py" benchmarks/identical_rounds.py --device cuda --tasks "$tasks" --repeats 1 --spin-reply-ms 100 \
    --out "$out/noise-spin.json"
}

[ -n "${HOLD_AWAKE:-}" ] && awake "$out/hold-awake.log" && trap 'kill "$awake_pid" 2>/dev/null' EXIT

ablations() {  # identical code on a launch-bound and a memory-bound task, one side difference removed each time
  # ABLATION_VARIANTS: '|'-separated identical_rounds.py options ('' is "as is"); ABLATION_TASKS; ABLATION_REPEATS
  local variant name variants
  IFS='|' read -r -a variants <<< "${ABLATION_VARIANTS:-|--fresh-reference|--checked-calls 1|--cpu-core 3}"
  for variant in "${variants[@]}"; do
    name="ablation${variant// /}"
    echo "variant: ${variant:-as is}"
    # shellcheck disable=SC2086  # the variant is one or two words
    "$py" benchmarks/identical_rounds.py --device cuda --repeats "${ABLATION_REPEATS:-2}" $variant \
      --tasks "${ABLATION_TASKS:-tests/corpus/refs/many_small_ops.py,L1/07_SumOverDim}" --out "$out/${name}.json" | cut -c1-400
  done
}

for s in "${steps[@]}"; do
  case "$s" in
    smoke)
      step smoke "${SMOKE_S:-150}" "$py" benchmarks/corpus_verdicts.py --device cuda --kind gpu \
        --names "${SMOKE_CASES:-identical_matmul,side_stream}" --out "$out/smoke.jsonl"
      if ! grep -q '"case": "identical_matmul".*"met": true' "$out/smoke.jsonl" 2>/dev/null; then
        echo "smoke failed: identical code not accepted; later steps skipped" | tee -a "$out/steps.txt"
        tail -c 4000 "$out/smoke.log"
        exit 1
      fi ;;
    gpu-builds) step gpu-builds "${GPU_BUILDS_S:-300}" "$py" -m pytest -m gpu -v -p no:cacheprovider --timeout 200 -rfEx \
        --durations 15 tests/test_build.py ;;
    gpu-tests) step gpu-tests "${GPU_TESTS_S:-480}" "$py" -m pytest -m gpu -v -p no:cacheprovider --timeout 120 -rfEx \
        --durations 15 -k "not test_cpu_corpus_on_gpu" tests/test_launch_share.py \
        tests/test_oracle_memory.py tests/test_fork_server.py tests/test_adversarial_gpu.py ;;
    gpu-tests-cpu-corpus) step gpu-tests-cpu-corpus "${GPU_CPU_CORPUS_TESTS_S:-480}" "$py" -m pytest -m gpu -q \
        -p no:cacheprovider --timeout 120 -rfEx --durations 15 tests/test_adversarial_gpu.py -k test_cpu_corpus_on_gpu ;;
    gpu-corpus) step gpu-corpus "${GPU_CORPUS_S:-300}" "$py" benchmarks/corpus_verdicts.py --device cuda --kind gpu \
        ${GPU_CORPUS_NAMES:+--names "$GPU_CORPUS_NAMES"} --out "$out/gpu-corpus.jsonl" ;;
    cpu-corpus) step cpu-corpus "${CPU_CORPUS_S:-300}" "$py" benchmarks/corpus_verdicts.py --device cuda --kind cpu \
        --quick ${CPU_CORPUS_NAMES:+--names "$CPU_CORPUS_NAMES"} --out "$out/cpu-corpus.jsonl" ;;
    identical) step identical "${IDENTICAL_S:-400}" "$py" benchmarks/identical_suite.py --device cuda \
        --out "$out/identical-gpu.json" ${IDENTICAL_ARGS:-} ;;
    audit) step audit "${AUDIT_S:-400}" "$py" -m cuda_l1 audit "${AUDIT_SOLUTIONS:-.data/cuda-l1/h100.jsonl}" \
        --out runs/audit --device cuda ${AUDIT_VERDICTS:+--verdicts-from "$AUDIT_VERDICTS"}
      tar czf "$out/audit-run.tgz" runs/audit ;;
    preload) step preload "${PRELOAD_S:-300}" "$py" benchmarks/preload_effect.py --device cuda \
        --source .data/KernelBench/KernelBench --task "${PRELOAD_TASK:-L1/1_Square_matrix_multiplication_}" \
        --out "$out/preload-effect.json" ;;
    kb-bench) # a resumed run (its store carried in) has had its noise check: no second one per call
      resumed=""; [ -s runs/kb/calibration.json ] && resumed="--no-calibrate"
      step kb-bench "${KB_S:-400}" "$py" -m cuda_l1 bench .data/KernelBench/KernelBench --out runs/kb \
        --device cuda ${KB_ARGS:---levels 1,2,3 --strategies eager,compile,compile-ro,cudagraph} $resumed \
        ${KB_VERDICTS:+--verdicts-from "$KB_VERDICTS"}
      tar czf "$out/kb-run.tgz" runs/kb ;;
    verify-cost) step verify-cost "${VERIFY_S:-200}" "$py" benchmarks/verify_cost.py --device cuda \
        --numel "${VERIFY_NUMEL:-1610612736}" --out "$out/verify-cost.json" ;;
    compile-time) step compile-time "${COMPILE_S:-200}" "$py" benchmarks/compile_time.py --repeats 1 --skip-stock \
        --out "$out/compile-time.json" ;;
    throughput) step throughput "${THROUGHPUT_S:-240}" "$py" benchmarks/throughput.py --device cuda --limit 8 \
        --out "$out/throughput.json" ${THROUGHPUT_ARGS:-} ;;
    window-noise) cpu_idle > "$out/cpu-idle.txt" 2>&1
      export out py; export -f window_noise awake
      step window-noise "${NOISE_S:-300}" bash -c window_noise ;;
    kb-tasks) kb_tasks=$(mktemp -d)
      for t in ${KB_TASKS:-level1/25_Swish.py level1/29_Softplus.py}; do
        mkdir -p "$kb_tasks/$(dirname "$t")" && cp ".data/KernelBench/KernelBench/$t" "$kb_tasks/$t"
      done
      step kb-tasks "${KB_TASKS_S:-200}" "$py" -m cuda_l1 bench "$kb_tasks" --out runs/kb-tasks --device cuda \
        --levels 1,2,3 --strategies "${KB_TASK_STRATEGIES:-eager}" --no-calibrate
      tar czf "$out/kb-tasks-run.tgz" runs/kb-tasks ;;
    copy-jitter) step copy-jitter "${COPY_S:-200}" "$py" benchmarks/gpu_copy_jitter.py --gib "${COPY_GIB:-6}" \
        --out "$out/copy-jitter.json" ;;
    ring-cost) step ring-cost "${RING_S:-240}" bash -c "$py benchmarks/gpu_ring_cost.py --op tanh \
        --numel 1024 262144 16777216 --out '$out/ring-cost-tanh.json' && $py benchmarks/gpu_ring_cost.py \
        --op matmul --numel 65536 1048576 --out '$out/ring-cost-matmul.json'" ;;
    sizes) step sizes "${SIZES_S:-300}" "$py" benchmarks/builtin_sizes.py --out "$out/builtin-sizes.json" ;;
    hypotheses) step hypotheses "${HYPOTHESES_S:-600}" bash benchmarks/gpu_hypotheses/run.sh "$out/hypotheses" \
        ${HYPOTHESES:-} ;;
    handle-sweep) step handle-sweep "${SWEEP_S:-120}" "$py" benchmarks/gpu_hypotheses/handle_sweep.py \
        --out "$out/handle-sweep.json" ;;
    main-job) step main-job "${MAIN_JOB_S:-540}" bash -c \
        "time $py -m cuda_l1 optimize builtin --out /tmp/runs-builtin ${MAIN_JOB_ARGS:-}; cp /tmp/runs-builtin/*.json /tmp/runs-builtin/*.md '$out/' 2>/dev/null; true" ;;
    ablations) export -f ablations; export out py
      step ablations "${ABLATIONS_S:-500}" bash -c ablations ;;
    *) echo "unknown step: $s" >&2; exit 2 ;;
  esac
done
tail -n 3 "$out"/*.log
