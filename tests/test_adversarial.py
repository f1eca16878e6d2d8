"""The adversarial corpus on CPU: every cheat is refused (or measured at its true speed), every
legitimate optimisation is accepted with its real speedup. CUDA-only cases: test_adversarial_gpu.py."""

from __future__ import annotations

import socket
import threading

import pytest

from corpus_util import cases, params, rounds_alive_at_once, substitutions
from cuda_l1.evaluate.config import EvalConfig, TimingConfig
from cuda_l1.evaluate.confine import landlock_abi
from cuda_l1.evaluate.evaluator import Evaluator
from cuda_l1.evaluate.config import SandboxConfig

CPU_CASES = {case.name: case for case in cases("cpu")}
_evaluators: dict[str, Evaluator] = {}


def cpu_config(**overrides) -> EvalConfig:
    timing = TimingConfig.quick()
    timing.max_time_s = 2.0
    config = EvalConfig(device="cpu", timing=timing, call_timeout_s=15.0, first_call_timeout_s=30.0,
                        sandbox=SandboxConfig(memory_bytes=3 * 2**30, max_processes=24))
    for key, value in overrides.items():
        setattr(config, key, value)
    return config


def evaluator_for(reference: str, task, fork_server: bool | None = None) -> Evaluator:
    key = f"{reference}/{fork_server}"
    if key not in _evaluators:
        config = cpu_config()
        if fork_server is not None:
            config.sandbox.fork_server = fork_server
        _evaluators[key] = Evaluator(task, config)
    return _evaluators[key]


@pytest.fixture
def listener():
    """A TCP listener on loopback that records whether anyone connected."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    server.settimeout(0.2)
    seen = []
    stop = threading.Event()

    def accept():
        while not stop.is_set():
            try:
                conn, _ = server.accept()
                seen.append(conn)
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server.getsockname()[1], seen
    stop.set()
    thread.join()
    server.close()


@pytest.fixture
def unix_listener(tmp_path):
    """A Unix-domain socket listening on the host, in a directory a side can find."""
    path = tmp_path / "host.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    path.chmod(0o777)
    server.listen(4)
    yield str(path)
    server.close()


# On a CPU sides are forked from the fork server by default (fork_server.py); sides started as fresh
# interpreters (the default on CUDA) face the cases that test what a side inherits or can reach
# (credentials, files, sockets, privileges, processes, the harness's own state), and a few plain ones.
FRESH_CASES = ("identical", "read_credentials", "write_outside", "network_access", "unix_socket", "privileges",
                "fork_bomb", "hang", "segfault", "memory_hog", "predict_seed", "harness_reply_first",
                "fake_verdict_exit", "timer_patch", "late_fill_thread", "input_mutation", "sysv_and_vsock",
                "deep_reply", "harness_skip_calls", "lying_address", "malformed_reply", "reply_ahead")


@pytest.mark.parametrize("name", params(CPU_CASES))
def test_cpu_corpus(name, tmp_path, monkeypatch, listener, unix_listener):
    _judge_case(CPU_CASES[name], tmp_path, monkeypatch, listener, unix_listener, fork_server=None)


@pytest.mark.parametrize("name", FRESH_CASES)
def test_cpu_corpus_with_fresh_sides(name, tmp_path, monkeypatch, listener, unix_listener):
    _judge_case(CPU_CASES[name], tmp_path, monkeypatch, listener, unix_listener, fork_server=False)


def _within_bounds(bounds: dict, verdict) -> bool:
    return (verdict.raw_speedup >= bounds.get("speedup_at_least", 0.0)
            and verdict.raw_speedup <= bounds.get("speedup_at_most", float("inf"))
            and verdict.speedup <= bounds.get("score_at_most", float("inf")))


def _not_faster(verdict) -> bool:
    """Refused, or measured in full and then no faster than the reference: raw within 15% (a busy CPU
    host strays; the tricks these cases try would gain far more), or scored no faster (the reward: an
    interval that holds 1). Raw alone failed once for code that gains nothing (timer_patch: raw 1.18,
    its interval from 0.85, scored 1.00)."""
    return verdict.status != "ok" or verdict.raw_speedup <= 1.15 or verdict.speedup <= 1.0


def _misses(case, verdict) -> bool:
    if case.expect == "not_faster":
        return not _not_faster(verdict)
    return bool(case.bounds) and not _within_bounds(case.bounds, verdict)


def _judge_case(case, tmp_path, monkeypatch, listener, unix_listener, fork_server: bool | None) -> None:
    # Credentials the evaluator's own process holds; none may reach the candidate.
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-openai-secret")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "sk-test-aws-secret")
    monkeypatch.setenv("HF_TOKEN", "sk-test-hf-secret")
    port, connections = listener
    if case.name in ("write_outside", "read_credentials") and landlock_abi() < 1:
        pytest.skip("Landlock is not available: file confinement is not enforced on this kernel")
    evaluator = evaluator_for(case.reference, case.task(), fork_server)
    source = case.source(**substitutions(case, tmp_path, port, unix_listener))
    verdict = evaluator.evaluate(source)
    if verdict.status == "ok" and _misses(case, verdict):
        # The bounds are for gains of several-fold (a trick's, or a legitimate rewrite's) and the
        # not-faster bar for gains above 15%; on a busy 2-core host one quick reading of short windows
        # strays by tens of percent (CI failed on such strays: flush_denormals, identical code on its
        # side, raw 1.17 with an interval from 1.07; twelve readings here ranged 0.90-1.17), so a miss
        # is measured once more and the second reading must hold: a trick that gains misses both.
        verdict = evaluator.evaluate(source)
    started = {None: None, True: "forked", False: "fresh interpreter"}[fork_server]
    assert started is None or verdict.sandbox.get("started") == started, verdict.sandbox
    summary = f"{verdict.status} {verdict.reasons} {[(c.name, c.passed, c.detail[:120]) for c in verdict.checks]}\nlog:{verdict.log[-1500:]}"
    assert "sk-test-" not in verdict.to_json()
    if case.expect == "not_faster":
        assert _not_faster(verdict), summary
        return
    assert case.expects(verdict.status), summary
    assert case.caught(verdict), summary
    if verdict.status == "ok":
        assert verdict.speedup is not None and verdict.ci[0] <= verdict.raw_speedup <= verdict.ci[1]
        if "speedup_at_least" in case.bounds:
            assert verdict.raw_speedup >= case.bounds["speedup_at_least"], summary
        if "speedup_at_most" in case.bounds:
            assert verdict.raw_speedup <= case.bounds["speedup_at_most"], summary
        if "score_at_most" in case.bounds:  # the score: identical code's scores 1.00 here, whatever the load
            assert verdict.speedup <= case.bounds["score_at_most"], summary
    else:
        assert verdict.speedup is None and verdict.reasons, summary
    # No verdict field may carry a credential, whatever the candidate printed, nor a terminal escape.
    assert "sk-test-" not in verdict.to_json()
    assert "\x1b" not in " ".join(verdict.reasons + [c.detail for c in verdict.checks] + [verdict.log])
    if case.name == "write_outside":
        assert not (tmp_path / "escaped.txt").exists()
    if case.name == "network_access":
        assert not connections, "the candidate reached a TCP listener on the host"


def test_credential_probe_can_see_secrets_when_landlock_is_off(tmp_path, monkeypatch):
    """The read_credentials candidate is not toothless: without the filesystem confinement it finds the
    evaluator's key in /proc/<pid>/environ and answers wrongly, so its ok verdict above means something."""
    if landlock_abi() < 1:
        pytest.skip("Landlock is not available here")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-openai-secret")
    case = CPU_CASES["read_credentials"]
    evaluator = Evaluator(case.task(), cpu_config(sandbox=SandboxConfig(landlock=False, memory_bytes=3 * 2**30)))
    try:
        verdict = evaluator.evaluate(case.source(**substitutions(case, tmp_path)))
    finally:
        evaluator.close()
    assert verdict.status == "incorrect", verdict.reasons


def test_the_parent_holds_one_rounds_inputs_at_a_time(monkeypatch):
    """A round's inputs are gone before the next round's, or the null windows measured again at the end
    of the warm-up, make theirs (on a CPU the round just verified stayed referenced through them; on a
    GPU two rounds of a 6 GiB task's inputs at once crowd an 80 GiB device)."""
    verdict, most = rounds_alive_at_once(monkeypatch, CPU_CASES["identical"], cpu_config())
    assert verdict.status == "ok", verdict.reasons
    assert most == 0, f"{most} earlier rounds' inputs were alive when a round's inputs were made"


def test_an_evaluator_failure_says_where_in_the_evaluator_it_happened(monkeypatch):
    """A failure of the parent's own work (on a GPU: running out of device memory) is a runtime_error
    verdict whose reason names the evaluator's function and line, not the failing library's: an H100
    run of KernelBench's Swish said only "CUDA out of memory", and which of the parent's allocations it
    was stayed unknown."""
    import re

    from cuda_l1.evaluate.task_env import TaskEnv

    real, made = TaskEnv.fresh_inputs, []

    def fails_third(self, count):
        made.append(count)
        if len(made) == 3:
            raise RuntimeError("no memory left for the inputs")
        return real(self, count)

    monkeypatch.setattr(TaskEnv, "fresh_inputs", fails_third)
    case = CPU_CASES["identical"]
    evaluator = Evaluator(case.task(), cpu_config())
    try:
        verdict = evaluator.evaluate(case.source())
    finally:
        evaluator.close()
    assert verdict.status == "runtime_error", verdict.reasons
    assert re.match(r"the evaluation failed in referee\.py:\d+ \(measure\): RuntimeError: no memory left",
                    verdict.reasons[0]), verdict.reasons
