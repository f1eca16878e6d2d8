"""The adversarial corpus on a CUDA device: the GPU-only cheats and legitimate kernels, the CPU
corpus again on the GPU, recovery after GPU faults, and identical-code calibration."""

from __future__ import annotations

import os

import pytest

from corpus_util import cases, params, rounds_alive_at_once
from cuda_l1.evaluate.config import EvalConfig, TimingConfig
from cuda_l1.evaluate.evaluator import Evaluator
from cuda_l1.evaluate.config import SandboxConfig

pytestmark = pytest.mark.gpu

GPU_CASES = {c.name: c for c in cases("gpu")}
# CPU-only by construction: a C++ loop over host pointers; a lie about a host address (CUDA outputs are
# described by IPC handles, and the GPU corpus lies about those); host memory hidden in an amount sized
# to the CPU tests' limit (a GPU side's is 12 GiB).
CPU_ON_GPU = {c.name: c for c in cases("cpu")
              if c.name not in ("cpp_extension", "lazy_cpp_extension", "load_inline_per_layer", "lying_address",
                                "hidden_shared_memory")}
# CPU mechanisms with nothing to act on in a GPU evaluation, where each falls back to honest code:
# there it must be refused or no faster than the reference.
CPU_MECHANISM_ONLY = {
    "output_in_a_second_input_mapping",  # maps the inputs' memfd; GPU inputs are device memory
    "input_buffer_mapped_shared",  # the same: on an H100 it found no memfd and returned honest outputs (ok, raw 0.94)
    "batch_window_checked",  # views the window's CPU input buffer; on a GPU it fails (CPU storage, device input)
    "end_harness_thread",  # a CPU ring stops the tree per call, a GPU side once a window: on an H100 ok, raw 1.05
}
# CPU cases whose GPU reading is an open question: what is known, until a GPU run settles it.
OPEN_ON_GPU = {
    "slow_in_warmup_only": "issue 11: on an H200 it read raw 0.52 once (bound 0.5; about 0.1 on a CPU and by launch "
                           "count); the GPU case nine_launches_gpu, the same kernels without the sleep, tells a "
                           "window's fixed cost on a GPU from the attack",
}
_evaluators: dict[str, Evaluator] = {}


def gpu_config() -> EvalConfig:
    timing = TimingConfig.quick()
    timing.max_time_s = 3.0
    return EvalConfig(device="cuda", timing=timing, call_timeout_s=15.0, first_call_timeout_s=40.0,
                      sandbox=SandboxConfig(memory_bytes=12 * 2**30, max_processes=24))


KEEP_EVALUATORS = 3  # as a worker does (jobs.Evaluators): every one kept holds its reference side's input slots


def evaluator_for(case) -> Evaluator:
    """The evaluator of the case's reference, reused; the least recently used beyond KEEP_EVALUATORS is
    closed. Kept without a bound, the evaluators of the corpus's references held their sides' input slots
    (up to two fifths of the GPU each, a fifth then) and a later, honest candidate ran out of device memory on an 80 GB H100."""
    evaluator = _evaluators.pop(case.reference, None)
    if evaluator is None:
        while len(_evaluators) >= KEEP_EVALUATORS:
            _evaluators.pop(next(iter(_evaluators))).close()
        evaluator = Evaluator(case.task(), gpu_config())
    _evaluators[case.reference] = evaluator
    return evaluator


def by_reference(named: dict) -> dict:
    """The cases grouped by reference, so that consecutive tests reuse one evaluator."""
    return {name: named[name] for name in sorted(named, key=lambda name: (named[name].reference, name))}


def check_case(case, verdict) -> None:
    summary = f"{verdict.status} {verdict.raw_speedup} {verdict.reasons} {[(c.name, c.passed, c.detail[:160]) for c in verdict.checks]}\nlog:{verdict.log[-1500:]}"
    if case.expect == "not_faster":
        # Refused, or measured in full and then no faster than the reference: raw within 10%, or scored
        # no faster (an interval that holds 1). Raw alone failed for code that gains nothing on a
        # launch-bound task (timer_patch on an H100: raw 1.15, its interval from 0.97, scored 1.00).
        assert verdict.status != "ok" or verdict.raw_speedup <= 1.1 or verdict.speedup <= 1.0, summary
        return
    assert case.expects(verdict.status), summary
    assert case.caught(verdict), summary
    if verdict.status == "ok":
        if "speedup_at_least" in case.bounds:
            assert verdict.raw_speedup >= case.bounds["speedup_at_least"], summary
        if "speedup_at_most" in case.bounds:
            assert verdict.raw_speedup <= case.bounds["speedup_at_most"], summary


@pytest.mark.parametrize("name", params(by_reference(GPU_CASES), by_name=False))
def test_gpu_corpus(name, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-openai-secret")
    case = GPU_CASES[name]
    verdict = evaluator_for(case).evaluate(case.source())
    check_case(case, verdict)
    assert "sk-test-" not in verdict.to_json()


def _open_on_gpu(name: str) -> str | None:
    """Why a CPU case's expectation does not hold on a GPU yet: its GPU question, or its open gap."""
    return OPEN_ON_GPU.get(name) or CPU_ON_GPU[name].open_gap


@pytest.mark.parametrize("name", [pytest.param(name, marks=pytest.mark.xfail(reason=_open_on_gpu(name), strict=False))
                                  if _open_on_gpu(name) else name for name in by_reference(CPU_ON_GPU)])
def test_cpu_corpus_on_gpu(name, tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-openai-secret")
    case = CPU_ON_GPU[name]
    subs = {"SECRET_FILE": str(tmp_path / "secret"), "TARGET_FILE": str(tmp_path / "escaped"), "PORT": "9",
            "EVALUATOR_PID": str(os.getpid())}
    (tmp_path / "secret").write_text("sk-test-0000")
    verdict = evaluator_for(case).evaluate(case.source(**subs))
    if case.expect == "ok" and case.bounds.get("speedup_at_least"):
        # CPU speedups (library swap, algebra) need not carry over to the GPU; correctness must.
        assert verdict.status == "ok", verdict.reasons
        return
    if case.expect in ("incorrect", "rejected") and verdict.status in ("incorrect", "rejected", "runtime_error"):
        # CPU-made cheats may fail differently on a GPU (an output left on the CPU, a CPU storage
        # set on a device tensor); they must still fail.
        return
    if name in CPU_MECHANISM_ONLY:
        assert verdict.status != "ok" or verdict.raw_speedup <= 1.1, (verdict.status, verdict.raw_speedup)
        return
    check_case(case, verdict)
    assert not (tmp_path / "escaped").exists()


@pytest.mark.parametrize("fault", ["illegal_memory_access", "infinite_kernel", "gpu_oom"])
def test_next_candidate_is_judged_normally_after_a_gpu_fault(fault):
    case = GPU_CASES[fault]
    evaluator = evaluator_for(case)
    bad = evaluator.evaluate(case.source())
    assert bad.status == case.expect, bad.reasons
    health = bad.check("gpu_health_after")
    assert health is None or health.passed
    good = evaluator.evaluate(case.task().source.replace("class Model(", "class ModelNew("))
    assert good.status == "ok", "\n".join(good.reasons)


@pytest.mark.parametrize("name", ["identical_matmul", "identical_small_ops", "identical_relu_add"])
def test_identical_code_measures_one(name):
    case = GPU_CASES[name]
    evaluator = Evaluator(case.task(), EvalConfig(device="cuda"))
    try:
        verdict = evaluator.evaluate(case.source())
    finally:
        evaluator.close()
    assert verdict.status == "ok", verdict.reasons
    assert verdict.timing["launch_share"] is not None, verdict.timing
    if name == "identical_small_ops":
        # Launch-bound: the issuing process's own speed strays from one process to the next (0.95-1.13
        # over six pairs on an H100), which the rounds cannot see and the wider spread absorbs.
        assert verdict.timing["launch_share"] > 0.6 and verdict.timing["process_spread"] > 0.02, verdict.timing
        assert abs(verdict.raw_speedup - 1.0) <= 0.15, verdict.timing
    else:
        assert abs(verdict.raw_speedup - 1.0) <= 0.05, verdict.timing
    assert verdict.speedup == 1.0 or abs(verdict.speedup - 1.0) <= 0.05


@pytest.mark.parametrize("settle_s", [0.02, 0.0])
def test_the_parent_holds_one_rounds_inputs_at_a_time(monkeypatch, settle_s):
    """On a GPU the next round's inputs are made during the pause after verification. The null windows
    measured again later (at the end of the warm-up, on a re-plan or a re-check) made inputs of their
    own beside them, and without the pause beside the round just verified: two rounds of a 6 GiB
    task's inputs at once, and KernelBench's Swish and Softplus ran out of memory in the parent on an
    80 GiB H100 (likely this). When a round's inputs are made, no earlier round's may still be alive."""
    config = EvalConfig(device="cuda")
    config.timing.settle_s = settle_s
    verdict, most = rounds_alive_at_once(monkeypatch, GPU_CASES["identical_relu_add"], config)
    assert verdict.status == "ok", verdict.reasons
    assert most == 0, f"{most} earlier rounds' inputs were alive when a round's inputs were made"
