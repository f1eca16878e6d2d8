"""Evaluation settings. Every field has a one-line help; defaults are the trusted policy."""

from __future__ import annotations

from dataclasses import dataclass, field

from cuda_l1.evaluate.precision import ToleranceConfig
from cuda_l1.evaluate.sandbox import SandboxConfig


@dataclass
class TimingConfig:
    """The timing protocol: rounds of one window per side, in random order, on fresh inputs."""

    enabled: bool = True  # time candidates (off: correctness only, a few rounds)
    window_s: float = 0.02  # target length of one window (a batch of back-to-back calls)
    warmup_rounds: int = 3  # rounds before any is recorded (the first is always one call per side)
    warmup_s: float = 0.2  # and at least this long
    min_rounds: int = 12  # recorded rounds before stopping is allowed
    max_rounds: int = 200  # hard cap on recorded rounds
    target_width: float = 0.02  # stop once the 95% interval is this narrow, relative to the speedup
    max_time_s: float = 10.0  # cap on the recorded phase
    flush_cache: bool = True  # flush the last-level cache before every window
    spot_checks: int = 64  # positions of every output compared for each checked call
    checked_calls: int = 8  # calls of each candidate window, drawn after it, compared with the reference
    full_check_rate: float = 0.2  # share of later rounds in which one checked call is compared in full
    remeasure_above: float = 3.0  # re-measure in a fresh process when the speedup exceeds this
    remeasure_vs_best: float = 2.0  # ... or exceeds this multiple of the best speedup known for the task

    @classmethod
    def quick(cls) -> "TimingConfig":
        """Short runs for tests and CPU smoke checks."""
        return cls(window_s=0.01, warmup_rounds=2, warmup_s=0.05, min_rounds=10, max_rounds=40, target_width=0.04,
                   max_time_s=3.0)


@dataclass
class EvalConfig:
    """Everything that decides how one candidate is judged."""

    device: str = "cpu"  # "cpu", "cuda" or "cuda:N"
    tolerance: ToleranceConfig = field(default_factory=ToleranceConfig)  # the precision policy
    timing: TimingConfig = field(default_factory=TimingConfig)  # the timing protocol
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)  # isolation and limits of each side
    correctness_trials: int = 5  # rounds in which one call is compared in full against the float64 oracle
    timeout_s: float = 180.0  # wall-clock limit for one candidate's whole evaluation (load, checks, timing)
    load_timeout_s: float = 900.0  # importing the candidate, including extension builds
    first_call_timeout_s: float = 300.0  # the first window (JIT compilers such as Triton or torch.compile)
    call_timeout_s: float = 60.0  # any later window
    threads: int | None = None  # CPU threads of each side (default 1 on CPU: both sides share one core)
    cpu_core: int | None = None  # the core both sides are timed on (None: on CPU the idlest core, on a GPU unpinned)
    best_known_speedup: float | None = None  # best verified speedup for this task, for the re-measure rule
    remeasure: bool = True  # apply the re-measure rule
    prewarm: bool | None = None  # keep a spare candidate process (torch imported, device ready) started ahead; default: on CUDA
    build_cache_dir: str | None = None  # where extension builds are cached (default: CUDA_L1_CACHE or ~/.cache)
    input_memory_bytes: int | None = None  # budget for the input slots of both sides (default: a quarter of the device)

    def config_key(self) -> str:
        """What makes two verdicts comparable: the precision policy and how long and how finely the
        timing protocol measures (so speedups measured with quick timing never mix with full ones)."""
        tc = self.timing
        timing = ("off" if not tc.enabled else
                  f"{tc.window_s:g}/{tc.min_rounds}-{tc.max_rounds}/{tc.target_width:g}/{tc.max_time_s:g}")
        return (f"tol={self.tolerance.mode}:{self.tolerance.error_factor}:{self.tolerance.floor_eps}"
                f"|trials={self.correctness_trials}|timing={timing}")
