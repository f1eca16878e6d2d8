"""Evaluation settings. Every field has a one-line help; defaults are the trusted policy."""

from __future__ import annotations

from dataclasses import dataclass, field

from cuda_l1.evaluate.precision import ToleranceConfig
from cuda_l1.evaluate.sandbox import SandboxConfig


@dataclass
class TimingConfig:
    """The timing protocol: alternating rounds, fresh inputs, flushed caches, adaptive stopping."""

    enabled: bool = True  # time candidates that passed correctness (off: correctness only)
    warmup_s: float = 0.25  # warm-up by time, per side, before anything is recorded
    min_warmup_calls: int = 3  # and at least this many calls per side
    min_rounds: int = 10  # rounds (one reference call + one candidate call) before stopping is allowed
    max_rounds: int = 400  # hard cap on rounds
    target_rse: float = 0.01  # stop once both sides' relative standard error is below this
    max_time_s: float = 20.0  # cap on the timed phase
    flush_cache: bool = True  # flush the last-level cache before every timed call
    same_buffer_fraction: float = 0.5  # share of rounds whose fresh values are copied into old buffers
    spot_checks: int = 64  # output positions of every timed call checked against the reference
    full_checks: int = 3  # timed calls (chosen after the fact) whose whole output is checked; plus the last
    remeasure_above: float = 3.0  # re-measure in a fresh process when the speedup exceeds this
    remeasure_vs_best: float = 2.0  # ... or exceeds this multiple of the best speedup known for the task
    hidden_work_ms: float = 0.02  # device-sync time beyond the reference's that means work on other streams
    consistency_slack_ms: float = 3.0  # allowed excess of the parent's round-trip over the child's report
    ping_fraction: float = 0.2  # share of timed rounds followed by a ping, to track round-trip latency under load

    @classmethod
    def quick(cls) -> "TimingConfig":
        """Short runs for tests and CPU smoke checks."""
        # Enough rounds that a fluke of a few calls cannot make identical code look 30% faster.
        return cls(warmup_s=0.05, min_warmup_calls=2, min_rounds=20, max_rounds=80, target_rse=0.02,
                   max_time_s=4.0, full_checks=2)


@dataclass
class EvalConfig:
    """Everything that decides how one candidate is judged."""

    device: str = "cpu"  # "cpu", "cuda" or "cuda:N"
    tolerance: ToleranceConfig = field(default_factory=ToleranceConfig)  # the precision policy
    timing: TimingConfig = field(default_factory=TimingConfig)  # the timing protocol
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)  # isolation and limits of the child
    correctness_trials: int = 5  # independent input sets checked before any timing
    timeout_s: float = 180.0  # wall-clock limit for one candidate's whole evaluation (load, checks, timing)
    load_timeout_s: float = 900.0  # importing the candidate, including extension builds
    first_call_timeout_s: float = 300.0  # the first call (JIT compilers such as Triton or torch.compile)
    call_timeout_s: float = 60.0  # any later call
    threads: int | None = None  # CPU threads for both sides (default 1 on CPU: two processes alternate on the cores)
    cpu_core: int | None = None  # CPU device, one thread: the core both sides are timed on (None: the lowest allowed)
    best_known_speedup: float | None = None  # best verified speedup for this task, for the re-measure rule
    remeasure: bool = True  # apply the re-measure rule
    prewarm: bool | None = None  # keep a spare child (torch imported, device ready) started ahead; default: on CUDA
    build_cache_dir: str | None = None  # where extension builds are cached (default: CUDA_L1_CACHE or ~/.cache)

    def config_key(self) -> str:
        """What makes two verdicts comparable: tolerance mode and the main protocol knobs."""
        return f"tol={self.tolerance.mode}:{self.tolerance.error_factor}:{self.tolerance.floor_eps}|trials={self.correctness_trials}"
