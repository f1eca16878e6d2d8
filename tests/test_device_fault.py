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
    assert (caught.value.kind, caught.value.check) == ("rejected", "outputs_readable")
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
    timing = TimingConfig.quick()
    timing.max_time_s = 1.0
    config = EvalConfig(device="cpu", timing=timing, call_timeout_s=15.0, first_call_timeout_s=30.0,
                        sandbox=SandboxConfig(memory_bytes=3 * 2**30, max_processes=24))
    real, faults = Referee.verify_round, {"left": 1}

    def faulting(self, round_no):
        if faults["left"]:
            faults["left"] -= 1
            raise ReferenceFailure("reading the candidate's outputs faulted on the device while comparing "
                                   f"({FAULT})", "rejected", "outputs_readable")
        return real(self, round_no)

    monkeypatch.setattr(Referee, "verify_round", faulting)
    evaluator = Evaluator(case.task(), config)
    try:
        first = evaluator.evaluate(case.source())
        second = evaluator.evaluate(case.source())
    finally:
        evaluator.close()
    assert first.status == "rejected", first.reasons
    assert first.check("outputs_readable").passed is False
    assert first.check("reference_ran") is None
    assert "faulted on the device" in first.reasons[0] and "running beside it" not in first.reasons[0]
    assert second.status == "ok", second.reasons
