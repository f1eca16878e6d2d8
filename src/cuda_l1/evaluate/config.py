"""Evaluation settings. Every field has a one-line help; defaults are the trusted policy."""

from __future__ import annotations

import math

from dataclasses import dataclass

from cuda_l1.devices import is_spelled
from cuda_l1.errors import UserError
from cuda_l1.evaluate.tolerance import ToleranceConfig
from cuda_l1.evaluate.protocol import MODULE_MODES
from cuda_l1.settings import setting
from cuda_l1.tasks.deadline import DEFAULT_TASK_TIMEOUT_S


@dataclass
class SandboxConfig:
    """Limits and isolation layers for one side's process."""

    namespaces: bool = setting(True, "new PID, network and mount namespaces where the platform allows")
    landlock: bool = setting(True, "filesystem (and TCP, signal) confinement where the kernel allows")
    seccomp: bool = setting(True, "refuse scheduling, affinity, ptrace and namespace system calls")
    drop_identity: bool = setting(True, "an unprivileged uid where possible, else uid 0 without capabilities")
    cgroup: bool = setting(True, "a cgroup v2 of its own (atomic freezing, CPU accounting) where one can be made")
    memory_bytes: int = setting(16 * 2**30, "host memory a candidate's side may hold on any task (resident, tmpfs, "
                                "memfd; not page cache) where the reference's side may hold as much; more on "
                                "tasks whose reference holds more")
    memory_factor: float = setting(2.0, "a candidate may hold this many times the reference's peak host memory...")
    memory_headroom_bytes: int = setting(4 * 2**30, "... plus this much (compilers, a copy of the weights)")
    reference_memory_bytes: int | None = setting(None, "host memory the reference's own side may hold (None: half "
                                                 "of this host's memory)")
    fork_server: bool = setting(True, "start sides by forking a process that has imported torch (a side ready "
                                "in 0.07 s on a CPU, 0.5 s on an H200, against 2.4 s and 5 s; each still confines "
                                "itself before any device or candidate code)")
    preload_compilers: bool = setting(True, "the fork server's second stage imports torch.compile's modules "
                                      "(Dynamo, Inductor) once, so a compiling candidate's side does not (its "
                                      "load 4.8 s instead of 10.9 s on an H200); checked as safe to fork first; "
                                      "sides asked for before it is ready come from the first stage")
    shm_bytes: int = setting(64 * 2**20, "size of the side's private /dev/shm")
    scratch_bytes: int = setting(4 * 2**30, "size of the side's scratch directory (a tmpfs"
                                 " where mount namespaces work)")
    max_processes: int = setting(32, "processes in the side's tree (fork bombs end here)")
    max_threads: int = setting(4096, "threads in the side's tree, all processes together: without a pids "
                               "controller nothing else stops a side from taking the host's pid space")
    cpu_seconds: int = setting(3600, "RLIMIT_CPU")
    file_bytes: int = setting(512 * 2**20, "RLIMIT_FSIZE: largest file the side may write")
    open_files: int = setting(4096, "RLIMIT_NOFILE")
    log_bytes: int = setting(16_000, "how much of the side's output (stdout and stderr) the verdict keeps: its "
                             "first and last halves, with the count of bytes dropped between")
    scratch_root: str | None = setting(None, "where scratch directories are made (default: the system temp dir)")
    keep_scratch: bool = setting(False, "keep the scratch directory for debugging")

    def confine_plan(self, scratch: str, uid: int | None, cpu_core: int | None = None, read_paths=(),
                     address_space_bytes: int | None = None):
        """The confine.ConfinePlan a side started under these settings applies to itself, before the
        namespaces and socket families that probe.usable_plan finds for this machine."""
        from cuda_l1.evaluate.confine import ConfinePlan

        return ConfinePlan(scratch=scratch, landlock=self.landlock, seccomp=self.seccomp,
                           drop_identity=self.drop_identity, uid=uid, cpu_core=cpu_core, shm_bytes=self.shm_bytes,
                           scratch_bytes=self.scratch_bytes, read_paths=list(read_paths),
                           limits={"cpu_s": self.cpu_seconds, "file_bytes": self.file_bytes,
                                   "open_files": self.open_files, "address_space_bytes": address_space_bytes})



@dataclass
class TimingConfig:
    """The timing protocol: rounds of one window per side, in random order, on fresh inputs."""

    enabled: bool = setting(True, "time candidates (off: correctness only, a few rounds)")
    window_s: float = setting(0.02, "target length of one window (a batch of back-to-back calls)")
    warmup_rounds: int = setting(3, "rounds before any is recorded (the first is always one call per side)")
    warmup_s: float = setting(0.2, "and at least this long")
    min_rounds: int = setting(12, "recorded rounds before stopping is allowed")
    max_rounds: int = setting(200, "hard cap on recorded rounds")
    target_width: float = setting(0.02, "stop once the 95% interval is this narrow, relative to the speedup")
    max_time_s: float = setting(10.0, "cap on the recorded phase")
    flush_cache: bool = setting(True, "flush the last-level cache before every window")
    spot_checks: int = setting(64, "positions of every output compared for each checked call")
    checked_calls: int = setting(8, "calls of each candidate window, drawn after it, compared with the reference")
    full_check_rate: float = setting(0.2, "share of later rounds in which one checked call is compared in full")
    settled_calls: int = setting(4, "GPU: calls of each candidate window whose outputs are read at a few positions "
                                 "right after the window and again at verification: an output that changed in "
                                 "between was finished after the window, in time no side was charged for (0: off)")
    settle_rate: float = setting(1.0, "GPU: the chance, drawn after each candidate window, that its outputs are read "
                                 "right after it (settled_calls). 1: every round (no round exempt). Lower pays the "
                                 "read and the pause after it (~13 ms a round on an H100) in a share of the rounds, "
                                 "and lets a candidate that defers work in a few rounds escape with a chance")
    oracle_rate: float = setting(0.3, "after the first round (always), the chance that a round's checked calls "
                                 "include one compared in full against the float64 oracle, drawn after the "
                                 "window: no round is known to be exempt")
    settle_s: float = setting(0.02, "GPU: pause this long after each round's verification, which runs in the "
                              "reference's process and otherwise speeds up its next window by ~4% (with 0.02 "
                              "identical code came out within 2% on 36 of 36 H200 tasks, all scored 1.00)")
    process_spread: float | None = setting(None, "one standard deviation of identical code's log speedup from one "
                                           "pair of processes to the next (memory placement), which rounds within "
                                           "an evaluation cannot see: it widens the interval the score is taken "
                                           "from. None: 0.04 on a CPU; on a GPU 0.0075 for a forward the device "
                                           "paces, moved toward 0.04 by how launch-bound the reference is "
                                           "(measured with identical code; docs/timing.md)")
    remeasure_above: float = setting(3.0, "re-measure in a fresh process when the speedup exceeds this")
    decide_early: bool = setting(True, "stop once the interval is clear of every speedup the caller decides at "
                                 "(EvalJob.thresholds), after min_rounds")
    decide_margin: float = setting(0.05, "... clear of each by this much, relative (a CPU host's noise band)")
    remeasure_vs_best: float = setting(2.0, "... or exceeds this multiple of the best speedup known for the task")

    @classmethod
    def quick(cls) -> "TimingConfig":
        """Short runs for tests and CPU smoke checks."""
        return cls(window_s=0.01, warmup_rounds=2, warmup_s=0.05, min_rounds=10, max_rounds=40, target_width=0.04,
                   max_time_s=3.0)


@dataclass
class EvalConfig:
    """Everything that decides how one candidate is judged."""

    device: str = setting("cpu", '"cpu", "cuda" or "cuda:N"')
    tolerance: ToleranceConfig = setting(factory=ToleranceConfig, help="the precision policy")
    timing: TimingConfig = setting(factory=TimingConfig, help="the timing protocol")
    sandbox: SandboxConfig = setting(factory=SandboxConfig, help="isolation and limits of each side")
    correctness_trials: int = setting(5, "rounds of a correctness-only evaluation (timing off), each with one "
                                      "call compared in full against the float64 oracle (timed: see oracle_rate)")
    timeout_s: float = setting(180.0, "wall-clock limit for one candidate's whole evaluation (load, checks, timing)")
    load_timeout_s: float = setting(900.0, "importing the candidate, including extension builds")
    task_timeout_s: float = setting(DEFAULT_TASK_TIMEOUT_S, "the task's own code in the evaluator's process, "
                                    "each of: importing it, its reference's first run; past it the task is "
                                    "reported broken (a sleep or endless loop in a task file hung every command)")
    first_call_timeout_s: float = setting(300.0, "the first window (JIT compilers such as Triton or torch.compile)")
    call_timeout_s: float = setting(60.0, "any later window")
    module_mode: str = setting("train", '"train": both models run as constructed (KernelBench\'s harness: '
                               'BatchNorm normalises with the batch\'s statistics) or "eval": model.eval() on both '
                               'sides first (CUDA-L1\'s harness: running statistics, no dropout)')
    threads: int | None = setting(None, "CPU threads of each side (default 1 on CPU: both sides share one core)")
    cpu_core: int | None = setting(None, "the core both sides run on from their start (None: on CPU "
                                   "the idlest core; on a GPU see pin_gpu_sides)")
    busy_cores: tuple[int, ...] = setting((), "cores other workers of the same pool time their sides on: "
                                          "while a CPU window runs, the parent waits for each call's ring off "
                                          "them as well as off its own timed core (where that leaves no core, "
                                          "it waits on its timed core, asleep, and neither it nor the side "
                                          "polls); on a GPU a reference side spread over the cores for its "
                                          "float64 oracle keeps off them")
    pin_gpu_sides: bool = setting(True, "on a GPU without cpu_core: after the first (JIT-compiling) window, "
                                  "pin every thread of both sides to one core, the idlest, so CPU a side "
                                  "burns beside its calls (a spinning helper process) is taken from its own calls")
    timed_core: int | None = setting(None, "the core pin_gpu_sides pins to (None: the idlest; a local pool "
                                     "gives each GPU worker its own)")
    best_known_speedup: float | None = setting(None, "best verified speedup for this task, for the re-measure rule")
    remeasure: bool = setting(True, "apply the re-measure rule")
    prewarm: bool | None = setting(None, "keep spare side processes (torch imported, device ready) "
                                   "started ahead; default: on CUDA")
    spares: int = setting(3, "with prewarm, how many spare sides a worker keeps starting: a run of quick "
                          "rejections takes one each, and a spare that is still starting waits")
    fresh_reference: bool | None = setting(None, "a new reference side for every candidate, as new as the "
                                           "candidate's own (None: on a CPU, where a reference side kept "
                                           "across candidates read 2.5-10% faster than a new candidate's side "
                                           "running identical code; kept on a GPU, where a start costs a "
                                           "CUDA context and no such gap was measured)")
    heap_reserve_bytes: int = setting(1 << 30, "CPU: at most this much host heap each side touches once before its "
                                      "first window (20 of the task's output blocks, or 4 per input slot if "
                                      "more; warmup.reserve_heap): without it the heap grew through the first "
                                      "windows, page-faulting at rounds that differed between the sides; 0: none")
    lookahead: int | None = setting(None, "candidates a worker loads ahead (side, import, model, builds) while it "
                                    "times another, each stopped for every timed window (None: 2 on a GPU, 0 on "
                                    "a CPU, where a loading side would take the timed core's only neighbour)")
    build_cache_dir: str | None = setting(None, "where extension builds are cached (default:"
                                          " CUDA_L1_CACHE or ~/.cache)")
    input_memory_bytes: int | None = setting(None, "budget for the input slots of both sides "
                                             "(default on a GPU: two fifths of its memory, at most half of what is free when the "
                                             "task is prepared; 1 GiB on a CPU)")

    def __post_init__(self) -> None:
        # The whole tree is checked here, nested settings included: an Evaluator copies its config
        # with dataclasses.replace, so values changed after construction are checked then too.
        check_settings(self)

    def config_key(self) -> str:
        """What makes two verdicts comparable: the precision policy and how long and how finely the
        timing protocol measures (so speedups measured with quick timing never mix with full ones)."""
        tc = self.timing
        decide = f"{tc.decide_margin:g}" if tc.decide_early else "off"  # early stops give wider intervals
        # The pause applies on a GPU only: CPU verdicts keep the key they had before it existed.
        settle = f"/settle={tc.settle_s:g}" if tc.settle_s and self.device.startswith("cuda") else ""
        # The device's default spread keeps the keys from before it: it moves only scores within about
        # 2 spreads of 1.00 to 1.00 (raw speedups and the rounds are as before).
        settle += f"/spread={tc.process_spread:g}" if tc.process_spread is not None else ""
        timing = ("off" if not tc.enabled else
                  f"{tc.window_s:g}/{tc.min_rounds}-{tc.max_rounds}/{tc.target_width:g}/{tc.max_time_s:g}"
                  f"/decide={decide}/oracle={tc.oracle_rate:g}" + settle)
        tol = self.tolerance  # (as floats: an error_factor of 10 is the default's 10.0)
        return (f"tol={tol.mode}:{float(tol.error_factor)}:{float(tol.floor_eps)}:{float(tol.low_precision_ulps)}"
                f"|trials={self.correctness_trials}|timing={timing}"
                + ("|mode=eval" if self.module_mode == "eval" else "")  # train: the keys from before the mode
                + self._limits_key())

    def _limits_key(self) -> str:
        """The limits that can turn one program's verdict into another (ok or timeout, ok or a memory
        failure) and the re-measure rule, where they differ from their defaults (stores made with the
        defaults keep their keys): a verdict judged with an 1800 s limit is not one of a 180 s judge."""
        changed = [f"{name}={_key_value(getattr(part, name), default)}"
                   for part, defaults in ((self, _DEFAULT_LIMITS), (self.sandbox, _DEFAULT_SANDBOX_LIMITS),
                                          (self.tolerance, _DEFAULT_TOLERANCE_LIMITS), (self.timing, _DEFAULT_CHECKS))
                   for name, default in defaults.items() if getattr(part, name) != default]
        if self.remeasure is not True:
            changed.append("remeasure=off")
        return f"|limits={','.join(changed)}" if changed else ""


_LIMIT_NAMES = ("timeout_s", "load_timeout_s", "first_call_timeout_s", "call_timeout_s")
# (the confinement layers too: a program refused a system call under seccomp may pass without it)
_SANDBOX_LIMIT_NAMES = ("memory_bytes", "memory_factor", "memory_headroom_bytes", "max_processes", "max_threads",
                        "cpu_seconds", "file_bytes", "scratch_bytes", "shm_bytes", "open_files", "namespaces",
                        "landlock", "seccomp", "drop_identity", "cgroup")
_DEFAULT_LIMITS = {name: EvalConfig.__dataclass_fields__[name].default for name in _LIMIT_NAMES}
_DEFAULT_SANDBOX_LIMITS = {name: SandboxConfig.__dataclass_fields__[name].default for name in _SANDBOX_LIMIT_NAMES}
# (KernelBench's tolerance decides in its mode and where a task has no float64 oracle; the checks' counts
# decide how much of each round is compared)
_DEFAULT_TOLERANCE_LIMITS = {name: ToleranceConfig.__dataclass_fields__[name].default
                             for name in ("kernelbench_atol", "kernelbench_rtol")}
_DEFAULT_CHECKS = {name: TimingConfig.__dataclass_fields__[name].default
                   for name in ("checked_calls", "spot_checks", "full_check_rate", "settled_calls", "settle_rate")}


def _key_value(value, default) -> str:
    """A setting in the settings key, in its default's type: 1800 and 1800.0 are one setting."""
    kind = float if type(default) is int and type(value) is float and not value.is_integer() else type(default)
    try:
        return repr(kind(value)) if kind in (int, float, bool) and type(value) is not str else repr(value)
    except (TypeError, ValueError):
        return repr(value)


def check_settings(config: EvalConfig) -> None:
    """UserError naming the first setting out of its range (a typo must not become a silent policy)."""
    t, box = config.timing, config.sandbox
    device = config.device
    problems = [
        (is_spelled(device),
         f"device is cpu, cuda or cuda:N (got {device!r})"),
        (config.module_mode in MODULE_MODES, f"module_mode is one of {', '.join(MODULE_MODES)}"),
        (all(type(c) is int and c >= 0 for c in config.busy_cores), "busy_cores are core numbers (0, 1, ...)"),
        (config.correctness_trials >= 1, "correctness_trials must be at least 1"),
        (1 <= config.spares <= 16, "spares must be between 1 and 16"),
        (config.lookahead is None or 0 <= config.lookahead <= 8, "lookahead must be between 0 and 8"),
        # (glibc gives a free heap top of 2 GiB or more back at once: a larger reserve would cost and do nothing)
        (0 <= config.heap_reserve_bytes < 1 << 31, "heap_reserve_bytes must be between 0 and 2 GiB (exclusive)"),
        (all(0 < value < math.inf for value in (config.timeout_s, config.load_timeout_s, config.task_timeout_s,
                                                 config.first_call_timeout_s, config.call_timeout_s)),
         "every timeout must be a positive, finite number of seconds"),
        (t.window_s > 0 and t.max_time_s > 0 and t.warmup_s >= 0, "timing window_s and max_time_s must be positive"),
        (1 <= t.warmup_rounds and 1 <= t.min_rounds <= t.max_rounds,
         "timing needs warmup_rounds >= 1 and 1 <= min_rounds <= max_rounds"),
        (t.target_width > 0, "timing target_width must be positive"),
        (t.process_spread is None or 0 <= t.process_spread <= 0.5, "timing process_spread is between 0 and 0.5"),
        (t.spot_checks >= 1 and t.checked_calls >= 1, "timing spot_checks and checked_calls must be at least 1"),
        (0 <= t.full_check_rate <= 1, "timing full_check_rate is a share between 0 and 1"),
        (t.settled_calls >= 0, "timing settled_calls must be 0 (off) or more"),
        (0 <= t.settle_rate <= 1, "timing settle_rate is between 0 and 1"),
        (0 <= t.oracle_rate <= 1, "timing oracle_rate is a chance between 0 and 1"),
        (0 <= t.decide_margin < 1, "timing decide_margin is a share between 0 and 1"),
        (0 <= t.settle_s <= 1, "timing settle_s is between 0 and 1 second"),
        (box.memory_factor >= 1 and box.memory_headroom_bytes >= 0,
         "sandbox memory_factor must be at least 1 and memory_headroom_bytes not negative"),
        (min(box.memory_bytes, box.shm_bytes, box.scratch_bytes, box.max_processes, box.max_threads,
             box.cpu_seconds, box.file_bytes, box.open_files) > 0, "every sandbox limit must be positive"),
    ]
    for ok, message in problems:
        if not ok:
            raise UserError(f"evaluation settings: {message}.")
