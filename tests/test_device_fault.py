"""Memory the candidate names that faults when the reference's side reads it (a forged IPC handle can
open to such a mapping) is the candidate's verdict, refused, not an evaluation that failed beside it;
and the reference's side, whose CUDA context a fault ends, is replaced."""

from __future__ import annotations

import json

import pytest

from corpus_util import cases
from cuda_l1.evaluate import output_checks, protocol, reference_checks, validate
from cuda_l1.evaluate.config import EvalConfig, SandboxConfig, TimingConfig
from cuda_l1.evaluate.evaluator import Evaluator
from cuda_l1.evaluate.protocol import Verified, Verify
from cuda_l1.evaluate.referee import Referee
from cuda_l1.evaluate.sides import ReferenceFailure
from cuda_l1.evaluate.validate import ProtocolError

FAULT = "AcceleratorError: CUDA error: unspecified launch failure"


def _quick_cpu_config() -> EvalConfig:
    timing = TimingConfig.quick()
    timing.max_time_s = 1.0
    return EvalConfig(device="cpu", timing=timing, call_timeout_s=15.0, first_call_timeout_s=30.0,
                      sandbox=SandboxConfig(memory_bytes=3 * 2**30, max_processes=24))


def test_device_fault_travels_as_a_bool():
    reply = Verified(False, FAULT, device_fault=True)
    assert validate.decode(json.loads(json.dumps(protocol.encode(reply))), from_side=True) == reply
    with pytest.raises(ProtocolError, match="device_fault"):
        validate.decode({"op": "verified", "ok": False, "device_fault": "yes"}, from_side=True)


def _answered(monkeypatch, reply: Verified) -> None:
    monkeypatch.setattr(output_checks, "_ask_reference", lambda *args, **kwargs: reply)


def test_a_fault_reading_the_candidates_memory_refuses_the_candidate(monkeypatch):
    _answered(monkeypatch, Verified(False, FAULT, device_fault=True))
    with pytest.raises(ReferenceFailure) as caught:
        output_checks._verified(None, Verify([], 16, {}), EvalConfig(device="cpu"), lambda: 10.0, None, "verifying")
    assert (caught.value.kind, caught.value.check, caught.value.device_fault) == ("rejected", "outputs_readable", True)
    assert "faulted on the device" in str(caught.value)


def test_any_other_failure_of_the_reference_is_the_evaluations(monkeypatch):
    _answered(monkeypatch, Verified(False, "ValueError: its own bug"))
    with pytest.raises(ReferenceFailure) as caught:
        output_checks._verified(None, Verify([], 16, {}), EvalConfig(device="cpu"), lambda: 10.0, None, "verifying")
    assert (caught.value.kind, caught.value.check) == ("runtime_error", "reference_ran")


class _Side:
    device = "cpu"


def test_the_side_says_whether_its_context_survived(monkeypatch):
    def fails(side, msg, memory):
        raise RuntimeError("CUDA error: unspecified launch failure")

    monkeypatch.setattr(reference_checks, "_verify", fails)
    reply = reference_checks.verify_request(_Side(), Verify([], 16, {}))
    assert not reply.ok and not reply.device_fault  # a CPU side has no context to lose
    monkeypatch.setattr(reference_checks, "_context_lost", lambda device: True)
    reply = reference_checks.verify_request(_Side(), Verify([], 16, {}))
    assert not reply.ok and reply.device_fault and "unspecified launch failure" in reply.message


def test_the_verdict_is_rejected_and_the_next_candidate_is_judged_beside_a_new_reference(monkeypatch):
    # On a GPU the fault comes from the reference side's Verify reply (above); the CPU path has no such
    # request, so the failure _verified raises is raised where verification runs, once.
    case = {c.name: c for c in cases("cpu")}["identical"]
    config = _quick_cpu_config()
    real, faults = Referee.verify_round, {"left": 1}

    def faulting(self, round_no):
        if faults["left"]:
            faults["left"] -= 1
            raise ReferenceFailure("reading the candidate's outputs faulted on the device while comparing "
                                   f"({FAULT})", "rejected", "outputs_readable", device_fault=True)
        return real(self, round_no)

    monkeypatch.setattr(Referee, "verify_round", faulting)
    config.fresh_reference = False  # a GPU's default: the side would serve the next candidate too
    evaluator = Evaluator(case.task(), config)
    try:
        faulted_side = evaluator.env.ref
        first = evaluator.evaluate(case.source())
        assert evaluator.env.ref is None or evaluator.env.ref is not faulted_side  # ended, never reused
        second = evaluator.evaluate(case.source())
    finally:
        evaluator.close()
    assert first.status == "rejected", first.reasons
    assert first.check("outputs_readable").passed is False
    assert first.check("reference_ran") is None
    assert "faulted on the device" in first.reasons[0] and "running beside it" not in first.reasons[0]
    assert second.status == "ok", second.reasons


def test_settle_rate_is_in_the_settings_key():
    default = EvalConfig(device="cuda")
    assert "settle_rate" not in default.config_key()
    lower = EvalConfig(device="cuda", timing=TimingConfig(settle_rate=0.5))
    assert "settle_rate=0.5" in lower.config_key() and lower.config_key() != default.config_key()


@pytest.mark.parametrize("rate", [0.0, 1.0])
def test_the_settle_read_is_drawn_at_settle_rate(monkeypatch, rate):
    # The read itself needs a GPU (RoundChecks.settles is False on a CPU); here it is counted, and what
    # the verdict claims follows what was done: every round at 1, none (and no claim) at 0.
    case = {c.name: c for c in cases("cpu")}["identical"]
    config = _quick_cpu_config()
    config.timing.settle_rate = rate
    reads = []
    monkeypatch.setattr(Referee, "settles", lambda self: True)
    monkeypatch.setattr(Referee, "settle_window", lambda self, round_no: reads.append(round_no))
    evaluator = Evaluator(case.task(), config)
    try:
        verdict = evaluator.evaluate(case.source())
    finally:
        evaluator.close()
    assert verdict.status == "ok", verdict.reasons
    settled = verdict.check("outputs_settled")
    if rate == 0.0:
        assert reads == [] and settled is None
    else:
        assert reads == sorted(set(reads)) and len(reads) >= 2  # each round's candidate window, once
        assert settled.passed and f"in {len(reads)} of {len(reads)} rounds" in settled.detail


class _OracleSide:
    """What _verify uses of the harness's side, with a float64 oracle that fails."""

    device, reader, input_base, settled = "cpu", None, 0, []

    def __init__(self):
        import torch

        self.kept = [torch.zeros(4)]

    def _oracle_outputs(self, slot, using, threads=1):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")


def test_a_fault_of_the_references_own_oracle_is_not_the_candidates(monkeypatch):
    request = Verify([protocol.CallToVerify(0, 0, "oracle", [-1.0], 7, [])], 16, {})
    monkeypatch.setattr(reference_checks, "_context_lost", lambda device: True)
    reply = reference_checks.verify_request(_OracleSide(), request)
    assert not reply.ok and not reply.device_fault and "float64 oracle lost" in reply.message
    # An oracle that fails without losing the context is noted, and the request goes on.
    monkeypatch.setattr(reference_checks, "_context_lost", lambda device: False)
    reply = reference_checks.verify_request(_OracleSide(), request)
    assert reply.ok and "illegal memory access" in reply.oracle_note


class _Sticky:
    """A device fault pending before the request: every synchronisation from the first on raises (sticky)."""

    def __init__(self):
        self.calls = 0

    def __call__(self, device):
        self.calls += 1
        raise RuntimeError("CUDA error: unspecified launch failure")


class _ReadingSide(_OracleSide):
    """A side whose oracle works; what faults is what was read before (the candidate's memory)."""

    def _oracle_outputs(self, slot, using, threads=1):
        import torch

        return [torch.zeros(4)]


@pytest.mark.parametrize("request_", [
    # reads before the oracle: their fault surfaces at the sync before it, as theirs
    Verify([protocol.CallToVerify(0, 0, "oracle", [-1.0], 7, [])], 16, {}),
    # no oracle: the fault of the last reads surfaces at the request's final sync
    Verify([protocol.CallToVerify(0, 0, "full", [-1.0], 7, [])], 16, {}),
    # the read right after the window: its own sync before the reply
    Verify([protocol.CallToVerify(0, 0, "settle", [-1.0], 7, [])], 16, {}),
], ids=["before_the_oracle", "at_the_end", "settle_read"])
def test_a_fault_pending_from_the_reads_is_the_candidates_wherever_it_surfaces(monkeypatch, request_):
    sync = _Sticky()
    monkeypatch.setattr(reference_checks, "_sync", sync)
    reply = reference_checks.verify_request(_ReadingSide(), request_)
    assert sync.calls >= 1 and not reply.ok and reply.device_fault, reply


def test_a_lost_context_keeps_the_requests_memory_pool(monkeypatch):
    released = []

    class Pool:
        def __init__(self, device):
            self.pool = object()

        def using(self):
            raise AssertionError("no oracle in this request")

        def release(self):
            released.append(self.pool)

    monkeypatch.setattr(reference_checks, "OracleMemory", Pool)
    monkeypatch.setattr(reference_checks, "_sync", _Sticky())
    kept = len(reference_checks._LOST_POOLS)
    reply = reference_checks.verify_request(_ReadingSide(), Verify([protocol.CallToVerify(0, 0, "full", [-1.0], 7, [])], 16, {}))
    assert reply.device_fault and released == [] and len(reference_checks._LOST_POOLS) == kept + 1
    del reference_checks._LOST_POOLS[kept:]
    monkeypatch.setattr(reference_checks, "_sync", lambda device: None)
    reply = reference_checks.verify_request(_ReadingSide(), Verify([protocol.CallToVerify(0, 0, "full", [-1.0], 7, [])], 16, {}))
    assert reply.ok and len(released) == 1 and len(reference_checks._LOST_POOLS) == kept


def test_the_parent_failing_to_give_back_a_buffer_is_a_verdict_not_a_traceback(monkeypatch):
    from cuda_l1.evaluate import slots

    case = {c.name: c for c in cases("cpu")}["identical"]
    real, failures = slots.SlotBuffer.close, {"left": 1}

    def close(self):
        if failures["left"]:
            failures["left"] -= 1
            raise RuntimeError("CUDA error: unspecified launch failure")
        return real(self)

    evaluator = Evaluator(case.task(), _quick_cpu_config())
    try:
        monkeypatch.setattr(slots.SlotBuffer, "close", close)
        verdict = evaluator.evaluate(case.source())
    finally:
        evaluator.close()
    assert failures["left"] == 0
    assert verdict.status == "runtime_error" and verdict.check("evaluator").passed is False
    assert "could not be given back" in verdict.check("evaluator").detail


def test_a_faulted_reference_is_let_go_even_when_its_buffer_cannot_be_given_back(monkeypatch):
    # After a fault the device is in error, and giving back the reference's input buffer raises: the side
    # must still be let go (and its ring closed), or the next evaluation meets the dead side.
    from cuda_l1.evaluate import slots

    case = {c.name: c for c in cases("cpu")}["identical"]
    config = _quick_cpu_config()
    config.fresh_reference = False  # a GPU's default: the side would serve the next candidate too
    real_verify, real_close = Referee.verify_round, slots.SlotBuffer.close
    faults, failed_closes = {"left": 1}, []

    def faulting(self, round_no):
        if faults["left"]:
            faults["left"] -= 1
            raise ReferenceFailure(f"reading the candidate's outputs faulted ({FAULT})", "rejected",
                                   "outputs_readable", device_fault=True)
        return real_verify(self, round_no)

    evaluator = Evaluator(case.task(), config)
    faulted = evaluator.env.ref

    def close(self):
        if faulted is not None and self is faulted.buffer and not failed_closes:
            failed_closes.append(self)
            raise RuntimeError("CUDA error: unspecified launch failure")
        return real_close(self)

    monkeypatch.setattr(Referee, "verify_round", faulting)
    monkeypatch.setattr(slots.SlotBuffer, "close", close)
    try:
        first = evaluator.evaluate(case.source())
        assert failed_closes, "the faulted side's buffer was not given back"
        assert evaluator.env.ref is None or evaluator.env.ref is not faulted
        second = evaluator.evaluate(case.source())
    finally:
        evaluator.close()
    assert first.status == "rejected" and first.check("outputs_readable").passed is False, first.reasons
    assert first.check("evaluator") is None
    assert second.status == "ok", second.reasons


@pytest.mark.parametrize("device_fault, healthy, status", [(True, True, "rejected"), (True, False, "runtime_error"),
                                                           (False, False, "runtime_error"), (False, True, "timeout")])
def test_a_device_fault_is_the_candidates_only_while_the_device_is_healthy(device_fault, healthy, status):
    from cuda_l1.evaluate.evaluator import judge_device_health
    from cuda_l1.evaluate.verdict import Verdict

    before = "rejected" if device_fault else ("runtime_error" if not healthy else "timeout")
    verdict = Verdict(status=before, reasons=["reading the candidate's outputs faulted"])
    judge_device_health(verdict, healthy, "ok" if healthy else "AcceleratorError: CUDA error", device_fault)
    assert verdict.status == status
    assert verdict.check("gpu_health_after").passed is healthy
    assert verdict.check("gpu_health_after").blocking is False
    assert ("the GPU itself failed" in verdict.reasons[0]) is (device_fault and not healthy)


def test_a_slot_buffer_is_freed_even_when_the_device_is_in_error(monkeypatch):
    # Giving back a GPU side's input slots (up to two fifths of the device) synchronises first; on a device
    # in error that raises, and the raise must not skip the free (close_reference swallows the error).
    import torch

    from cuda_l1.evaluate import cudadrv, slots

    freed = []
    monkeypatch.setattr(cudadrv, "free", freed.append)

    def in_error(device=None):
        raise RuntimeError("CUDA error: unspecified launch failure")

    monkeypatch.setattr(torch.cuda, "synchronize", in_error)
    buffer = object.__new__(slots.SlotBuffer)
    buffer.views, buffer.raw, buffer._map, buffer.device, buffer._ptr = [], None, None, "cuda:0", 0x7000
    with pytest.raises(RuntimeError, match="unspecified launch failure"):
        buffer.close()
    assert freed == [0x7000] and buffer._ptr is None
    buffer.close()  # once given back, closing again does nothing
    assert freed == [0x7000]
